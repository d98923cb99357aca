"""Symmetric ranks simulated once (sim/kernel/symmetry.py: the whole world; sim/kernel/subgroups.py: classes of ranks under
sub-group collectives and pipelines): the trace equals the full simulation's, record by record."""
import math
from dataclasses import replace

import pytest

from distlab.sim import scenario as sc
from distlab.sim.kernel import solo
from distlab.sim.kernel.engine import simulate
from distlab.sim.parallel.pipeline.plan import PipelineSpec
from distlab.sim.plan import Collective, Plan
from distlab.sim.kernel.relabel import RelabelledRanks
from distlab.sim.check import PlanMismatch
from distlab.sim.collectives.context import Context
from distlab.sim.kernel.network import Topology
from distlab.sim.kernel.subgroups import find_classes
from distlab.sim.kernel.symmetry import find_symmetry
from distlab.sim.parallel.tp.pipeline import pp_tp_plan
from distlab.sim.trace import RankCopies

GPT2 = {"preset": "gpt2-small", "micro_batch": 8}
SCENARIOS = {   # up to 256 GPUs, each of them small enough for the full simulation
    "ddp 8 gpus": {"model": GPT2, "ddp": {}, "cluster": "dgx-h100", "nodes": 1},
    "ddp 16 gpus, grad accum, bf16 hook": {"model": {**GPT2, "micro_batch": 4},
                                           "ddp": {"grad_accum": 2, "compress": "bf16"}, "cluster": "dgx-h100",
                                           "nodes": 2},
    "ddp 32 gpus, ring, degraded link": {"model": GPT2, "ddp": {"algorithm": "ring", "bucket_cap_mb": 50},
                                         "cluster": "dgx-h100", "nodes": 4,
                                         "degraded_links": {"node1.nic0.up": 0.5}},
    "ddp 256 gpus": {"model": GPT2, "ddp": {"bucket_cap_mb": 200}, "cluster": "dgx-h100", "nodes": 32},
    "fsdp 16 gpus, two streams": {"model": GPT2, "fsdp": {"zero": 3},
                                  "cluster": "dgx-h100", "nodes": 2},
    "fsdp 16 gpus, two groups over the world": {"model": GPT2, "fsdp": {"separate_reduce_scatter_group": True},
                                                "cluster": "dgx-h100", "nodes": 2},
}
LLAMA = {"preset": "llama3-8b", "layers": 2, "seq_len": 256, "micro_batch": 1}
SUBGROUP_SCENARIOS = {   # up to 256 GPUs; TP x DP, FSDP x TP, PP x TP x DP
    "tp 8 x dp 2, two nodes": {"model": LLAMA, "mesh": {"dp": 2, "tp": 8}, "tp": {}, "cluster": "dgx-h100",
                               "nodes": 2},
    "fsdp 4 x tp 2, one node (dp traffic shares NVLink with the other tp pairs)": {
        "model": LLAMA, "mesh": {"dp_shard": 4, "tp": 2}, "tp": {}, "cluster": "dgx-h100", "nodes": 1},
    "fsdp 8 x tp 2 on a fat-tree of PCIe nodes": {"model": {**LLAMA, "layers": 1}, "mesh": {"dp_shard": 8, "tp": 2},
                                                  "tp": {}, "cluster": "pcie-8gpu", "nodes": 2},
    "pp 2 x tp 4 x dp 2, both stages in a node": {"model": LLAMA, "mesh": {"dp": 2, "pp": 2, "tp": 4},
                                                  "tp": {"microbatches": 4}, "cluster": "dgx-h100", "nodes": 2},
    "pp 2 x tp 8 x dp 2, stages across nodes": {"model": LLAMA, "mesh": {"dp": 2, "pp": 2, "tp": 8},
                                                "tp": {"microbatches": 3, "sequence_parallel": False},
                                                "cluster": "dgx-h100", "nodes": 4},
    "tp 8 x dp 8, 64 gpus": {"model": {**LLAMA, "layers": 1, "seq_len": 64}, "mesh": {"dp": 8, "tp": 8}, "tp": {},
                             "cluster": "dgx-h100", "nodes": 8},
}
FIELDS = ("rank", "stream", "index", "kind", "name", "bytes", "op", "group", "algorithm", "peer")


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-15)


