"""The goodput model of sim/resilience.py: simulated failures against the closed forms of Young and Daly."""
from __future__ import annotations

import math
import time

import pytest

from distlab.sim.resilience import (CheckpointCost, daly_interval, expected_goodput, goodput_curve, job_mtbf_s,
                                    optimal_interval, simulate_goodput, simulate_timeline, young_interval)

HOUR = 3600.0


def test_the_simulated_optimum_equals_young_daly_within_5_percent_for_three_failure_rates():
    t0 = time.perf_counter()
    for mtbf_h in (1.0, 3.0, 12.0):
        curve = goodput_curve(delta_s=120.0, mtbf_s=mtbf_h * HOUR, restart_s=600.0, segments=100_000, seed=1)
        assert curve.simulated_optimum_s == pytest.approx(curve.daly_s, rel=0.05), mtbf_h
        assert curve.simulated_optimum_s == pytest.approx(curve.young_s, rel=0.10), mtbf_h
        best = max(range(len(curve.simulated)), key=curve.simulated.__getitem__)
        assert curve.simulated[best] > curve.simulated[0] and curve.simulated[best] > curve.simulated[-1]
    assert time.perf_counter() - t0 < 6.0          # < 2 s on an idle machine


def test_the_monte_carlo_agrees_with_the_expected_goodput_and_with_an_event_by_event_run():
    delta, mtbf, restart = 120.0, 3 * HOUR, 600.0
    for tau in (300.0, 1500.0, 6000.0):
        want = expected_goodput(tau, delta, mtbf, restart)
        assert simulate_goodput(tau, delta, mtbf, restart, 200_000, seed=3) == pytest.approx(want, rel=0.01)
    run = simulate_timeline(1500.0, delta, mtbf, restart, work_s=2000 * mtbf, seed=2)
    assert run["goodput"] == pytest.approx(expected_goodput(1500.0, delta, mtbf, restart), rel=0.01)
    assert run["failures"] == pytest.approx(run["wall_s"] / (mtbf + restart), rel=0.05)   # none while restarting


def test_daly_is_the_exact_optimum_to_higher_order_and_young_to_first_order():
    for delta, mtbf in ((60.0, 10 * HOUR), (300.0, 3 * HOUR), (600.0, HOUR)):
        exact = optimal_interval(delta, mtbf)
        assert math.exp((exact + delta) / mtbf) * (1 - exact / mtbf) == pytest.approx(1.0, abs=1e-9)
        assert abs(daly_interval(delta, mtbf) / exact - 1) < abs(young_interval(delta, mtbf) / exact - 1)
        assert daly_interval(delta, mtbf) == pytest.approx(exact, rel=0.01)
    assert daly_interval(3 * HOUR, HOUR) == HOUR                      # delta >= 2M: checkpoint every M
    assert young_interval(120.0, 3 * HOUR) == pytest.approx(math.sqrt(2 * 120 * 3 * HOUR))


def test_the_restart_cost_scales_goodput_but_does_not_move_the_optimum():
    g0 = [expected_goodput(t, 120.0, HOUR, 0.0) for t in (300, 600, 900, 1200)]
    g1 = [expected_goodput(t, 120.0, HOUR, 900.0) for t in (300, 600, 900, 1200)]
    ratios = [b / a for a, b in zip(g0, g1)]
    assert max(ratios) == pytest.approx(min(ratios)) and ratios[0] == pytest.approx(HOUR / (HOUR + 900.0))


def test_checkpoint_write_time_is_sharded_over_ranks_up_to_the_storage_bandwidth():
    c = CheckpointCost(state_bytes=16e12, ranks=1024, rank_write_Bps=1e9, storage_Bps=2e12)
    assert c.write_time_s == pytest.approx(16e12 / 1.024e12)              # ranks-bound
    c.ranks = 16384
    assert c.write_time_s == pytest.approx(8.0)                           # storage-bound: 16 TB at 2 TB/s
    assert job_mtbf_s(16384 * 3 * HOUR, 16384) == pytest.approx(3 * HOUR)
