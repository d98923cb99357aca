"""sim/kernel/relabel.py fsdp_shifts: FSDP2 x TP, HSDP x TP and CP x TP (x HSDP) plans built from one program per class
(the others renamed) equal the plans built rank by rank, and simulate to the same step and trace summary."""
import math

import pytest

from distlab.sim import scenario as sc
from distlab.sim.parallel.cp.plan import cp_plan
from distlab.sim.kernel.engine import simulate
from distlab.sim.kernel.relabel import RelabelledRanks, fsdp_shifts
from distlab.sim.result import step_summary
from distlab.sim.kernel.symmetry import find_symmetry
from distlab.sim.parallel.tp.compose import fsdp_tp_plan

LLAMA = {"preset": "llama3-8b", "layers": 2, "seq_len": 256, "micro_batch": 1}
CASES = {   # name: (scenario, the representatives relabel builds)
    "hsdp 2 x 8 x tp 2, 32 ranks": ({"model": LLAMA, "mesh": {"dp_replicate": 2, "dp_shard": 8, "tp": 2},
                                     "tp": {"recompute": "full"}, "cluster": "dgx-h100", "nodes": 4}, [0, 1]),
    "fsdp2 8 x tp 2, 16 ranks (one replica: every node shift)": (
        {"model": LLAMA, "mesh": {"dp_shard": 8, "tp": 2}, "tp": {}, "cluster": "dgx-h100", "nodes": 2}, [0, 1]),
    "hsdp 4 x 4 x tp 1 (replicas of half a node are not relabelled)": (
        {"model": LLAMA, "mesh": {"dp_replicate": 4, "dp_shard": 4, "tp": 1}, "tp": {}, "cluster": "dgx-h100",
         "nodes": 2}, None),
    "cp 2 x tp 2 x hsdp 2 x 2, 16 ranks": ({"model": LLAMA, "mesh": {"dp_replicate": 2, "dp_shard": 2, "cp": 2,
                                                                      "tp": 2},
                                            "cp": {"recompute": "full"}, "cluster": "dgx-h100", "nodes": 2},
                                           [0, 1, 2, 3]),
    "cp 2 x hsdp 2 x 8, 32 ranks": ({"model": LLAMA, "mesh": {"dp_replicate": 2, "dp_shard": 8, "cp": 2},
                                     "cp": {}, "cluster": "dgx-h100", "nodes": 4}, [0, 1]),
}


def _rank_by_rank(r):
    if "cp" in r.mesh:
        return cp_plan(r.model, r.mesh, r.options)
    return fsdp_tp_plan(r.model, r.mesh, tp_opts=r.options)


@pytest.mark.parametrize("name", CASES)
def test_plans_built_from_representatives_equal_the_plans_built_rank_by_rank(name):
    d, reps = CASES[name]
    r = sc.build(d, "s")
    full = _rank_by_rank(r)
    if reps is None:
        assert not isinstance(r.plan.ranks, RelabelledRanks)
        return
    assert isinstance(r.plan.ranks, RelabelledRanks) and r.plan.ranks.representatives() == reps
    assert (full.name, full.meta) == (r.plan.name, r.plan.meta)
    assert all(full.ranks[k] == r.plan.ranks[k] for k in range(full.world_size))
    # the same simulation as the plan built rank by rank (its classes found by comparing programs)
    once, today = simulate(r.plan, r.cluster, record_transfers=False), simulate(full, r.cluster,
                                                                                record_transfers=False)
    assert math.isclose(once.makespan, today.makespan, rel_tol=1e-9)
    assert step_summary(once) == step_summary(today)
    # and the simulation of every rank, no symmetry at all (the reference)
    every = simulate(r.plan, r.cluster, record_transfers=False, symmetric=False)
    assert math.isclose(once.makespan, every.makespan, rel_tol=1e-9)
    last = r.plan.world_size - 1
    assert type(every.ops).__name__ != "RankCopies" and len(every.for_rank(last)) == len(once.for_rank(last))
    assert [op.end for op in once.for_rank(last)] == pytest.approx([op.end for op in every.for_rank(last)], rel=1e-9)


