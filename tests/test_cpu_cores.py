"""cpu_cores: compute ops of one node's ranks share the node's cores (sim.cores, processor sharing)."""
from dataclasses import replace

import pytest
import simpy
import yaml
from hypothesis import given, settings, strategies as st
from pytest import approx

from distlab.sim.cluster import PRESETS, cluster_from_dict
from distlab.sim.kernel.cores import SharedCores
from distlab.sim.kernel.engine import simulate
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Compute, Plan, Recv, Send

CPU = PRESETS["localhost-cpu"]


def cpu(ranks: int, cores: int | None):
    return replace(CPU, gpus_per_node=ranks, cpu_cores=cores)


def run(per_rank, cluster, **kw):
    """per_rank[r] = rank r's compute seconds, in order. Returns {rank: [end of each op]}."""
    plan = Plan([[Compute(name=f"c{r}.{i}", seconds=s) for i, s in enumerate(secs)]
                 for r, secs in enumerate(per_rank)]).validate()
    trace = simulate(plan, cluster, **kw)
    ends = {r: [] for r in range(len(per_rank))}
    for o in sorted(trace.ops, key=lambda o: (o.rank, o.index)):
        ends[o.rank].append(o.end)
    return ends, trace


# --- closed forms ------------------------------------------------------------------------------------------
def test_four_equal_ops_on_two_cores_take_twice_as_long():
    # 4 ops at rate 2/4 = 1/2: 1 s of work takes 2 s.
    ends, trace = run([[1.0]] * 4, cpu(4, 2))
    assert [e for r in range(4) for e in ends[r]] == approx([2.0] * 4)
    assert trace.makespan == approx(2.0)


def test_short_op_leaves_and_the_rest_speed_up():
    # t in [0, 1]: 4 ops at rate 1/2 -> the 0.5 s op is done at t = 1; the others have 1 - 0.5 = 0.5 s left.
    # then 3 ops at rate 2/3: 0.5 / (2/3) = 0.75 s more -> they end at 1.75.
    ends, _ = run([[1.0], [1.0], [1.0], [0.5]], cpu(4, 2))
    assert ends[3] == [approx(1.0)]
    assert [ends[r][0] for r in range(3)] == approx([1.75] * 3)


def test_roofline_compute_is_shared_too():
    # cpu GPU spec: 0.05 TFLOP/s x mfu 1 -> 5e10 flops = 1 s of work; 3 such ops on 1 core end at 3 s.
    plan = Plan([[Compute(name="f", flops=5e10)] for _ in range(3)]).validate()
    trace = simulate(plan, cpu(3, 1))
    assert [o.end for o in trace.ops] == approx([3.0] * 3)


# --- no sharing --------------------------------------------------------------------------------------------
def test_no_sharing_when_ops_fit_the_cores():
    ends, _ = run([[1.0], [0.25]], cpu(2, 2))
    assert ends == {0: [approx(1.0)], 1: [approx(0.25)]}
    ends, _ = run([[1.0], [0.25]], cpu(2, 8))          # more cores than ranks: still one core each
    assert ends == {0: [approx(1.0)], 1: [approx(0.25)]}


def test_cpu_cores_none_keeps_one_core_per_rank():
    assert cpu(4, None).cpu_cores is None
    ends, _ = run([[1.0], [2.0], [0.5], [1.5, 1.0]], cpu(4, None))
    assert ends == {0: [approx(1.0)], 1: [approx(2.0)], 2: [approx(0.5)], 3: [approx(1.5), approx(2.5)]}


