"""`distlab plan` at scale and its last family (issue 28 item 4, issue 30 item 2):

- the search estimates only what could enter the table or be its family's best (a lower bound of each step,
  sim/planner/step.py ``Estimator.bound``): the table's rows and every family's best are those of estimating all;
- above sim/planner/confirm.py ``SIMULATE_UP_TO`` GPUs the best are confirmed from their program (one rank per
  pipeline index), which is the simulator's step within the estimate's bound;
- PP x FSDP2 x TP x CP for long sequences, built by sim/parallel/parallelize.py: estimated as the simulator
  runs it, its memory as `distlab simulate` reports it;
- plan's MFU (3 x forward FLOPs of the global batch) is `distlab simulate`'s for TP x FSDP2 with gradient
  accumulation and a PP x TP x FSDP2 layout, and the estimate prices their compute as the simulator does.

benchmarks/plan_scale.py runs Llama 3 405B on 16,384 H100 (wall time, CPU, peak memory).
"""
from __future__ import annotations

import pytest

from distlab.sim.cluster import load_cluster
from distlab.sim.kernel.engine import compute_seconds
from distlab.sim.plan import Compute
from distlab.sim.parallel.fsdp.memory import fits
from distlab.sim.planner.confirm import composed_step
from distlab.sim.planner.layouts import Layout, enumerate_layouts
from distlab.sim.planner.search import ESTIMATE_BOUND, Candidate, estimate_pruned
from distlab.sim.planner.step import Estimator
from distlab.sim.scenario import simulate

TINY = {"arch": "llama", "layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn_hidden": 512, "vocab": 1024,
        "seq_len": 128}
LONG = {"arch": "llama", "layers": 8, "hidden": 512, "heads": 8, "kv_heads": 4, "ffn_hidden": 1024, "vocab": 4096,
        "seq_len": 32768}


def test_pruned_search_keeps_the_table_and_every_familys_best():
    cluster = load_cluster("dgx-h100", 2)
    est = Estimator(TINY, cluster)
    layouts = enumerate_layouts(est.model(1).config, 16, 8, 16, (1, 2))[::3]
    cands = [Candidate(L, est.memory(L)) for L in layouts]
    every = {c.layout: est.estimate(c.layout).step_s for c in cands}
    kept = estimate_pruned(est, [Candidate(c.layout, c.memory) for c in cands], keep=5, least=0)
    assert 0 < len(kept) < len(cands)
    assert sorted(x.estimate.step_s for x in kept)[:5] == sorted(every.values())[:5]
    best = {}
    for L, t in every.items():
        best[L.family] = min(t, best.get(L.family, t))
    found = {}
    for x in kept:
        found[x.layout.family] = min(x.estimate.step_s, found.get(x.layout.family, x.estimate.step_s))
    assert found == best


def test_confirming_from_the_program_is_the_simulators_step():
    """TP x FSDP2 with gradient accumulation, PP x TP x DDP (1F1B), PP x TP x HSDP, TP x DDP, CP x TP x FSDP2:
    the program's step within the estimate's bound of simulating every rank (what confirms above 1,024 GPUs)."""
    est = Estimator(TINY, load_cluster("dgx-h100", 2))
    for L in (Layout(2, 1, 8, "fsdp", 1, 2, True, "none", dp_shard=8),
              Layout(4, 2, 2, "ddp", 1, 4, True, "selective"),
              Layout(2, 2, 4, "hsdp", 1, 4, True, "full", dp_shard=2),
              Layout(4, 1, 4, "ddp", 4, 1, False, "none"),
              Layout(2, 1, 4, "fsdp", 4, 1, True, "full", cp=2, dp_shard=4)):
        simulated = simulate(L.scenario(TINY, "dgx-h100", 2)).summary["step_s"]
        assert abs(composed_step(est, L) / simulated - 1) <= ESTIMATE_BOUND, L.label()


