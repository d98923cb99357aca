"""The DDP plan on the simulator: overlap, exposed communication, launch order, options."""
from dataclasses import replace

import pytest

from distlab.sim import models as m
from distlab.sim.cluster import GPUS, PRESETS
from distlab.sim.parallel.ddp.plan import DDPOptions, bucket_rows, ddp_plan
from distlab.sim.result import step_summary as summarize
from distlab.sim.kernel.engine import simulate, simulate_collective
from distlab.sim.plan import Collective, Compute, Record

MIB = 2**20


def cluster(tflops=1.0, hbm=1e9, n=2):
    gpu = replace(GPUS["h100"], tflops=tflops, hbm_GBps=hbm, mfu=1.0, fp32_tflops=None)   # tflops in any dtype
    return replace(PRESETS["dgx-h100"], gpu=gpu, gpus_per_node=n, interference=1.0)   # (tests/test_interference.py)


def equal_layers(n_layers=3, numel=MIB, fwd_flops=1e9):
    """n layers, one fp32 weight each, backward = 2 x forward."""
    return m.Model("eq", [m.Layer(f"l{i}", [m.Param(f"l{i}.w", (numel,))], fwd_flops=fwd_flops)
                          for i in range(n_layers)])


def t_allreduce(nbytes, c):
    return simulate_collective("all_reduce", nbytes, c)[0].makespan


def run(model, c, **opts):
    plan, info = ddp_plan(model, c.world_size, DDPOptions(optimizer="none", **opts))
    trace = simulate(plan, c, record_transfers=False)
    return trace, info, summarize(trace), bucket_rows(trace, info)


def test_overlap_matches_a_hand_computed_timeline():
    # layers of 4 MiB, one bucket each (cap = 4 MiB); a bucket's all-reduce T = 3 f, f = one layer's forward.
    c0 = cluster()
    T = t_allreduce(4 * MIB, c0)
    f = T / 3
    c = cluster(tflops=1e9 / f / 1e12)
    trace, info, s, rows = run(equal_layers(), c, bucket_cap_mb=4)
    # fwd 0..3f; bwd l2 3f..5f, l1 ..7f, l0 ..9f. b0 5f..8f, b1 8f..11f (ready 7f), b2 11f..14f (ready 9f)
    assert [r["ready_s"] / f for r in rows] == pytest.approx([5, 7, 9])
    assert [r["launch_s"] / f for r in rows] == pytest.approx([5, 8, 11])
    assert [r["end_s"] / f for r in rows] == pytest.approx([8, 11, 14])
    assert s["step_s"] / f == pytest.approx(14)
    assert s["compute_s"] / f == pytest.approx(9)
    assert s["comm_s"] / f == pytest.approx(9)
    assert s["exposed_comm_s"] / f == pytest.approx(5)        # comm during compute: 5f..9f = 4f of 9f
    assert s["overlap_pct"] == pytest.approx(100 * 4 / 9)


def test_fast_comm_exposes_only_what_follows_the_last_bucket():
    c0 = cluster()
    model = equal_layers(8)
    T = t_allreduce(4 * MIB, c0)
    c = cluster(tflops=1e9 / (20 * T) / 1e12)                # a layer's forward = 20 all-reduces
    trace, info, s, rows = run(model, c, bucket_cap_mb=4)
    backward_end = max(o.end for o in trace.for_rank(0) if o.kind == "compute")
    assert all(r["end_s"] < backward_end for r in rows[:-1])
    assert rows[-1]["ready_s"] == pytest.approx(backward_end)
    assert s["exposed_comm_s"] == pytest.approx(rows[-1]["end_s"] - rows[-1]["ready_s"])
    assert s["exposed_comm_s"] == pytest.approx(T)
    assert s["step_s"] == pytest.approx(backward_end + T)


def test_zero_compute_step_is_the_sum_of_all_reduces():
    model = m.Model("z", [m.Layer(f"l{i}", [m.Param(f"w{i}", (k,))]) for i, k in enumerate([MIB, 3 * MIB, 5000])])
    c = cluster(hbm=1e15)
    trace, info, s, rows = run(model, c, bucket_cap_mb=1)
    assert len(rows) == 2           # [w2 + w1], [w0]
    total = sum(t_allreduce(b["bytes"], c) for b in info["buckets"])
    assert s["step_s"] == pytest.approx(total, rel=1e-6)
    assert s["overlap_pct"] == pytest.approx(0.0, abs=1e-6)


def test_plan_structure_grad_accum_compression_algorithm_iteration0():
    model = m.mlp(256, 256, 256, 256)
    plan, info = ddp_plan(model, 2, DDPOptions(grad_accum=3, compress="fp16", algorithm="ring", bucket_cap_mb=0.2))
    ops = plan.ranks[0]
    colls = [o for o in ops if isinstance(o, Collective)]
    assert len(colls) == len(info["buckets"]) == 3
    assert [o.bytes for o in colls] == [b["bytes"] // 2 for b in info["buckets"]]
    assert {o.dtype for o in colls} == {"float16"} and {o.algorithm for o in colls} == {"ring"}
    computes = [o for o in ops if isinstance(o, Compute)]
    assert sum(o.name.startswith("bwd") for o in computes) == 3 * 3
    first_record = next(i for i, o in enumerate(ops) if isinstance(o, Record))
    assert sum(isinstance(o, Compute) and o.name.startswith("fwd") for o in ops[first_record:]) == 0
    assert computes[-1].name == "optimizer step"
    assert plan.ranks[0] == plan.ranks[1]
    plan0, info0 = ddp_plan(model, 2, DDPOptions(iteration=0))
    assert len(info0["buckets"]) == 1 and info0["buckets"][0]["bytes"] == model.param_bytes


def test_grad_accum_adds_compute_not_communication():
    c = cluster(tflops=0.001)
    model = m.mlp(512, 512, 512)
    _, _, one, _ = run(model, c)
    _, _, four, _ = run(model, c, grad_accum=4)
    assert four["comm_s"] == pytest.approx(one["comm_s"])
    assert four["compute_s"] == pytest.approx(4 * one["compute_s"])


def test_presets_and_flops():
    g = m.preset("gpt2-small")
    assert g.num_params == 124_439_808                    # HF gpt2
    assert m.preset("llama-7b").num_params == 6_738_415_616
    assert m.preset("llama-70b").num_params == 68_976_648_192
    b, s, h, L = 1, 1024, 768, 12
    # Megatron 2104.04473: per layer 24·b·s·h² + 4·b·s²·h forward; head 2·b·s·h·V
    assert g.fwd_flops == pytest.approx(L * (24 * b * s * h * h + 4 * b * s * s * h) + 2 * b * s * h * 50257,
                                        rel=1e-3)
    assert g.bwd_flops == pytest.approx(2 * g.fwd_flops)
    assert m.model_from_spec({"preset": "gpt2-small", "micro_batch": 4}).config["micro_batch"] == 4