@pytest.mark.parametrize("name", list(SCENARIOS) + list(SUBGROUP_SCENARIOS))
def test_symmetric_simulation_equals_the_full_one(name):
    d = SCENARIOS.get(name) or SUBGROUP_SCENARIOS[name]
    r = sc.build(sc.validate(d, name))
    kw = {"record_transfers": False, "link_factors": d.get("degraded_links")}
    once = simulate(r.plan, r.cluster, **kw)
    full = simulate(r.plan, r.cluster, symmetric=False, **kw)
    assert isinstance(once.ops, RankCopies) and not isinstance(full.ops, RankCopies)
    assert 2 * len(once.ops.records) <= len(full.ops)        # at most half of the ranks simulated
    assert len(once.ops) == len(full.ops) == sum(len(ops) for ops in r.plan.ranks)
    for a, b in zip(once.ops, full.ops):
        assert [getattr(a, f) for f in FIELDS] == [getattr(b, f) for f in FIELDS]
        assert _close(a.start, b.start) and _close(a.end, b.end) and _close(a.launch, b.launch), (a, b)
    assert once.meta == full.meta
    assert math.isclose(once.makespan, full.makespan, rel_tol=1e-6)
    last = r.plan.world_size - 1
    assert [o.end for o in once.for_rank(last)] == pytest.approx([o.end for o in full.for_rank(last)], rel=1e-6)


def test_what_is_not_symmetric_is_simulated_in_full():
    r = sc.build(sc.validate(SCENARIOS["ddp 8 gpus"], "s"))
    assert find_symmetry(r.plan, r.cluster, None, False) is not None
    assert find_symmetry(r.plan, r.cluster, {3: 1.5}, False) is None          # a straggler
    assert find_symmetry(r.plan, r.cluster, None, True) is None               # transfers are recorded per flow
    halves = [[Collective("all_reduce", 1 << 20, group=(0, 1, 2, 3) if k < 4 else (4, 5, 6, 7))] for k in range(8)]
    assert find_symmetry(Plan(halves), r.cluster, None, False) is None        # sub-groups: sim/kernel/subgroups.py
    odd = [list(ops) for ops in r.plan.ranks]
    odd[5] = odd[5][:-1]
    assert find_symmetry(Plan(odd), r.cluster, None, False) is None           # one rank runs something else
    straggler = simulate(r.plan, r.cluster, slowdown={3: 1.5})
    assert not isinstance(straggler.ops, RankCopies)
    assert straggler.makespan > simulate(r.plan, r.cluster).makespan


def test_rank_copies_read_like_a_list():
    r = sc.build(sc.validate(SCENARIOS["ddp 8 gpus"], "s"))
    once = simulate(r.plan, r.cluster, record_transfers=False)
    full = simulate(r.plan, r.cluster, record_transfers=False, symmetric=False)
    n = len(full.ops)
    for i in (0, 1, n // 2, n - 1, -1):
        assert (once.ops[i].rank, once.ops[i].index) == (full.ops[i].rank, full.ops[i].index)
        assert once.ops[i].end == pytest.approx(full.ops[i].end, rel=1e-12, abs=0)
    assert _same(once.to_dict(), full.to_dict())


def _same(a, b) -> bool:
    """Equal, floats to 1e-12 relative: a compute op that a collective's interference slows is advanced at every
    event, and the full simulation has more events (every rank's), so its sums round in other places."""
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=1e-18)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _classes(plan, cluster):
    return find_classes(plan, Context(Topology(cluster)))


