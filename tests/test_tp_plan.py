"""The tp plan builder (sim/parallel/tp/plan.py): the collectives per phase that torch's ParallelStyles imply (counts and
sizes for plain TP and TP + SP, fused and separate q/k/v, SwiGLU and GELU), compute divided by tp, recompute,
bad input as one line with exit code 2, and `distlab simulate` of the shipped tp scenarios."""
import json

import pytest
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process

from distlab.sim import scenario as sc
from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt, preset
from distlab.sim.plan import Collective, Compute
from distlab.sim.parallel.tp.plan import TPOptions, collective_sequence, tp_plan

LLAMA = gpt(layers=3, hidden=64, heads=8, kv_heads=4, seq_len=16, vocab=256, micro_batch=2, dtype="bfloat16",
            arch="llama", ffn_hidden=128)
GPT2 = gpt(layers=3, hidden=64, heads=8, seq_len=16, vocab=256, micro_batch=2, dtype="bfloat16", arch="gpt2")
X = 2 * 16 * 64 * 2            # b·s·h·e


def counts(plan):
    out = {}
    for op, b, _, _, phase in collective_sequence(plan):
        out[(op, phase)] = out.get((op, phase), 0) + 1
    return out


def test_sequence_parallel_counts_and_sizes():
    plan = tp_plan(LLAMA, Mesh({"tp": 4}), TPOptions())
    L = 3
    assert counts(plan) == {("reduce_scatter", "forward"): 2 * L + 1, ("all_gather", "forward"): 2 * L + 2,
                            ("reduce_scatter", "backward"): 2 * L + 1, ("all_gather", "backward"): 2 * L + 1,
                            ("all_reduce", "optimizer"): 3 * (2 * L + 1)}     # 7 norms, 3 reads each
    seq = collective_sequence(plan)
    assert {b for op, b, *_ in seq if op != "all_reduce"} == {X, 2 * 16 * 256 * 2}      # logits gathered once
    assert seq[4 * L + 2][:2] == ("all_gather", 2 * 16 * 256 * 2) and seq[-1][1] == 64 * 2


def test_plain_tp_all_reduces_once_per_column_parallel_linear_in_backward():
    L = 3
    llama = counts(tp_plan(LLAMA, Mesh({"tp": 4}), TPOptions(sequence_parallel=False)))
    assert llama == {("all_reduce", "forward"): 2 * L + 1, ("all_gather", "forward"): 1,
                     ("all_reduce", "backward"): (3 + 2) * L + 1}          # q, k, v, gate, up, lm_head
    gpt2 = counts(tp_plan(GPT2, Mesh({"tp": 4}), TPOptions(sequence_parallel=False)))
    assert gpt2[("all_reduce", "backward")] == (1 + 1) * L + 1              # fused qkv, fc


def test_loss_parallel_keeps_logits_sharded_and_all_reduces_three_vectors():
    seq = collective_sequence(tp_plan(LLAMA, Mesh({"tp": 4}), TPOptions(loss_parallel=True)))
    assert 2 * 16 * 256 * 2 not in [b for _, b, *_ in seq]
    loss = [s for s in seq if s[0] == "all_reduce" and s[4] == "forward"]
    assert [(b, d) for _, b, d, *_ in loss] == [(2 * 16 * 4, "float32")] * 3


def test_compute_divides_by_tp_and_tp1_issues_nothing():
    def flops(plan, prefix):
        return sum(o.flops for o in plan.ranks[0] if isinstance(o, Compute) and o.name.startswith(prefix))
    one, four = (tp_plan(LLAMA, Mesh({"tp": t}), TPOptions()) for t in (1, 4))
    assert not any(isinstance(o, Collective) for o in one.ranks[0])
    for prefix in ("fwd", "bwd"):
        assert flops(four, prefix) == pytest.approx(flops(one, prefix) / 4)
    assert flops(one, "fwd") == pytest.approx(LLAMA.fwd_flops)       # the model's own FLOPs count
    full = tp_plan(LLAMA, Mesh({"tp": 4}), TPOptions(recompute="full"))
    assert flops(full, "bwd") == pytest.approx(flops(four, "bwd") + flops(four, "fwd h."))


def test_groups_follow_the_mesh():
    plan = tp_plan(LLAMA, Mesh({"dp": 2, "tp": 2}), TPOptions())
    assert {g for *_, g, _ in collective_sequence(plan, 3)} == {(2, 3)}