def test_fsdp_of_one_replica_and_tp_1_is_one_program_simulated_once():
    """One representative, whole-world groups: find_symmetry takes every rank as rank 0 without making the
    renamed programs; the step equals the one of the plan built rank by rank."""
    d = {"model": LLAMA, "mesh": {"dp_shard": 16, "tp": 1}, "tp": {"recompute": "full"}, "cluster": "dgx-h100",
         "nodes": 2}
    r = sc.build(d, "s")
    assert r.plan.ranks.representatives() == [0] and find_symmetry(r.plan, r.cluster, None, False) is not None
    full = _rank_by_rank(r)
    assert all(full.ranks[k] == r.plan.ranks[k] for k in range(full.world_size))
    once, today = simulate(r.plan, r.cluster, record_transfers=False), simulate(full, r.cluster,
                                                                                record_transfers=False)
    assert math.isclose(once.makespan, today.makespan, rel_tol=1e-9)
    assert step_summary(once) == step_summary(today)


def test_fsdp_shifts_of_the_planner_layouts_at_1024_gpus():
    """Llama 3 70B's best layouts on 128 x 8 GPUs: HSDP 8 x 128 -> rotations inside blocks of 16 nodes (a
    replica) x shifts of the blocks (1 class); HSDP x TP 2 -> the same x local rotations by 2 (2 classes); FSDP
    over all -> every node shift; CP 2 x HSDP -> blocks x rotations by 2."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.mesh import Mesh
    c = load_cluster("dgx-h100", 128)
    shifts = lambda m: fsdp_shifts(Mesh(m), c)       # noqa: E731
    fields = lambda s: (s.node_step, s.block, s.block_step, s.local_step)       # noqa: E731
    assert fields(shifts({"dp_replicate": 8, "dp_shard": 128, "tp": 1})) == (1, 16, 1, 1)
    assert fields(shifts({"dp_replicate": 8, "dp_shard": 64, "tp": 2})) == (1, 16, 1, 2)
    assert fields(shifts({"dp_replicate": 2, "dp_shard": 256, "tp": 2})) == (1, 64, 1, 2)
    assert fields(shifts({"dp_shard": 1024, "tp": 1})) == (1, 0, 1, 1)
    assert fields(shifts({"dp_replicate": 8, "dp_shard": 64, "cp": 2})) == (1, 16, 1, 2)
    s = shifts({"dp_replicate": 2, "dp_shard": 256, "tp": 2})
    assert sorted({s.rep(r) for r in range(1024)}) == [0, 1]
    assert fsdp_shifts(Mesh({"dp_replicate": 8, "dp_shard": 128, "tp": 1}), c, reshard_after_forward=2) is None


def test_rotations_inside_blocks_rename_ranks_onto_ranks():
    """Shifts with blocks: every element is a bijection of the ranks, compose / inverse / element agree with
    apply, and the representatives are one per orbit."""
    import itertools

    import numpy as np

    from distlab.sim.kernel.equivariance import Shifts
    s = Shifts(6, 4, 1, 2, block=3, block_step=1)          # 6 nodes in 2 blocks of 3, 4 GPUs each
    ranks = range(24)
    els = s.elements()
    assert len(els) == 3 * 2 * 2
    for e in els:
        assert sorted(s.apply(e, r) for r in ranks) == list(ranks)
        assert s.apply_array(e, np.arange(24)).tolist() == [s.apply(e, r) for r in ranks]
        assert all(s.apply(s.inverse(e), s.apply(e, r)) == r for r in ranks)
    for e, f in itertools.product(els, els):
        assert all(s.apply(s.compose(e, f), r) == s.apply(e, s.apply(f, r)) for r in ranks)
    orbits = {frozenset(s.apply(e, r) for e in els) for r in ranks}
    assert sorted(min(o) for o in orbits) == sorted({s.rep(r) for r in ranks}) == [0, 1]
    assert all(s.apply(s.element(s.rep(r), r), s.rep(r)) == r for r in ranks)
    # inside a block the nodes rotate; blocks move as a whole: node 2 (block 0) -> node 0, node 5 -> node 3
    assert s.apply((1, 0, 0), 2 * 4) == 0 and s.apply((1, 0, 0), 5 * 4 + 1) == 3 * 4 + 1
    assert s.apply((0, 1, 0), 1 * 4) == 4 * 4
