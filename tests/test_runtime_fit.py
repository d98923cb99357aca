"""The calibration fit and its agreement with the simulator's use of it (no ranks started)."""
from __future__ import annotations

import pytest

from distlab.runtime.fit import calibrated_cluster, calibration_from_rows, fit_line, predict, ring_cost
from distlab.sim.cluster import cluster_from_dict
from distlab.sim.errors import ConfigError


def rows_for(op, n, alpha, bw, sizes):
    steps, factor = ring_cost(op, n)
    return [{"op": op, "world_size": n, "bytes": s, "time_s": steps * alpha + factor * s / bw} for s in sizes]


def test_fit_recovers_latency_and_bandwidth():
    sizes = [2**k for k in range(18, 27, 2)]
    rows = rows_for("all_reduce", 4, 100e-6, 1.5e9, sizes) + rows_for("all_gather", 2, 50e-6, 3e9, sizes)
    cal = calibration_from_rows(rows)["collectives"]
    assert cal["all_reduce"]["4"]["latency_us"] == pytest.approx(100, rel=1e-3)
    assert cal["all_reduce"]["4"]["bandwidth_GBps"] == pytest.approx(1.5, rel=1e-3)
    assert cal["all_gather"]["2"]["latency_us"] == pytest.approx(50, rel=1e-3)


def test_negative_intercept_or_slope_falls_back_to_a_slope_through_zero():
    a, b = fit_line([1e6, 2e6, 4e6], [0.9e-3, 2.0e-3, 4.1e-3])
    assert a == 0.0 and b > 0
    a, b = fit_line([1e6, 2e6, 4e6], [3e-3, 2e-3, 1e-3])                 # noise: falling with size
    assert a == 0.0 and b > 0
    with pytest.raises(ConfigError):
        fit_line([1e6, 1e6], [1e-3, 1e-3])


def test_prediction_matches_the_simulator_on_the_calibrated_cluster():
    from distlab.sim.engine import simulate_collective
    sizes = [2**20, 2**23, 2**26]
    rows = rows_for("all_reduce", 2, 200e-6, 1.2e9, sizes) + rows_for("all_reduce", 4, 300e-6, 0.6e9, sizes)
    rows += rows_for("reduce_scatter", 2, 100e-6, 0.3e9, sizes)
    cal = calibration_from_rows(rows)
    compute = {"flops_per_s": 5e10, "copy_Bps": 4e9}
    for op, n in (("all_reduce", 2), ("all_reduce", 3), ("all_reduce", 4), ("reduce_scatter", 4)):
        cluster = calibrated_cluster(cal, compute, n, "gloo")
        cluster = cluster_from_dict(cluster.to_dict())                   # survives a YAML round trip
        trace, _ = simulate_collective(op, 16 * 2**20, cluster)
        assert trace.makespan == pytest.approx(predict(cal, op, n, 16 * 2**20), rel=1e-3)
    assert cluster.gpu.tflops == pytest.approx(0.05)


def test_timed_compute_never_ends_early():
    """A Compute op with planned seconds lasts at least that long, however slow one matmul is."""
    import time
    from distlab.runtime.compute import Matmuls
    mm = Matmuls("cpu", n=192)
    for seconds in (0.0005, 0.002, 0.005):
        for _ in range(5):
            t0 = time.perf_counter()
            mm.work_for(seconds, 0.0, 0.0)()
            took = time.perf_counter() - t0
            assert seconds <= took < seconds + 0.25
