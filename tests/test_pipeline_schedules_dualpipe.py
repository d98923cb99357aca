"""DualPipeV and Looped BFS: the simulator's per-rank order equals what torch 2.13's ScheduleDualPipeV and
ScheduleLoopedBFS execute. Both are ``_PipelineScheduleRuntime`` schedules, whose step runs
``pipeline_order_with_comms[rank]`` in order (an OVERLAP_F_B action runs its sub-actions in order); we compare
its compute actions (F, B, I, W, sub-actions flattened) with ``schedules.build`` and its OVERLAP_F_B actions with
``schedules.overlap_pairs``."""
import pytest

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.pipeline import schedules as S
from test_pipeline_schedules import _Stage

torch_pp = pytest.importorskip("torch.distributed.pipelining")
from torch.distributed.pipelining.schedules import OVERLAP_F_B  # noqa: E402


def torch_schedules(schedule, p, m, v):
    cls = getattr(torch_pp, S.TORCH_CLASSES[schedule])
    placement = S.stage_to_rank(schedule, p, v) if schedule != "dualpipev" or v == 2 else [s % p for s in range(p * v)]
    return [cls([_Stage(s, p * v, r, p, []) for s in range(p * v) if placement[s] == r], m) for r in range(p)]


def executed(schedule, p, m, v):
    """(compute order, overlapped pairs) per rank, as torch's runtime executes them."""
    orders, pairs = [], []
    for r, sched in enumerate(torch_schedules(schedule, p, m, v)):
        order, overlap = [], []
        for a in sched.pipeline_order_with_comms[r]:
            subs = a.sub_actions if a.computation_type == OVERLAP_F_B else (a,)
            order += [str(s) for s in subs if str(s)[-1].isdigit() and S.Action.parse(str(s))]
            if a.computation_type == OVERLAP_F_B:
                overlap.append(tuple(str(s) for s in subs))
        orders.append(order)
        pairs.append(overlap)
    return orders, pairs


CASES = ([("dualpipev", p, m, 2) for p, m in ((1, 2), (2, 4), (2, 7), (3, 6), (4, 8), (4, 11))]
         + [("loopedbfs", p, m, v) for p, m, v in ((1, 3, 1), (2, 1, 1), (2, 4, 2), (3, 5, 2), (4, 2, 3), (4, 8, 2))])


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_order_equals_torch(schedule, p, m, v):
    orders, pairs = executed(schedule, p, m, v)
    assert [[str(a) for a in acts] for acts in S.build(schedule, p, m, v)] == orders
    assert [[tuple(map(str, pair)) for pair in rank] for rank in S.overlap_pairs(schedule, p, m, v)] == pairs
    if schedule == "dualpipev" and m > 2:
        assert all(pairs), "DualPipeV overlaps on every rank"


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_every_backward_once(schedule, p, m, v):
    """Each stage runs each microbatch's forward once and its backward once (B, or I then W)."""
    acts = [a for rank in S.build(schedule, p, m, v) for a in rank]
    assert sorted((a.stage, a.mb) for a in acts if a.kind == "F") == [(s, i) for s in range(p * v) for i in range(m)]
    assert (sorted((a.stage, a.mb) for a in acts if a.kind in "BI")
            == sorted((a.stage, a.mb) for a in acts if a.kind in "BW"))


@pytest.mark.parametrize("p,m,v", [(2, 3, 2), (3, 5, 2), (2, 4, 1), (2, 4, 3)])
def test_dualpipev_rejects_what_torch_rejects(p, m, v):
    with pytest.raises(ConfigError) as e:
        S.build("dualpipev", p, m, v)
    msg = str(e.value)
    assert "\n" not in msg and ("allowed: microbatches >=" in msg or "virtual_stages must be 2" in msg)
    with pytest.raises(ValueError):
        torch_schedules("dualpipev", p, m, v)
