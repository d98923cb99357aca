"""Symmetric ranks simulated once (sim/symmetry.py): the trace equals the full simulation's, record by record."""
import math

import pytest

from distlab.sim import scenario as sc
from distlab.sim.engine import simulate
from distlab.sim.plan import Collective, Plan
from distlab.sim.symmetry import find_symmetry
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
}
FIELDS = ("rank", "stream", "index", "kind", "name", "bytes", "op", "group", "algorithm", "peer")


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-15)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_symmetric_simulation_equals_the_full_one(name):
    d = SCENARIOS[name]
    r = sc.build(sc.validate(d, name))
    kw = {"record_transfers": False, "link_factors": d.get("degraded_links")}
    once = simulate(r.plan, r.cluster, **kw)
    full = simulate(r.plan, r.cluster, symmetric=False, **kw)
    assert isinstance(once.ops, RankCopies) and not isinstance(full.ops, RankCopies)
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
    assert find_symmetry(Plan(halves), r.cluster, None, False) is None        # sub-groups: not handled
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
        assert (once.ops[i].rank, once.ops[i].index, once.ops[i].end) == (full.ops[i].rank, full.ops[i].index,
                                                                          full.ops[i].end)
    assert once.to_dict() == full.to_dict()
