"""The calibration fit and its agreement with the simulator's use of it (no ranks started)."""
from __future__ import annotations

import statistics

import pytest

from distlab.runtime.measure.fit import calibrated_cluster, calibration_from_rows, fit_line, predict, ring_cost
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
    from distlab.sim.kernel.engine import simulate_collective
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
    from distlab.runtime.execute.compute import Matmuls
    mm = Matmuls("cpu", n=192)
    for seconds in (0.0005, 0.002, 0.005):
        for _ in range(5):
            t0 = time.perf_counter()
            mm.work_for(seconds, 0.0, 0.0)()
            took = time.perf_counter() - t0
            assert seconds <= took < seconds + 0.25


def two_regime_rows(op="all_gather", n=2):
    """Synthetic timings: up to 32 MiB the ring runs at 3 GB/s, from 128 MiB on at 1 GB/s (a CPU whose caches
    stop helping): one α-β line cannot fit both."""
    steps, factor = ring_cost(op, n)
    small = [2**19, 2**21, 2**23, 2**25]
    large = [2**27, 2**28, 2**29]
    return ([{"op": op, "world_size": n, "bytes": s, "time_s": steps * 50e-6 + factor * s / 3e9} for s in small]
            + [{"op": op, "world_size": n, "bytes": s, "time_s": steps * 50e-6 + factor * s / 1e9} for s in large])


def test_one_line_that_fits_keeps_the_old_format():
    rows = rows_for("all_reduce", 2, 100e-6, 1.5e9, [2**k for k in range(18, 27, 2)])
    entry = calibration_from_rows(rows)["collectives"]["all_reduce"]["2"]
    assert set(entry) - {"spread", "samples", "noise", "latency_resolution_us"} == {"latency_us", "bandwidth_GBps"}
    assert entry["latency_resolution_us"] == 0       # noiseless samples: any latency is measurable
    assert entry["spread"] == 0 and entry["samples"] == 5


def test_size_bands_where_one_line_does_not_fit():
    from distlab.runtime.measure.fit import worst_error
    rows = two_regime_rows()
    cal = calibration_from_rows(rows)
    entry = cal["collectives"]["all_gather"]["2"]
    a, b = fit_line([r["bytes"] for r in rows], [r["time_s"] for r in rows])
    assert worst_error([r["bytes"] for r in rows], [r["time_s"] for r in rows], a, b) > 0.25
    assert [(x["min_bytes"], x["max_bytes"]) for x in entry["bands"]] == [(2**19, 2**25), (2**27, 2**29)]
    assert [x["bandwidth_GBps"] for x in entry["bands"]] == [pytest.approx(3.0, rel=1e-3), pytest.approx(1.0, rel=1e-3)]
    for r in rows:                                                        # every calibrated size within 0.1%
        assert predict(cal, "all_gather", 2, r["bytes"]) == pytest.approx(r["time_s"], rel=1e-3)
    # 64 MiB lies between the bands: halfway in log size, so 1/B is halfway between 1/3 and 1/1 GB/s
    steps, factor = ring_cost("all_gather", 2)
    expected = steps * 50e-6 + factor * 2**26 * (0.5 / 3e9 + 0.5 / 1e9)
    assert predict(cal, "all_gather", 2, 2**26) == pytest.approx(expected, rel=1e-3)


def test_the_simulator_uses_the_size_bands_of_a_cluster_file():
    from distlab.sim.kernel.engine import simulate_collective
    cal = calibration_from_rows(two_regime_rows() + two_regime_rows(n=4))
    for n in (2, 3, 4):                                     # 3: interpolated between the calibrated 2 and 4
        cluster = cluster_from_dict(calibrated_cluster(cal, {"flops_per_s": 5e10, "copy_Bps": 4e9}, n, "gloo",
                                                       cpu_cores=2).to_dict())        # a YAML round trip
        assert "bands" in cluster.calibration["collectives"]["all_gather"]["4"]
        for nbytes in (2**20, 2**26, 2**28):
            trace, _ = simulate_collective("all_gather", nbytes, cluster)
            assert trace.makespan == pytest.approx(predict(cal, "all_gather", n, nbytes), rel=1e-3)
    # cpu_cores: 4 ranks on 2 cores measured 5e10 FLOP/s each while all ran; one alone runs twice as fast
    assert cluster.cpu_cores == 2 and cluster.gpu.tflops == pytest.approx(0.1)


def test_validation_reports_worst_error_and_spread():
    from distlab.runtime.measure.validation import case, summarize
    repeats = [1.0e-3, 1.1e-3, 1.2e-3, 3.0e-3]                             # one slow repeat
    c = case("held-out size", "all_gather", 2, 2**26, 1.0e-3, 1.15e-3, repeats)
    assert c["error"] == pytest.approx(-0.15 / 1.15)
    assert c["worst_error"] == pytest.approx((1.0e-3 - 3.0e-3) / 3.0e-3)
    assert c["spread"] == pytest.approx(2.0e-3 / 1.15e-3)
    assert (c["measured_min_s"], c["measured_max_s"], c["repeats"]) == (1.0e-3, 3.0e-3, 4)
    cases = [case("held-out size", "all_reduce", 2, 2**20 * k, 1e-3, 1e-3 * (1 + e)) for k, e in
             ((1, 0.05), (4, -0.1), (16, 0.08), (64, 2.0))]
    rows = summarize(cases)
    assert rows[0]["median_abs_error"] == pytest.approx(statistics.median([abs(x["error"]) for x in cases]))
    assert rows[0]["worst_abs_error"] == pytest.approx(2.0 / 3.0)        # the 64 MiB case, measured at 3x
    assert rows[0]["worst_case"] == "all_reduce 64 MiB on 2 ranks"
    assert rows[-1]["world_size"] == "all" and rows[-1]["worst_abs_error"] == rows[0]["worst_abs_error"]