@pytest.mark.parametrize("model,where,text", [
    ({"arch": "llama", "layers": 1, "hidden": 48, "heads": 6, "seq_len": 16, "vocab": 64}, "mesh.tp", "heads 6"),
    ({"arch": "llama", "layers": 1, "hidden": 64, "heads": 8, "kv_heads": 2, "seq_len": 16, "vocab": 64},
     "mesh.tp", "kv_heads 2"),
    ({"arch": "llama", "layers": 1, "hidden": 64, "heads": 8, "ffn_hidden": 102, "seq_len": 16, "vocab": 64},
     "mesh.tp", "ffn_hidden 102"),
    ({"arch": "llama", "layers": 1, "hidden": 64, "heads": 8, "seq_len": 16, "vocab": 1001}, "mesh.tp", "vocab 1001"),
    ({"arch": "llama", "layers": 1, "hidden": 64, "heads": 8, "seq_len": 18, "vocab": 64}, "mesh.tp", "seq_len 18")])
def test_tp_must_divide_what_it_shards(model, where, text):
    d = {"model": model, "mesh": {"tp": 4}, "tp": {}, "cluster": "dgx-h100", "world_size": 4}
    with pytest.raises(ConfigError) as e:
        sc.build(d)
    assert where in e.value.where and text in str(e.value) and "allowed tp" in str(e.value)


def _yaml(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text,msg", [
    ("model: llama3-8b\nmesh: {tp: 3}\ntp: {}\nworld_size: 3\n", "tp 3 does not divide heads 32"),
    ("model: llama3-8b\nmesh: {dp_shard: 3, tp: 2}\ntp: {}\n", "= 6 ranks, but the world has 8"),
    ("model: llama3-8b\nmesh: {tp: 3}\ntp: {}\n", "must divide the world size 8"),
    ("model: llama3-8b\ntp: {recompute: some}\nmesh: {tp: 8}\n", "unknown recompute 'some'"),
    ("model: {preset: llama3-8b, layers: 2}\nmesh: {pp: 4, tp: 2}\ntp: {}\n",
     "mesh.pp: pp 4 is more than the model's 2 transformer blocks (every stage holds the same number of blocks); "
     "allowed pp: 1, 2")])
def test_cli_bad_input_one_line_exit_2(cli, tmp_path, text, msg):
    rc, out, err = cli("simulate", _yaml(tmp_path, text + "cluster: dgx-h100\n"), "--no-files")
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1 and out == ""


def test_cli_simulate_tp_scenarios(cli):
    rc, out, err = cli("simulate", "scenarios/tp-llama3-8b.yaml", "--json", "--no-files")
    assert rc == 0, err
    r = json.loads(out)["results"][0]
    mem = r["memory"]
    assert mem["fits"] and set(mem["breakdown_bytes"]) == {"params", "grads", "optimizer", "activations"}
    assert r["step_s"] > r["compute_s"] > 0 and r["exposed_comm_s"] > 0
    rc, out, err = cli("simulate", "scenarios/tp-llama3-70b.yaml", "--no-files")
    assert rc == 0 and "warning: does not fit" in out and "GB = " in out and "GiB" in out


def test_recompute_and_sequence_parallel_shrink_memory_in_the_report():
    """SP and full recompute shrink the activations; selective recompute does nothing with SDPA (no s x s
    tensors to drop: FlashAttention already recomputes the scores), only with unfused attention."""
    def total(opts, model=None):
        d = sc.load("scenarios/tp-llama3-8b.yaml")
        d["tp"].update(opts)
        d["model"].update(model or {})
        from distlab.sim.workloads.tp import memory
        return memory(sc.build(d))["json"]["breakdown_bytes"]["activations"]
    plain, sp, sel, full = (total({"sequence_parallel": False}), total({}), total({"recompute": "selective"}),
                            total({"recompute": "full"}))
    assert plain > sp == sel > full
    assert total({"recompute": "selective"}, {"attention": "unfused"}) < total({}, {"attention": "unfused"})
    assert preset("llama3-8b").num_params > 8e9


def test_fsdp2_x_tp_from_the_mesh(cli):
    """A dp_shard dimension makes the tp section FSDP2 x TP; a mesh {tp: 2} on 8 GPUs fills dp_shard with 4."""
    d = {"model": {"preset": "llama3-8b", "layers": 2, "micro_batch": 1}, "mesh": {"tp": 2}, "tp": {},
         "cluster": "dgx-h100"}
    r = sc.build(d)
    assert r.mesh.as_dict() == {"dp_shard": 4, "tp": 2} and r.plan.meta["builder"] == "fsdp_tp"
    rc, out, err = cli("simulate", "scenarios/tp-fsdp-llama3-8b.yaml", "--json", "--no-files")
    assert rc == 0, err
    res = json.loads(out)["results"][0]
    dims = {(c["mesh_dim"], c["op"]) for c in res["collectives"]}
    assert {("dp_shard", "all_gather"), ("dp_shard", "reduce_scatter"), ("tp", "all_gather")} <= dims
    assert res["memory"]["fits"]