# --- sequential ops, staggered starts -----------------------------------------------------------------------
def test_sequential_ops_and_staggered_start():
    # rank 0: 0.5 s then 1 s; ranks 1, 2: 1 s each from t = 0; 3 ranks on 2 cores.
    # [0, 0.75]: 3 ops at rate 2/3 -> rank 0's 0.5 s op ends at 0.75; ranks 1, 2 have 1 - 0.5 = 0.5 s left.
    # t = 0.75: rank 0 starts its 1 s op -> again 3 ops at 2/3; ranks 1, 2 finish 0.5 / (2/3) = 0.75 s later,
    #   at 1.5, when rank 0's op has 1 - 0.5 = 0.5 s left.
    # [1.5, 2.0]: rank 0 alone at rate 1 -> ends at 2.0.
    ends, trace = run([[0.5, 1.0], [1.0], [1.0]], cpu(3, 2))
    assert ends[0] == [approx(0.75), approx(2.0)]
    assert ends[1] == [approx(1.5)] and ends[2] == [approx(1.5)]
    second = next(o for o in trace.ops if o.rank == 0 and o.index == 1)
    assert second.start == approx(0.75)


def test_zero_second_op_under_sharing_is_instant():
    # rank 0: 0 s then 1 s; rank 1: 1 s; 1 core -> the 0 s op ends at 0, then 2 ops at 1/2 end at 2.
    ends, _ = run([[0.0, 1.0], [1.0]], cpu(2, 1))
    assert ends == {0: [approx(0.0), approx(2.0)], 1: [approx(2.0)]}


def test_rank_blocked_in_recv_holds_no_core():
    # 1 core. rank 1 waits in a recv while rank 0 computes: rank 0 has the core alone (ends at 1.0, not 2.0);
    # after the message, rank 1's compute has the core alone too (takes its 1 s).
    # (send/recv on the compute stream, so that rank 1's compute waits for the recv)
    plan = Plan([[Compute(name="a", seconds=1.0), Send(peer=1, bytes=0, stream="compute")],
                 [Recv(peer=0, bytes=0, stream="compute"), Compute(name="b", seconds=1.0)]]).validate()
    trace = simulate(plan, cpu(2, 1))
    a = next(o for o in trace.ops if o.name == "a")
    b = next(o for o in trace.ops if o.name == "b")
    assert a.end == approx(1.0)
    assert b.start >= 1.0 and b.duration == approx(1.0)


# --- nodes -------------------------------------------------------------------------------------------------
def test_nodes_have_their_own_cores():
    two_nodes = replace(PRESETS["dgx-a100"], gpus_per_node=2, nodes=2, cpu_cores=1)   # ranks 0,1 | 2,3
    # node 0: ranks 0, 1 share 1 core (2 s each); node 1: rank 2 alone (1 s), rank 3 idle.
    ends, _ = run([[1.0], [1.0], [1.0], []], two_nodes)
    assert ends[0] == [approx(2.0)] and ends[1] == [approx(2.0)]
    assert ends[2] == [approx(1.0)] and ends[3] == []
    # one op per node: nobody is slowed down, although the cluster has 4 ranks and 1 core per node.
    ends, _ = run([[1.0], [], [1.0], []], two_nodes)
    assert ends[0] == [approx(1.0)] and ends[2] == [approx(1.0)]
    # all four busy: 2 per node on 1 core -> 2 s each, not the 4 s of one shared pool.
    ends, _ = run([[1.0]] * 4, two_nodes)
    assert [ends[r][0] for r in range(4)] == approx([2.0] * 4)


# --- stragglers --------------------------------------------------------------------------------------------
def test_slowdown_multiplies_the_work_under_sharing():
    # 2 ranks on 1 core; rank 0 slowed x2 -> 2 s of work, rank 1 1 s.
    # [0, 2]: both at rate 1/2 -> rank 1 done at 2.0, rank 0 has 2 - 1 = 1 s left; alone -> ends at 3.0.
    ends, _ = run([[1.0], [1.0]], cpu(2, 1), slowdown={0: 2.0})
    assert ends == {0: [approx(3.0)], 1: [approx(2.0)]}
    # with a core each, the slowdown alone: 2 s and 1 s.
    ends, _ = run([[1.0], [1.0]], cpu(2, 2), slowdown={0: 2.0})
    assert ends == {0: [approx(2.0)], 1: [approx(1.0)]}


