"""Mismatched collectives, missing calls and deadlocks are named, statically and in the simulator."""
import pytest
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process

from distlab.sim.analysis import straggler_report, time_breakdown, who_waited
from distlab.sim.check import PlanMismatch, check_plan, rank_ranges
from distlab.sim.kernel.engine import simulate
from distlab.sim.errors import SimulationDeadlock
from distlab.sim.plan import Collective, Compute, Plan, Record, Recv, Send, Wait
from tests.conftest import one_node

MiB = 2**20


def world(n, make):
    return Plan([make(r) for r in range(n)]).validate()


def five_then(r, odd):
    ops = [Collective("all_reduce", 4 * MiB) for _ in range(5)]
    return ops + ([odd] if odd is not None else []) + [Collective("all_reduce", 4 * MiB)]


def test_rank_ranges():
    assert rank_ranges([0, 1, 2, 4, 5, 6, 7]) == "0-2, 4-7" and rank_ranges([3]) == "3"


def test_wrong_collective_is_named():
    plan = world(8, lambda r: [Collective("all_reduce", 4 * MiB)] * 5 +
                 [Collective("broadcast", 4 * MiB, root=0) if r == 3 else Collective("all_reduce", 4 * MiB)])
    assert check_plan(plan) == ["group [0..7], collective #5: rank 3 calls broadcast(4 MiB, root 0); "
                                "ranks 0-2, 4-7 call all_reduce(4 MiB)"]


def test_missing_collective_would_hang():
    plan = world(8, lambda r: [Collective("all_reduce", 4 * MiB)] * (5 if r == 3 else 6))
    assert check_plan(plan) == ["would hang: ranks 0-2, 4-7 wait in all_reduce #5 on group [0..7]; "
                                "rank 3 never calls it"]
    with pytest.raises(PlanMismatch, match="rank 3 never calls it"):
        simulate(plan, one_node(8))


@pytest.mark.parametrize("make,expected", [
    (lambda r: [Collective("all_reduce", 4 * MiB if r else 2 * MiB)], "rank 0 calls all_reduce(2 MiB)"),
    (lambda r: [Collective("all_reduce", 8, dtype="float16" if r == 1 else "float32")], "collective #0"),
    (lambda r: [Collective("broadcast", 8, root=1 if r == 2 else 0)], "root 1"),
    (lambda r: [Collective("all_gather", 8, group=(0, 1)), Collective("all_reduce", 8, group=(0, 1))]
     if r == 0 else [Collective("all_reduce", 8, group=(0, 1)), Collective("all_gather", 8, group=(0, 1))]
     if r == 1 else [], "group [0,1], collective #0"),
])
def test_mismatch_kinds(make, expected):
    problems = check_plan(world(4, make))
    assert problems and expected in problems[0]


def test_p2p_problems():
    plan = Plan([[Send(peer=1, bytes=8), Send(peer=1, bytes=8)], [Recv(peer=0, bytes=8)]]).validate()
    assert check_plan(plan) == ["would hang: rank 0 sends 2 messages to rank 1, which receives only 1"]
    plan = Plan([[Send(peer=1, bytes=8)], [Recv(peer=0, bytes=16)]]).validate()
    assert "rank 1 calls recv(16 B <- 0)" in check_plan(plan)[0]


def test_wait_for_unrecorded_event_is_caught_statically_and_by_the_simulator():
    plan = Plan([[Wait("never", stream="comm"), Collective("all_reduce", 8)], [Collective("all_reduce", 8)]])
    plan.validate()
    assert "waits for event 'never'" in check_plan(plan)[0]
    with pytest.raises(SimulationDeadlock) as e:
        simulate(plan, one_node(2), check=False)
    text = str(e.value)
    assert "rank 0 stream 'comm' waits in wait for event 'never'" in text
    assert "rank 1 stream 'comm' waits in all_reduce(8 B) #0 on group [0,1]" in text


