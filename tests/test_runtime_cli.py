"""The runtime commands: bad input is one line and exit 2; run, bench, calibrate and validate end to end.
Each runs in this process (tests/cli_in_process.py): the ranks of every launch come from one fork server; the
process-level behaviour (signals, a killed launcher) is tests/test_runtime_launch.py's."""
from __future__ import annotations

import json
import os

import pytest
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process

from distlab.sim.plan import Collective, Compute, Plan, Record, Wait


@pytest.fixture
def plan_file(tmp_path):
    ops = [Compute(name="c", seconds=0.002), Record("e", stream="compute"), Wait("e", stream="comm"),
           Collective("all_reduce", 256 * 1024), Collective("reduce_scatter", 128 * 1024, stream="comm")]
    path = tmp_path / "p.json"
    Plan([list(ops), list(ops)], name="p").save(str(path))
    return str(path)


def one_line_error(rc, out, err):
    assert rc == 2, err
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "error" in err, err


@pytest.mark.parametrize("argv", [
    ["run", "no-such-plan.json"],
    ["run", "PLAN", "--nproc", "3"],
    ["run", "PLAN", "--nproc", "two"],
    ["run", "PLAN", "--repeat", "0"],
    ["run", "PLAN", "--timeout", "0"],
    ["run", "PLAN", "--backend", "mpi"],
    ["run", "INT16", "--backend", "gloo"],
    ["bench", "--sizes", "banana"],
    ["bench", "--ops", "all_fold"],
    ["bench", "--dtype", "int16", "--backend", "gloo"],
    ["bench", "--iters", "0"],
    ["calibrate", "--nproc", "1"],
    ["calibrate", "--sizes", "1MiB", "--ops", "all_reduce"],
    ["calibrate", "--ops", "barrier"],
    ["validate", "--calib-sizes", "1MiB,2MiB", "--sizes", "1MiB"],
    ["validate", "--overlap-repeats", "0"],
    ["validate", "--scenario", "SCENARIO"],
])
def test_bad_input_is_one_line_and_exit_2(cli, argv, plan_file, tmp_path):
    int16 = tmp_path / "i16.json"
    Plan([[Collective("all_reduce", 64, dtype="int16")]] * 2, name="i16").save(str(int16))
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: gpt2-small\nparallelism: {kind: no-such-kind}\ncluster: localhost-cpu\n")
    argv = [{"PLAN": plan_file, "INT16": str(int16), "SCENARIO": str(scenario)}.get(a, a) for a in argv]
    rc, out, err = cli(*argv)
    one_line_error(rc, out, err)
    if "--scenario" in argv:           # refused while the scenario is read, before its memory check or any rank
        assert "unknown kind 'no-such-kind'; allowed:" in err or "scenario kind 'no-such-kind' not supported" in err


@pytest.mark.slow
def test_run_writes_a_measured_trace(cli, plan_file, tmp_path):
    from distlab.sim.trace import Trace
    out = tmp_path / "m.trace"
    rc, stdout, err = cli("run", plan_file, "--nproc", "2", "--repeat", "2", "--out", str(out), "--json",
                          "--dump-dir", str(tmp_path / "flight"))
    assert rc == 0, err
    summary = json.loads(stdout)
    assert summary["backend"] == "gloo" and summary["makespan_s"] > 0
    trace = Trace.from_json(out.read_text())
    assert trace.meta["source"] == "measured" and len(trace.ops) == 10
    assert {o.kind for o in trace.ops} == {"compute", "record", "wait", "collective"}
    # a healthy run: every rank left a final dump, and diagnose says the run completed (not "died")
    from distlab.runtime.diagnosis.diagnose import diagnose
    from distlab.runtime.diagnosis.flight_read import load_dir
    d = diagnose(load_dir(str(tmp_path / "flight")))
    assert d["status"] == "completed" and not d["problems"], d["verdict"]
    assert d["verdict"].startswith("completed: all 2 ranks finished")


@pytest.mark.slow
def test_bench_table_json_and_plot(cli, tmp_path):
    rc, out, err = cli("bench", "--ops", "all_reduce,all_gather,barrier", "--sizes", "64KiB,256KiB", "--iters",
                       "2", "--plot", str(tmp_path / "b.png"), "--out", str(tmp_path / "b.json"))
    assert rc == 0, err
    doc = json.loads((tmp_path / "b.json").read_text())            # --out holds what --json prints
    table = [line.split() for line in out.splitlines() if line and not line.startswith(("#", "wrote"))]
    assert [t[:6] for t in table] == [[r["op"], str(r["bytes"]), str(r["count"]), r["type"], r["redop"],
                                       str(r["root"])] for r in doc["results"]]      # nccl-tests' columns
    assert "# Avg bus bandwidth" in out
    rows = doc["results"]
    assert doc["schema"] == "distlab.bench/1" and doc["world_size"] == 2 and doc["complete"] and not doc["errors"]
    assert doc["config"]["min_bytes"] == 65536 and doc["config"]["iterations"] == 2
    assert [(r["op"], r["bytes"]) for r in rows] == [("all_reduce", 65536), ("all_reduce", 262144),
                                                     ("all_gather", 65536), ("all_gather", 262144), ("barrier", 0)]
    assert [(r["count"], r["redop"], r["root"], r["in_place"]) for r in rows[1:3]] == [
        (65536, "sum", -1, True), (16384, "none", -1, False)]                # nccl-tests' fields
    assert doc["average_busbw_GBps"] == pytest.approx(sum(r["busbw_GBps"] for r in rows[:4]) / 4)
    ar = rows[1]
    assert ar["algbw_GBps"] == pytest.approx(262144 / ar["time_s"] / 1e9)
    assert ar["busbw_GBps"] == pytest.approx(ar["algbw_GBps"])           # 2 ranks: 2(n-1)/n = 1
    assert (tmp_path / "b.png").stat().st_size > 0