def test_cp_inside_pipelines_for_long_sequences():
    """PP x FSDP2 x TP x CP is searched for long sequences only; its estimate is the simulator's step (the
    composition's program, no contention here) and its memory what `distlab simulate` reports."""
    short = enumerate_layouts({**LONG, "seq_len": 8192}, 16, 8, 4, (1,))
    assert not any(L.cp > 1 and L.pp > 1 for L in short)
    layouts = enumerate_layouts(LONG, 16, 8, 4, (1,))
    ours = [L for L in layouts if L.cp > 1 and L.pp > 1]
    assert {"PP x CP x TP x FSDP", "PP (interleaved) x CP x TP x FSDP"} <= {L.family for L in ours}
    est = Estimator(LONG, load_cluster("dgx-h100", 2))
    L = next(L for L in ours if L.family == "PP x CP x TP x FSDP" and L.recompute == "full" and L.tp == 2)
    r = simulate(L.scenario(LONG, "dgx-h100", 2))
    assert r.workload.name == "composed" and r.mesh.names == ("pp", "dp_shard", "cp", "tp")
    e = est.estimate(L)
    assert abs(e.step_s / r.summary["step_s"] - 1) <= 0.001 and est.bound(L) <= e.step_s
    assert sum(est.memory(L).values()) == pytest.approx(r.reports["composed"]["json"]["memory"]["total_bytes"],
                                                        rel=1e-9)
    assert fits(sum(est.memory(L).values()), 80)
    # CP x TP: the cp section's recompute keeps only each block's input, as the builder recomputes (it was
    # reported as none: sim/workloads/composed_report.py)
    none = next(M for M in ours if M == Layout(**{**L.to_dict(), "recompute": "none", "split": L.split}))
    assert est.memory(L)["activations"] < est.memory(none)["activations"]


def test_plan_mfu_and_compute_are_simulates():
    """For TP x FSDP2 with gradient accumulation and PP x TP x FSDP2 (8 micro-batches): simulate's MFU counts
    every micro-batch of the global batch as the planner does, and the estimate's compute (recompute included)
    is what the simulator's plan of the busiest pipeline rank computes in its layers (FSDP2's copies and AdamW
    are other terms)."""
    est = Estimator(TINY, load_cluster("dgx-h100", 2))
    gpu = est.cluster.gpu
    for L in (Layout(2, 1, 8, "fsdp", 1, 4, True, "selective", dp_shard=8),
              Layout(2, 2, 4, "fsdp", 1, 8, True, "none", dp_shard=4)):
        r = simulate(L.scenario(TINY, "dgx-h100", 2))
        s = r.summary
        model_flops = 3.0 * est.model(1).fwd_flops * L.dp * L.micro_batch * L.microbatches
        assert s["mfu"] == pytest.approx(model_flops / (16 * gpu.tflops * 1e12 * s["step_s"]), rel=1e-9)
        assert s["tokens_per_step"] == L.dp * L.micro_batch * L.microbatches * TINY["seq_len"]
        terms = est.estimate(L).terms
        layers = max(sum(compute_seconds(o, est.cluster) for o in r.plan.ranks[g] if isinstance(o, Compute)
                         and not o.name.startswith(("copy-in", "copy-out", "optimizer")))
                     for g in r.mesh.group_of(0, "pp"))             # the busiest pipeline rank
        assert terms["compute_s"] + terms["recompute_s"] == pytest.approx(layers, rel=1e-6), L.label()


def test_groups_of_the_same_gpus_of_every_node_run_on_smaller_nodes():
    """A data-parallel group beside TP or CP (the same k GPUs of every node, a NIC each) costs what it costs on
    nodes of k GPUs and k NICs (CostCache._cut; at 16,384 GPUs the whole nodes' simulation ran out of memory):
    equal to the simulator on the whole nodes, for every op, small and large."""
    from distlab.sim.kernel.engine import simulate_collective
    from distlab.sim.planner.estimate import CostCache
    cluster = load_cluster("dgx-h100", 4)
    for group in (tuple(r for n in range(4) for r in (8 * n, 8 * n + 2, 8 * n + 4, 8 * n + 6)),
                  tuple(r for n in range(4) for r in (8 * n + 1, 8 * n + 5))):
        assert CostCache(cluster)._cut(group)[0].gpus_per_node == len(group) // 4
        for op in ("all_gather", "reduce_scatter", "all_reduce"):
            for nbytes in (1 << 16, 1 << 27):
                simulated = simulate_collective(op, nbytes, cluster, group=group)[0].makespan
                assert CostCache(cluster).collective(op, nbytes, group) == pytest.approx(simulated, rel=1e-9)
