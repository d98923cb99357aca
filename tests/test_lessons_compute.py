"""Lesson 13's library (sim/lessons/bank_compute.py, runtime/lessons/compute.py): its FLOP counts are what the
simulator's builders emit and what `distlab reproduce` divides by, its curve fit recovers known constants, the
interference formula is the engine's, and the GEMM sweep times real torch.mm."""
from dataclasses import replace
from types import SimpleNamespace

import pytest

from distlab.sim.lessons import bank_compute as bc
from distlab.sim.lessons import exercises
from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt
from distlab.sim.plan import Compute
from distlab.sim.parallel.tp.plan import TPOptions, tp_plan

MEGATRON_PASSES = {"forward": 1, "backward": 2, "recompute+backward": 3}   # attention: backward = 2 x forward


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_megatron_count_is_what_the_builders_emit(recompute):
    """72·B·s·l·h²(1 + s/6h) + 6BshV (eq. 3 with the recomputed forward) = the GEMM FLOPs of sim/parallel/tp/plan.py's
    step plus its attention calls counted as Megatron counts them (4·b·heads·s²·d forward, 2x that backward)."""
    l, h, heads, s, V, b = 3, 192, 6, 96, 640, 2
    model = gpt(layers=l, hidden=h, heads=heads, seq_len=s, vocab=V, micro_batch=b, dtype="float16")
    ops = [o for o in tp_plan(model, Mesh({"tp": 1}), TPOptions(sequence_parallel=False, recompute=recompute))
           .ranks[0] if isinstance(o, Compute)]
    emitted = sum(2.0 * M * N * K for o in ops for M, N, K in o.gemms)
    emitted += sum(4.0 * bb * hh * ss * ss * dd * MEGATRON_PASSES[o.attention_pass]
                   for o in ops if o.attention is not None for bb, hh, ss, dd in [o.attention])
    run = SimpleNamespace(global_batch=b, model={"seq_len": s, "layers": l, "hidden": h, "vocab": V})
    assert emitted == pytest.approx(bc.step_flops(run, recompute=recompute == "full"), rel=1e-12)


def test_step_flops_is_reproduce_s_count_and_the_exercises_follow():
    from distlab.sim.reproduce.predict import model_flops
    from distlab.sim.reproduce.runs import load_runs
    for run in [r for r in load_runs()[0] if r.flops == "megatron-eq3"]:       # the rows counted with eq. 3
        assert bc.step_flops(run) == pytest.approx(model_flops(run), rel=1e-12)
        assert 0.75 < bc.step_flops(run, recompute=False) / bc.step_flops(run) < 0.78   # the layers: 3/4
    run = bc.row()[0]
    assert exercises("13")["13-step-time"].expected() == pytest.approx(model_flops(run) / (137e12 * 32), rel=1e-12)


def test_tp_slices_lose_efficiency_and_the_tables_agree():
    costs = [bc.tp_slice_cost(tp=tp) for tp in (1, 2, 4, 8)]
    assert costs[0] == pytest.approx(1.0) and costs == sorted(costs) and costs[-1] > 1.1
    tp8 = dict(bc.block_gemms(bc.TP_ROW, 8))
    assert tp8["mlp fc1"] == (2048, 16384 // 8, 4096) and tp8["mlp fc2"] == (2048, 4096, 16384 // 8)
    assert len(bc.gemm_table(bc.TP_ROW, (1, 8)).rows) == 2 * len(tp8)
    forward = bc.attention_ratio()          # unfused: the whole score matrix and its HBM passes
    assert forward > 2 and bc.attention_table().rows[0][-1] == f"{forward:.2f}x"


def test_fit_recovers_the_constants_of_a_saturating_rate():
    rows = [{"flops": f, "flops_per_s": 5e10 * f / (f + 1e6)} for f in (1e4, 1e5, 1e6, 1e7, 1e8, 1e9)]
    peak, half = bc.fit_saturating(rows)
    assert peak == pytest.approx(5e10, rel=1e-9) and half == pytest.approx(1e6, rel=1e-9)


def test_overlap_formula():
    assert bc.overlapped_compute_s(0.020, 0.008, 1.0) == pytest.approx(0.020)
    assert bc.overlapped_compute_s(0.020, 0.008, 2.0) == pytest.approx(0.020 + 0.004)   # pays half of the 8 ms
    assert bc.overlapped_compute_s(0.002, 0.008, 2.0) == pytest.approx(0.004)            # over before the collective


def test_overlap_formula_is_the_engine_s():
    """With Cluster.interference, the engine's compute beside an all-reduce that starts with it ends where
    overlapped_compute_s says."""
    from distlab.sim.cluster import PRESETS
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.plan import Collective, Plan
    cluster = replace(PRESETS["dgx-a100"].with_world_size(2), interference=1.5)
    coll = Collective("all_reduce", 64 * 2**20, "float32", (0, 1), name="grads")
    alone = simulate(Plan([[coll], [coll]]).validate(), cluster, check=False).makespan
    compute_s = 4 * alone
    ops = [coll, Compute("backward", seconds=compute_s)]
    trace = simulate(Plan([ops, ops]).validate(), cluster, check=False)
    end = max(r.end for rank in (0, 1) for r in trace.for_rank(rank) if r.kind == "compute")
    assert end == pytest.approx(bc.overlapped_compute_s(compute_s, alone, 1.5), rel=1e-6)


def test_gemm_sweep_times_real_matmuls():
    import torch

    from distlab.runtime.lessons.compute import gemm_sweep
    threads = torch.get_num_threads()
    rows = gemm_sweep([(8, 16, 32), (64, 64, 64)], block_s=0.001)
    assert torch.get_num_threads() == threads                          # the one-thread sweep restores torch's
    assert [(r["M"], r["N"], r["K"], r["flops"]) for r in rows] == [(8, 16, 32, 8192.0), (64, 64, 64, 524288.0)]
    assert all(r["time_s"] > 0 and r["flops_per_s"] == pytest.approx(r["flops"] / r["time_s"]) for r in rows)
    assert rows[0]["device"] == "cpu" and rows[0]["dtype"] == "float32"