# --- property ----------------------------------------------------------------------------------------------
@settings(max_examples=50, deadline=None)
@given(st.integers(1, 5).flatmap(lambda n: st.tuples(
    st.lists(st.lists(st.floats(0.0, 5.0, allow_nan=False), max_size=4), min_size=n, max_size=n),
    st.integers(1, 6))))
def test_makespan_bounds(case):
    per_rank, c = case
    n = len(per_rank)
    ends, trace = run(per_rank, cpu(n, c))
    sums = [sum(s) for s in per_rank]
    total = sum(sums)
    makespan = max((o.end for o in trace.ops), default=0.0)
    tol = dict(rel=1e-9, abs=1e-9)
    assert makespan >= max(sums) - 1e-9 * (1 + max(sums))          # a rank runs at most one core fast
    assert makespan >= total / min(c, n) - 1e-9 * (1 + total)      # the node does at most min(c, n) s per s
    assert makespan <= total + 1e-9 * (1 + total)                 # some op always runs at >= 1 core's worth
    for o in trace.ops:                                           # no op runs faster than its own seconds
        assert o.duration >= per_rank[o.rank][o.index] - 1e-9 * (1 + total)
    if c >= n:
        assert makespan == approx(max(sums), **tol)
        for r, secs in enumerate(per_rank):                        # each rank runs back to back at full speed
            t = 0.0
            for i, s in enumerate(secs):
                t += s
                assert ends[r][i] == approx(t, **tol)


# --- config ------------------------------------------------------------------------------------------------
def test_cpu_cores_round_trips_through_dict_and_yaml():
    assert "cpu_cores" not in CPU.to_dict()                       # unset: not written
    d = {**CPU.to_dict(), "cpu_cores": 2}
    c = cluster_from_dict(d)
    assert c.cpu_cores == 2 and c == replace(CPU, cpu_cores=2)
    assert c.to_dict()["cpu_cores"] == 2
    assert cluster_from_dict(yaml.safe_load(c.to_yaml())) == c
    assert cluster_from_dict(CPU.to_dict()).cpu_cores is None


@pytest.mark.parametrize("bad", [0, -1, "two", True])        # fractional cores are allowed: runtime/measure/load.py
def test_bad_cpu_cores_is_a_config_error(bad):
    with pytest.raises(ConfigError) as e:
        cluster_from_dict({**CPU.to_dict(), "cpu_cores": bad})
    assert "cpu_cores" in str(e.value)
    assert e.value.where is not None and e.value.where.endswith("cpu_cores")


# --- long runs: float spacing of the clock ----------------------------------------------------------------
def _finish_bounded(per_rank_seconds, cores):
    """Run each list of seconds as one rank's back-to-back ops on one SharedCores, stepping a bounded number of
    events (a wake-up that cannot advance the clock would otherwise loop forever). Returns end times per rank."""
    env = simpy.Environment()
    shared = SharedCores(env, cores)
    ends = [[] for _ in per_rank_seconds]

    def rank(r, secs):
        for s in secs:
            yield from shared.run(s)
            ends[r].append(env.now)

    for r, secs in enumerate(per_rank_seconds):
        env.process(rank(r, secs))
    for _ in range(10_000):
        try:
            env.step()
        except simpy.core.EmptySchedule:
            break
    return ends


def test_ops_late_in_a_long_run_finish():
    # At t = 100000.1 the clock's spacing (1.5e-11 s) exceeds an absolute 1e-12 s "done" threshold: an op left
    # with ~3e-12 s of work used to re-wake at the same instant forever (simulate() never returned).
    assert _finish_bounded([[100000.1, 0.7]], 1) == [[approx(100000.1), approx(100000.8)]]
    secs = [2535169.185413741, 4303072.391373317, 1890398.266251361, 3719298.7910444443]
    ends = _finish_bounded([secs], 4)
    assert len(ends[0]) == 4 and ends[0][-1] == approx(sum(secs), rel=1e-12)
    # shared, large times: 3 ranks of 1e6 s on 2 cores -> 1.5e6 s each.
    assert _finish_bounded([[1e6]] * 3, 2) == [[approx(1.5e6, rel=1e-12)]] * 3
