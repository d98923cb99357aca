"""benchmarks/overlap_accuracy.py and benchmarks/overlap_ops.py, `distlab validate`'s overlap plan measured
(issue 33): sim-only, on simulated traces and hand-made runs (no real ranks)."""
from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import overlap_accuracy
        import overlap_ops
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return overlap_accuracy, overlap_ops


def test_a_plans_parts_add_up_to_its_makespan_and_each_is_what_it_says(bench):
    """overlap_ops.parts on the simulated plan: the first compute is bwd0's FLOPs at the rate F, the last
    all_reduce the collective alone (nothing computes beside it), and the three parts add up to the makespan;
    with interference both ways only the overlapped part grows."""
    from dataclasses import replace

    from distlab.runtime.measure.validation import cluster_for, overlap_plan
    from distlab.sim.kernel.engine import simulate, simulate_collective
    _, ops = bench
    compute = {"flops_per_s": 50e9, "copy_Bps": 10e9, "interference": 1.0, "comm_interference": 1.0}
    calibration = {"collectives": {"all_reduce": {"2": {"bandwidth_GBps": 1.0, "latency_us": 100.0}}}}
    cluster = cluster_for(calibration, compute, 2, "gloo", 2.0)
    plan = overlap_plan(2)
    alone = ops.parts(simulate(plan, cluster, record_transfers=False))
    assert alone["first compute"] == pytest.approx(plan.meta["flops"] / 50e9, rel=1e-6)
    ar = simulate_collective("all_reduce", plan.meta["bytes"], cluster)[0].makespan
    assert alone["last all_reduce"] == pytest.approx(ar, rel=1e-6)
    assert sum(alone[p] for p in ops.PARTS[:3]) == pytest.approx(alone["makespan"], rel=1e-9)
    slowed = ops.parts(simulate(plan, replace(cluster, interference=1.8, comm_interference=1.8),
                                record_transfers=False))
    for p in ("first compute", "last all_reduce"):
        assert slowed[p] == pytest.approx(alone[p], rel=1e-6)
    assert slowed["overlapped"] > 1.3 * alone["overlapped"]


def test_three_ranks_on_two_cores_pass_only_when_every_run_is_within_or_explained(bench):
    """At 3 ranks (more than the 2 cores) each run must be within 25% or carry validate's reason; a run beyond
    25% that validate trusted is a miss, whatever the other runs did."""
    summarize = bench[0].summarize
    oversubscribed = ("compute+all_reduce on 3 ranks: its -40% is beyond its tolerance (25%) with more ranks than "
                      "the 2 cores: they take turns on them in the scheduler's time slices, ...")

    def run(error3, doubt=None):
        case = {"kind": "overlap plan", "case": "compute+all_reduce", "world_size": 3, "error": error3,
                "spread": 0.3, "error_without_interference": error3 - 0.1, "interference": 1.5,
                "trusted": doubt is None, **({"doubt": doubt} if doubt else {})}
        return {"load": {"during": {"background_cores": 0.0}}, "trust": {"trustworthy": doubt is None,
                                                                          "reasons": [doubt] if doubt else []},
                "cases": [case]}
    explained = summarize([run(0.1), run(-0.2), run(-0.4, oversubscribed), run(0.05), run(-0.6, oversubscribed)])[0]
    assert explained["ok"] and explained["within_target"] == 3
    assert explained["status"] == "ok: 3 of 5 runs within 25%, 2 reported untrustworthy with the reason"
    assert "more ranks than the 2 cores" in explained["doubts"][0]
    silent = summarize([run(0.1), run(-0.2), run(-0.4), run(0.05), run(0.0)])[0]     # within in 4 of 5
    assert not silent["ok"] and silent["status"] == "MISSED: 1 of 5 runs beyond 25% and trusted"


def test_overlap_ops_refuses_a_folder_without_kept_runs_in_one_line(bench, tmp_path, capsys):
    assert bench[1].main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no validate-*.json in" in err and "--keep DIR" in err