def test_subgroup_classes_and_what_breaks_them():
    d = SUBGROUP_SCENARIOS["pp 2 x tp 8 x dp 2, stages across nodes"]
    r = sc.build(sc.validate(d, "s"))
    classes = _classes(r.plan, r.cluster)
    assert classes.reps == [0, 8]                         # one rank per pipeline stage: replicas and tp ranks alike
    assert [classes.rep_of(x) for x in (0, 7, 16, 23, 8, 31)] == [0, 0, 0, 0, 8, 8]
    odd = [list(ops) for ops in r.plan.ranks]
    i = next(i for i, op in enumerate(odd[17]) if op.kind == "compute")
    odd[17][i] = replace(odd[17][i], flops=odd[17][i].flops * 2 + 1)   # one rank of stage 0 computes more
    assert _classes(Plan(odd), r.cluster) is None
    assert not isinstance(simulate(Plan(odd), r.cluster, record_transfers=False).ops, RankCopies)
    degraded = simulate(r.plan, r.cluster, record_transfers=False, link_factors={"node1.nic0.up": 0.5})
    assert not isinstance(degraded.ops, RankCopies)       # a degraded link breaks the fabric's symmetry
    assert degraded.makespan > simulate(r.plan, r.cluster, record_transfers=False).makespan
    # pairs {0,1}, {2,3}, ... and pairs across them {0,2}, {1,3}, {4,6}, {5,7}: the two halves of the node alike
    halves = [[Collective("all_reduce", 1 << 20, group=(k - k % 2, k - k % 2 + 1)),
               Collective("all_reduce", 1 << 20, group=((0, 2) if k in (0, 2) else (1, 3) if k in (1, 3) else
                                                        (4, 6) if k in (4, 6) else (5, 7)))] for k in range(8)]
    one = sc.build(sc.validate(SCENARIOS["ddp 8 gpus"], "s")).cluster
    classes = _classes(Plan(halves), one)
    assert classes is not None and classes.reps == [0, 1, 2, 3]          # node halves alike
    once, full = simulate(Plan(halves), one), simulate(Plan(halves), one, symmetric=False)
    assert once.to_dict() == full.to_dict()
    odd_sizes = [[replace(ops[0], bytes=2 << 20) if k % 2 else ops[0], ops[1]] for k, ops in enumerate(halves)]
    assert _classes(Plan(odd_sizes), one) is not None         # still symmetric, but pairs disagree: caught
    with pytest.raises(PlanMismatch, match="group \\[0,1\\], collective #0: rank 1 calls all_reduce\\(2 MiB\\)"):
        simulate(Plan(odd_sizes), one)


def test_rank_copies_of_classes_read_like_a_list(monkeypatch):
    monkeypatch.setattr(solo, "ENABLED", False)      # record for record, bit for bit: steps one by one
    d = SUBGROUP_SCENARIOS["pp 2 x tp 4 x dp 2, both stages in a node"]
    r = sc.build(sc.validate(d, "s"))
    once = simulate(r.plan, r.cluster, record_transfers=False)
    full = simulate(r.plan, r.cluster, record_transfers=False, symmetric=False)
    n = len(full.ops)
    for i in (0, 1, n // 3, n // 2, n - 1, -1):
        a, b = once.ops[i], full.ops[i]
        assert (a.rank, a.index, a.stream, a.group, a.peer) == (b.rank, b.index, b.stream, b.group, b.peer)
    assert once.to_dict() == full.to_dict()


def test_pp_tp_plans_built_from_representatives_equal_the_plans_built_rank_by_rank():
    """sim/kernel/relabel.py: PP x TP x DP with a tp group per node builds one program per stage and renames it; every
    rank's program equals the one pp_tp_plan builds rank by rank (dp 3: replica shifts wrap around)."""
    d = {"model": LLAMA, "mesh": {"dp": 3, "pp": 2, "tp": 8}, "tp": {"microbatches": 3, "sequence_parallel": False},
         "cluster": "dgx-h100", "nodes": 6}
    r = sc.build(sc.validate(d, "s"))
    assert isinstance(r.plan.ranks, RelabelledRanks) and r.plan.ranks.representatives() == [0, 8]
    o = r.options
    spec = PipelineSpec(schedule=o.schedule, stages=2, microbatches=o.microbatches, data_parallel=3)
    full = pp_tp_plan(r.model, r.mesh, spec, o)
    assert isinstance(full.ranks, list) and (full.name, full.meta) == (r.plan.name, r.plan.meta)
    assert all(full.ranks[k] == r.plan.ranks[k] for k in range(full.world_size))
    once = simulate(r.plan, r.cluster, record_transfers=False)
    assert math.isclose(once.makespan, simulate(full, r.cluster, record_transfers=False, symmetric=False).makespan,
                        rel_tol=1e-6)
