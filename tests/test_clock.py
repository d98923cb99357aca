"""runtime/execute/clock.py without ranks: interpolation between two offset measurements, the trace's summary, the
test hook that shifts a process's clock (the two-node test in test_multinode.py measures real offsets)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from distlab.runtime.execute.clock import Alignment, ClockSync, describe, summarize


def test_times_between_two_measurements_are_aligned_by_linear_interpolation():
    before = ClockSync(offset_s=2.0, uncertainty_s=20e-6, min_rtt_s=40e-6, at_s=100.0, rounds=16, node="b")
    after = ClockSync(offset_s=2.001, uncertainty_s=30e-6, min_rtt_s=60e-6, at_s=110.0, rounds=16, node="b")
    align = Alignment(before, after)
    assert align(100.0) == pytest.approx(98.0)
    assert align(105.0) == pytest.approx(105.0 - 2.0005)
    assert align(110.0) == pytest.approx(107.999)
    assert align(200.0) == pytest.approx(200.0 - 2.001)            # outside: the nearest measurement
    report = align.report()
    assert report["drift_s"] == pytest.approx(0.001) and report["uncertainty_s"] == pytest.approx(30e-6)


def test_the_trace_meta_keeps_every_ranks_offset_and_the_worst_uncertainty():
    same = Alignment(ClockSync(node="a")).report()
    other = Alignment(ClockSync(1.5, 25e-6, 50e-6, 0.0, 16, "b"), ClockSync(1.5002, 35e-6, 70e-6, 1.0, 16, "b"))
    clock = summarize({0: same, 1: same, 2: other.report(), 3: other.report()})
    assert clock["offset_s"] == [0.0, 0.0, 1.5, 1.5]
    assert clock["max_uncertainty_s"] == pytest.approx(35e-6) and clock["max_drift_s"] == pytest.approx(2e-4)
    assert describe(clock) == "clocks: 2 nodes aligned to rank 0 within ±35 us (half the min round trip); " \
                              "drift over the run 200 us"
    assert describe(summarize({0: same})).startswith("clocks: one node")


def test_the_test_hook_shifts_the_process_clock():
    code = ("import time; from distlab.runtime.execute.clock import install_test_shift; a = time.perf_counter(); "
            "install_test_shift(); print(time.perf_counter() - a)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, DISTLAB_TEST_CLOCK_SHIFT_S="7.5")).stdout
    assert float(out) == pytest.approx(7.5, abs=0.05)