def test_hsdp_x_tp_on_a_3d_mesh_all_reduces_each_shard_over_the_replicas():
    """HSDP x TP (dp_replicate 2 x dp_shard 2 x tp 2): after each unit's reduce-scatter over dp_shard, one
    all-reduce of the shard over dp_replicate; memory per rank as FSDP2 x TP with the same dp_shard (replicas
    hold copies)."""
    from distlab.sim.parallel.tp.compose import collective_sequence as seq3
    d = {"model": {"preset": "llama3-8b", "layers": 2, "micro_batch": 1}, "tp": {}, "cluster": "dgx-h100",
         "mesh": {"dp_replicate": 2, "dp_shard": 2, "tp": 2}}
    r = sc.simulate(d)
    calls = seq3(r.plan, 0)
    rs = [c for c in calls if c[0] == "reduce_scatter" and c[3] == (0, 2)]
    ar = [c for c in calls if c[0] == "all_reduce" and c[3] == (0, 4)]
    assert len(rs) == len(ar) == 3 and [c[1] // 2 for c in rs] == [c[1] for c in ar]
    two_d = sc.simulate({**d, "mesh": {"dp_shard": 2, "tp": 2}, "world_size": 4})
    mem = r.report["json"]["memory"]["breakdown_bytes"]
    assert mem == two_d.report["json"]["memory"]["breakdown_bytes"]
    assert ["dp_replicate", "all_reduce", "backward", 3] == r.report["tables"][0]["rows"][-1][:4]


def test_dtensor_launches_cost_launch_s_each_on_the_critical_path():
    """Each Compute op of a TP plan carries the DTensor ops it dispatches (sim/parallel/tp/plan.py DTENSOR_OPS; real
    counts checked in tests/test_tp_runtime.py); the engine adds launches x launch_s. TP's compute and
    collectives are serial, so the step grows by exactly the sum; a tp = 1 plan has none."""
    from dataclasses import replace

    from distlab.sim.cluster import PRESETS
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.plan import Compute
    from distlab.sim.parallel.tp.plan import ADAMW_DTENSOR_OPS, DTENSOR_OPS
    model = gpt(layers=2, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=2, dtype="float32",
                arch="llama", ffn_hidden=64)
    plan = tp_plan(model, Mesh({"tp": 2}), TPOptions())
    n = sum(o.launches for o in plan.ranks[0] if isinstance(o, Compute))
    d = DTENSOR_OPS[True]
    ends = sum(d[f"{e} {p}"] for e in ("embed", "head") for p in ("fwd", "bwd"))
    assert n == 2 * (d["block fwd"] + d["block bwd"]) + ends + ADAMW_DTENSOR_OPS * 21
    base = PRESETS["localhost-cpu"]
    slow = replace(base, gpu=replace(base.gpu, launch_s=1e-3))
    assert simulate(plan, slow).makespan - simulate(plan, base).makespan == pytest.approx(n * 1e-3)
    one = tp_plan(model, Mesh({"tp": 1}), TPOptions())
    assert all(o.launches is None for o in one.ranks[0] if isinstance(o, Compute))
    assert "launches" not in one.to_json()            # plans without launches serialize as before


def test_tp_calibration_fit_keeps_the_latency_and_measures_launch_s():
    """runtime/parallel/tp/fit.py fit_cluster: launch_s = (TP block CPU - plain block CPU - the block's collectives'
    issue CPU) / the block's DTensor ops, each the median over rounds of the slowest rank; cpu_cores = the cores
    given (else the ranks' own count), at most the world; latency-bound collectives whose line fit comes out
    negative (a larger size timed faster) keep α = the shortest time instead of dropping it to 0."""
    from distlab.runtime.parallel.tp.fit import fit_cluster
    model = gpt(layers=2, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=2, dtype="float32",
                arch="llama", ffn_hidden=64)

    def rank(scale):
        coll = {"all_gather": {"2048": [3e-3 * scale] * 3, "65536": [2.5e-3 * scale] * 3}}
        return {"variants": [{"calibration": {
            "collectives": coll, "isolated": coll, "fwd_bwd": [6e-3] * 3, "optimizer": [1e-3] * 3,
            "block_tp": [10e-3 * scale] * 3, "block_local": [1e-3] * 3, "block_ops": 100, "cores": 2,
            "block_calls": ["all_gather", "reduce_scatter", "all_gather"],
            "block_collectives": {"all_gather": [0.2e-3 * scale] * 3, "reduce_scatter": [0.1e-3] * 3}}}]}
    cluster = fit_cluster([rank(1.0), rank(1.2)], model, 2, 2)
    assert cluster.gpu.launch_s == pytest.approx((12e-3 - 1e-3 - (0.24e-3 + 0.1e-3 + 0.24e-3)) / 100)
    assert cluster.cpu_cores == 2
    assert fit_cluster([rank(1.0), rank(1.2)], model, 2, 2, cores=1.5).cpu_cores == 1.5
    fit = cluster.calibration["collectives"]["all_gather"]["2"]
    assert fit["latency_us"] == pytest.approx(2.5e-3 * 1.2 * 1e6, rel=1e-3)    # 1 ring step at n = 2
    assert cluster.intra_node.latency_us == fit["latency_us"]         # a stage-to-stage send: one hop


def test_tp_ranks_share_the_cores_for_their_compute():
    """TP ranks run in lock-step (every collective waits for all of them), so on a node with half as many cores as
    ranks every compute op of rank 0 runs while the other three compute too, at cores / ranks = 1/2 of a core
    (sim/kernel/cores.py): the step grows by exactly rank 0's compute time alone (hand sum of op_seconds)."""
    from dataclasses import replace

    from distlab.sim.cluster import PRESETS
    from distlab.sim.compute import op_seconds
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.plan import Compute
    model = gpt(layers=2, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=2, dtype="float32",
                arch="llama", ffn_hidden=64)
    plan = tp_plan(model, Mesh({"tp": 4}), TPOptions())
    base = PRESETS["localhost-cpu"].with_world_size(4)
    base = replace(base, gpu=replace(base.gpu, launch_s=40e-6))
    alone = sum(op_seconds(o, base.gpu) for o in plan.ranks[0] if isinstance(o, Compute))
    shared = simulate(plan, replace(base, cpu_cores=2.0)).makespan
    assert shared - simulate(plan, base).makespan == pytest.approx(alone, rel=1e-9)


def test_cli_memory_of_a_tp_scenario(cli, tmp_path):
    """`distlab memory --scenario`: the mesh, a custom model and recompute of a tp scenario; GB and GiB labelled;
    what does not fit flagged; any other layout (fsdp) taken too; a missing file refused in one line."""
    big = _yaml(tmp_path, "model: {arch: llama, layers: 4, hidden: 16384, heads: 128, kv_heads: 8, ffn_hidden: "
                          "53248, seq_len: 4096, vocab: 128256, dtype: bfloat16}\nmesh: {tp: 2}\ntp: {}\n"
                          "cluster: dgx-h100\nworld_size: 2\n")
    rc, out, err = cli("memory", "--scenario", big)
    assert rc == 0 and "1 GiB = 2^30 bytes" in out and "NO: over 80 GiB" in out and "warning: does not fit" in out
    custom = _yaml(tmp_path, "model: {arch: llama, layers: 4, hidden: 1024, heads: 16, kv_heads: 4, seq_len: 2048, "
                             "vocab: 32000}\nmesh: {dp_shard: 2, tp: 4}\ntp: {recompute: selective}\n"
                             "cluster: dgx-h100\n")
    rc, out, err = cli("memory", "--scenario", custom, "--json")
    r = json.loads(out)
    assert rc == 0 and r["mesh"] == {"dp_shard": 2, "tp": 4} and r["fits"] and r["inputs"]["recompute"] == "selective"
    rc, out, err = cli("memory", "--scenario", "scenarios/fsdp-cpu.yaml")     # any layout: sim/parallel/memory.py
    assert rc == 0 and "peak memory per GPU (total)" in out
    rc, out, err = cli("memory", "--scenario", str(tmp_path / "missing.yaml"))
    assert rc == 2 and len(err.strip().splitlines()) == 1


def test_prepare_input_all_reduces_once_per_part_backward():
    """Plain TP with PrepareModuleInput on attention and the MLP (torchtitan's wrapping; TPOptions.prepare_input):
    backward all-reduces once per part (Megatron's f) where per-module ColwiseParallel all-reduces once per
    column-parallel linear (q, k, v; gate, up); forward and bytes per call unchanged; TP + SP ignores it.
    tests/test_tp_runtime.py checks both against torch on gloo ranks."""
    from distlab.sim.parallel.tp.plan import collective_sequence
    model = gpt(layers=2, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=2, dtype="float32",
                arch="llama", ffn_hidden=64)

    def calls(**o):
        seq = collective_sequence(tp_plan(model, Mesh({"tp": 2}), TPOptions(**o)))
        return [(k, b, ph) for k, b, _, _, ph in seq]
    per_module, prepared = calls(sequence_parallel=False), calls(sequence_parallel=False, prepare_input=True)
    fwd = [c for c in per_module if c[2] == "forward"]
    assert fwd == [c for c in prepared if c[2] == "forward"]
    bwd = [c for c in prepared if c[2] == "backward"]
    assert len(bwd) == 2 * 2 + 1 and len([c for c in per_module if c[2] == "backward"]) == 5 * 2 + 1
    assert {b for _, b, _ in bwd} == {b for k, b, ph in per_module if ph == "backward"}
    assert calls(sequence_parallel=True, prepare_input=True) == calls(sequence_parallel=True)
