"""ProcessGroupGloo on real ranks (sim/kernel/communicators.py): three collectives issued at once on one group
(from three streams of a plan, runtime/execute/executor.py) run at most two at a time, in issue order: the small third
one ends only after the first has freed a worker thread, and before the long second one; on a group of its own
it ends at once. The simulator, on a CPU cluster, gives the same order."""
import pytest

from distlab.sim.cluster import load_cluster
from distlab.sim.kernel.engine import simulate
from distlab.sim.plan import Collective, Plan, Record, Wait

pytestmark = pytest.mark.slow
MiB = 2**20


def program() -> list:
    ops = [Collective("all_reduce", 8 * MiB, stream="a", name="A"),
           Collective("all_reduce", 32 * MiB, stream="b", name="B"),
           Collective("all_reduce", 4, stream="c", name="C"),
           Record("a", "a"), Record("b", "b"), Record("c", "c")]
    for s in "abc":                        # then the same three, the small one on another process group
        ops += [Wait(e, s) for e in "abc"]
    return ops + [Collective("all_reduce", 16 * MiB, stream="a", name="A2"),
                  Collective("all_reduce", 32 * MiB, stream="b", name="B2"),
                  Collective("all_reduce", 4, stream="c", name="C2", group_name="other")]


def check(trace, rank) -> None:
    o = {r.name: r for r in trace.for_rank(rank) if r.kind == "collective"}
    a, b, c = o["A"], o["B"], o["C"]
    assert a.end - 0.2 * (a.end - a.start) < c.end < b.end, (a, b, c)       # waits for a worker, not for B
    # its own group: it does not wait for a worker to free (that would end it after A2); a margin of a quarter of
    # A2 for the 2 cores the ranks' threads share (a 4-byte all_reduce starved for 7.7 ms of A2's 13 ms once)
    assert o["C2"].end < o["A2"].start + 0.75 * (o["A2"].end - o["A2"].start), o


def test_gloo_runs_two_collectives_of_a_group_at_a_time():
    from distlab.runtime.execute.executor import merge_results
    from distlab.runtime.ranks.launch import launch
    plan = Plan([program(), program()]).validate()
    results = launch("distlab.runtime.execute.executor:plan_task", {"plan": plan.to_dict(), "warmup": 1, "repeat": 1}, 2,
                     backend="gloo", timeout=60)
    measured = merge_results(plan, results)
    simulated = simulate(plan, load_cluster("localhost-cpu"))
    for rank in (0, 1):
        check(measured, rank)
        check(simulated, rank)
    assert simulated.for_rank(0)[2].launch == pytest.approx(simulated.for_rank(0)[0].end)