@pytest.mark.slow
def test_calibrate_writes_a_cluster_the_simulator_loads(cli, tmp_path):
    from distlab.sim.cluster import load_cluster
    from distlab.sim.kernel.engine import simulate_collective
    out = tmp_path / "c.yaml"
    rc, stdout, err = cli("calibrate", "--ops", "all_reduce,all_gather", "--nproc", "2", "--sizes",
                          "256KiB,1MiB,4MiB", "--iters", "2", "--out", str(out), "--compute", "--compute-budget",
                          "0.3", "--probe-seconds", "0.05", "--interference-rounds", "1",   # short probes: CI time
                          "--plot", str(tmp_path / "curve.png"))
    assert rc == 0, err
    cluster = load_cluster(str(out))
    # --compute (runtime/measure/compute_probe.py): the schema's fields, measured; interference from the ranks
    curve = cluster.gpu.gemm_efficiency
    assert len(curve) >= 5 and max(e for _, e in curve) <= 1 and 0 < cluster.gpu.launch_s < 1e-3
    assert cluster.interference >= 1 and "interference: compute x" in stdout and "model error" in stdout
    assert cluster.comm_interference >= 1 and "comm_interference: all_reduce x" in stdout
    assert (tmp_path / "curve.png").stat().st_size > 0
    scenario = tmp_path / "s.yaml"           # `distlab simulate` on it
    scenario.write_text(f"model: {{kind: mlp, widths: [256, 256], batch: 8}}\nparallelism: {{kind: ddp}}\n"
                        f"cluster: {out}\n")
    assert cli("simulate", str(scenario), "--no-files", "--json")[0] == 0
    assert set(cluster.calibration["collectives"]) == {"all_reduce", "all_gather"}
    fit = cluster.calibration["collectives"]["all_reduce"]["2"]
    assert fit["bandwidth_GBps"] > 0 and fit["latency_us"] >= 0
    assert cluster.gpu.tflops > 0 and cluster.gpu.name == "cpu"
    cores = len(os.sched_getaffinity(0))       # the cores the ranks shared, less what other processes used
    assert cores / 2 <= cluster.cpu_cores <= cores
    assert "# load: average" in out.read_text() and "load: average" in stdout     # recorded and printed
    trace, algorithm = simulate_collective("all_reduce", 2**20, cluster)
    assert algorithm == "ring" and trace.makespan > 0


@pytest.mark.slow
def test_validate_prints_cases_and_medians(cli, tmp_path):
    rc, out, err = cli("validate", "--ops", "all_reduce", "--nproc", "2", "--holdout-nproc", "none",
                       "--calib-sizes", "64KiB,512KiB", "--sizes", "128KiB,256KiB", "--iters", "2", "--json",
                       "--overlap-repeats", "3",
                       "--plot", str(tmp_path / "v.png"), "--out", str(tmp_path / "v.json"))
    assert rc == 0, err
    result = json.loads(out)
    kinds = [c["kind"] for c in result["cases"]]
    assert kinds == ["held-out size", "held-out size", "overlap plan"]
    overlap = result["cases"][-1]      # both interference factors from the probe rounds between the plan's runs
    assert overlap["interference"] >= 1 and overlap["comm_interference"] >= 1
    assert overlap["error"] >= overlap["error_without_comm_interference"] - 1e-9   # a slower all_reduce: no faster
    for c in result["cases"]:
        assert c["error"] == pytest.approx((c["predicted_s"] - c["measured_s"]) / c["measured_s"])
        assert c["repeats"] >= 2 and c["measured_min_s"] <= c["measured_s"] <= c["measured_max_s"]
        assert abs(c["worst_error"]) >= abs(c["error"]) - 1e-12 and c["spread"] >= 0
    assert all(s["worst_abs_error"] >= s["median_abs_error"] for s in result["summary"])
    held = [s for s in result["summary"] if s["kind"] == "held-out size"]
    assert held and all(s["median_abs_error_noise"] >= 0 for s in held)
    assert result["summary"][-1]["kind"] == "held-out size"
    assert (tmp_path / "v.png").stat().st_size > 0
    # issue 33: the load before and during, and a verdict with reasons (runtime/measure/trust.py)
    trust = result["trust"]
    assert set(trust) >= {"trustworthy", "reasons", "load_during"} and trust["trustworthy"] == (not trust["reasons"])
    assert result["load"]["during"]["cores"] >= 1 and result["load"]["during"]["window_s"] > 0
    assert all("trusted" in c for c in result["cases"])
