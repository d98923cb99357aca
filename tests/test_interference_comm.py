"""Communication interference: a collective progresses ``cluster.comm_interference`` (K) times slower exactly
while compute runs on its members' pool (node cores, or the rank's GPU), and ends when its progress reaches its
network time T (sim/kernel/cores.py CommSlowdown); hand-computed timelines, milliseconds."""
from dataclasses import replace

import pytest
from pytest import approx

from distlab.sim.cluster import PRESETS, cluster_from_dict
from distlab.sim.kernel.engine import simulate, simulate_collective
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Plan

from test_interference import NBYTES, ends, overlap_plan

CPU = PRESETS["localhost-cpu"]
T = simulate_collective("all_reduce", NBYTES, CPU)[0].makespan            # the all_reduce alone: ~0.1 s


def test_collective_under_compute_takes_k_times_longer():
    # A [0, 1]; the all_reduce starts at 1 beside B (2 s): compute the whole time, so 2T at rate 1/2
    assert 2 * T < 2.0
    got = ends(simulate(overlap_plan(2), replace(CPU, comm_interference=2.0)))
    assert got["ar"] == approx((1.0, 1.0 + 2 * T))
    assert got["B"] == approx((1.0, 3.0)) and got["C"] == approx((3.0, 3.5))    # compute: unchanged (I = 1)


def test_collective_speeds_up_when_the_compute_ends():
    # B lasts 0.01 s: 0.005 s of progress at 1/2, then T - 0.005 at rate 1 -> ends at 1.01 + T - 0.005
    got = ends(simulate(overlap_plan(2, during=0.01, after=0.0), replace(CPU, comm_interference=2.0)))
    assert got["ar"] == approx((1.0, 1.0 + T + 0.005))
    assert got["B"] == approx((1.0, 1.01))


def test_collective_with_no_compute_beside_it_is_unchanged():
    # B and C last 0 s: the compute stream is done at 1, so the all_reduce [1, 1 + T] runs alone
    got = ends(simulate(overlap_plan(2, during=0.0, after=0.0), replace(CPU, comm_interference=3.0)))
    assert got["ar"] == approx((1.0, 1.0 + T))


def test_both_directions_together():
    # I = K = 2: during the overlap compute runs at 1/2 and the all_reduce at 1/2: the all_reduce takes 2T
    # (B still runs at its end: B did T of its 2 s by then), B's remaining 2 - T at rate 1
    got = ends(simulate(overlap_plan(2), replace(CPU, interference=2.0, comm_interference=2.0)))
    assert got["ar"] == approx((1.0, 1.0 + 2 * T))
    assert got["B"] == approx((1.0, 1.0 + 2 * T + (2.0 - T)))


def test_shared_cores_slow_the_collective_of_the_whole_node():
    # one node, 2 ranks on 1 core: A of both ranks shares it (ends at 2); B too (rate 1/2, 1 s of work);
    # the all_reduce [2, ...] is beside B the whole time: 2T; B itself is only shared, not slowed (I = 1)
    got = ends(simulate(overlap_plan(2, before=1.0, during=1.0, after=0.0),
                        replace(CPU, cpu_cores=1, comm_interference=2.0)))
    assert 2 * T < 2.0
    assert got["A"] == approx((0.0, 2.0)) and got["ar"] == approx((2.0, 2.0 + 2 * T))
    assert got["B"] == approx((2.0, 4.0))


def test_symmetric_and_full_simulation_agree_under_comm_interference():
    cluster = replace(PRESETS["dgx-h100"], comm_interference=1.5)
    plan = Plan([list(overlap_plan(1).ranks[0]) for _ in range(8)]).validate()
    sym, full = simulate(plan, cluster), simulate(plan, cluster, symmetric=False)
    assert [(o.rank, o.name, o.end) for o in sym.ops] == [(o.rank, o.name, approx(o.end)) for o in full.ops]
    plain = ends(simulate(plan, replace(cluster, comm_interference=1.0)))
    slowed = ends(sym)
    assert slowed["ar"][1] - slowed["ar"][0] == approx(1.5 * (plain["ar"][1] - plain["ar"][0]))


def test_presets_default_to_no_comm_interference_and_it_round_trips():
    assert {c.comm_interference for c in PRESETS.values()} == {1.0}
    assert "comm_interference" not in CPU.to_dict()
    d = replace(CPU, comm_interference=1.25).to_dict()
    assert cluster_from_dict(d).comm_interference == 1.25


@pytest.mark.parametrize("value", [0.9, "x", float("nan"), 1000])
def test_bad_comm_interference_is_refused(value):
    d = {**CPU.to_dict(), "comm_interference": value}
    with pytest.raises(ConfigError) as e:
        cluster_from_dict(d, where="c.yaml")
    assert e.value.where == "c.yaml: comm_interference" and "a collective does not slow" in str(e.value)


def test_late_in_a_long_run_the_collective_still_ends():
    # at t = 1e6 s a float step is ~1e-10 s: the owed time is paid down to that, then the collective ends
    got = ends(simulate(overlap_plan(2, before=1e6), replace(CPU, comm_interference=2.0)))
    assert got["ar"][1] - got["ar"][0] == approx(2 * T, rel=1e-6)
