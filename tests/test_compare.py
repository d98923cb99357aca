"""`distlab compare PREDICTED MEASURED` (sim/compare.py): a simulated trace against a real 2-rank gloo run of the
same plan (one launch through `distlab run`, shared by the module), op matching by (rank, index), the sign of
the error, the combined Perfetto trace, and bad input (one line, exit code 2)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from distlab.runtime.cli import main
from distlab.sim.cluster import PRESETS
from distlab.sim.compare import combined_chrome, compare, load_trace
from distlab.sim.kernel.engine import simulate
from distlab.sim.plan import Collective, Compute, Plan, Record, Wait
from distlab.sim.trace import Trace

FLOPS = 2e7


def small_plan(n: int = 2, layers: int = 3, name: str = "compare-test") -> Plan:
    """A DDP-like backward: per layer a compute, then its all-reduce on a second stream once the compute is done."""
    ops = []
    for i in range(layers):
        ops += [Compute(name=f"bwd{i}", flops=FLOPS), Record(f"grad{i}", stream="compute"),
                Wait(f"grad{i}", stream="comm"), Collective("all_reduce", 2**20, name=f"ar{i}", stream="comm")]
    return Plan([list(ops) for _ in range(n)], name=name).validate()


def cluster(tflops: float | None = None):
    c = PRESETS["localhost-cpu"].with_world_size(2)
    return c if tflops is None else replace(c, gpu=replace(c.gpu, tflops=tflops, mfu=1.0))


def cli(argv, capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """plan.json, its real 2-rank run (measured.trace) and the simulated trace (predicted.trace, .json)."""
    d = tmp_path_factory.mktemp("compare")
    plan = small_plan()
    (d / "plan.json").write_text(json.dumps(plan.to_dict()))
    assert main(["run", str(d / "plan.json"), "--nproc", "2", "--repeat", "3", "--out", str(d / "measured.trace")]) == 0
    predicted = simulate(plan, cluster())
    predicted.save(str(d / "predicted.trace"))
    predicted.save(str(d / "predicted.json"))
    return d


@pytest.mark.slow
def test_every_op_of_the_real_run_is_matched(files, capsys):
    rc, out, _ = cli(["compare", files / "predicted.trace", files / "measured.trace", "--json", "--worst", "3",
                      "--out", files / "both.json"], capsys)
    assert rc == 0
    result = json.loads(out)
    assert result["plan"] == "compare-test" and result["world_size"] == 2
    measured = Trace.from_json((files / "measured.trace").read_text())
    predicted = Trace.from_json((files / "predicted.trace").read_text())
    # 2 ranks x 3 layers x (compute + all_reduce); record/wait are markers
    assert [(o["rank"], o["index"], o["name"]) for o in result["ops"]] == \
        [(r, 4 * i + k, f"{n}{i}") for r in (0, 1) for i in range(3) for k, n in ((0, "bwd"), (3, "ar"))]
    for o in result["ops"]:
        m = next(x for x in measured.ops if (x.rank, x.index) == (o["rank"], o["index"]))
        p = next(x for x in predicted.ops if (x.rank, x.index) == (o["rank"], o["index"]))
        assert o["measured_start_s"] == m.start and o["measured_duration_s"] == pytest.approx(m.duration)
        assert o["predicted_duration_s"] == pytest.approx(p.duration)
        assert o["error"] == pytest.approx((p.duration - m.duration) / m.duration)
    assert result["totals"]["makespan"]["measured_s"] == pytest.approx(measured.makespan)
    assert result["totals"]["makespan"]["predicted_s"] == pytest.approx(predicted.makespan)
    busy = {(s["rank"], s["stream"]): s["measured_busy_s"] for s in result["totals"]["streams"]}
    assert busy == {(r, s): pytest.approx(measured.busy_time(r, s)) for r in (0, 1) for s in ("compute", "comm")}
    diffs = sorted((abs(o["duration_diff_s"]) for o in result["ops"]), reverse=True)
    assert [abs(w["duration_diff_s"]) for w in result["worst"]] == diffs[:3]


@pytest.mark.slow
def test_the_error_sign_follows_the_prediction(files):
    """The same real run predicted on a far too slow and a far too fast machine: every compute op's error is
    positive (predicted longer), then negative."""
    plan, measured = small_plan(), load_trace(str(files / "measured.trace"))
    slow = compare(simulate(plan, cluster(tflops=FLOPS / 1.0 / 1e12)), measured)      # 1 s per compute
    fast = compare(simulate(plan, cluster(tflops=FLOPS / 1e-9 / 1e12)), measured)     # 1 ns per compute
    for c, sign in ((slow, 1), (fast, -1)):
        errors = [p.error for p in c.pairs if p.measured.kind == "compute"]
        assert len(errors) == 6 and all(e * sign > 0 for e in errors)
    assert slow.totals()["makespan"]["error"] > 0 > fast.totals()["makespan"]["error"]


@pytest.mark.slow
def test_combined_trace_has_one_process_per_rank_and_sibling_tracks(files):
    c = compare(load_trace(str(files / "predicted.trace")), load_trace(str(files / "measured.trace")))
    events = combined_chrome(c)["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {0: "rank 0", 1: "rank 1"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    for rank in (0, 1):
        names = [threads[k] for k in sorted(k for k in threads if k[0] == rank)]
        assert names == ["predicted comm", "measured comm", "predicted compute", "measured compute"]
    for rank, side in ((0, "predicted"), (1, "measured")):
        trace = c.predicted if side == "predicted" else c.measured
        slices = [e for e in events if e["ph"] == "X" and e["pid"] == rank and e["cat"] != "wait"
                  and threads[rank, e["tid"]].startswith(side)]
        assert sorted(e["args"]["index"] for e in slices) == sorted(o.index for o in trace.for_rank(rank)
                                                                      if o.kind not in ("record", "wait"))
        assert all(threads[rank, e["tid"]].endswith(next(o.stream for o in trace.for_rank(rank)
                                                         if o.index == e["args"]["index"])) for e in slices)


@pytest.mark.slow
@pytest.mark.parametrize("predicted", ["predicted.json", "plan.json"])
def test_a_chrome_trace_or_the_plan_reads_back_as_the_native_trace(files, predicted):
    """The Chrome trace Trace.save writes, and the plan simulated here on the same cluster, give the same ops."""
    native = compare(load_trace(str(files / "predicted.trace")), load_trace(str(files / "measured.trace")))
    other = compare(load_trace(str(files / predicted), "localhost-cpu"), load_trace(str(files / "measured.trace")))
    for a, b in zip(native.pairs, other.pairs, strict=True):
        assert (a.predicted.rank, a.predicted.index, a.predicted.stream) == (b.predicted.rank, b.predicted.index,
                                                                             b.predicted.stream)
        assert b.predicted.start == pytest.approx(a.predicted.start, abs=1e-12)
        assert b.predicted.end == pytest.approx(a.predicted.end, abs=1e-12)


def test_identical_traces_have_no_error_and_a_partial_run_lists_what_is_missing():
    trace = simulate(small_plan(), cluster())
    c = compare(trace, trace)
    assert len(c.pairs) == 12 and all(p.error == 0 for p in c.pairs) and not c.missing
    partial = Trace([o for o in trace.ops if not (o.rank == 1 and o.index >= 4)], [], dict(trace.meta))
    c = compare(trace, partial)
    assert [(o.rank, o.name) for o in c.missing] == [(1, "bwd1"), (1, "ar1"), (1, "bwd2"), (1, "ar2")]


@pytest.mark.parametrize("case", ["missing", "not json", "other plan", "other world size", "other ops", "out"])
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, capsys):
    """Nothing is written (--out) when the input is bad."""
    predicted = tmp_path / "p.trace"
    simulate(small_plan(), cluster()).save(str(predicted))
    other = tmp_path / "m.trace"
    if case == "not json":
        other.write_text("not a trace\n")
    elif case == "other plan":
        simulate(small_plan(name="another"), cluster()).save(str(other))
    elif case == "other world size":
        simulate(small_plan(n=4), PRESETS["dgx-h100"].with_world_size(4)).save(str(other))
    elif case == "other ops":
        simulate(small_plan(layers=4), cluster()).save(str(other))
    else:
        simulate(small_plan(), cluster()).save(str(other))
    argv = ["compare", predicted, tmp_path / "nope.trace" if case == "missing" else other]
    argv += ["--out", tmp_path / ("both.png" if case == "out" else "both.json")]
    rc, out, err = cli(argv, capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("distlab compare: error: ")
    expected = {"missing": "no such trace file", "not json": "not a trace", "other plan": "different plans",
                "other world size": "world_size 2 predicted, 4 measured",
                "other ops": "rank 0 op 12 is compute 'bwd3' measured, nothing predicted",
                "out": "allowed: a *.json path"}[case]
    assert expected in err
    assert not (tmp_path / "both.png").exists() and not (tmp_path / "both.json").exists()