def test_send_recv_cycle_deadlocks_with_a_report():
    # both ranks receive first: a cycle that counts alone cannot see
    plan = Plan([[Recv(peer=1, bytes=8), Send(peer=1, bytes=8)],
                 [Recv(peer=0, bytes=8), Send(peer=0, bytes=8)]]).validate()
    assert check_plan(plan) == []
    with pytest.raises(SimulationDeadlock) as e:
        simulate(plan, one_node(2))
    assert e.value.stuck == [(0, "comm", "op #0 recv(8 B <- 1)"), (1, "comm", "op #0 recv(8 B <- 0)")]


def test_event_cycle_across_streams_deadlocks():
    plan = Plan([[Wait("b", stream="compute"), Record("a", stream="compute"),
                  Wait("a", stream="comm"), Record("b", stream="comm")]]).validate()
    with pytest.raises(SimulationDeadlock, match="rank 0 stream 'compute' waits in wait for event 'b'"):
        simulate(plan, one_node(1))


def test_straggler_shows_who_waited_for_whom():
    plan = world(4, lambda r: [Compute("work", seconds=1e-3), Collective("all_reduce", MiB, name="sync",
                                                                                stream="compute")])
    trace = simulate(plan, one_node(4), slowdown={2: 3.0})
    waits = who_waited(trace)
    assert len(waits) == 1 and waits[0].late_rank == 2
    assert waits[0].waited_s == pytest.approx({0: 2e-3, 1: 2e-3, 3: 2e-3})
    breakdown = {b.rank: b for b in time_breakdown(trace)}
    assert breakdown[0].waiting_s == pytest.approx(2e-3) and breakdown[2].waiting_s == pytest.approx(0)
    assert breakdown[2].compute_s == pytest.approx(3e-3)
    assert straggler_report(trace)[0].startswith("rank 2 arrived last and held up its peers for 2.00 ms")


def test_degraded_link_slows_only_its_flows():
    plan = world(4, lambda r: [Collective("all_reduce", 64 * MiB, algorithm="ring")])
    base = simulate(plan, one_node(4)).makespan
    slow = simulate(plan, one_node(4), link_factors={"gpu1.up": 0.5}).makespan
    assert slow > 1.5 * base
    with pytest.raises(Exception, match="no link named 'gpu9.up'"):
        simulate(plan, one_node(4), link_factors={"gpu9.up": 0.5})


def test_scenario_straggler_and_degraded_link_reported_by_cli(cli, tmp_path):
    from dataclasses import replace

    from distlab.sim.cluster import PRESETS
    quiet = tmp_path / "c.yaml"          # dgx-h100 without interference: a straggler's compute is exactly 4 x
    quiet.write_text(replace(PRESETS["dgx-h100"], interference=1.0).to_yaml())
    base = ("model: {kind: mlp, widths: [1024, 1024, 1024, 1024], batch: 64}\n"
            f"parallelism: {{kind: ddp, bucket_cap_mb: 1}}\ncluster: {quiet}\n")
    path = tmp_path / "s.yaml"
    path.write_text(base + "stragglers: {3: 4.0}\n")
    rc, out, err = cli("simulate", str(path), "--no-files", "--json")
    assert rc == 0, err
    import json
    d = json.loads(out)["results"][0]          # distlab.simulate/1: a list of results
    assert d["stragglers"][0].startswith("rank 3 arrived last")
    ranks = {r["rank"]: r for r in d["time_by_rank"]}
    assert ranks[3]["compute_s"] == pytest.approx(4 * ranks[0]["compute_s"])
    assert ranks[0]["waiting_s"] > 0 and ranks[3]["waiting_s"] == 0
    path.write_text(base)
    fast = json.loads(cli("simulate", str(path), "--no-files", "--json")[1])["results"][0]["step_s"]
    path.write_text(base + "degraded_links: {gpu5.up: 0.1}\n")
    slow = json.loads(cli("simulate", str(path), "--no-files", "--json")[1])["results"][0]["step_s"]
    assert slow > 2 * fast
    for bad, message in (("stragglers: {3: 0}\n", "must be a number > 0"), ("stragglers: {99: 2}\n", "rank 99"),
                         ("degraded_links: {gpu5.up: 2}\n", "in (0, 1]"), ("degraded_links: {warp9: 0.5}\n",
                                                                             "no link named 'warp9'")):
        path.write_text(base + bad)
        rc, out, err = cli("simulate", str(path), "--no-files")
        assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
