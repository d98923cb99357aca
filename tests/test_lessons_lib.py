"""The lessons' library: the exercise checker (right, wrong, wrong unit), units, tables and figures, the
`distlab lessons` command, and the real-run helpers of runtime/lessons/."""
import argparse
import os

import pytest

from distlab.sim.lessons import (CPU_DDP_MODEL, CPU_FSDP_MODEL, Figure, Table, check, exercises, question, ranks_table,
                         scenario, simulate, simulate_sweep, solution)
from distlab.sim.lessons.units import UnitError, parse
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process (no interpreter start)


# --- the checker ----------------------------------------------------------------------------------------------
def test_accepts_the_right_answer_in_the_unit_asked():
    v = check("02-alpha-beta", "4.77 ms")
    assert v.ok and v.status == "correct" and bool(v)
    assert check("02-alpha-beta", 4.77).ok                 # a bare number is read in the unit asked for
    assert check("03-nic", "400 GB/s").ok
    assert check("01-ring-bytes", "112 MiB").ok
    assert check("04-error", "20%").ok and check("04-error", 20).ok
    assert check("02-alpha-beta", "0.00477 s").ok and check("03-nic", "3200 Gb/s").ok  # equivalent units


def test_rejects_a_wrong_answer_with_a_hint():
    v = check("02-alpha-beta", "9.5 ms")
    assert not v.ok and v.status == "wrong"
    assert "off by" in v.message
    v = check("03-nic", "3200 GB/s")
    assert v.status == "wrong" and "bits against bytes" in v.message
    assert "one NIC's" in check("03-nic", "50 GB/s").message                # a usual wrong value, named
    assert check("04-error", "-20%").status == "wrong"
    assert check("01-local-rank", 1).status == "wrong"


def test_names_a_wrong_unit():
    v = check("01-ring-bytes", "112 MB")                   # MB is not MiB: converted it is wrong, and why
    assert v.status == "wrong" and "MB against MiB" in v.message and "= 106.8 MiB" in v.message
    v = check("02-alpha-beta", 0.00477)                    # a bare number that fits another unit
    assert v.status == "wrong unit" and "in s; the answer is in ms" in v.message
    v = check("04-error", 0.2)
    assert v.status == "wrong unit" and "the answer is in %" in v.message
    assert check("01-ring-steps", "6 ms").status == "wrong unit"


def test_other_verdicts():
    assert check("02-alpha-beta", None).status == "unanswered"
    assert check("02-alpha-beta", "").status == "unanswered"
    v = check("02-alpha-beta", "4.77 GB/s")
    assert v.status == "wrong kind" and "bandwidth" in v.message and "time" in v.message
    assert check("02-busbw", "fast").status == "unreadable"
    assert check("02-busbw", "3 parsecs").status == "unreadable"
    v = check("02-busbw", "324 gb/s")
    assert v.status == "unreadable" and "GB/s or Gb/s" in v.message and "case matters" in v.message
    assert check("02-small-message", "ring").ok          # NCCL's model: ring LL 15.0 us < tree LL 15.2 us (issue 14)
    assert check("02-small-message", "tree").status == "wrong"
    assert check("02-small-message", "bus").status == "unreadable"
    with pytest.raises(KeyError, match="no exercise"):
        check("99-nope", 1)


def test_every_exercise_accepts_its_solution():
    given = {"02-your-busbw": {"row": {"op": "all_reduce", "world_size": 4, "bytes": 2**20, "time_s": 2e-3}},
             "04-your-prediction": {"case": {"measured_s": 0.004}},
             "07-your-prediction": {"row": {"measured_s": 0.5}},
             "05-your-prediction": {"row": {"measured_s": 0.040}}, "06-your-prediction": {"row": {"measured_s": 0.2}},
             "15-bf16-error": {"result": {"matmul_error": 0.0029}},
             "15-underflow": {"result": {"rows": [{"zero": 0.997}]}},
             "12-restart-or-lost": {"summary": {"failures": [{"restart_s": 3.0, "lost_work_s": 0.01}]}}}
    table = exercises()
    assert len({k[:2] for k in table}) >= 8 and all(sum(k.startswith(p) for k in table) >= 2
                                                    for p in ("01", "02", "03", "04", "05", "06", "07", "08"))
    for ex_id in table:
        sol = solution(ex_id, **given.get(ex_id, {}))
        assert check(ex_id, sol, **given.get(ex_id, {})).ok, (ex_id, sol)
        assert question(ex_id)
    assert solution("02-your-busbw", **given["02-your-busbw"]) == "0.7864 GB/s"   # 2^20 B / 2 ms x 2(3)/4
    assert check("04-your-prediction", "4.9 ms", **given["04-your-prediction"]).ok                  # +22%
    assert check("04-your-prediction", "5.5 ms", **given["04-your-prediction"]).status == "wrong"
    with pytest.raises(TypeError, match="needs row"):
        check("02-your-busbw", "1 GB/s")
    # predictions from lesson 04's fit: within 25% of the measurement
    assert check("05-your-prediction", "48 ms", row={"measured_s": 0.040}).ok
    assert check("05-your-prediction", "56 ms", row={"measured_s": 0.040}).status == "wrong"
    assert check("07-your-prediction", "0.6 s", row={"measured_s": 0.5}).ok
    assert check("07-your-prediction", "300 ms", row={"measured_s": 0.5}).status == "wrong"
    assert check("02-your-busbw", "0.95 GB/s", **given["02-your-busbw"]).ok        # 0.786 measured: +21%
    assert check("02-your-busbw", "1.1 GB/s", **given["02-your-busbw"]).status == "wrong"
    # a prediction left unanswered says, once the run is there, what it measured (and marks it for the tests)
    v = check("07-your-prediction", None, row={"measured_s": 0.5})
    assert v.status == "unanswered" and v.message.endswith("; measured: 500 ms") and 'data-expected="500.0"' in \
        v._repr_html_()
    # every exercise that takes your measurement is such a prediction (issue 21: predict before measuring)
    assert all(ex.prediction for ex in exercises().values() if ex.needs)


def test_ddp_and_fsdp_exercises_follow_the_library():
    """Lessons 05 and 06: the expected answers are the rules of PyTorch's Reducer and of ZeRO."""
    # REFERENCES.md: 6 x Linear(1024, 1024), default cap -> rebuilt buckets 4 MiB + 20 MiB (first: bias + weight)
    assert solution("05-first-bucket") == "4.004 MiB" and check("05-first-bucket", "4.004 MiB").ok
    assert "the weight alone" in check("05-first-bucket", "4 MiB").message        # the bias arrived first
    assert check("05-first-bucket", "1 MiB").status == "wrong"
    assert check("05-first-bucket", "4.1984 MB").ok                              # = 4.0039 MiB
    assert check("05-buckets", solution("05-buckets")).ok and int(solution("05-buckets")) > 1
    assert check("05-best-cap", solution("05-best-cap")).ok
    assert check("05-best-cap", "1").status == "wrong" and check("05-best-cap", "7").status == "unreadable"
    # no_sync: one all-reduce per bucket per optimizer step, whatever grad_accum is
    assert solution("05-no-sync") == str(len(simulate(scenario("gpt2-medium", nodes=2, micro_batch=4))["buckets"]))
    # ZeRO: 16 bytes per parameter (bf16 params and grads, K = 12), sharded 1/N at stage 3
    from distlab.sim.models import model_from_spec
    psi = model_from_spec("llama-7b").num_params
    assert float(solution("06-zero3-memory").split()[0]) == pytest.approx(16 * psi / 64 / 2**30, rel=1e-3)
    assert float(solution("06-zero1-memory").split()[0]) == pytest.approx((4 + 12 / 64) * psi / 2**30, rel=1e-3)
    assert "GB against GiB" in check("06-zero3-memory", solution("06-zero3-memory").replace("GiB", "GB")).message
    assert 1.4 < float(solution("06-comm-ratio").rstrip("x")) <= 1.5              # 1.5x, less the root's regather
    assert solution("06-all-gathers") == "9"                                       # 5 forward + 4 backward


def test_ddp_and_fsdp_helpers():
    from distlab.sim.lessons import (bucket_table, collectives_table, fastest, plot_fsdp, plot_timeline, summary_table,
                             sweep, sweep_table, world_sweep, zero_bytes, zero_table)
    d = scenario("gpt2-medium", "ddp", nodes=2, micro_batch=4)
    r = simulate(d)
    s = r["summary"]
    assert s["step_s"] > s["compute_s"] > 0 and 0 < s["exposed_comm_s"] < s["comm_s"] and 0 < s["overlap_pct"] < 100
    launches = [b["ddp_launch_s"] for b in r["buckets"]]
    assert launches == sorted(launches) and all(b["ddp_launch_s"] >= b["ready_s"] for b in r["buckets"])
    assert "overlap" in str(summary_table(s)) and len(bucket_table(r["buckets"]).rows) == len(r["buckets"])
    rows = sweep(d, "bucket_cap_mb", [1, 5, 10, 25, 50, 100, 400])
    steps = [x["step_s"] for x in rows]
    best = steps.index(min(steps))
    assert 0 < best < len(steps) - 1, "the bucket-size sweep is U-shaped"
    assert fastest(rows, "bucket_cap_mb") == rows[best]["bucket_cap_mb"]
    assert [x["buckets"] for x in rows] == sorted([x["buckets"] for x in rows], reverse=True)
    assert "buckets" in str(sweep_table(rows, "bucket_cap_mb"))
    assert plot_timeline(r["trace"])._repr_png_()[:4] == b"\x89PNG"
    # ZeRO: the paper's example, 7.5B parameters on 64 GPUs: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB
    from distlab.sim.models import mlp
    flat = mlp(64, 7_500_000_000 // 64 // 64 * 64, bias=False, dtype="bfloat16")
    totals = [zero_bytes(flat, 64, z)["total"] / 1e9 for z in (0, 1, 2, 3)]
    assert totals == pytest.approx([120, 31.4, 16.6, 1.9], rel=0.02)
    assert len(zero_table("llama-7b", 8).rows) == 4
    ws = world_sweep("llama-7b", [8, 16])
    assert ws["memory"]["ZeRO-3"][1] == pytest.approx(ws["memory"]["ZeRO-3"][0] / 2, rel=0.01)
    assert ws["memory"]["DDP"][0] == ws["memory"]["DDP"][1]
    assert ws["comm"]["ZeRO-3"][0] > ws["comm"]["ZeRO-2"][0] == pytest.approx(ws["comm"]["DDP"][0], rel=0.01)
    f = simulate(scenario(CPU_FSDP_MODEL, "fsdp", cluster="localhost-cpu"))
    assert f["report"]["peak_memory"]["total"] > 0 and plot_fsdp(f)._repr_png_()[:4] == b"\x89PNG"
    assert collectives_table(f["plan"]).rows[0][2] == "all_gather"
    fr = sweep(scenario("llama-7b", "fsdp", micro_batch=1), "reshard_after_forward", [True, False])
    assert fr[0]["peak_GiB"] < fr[1]["peak_GiB"] and fr[0]["comm_s"] > fr[1]["comm_s"]
    assert "peak memory" in str(sweep_table(fr, "reshard_after_forward"))


def test_pipeline_exercises_follow_the_formulas():
    """Lesson 07: bubbles (p-1)/(m+p-1) and (p-1)/(v·m+p-1), peak in flight m (GPipe) and p - s (1F1B)."""
    assert check("07-bubble", f"{3 / 11 * 100:.2f}%").ok and check("07-bubble", "27%").ok
    assert check("07-bubble", 0.2727).status == "wrong unit"                      # a fraction, not %
    assert check("07-bubble", "42.9%").status == "wrong"                           # (p-1)/m
    assert check("07-interleaved", f"{3 / 19 * 100:.2f}%").ok
    assert solution("07-memory") == "1.125 GiB" and check("07-memory", "1152 MiB").ok
    assert check("07-memory", "1.5 GiB").status == "wrong"                         # GPipe's peak, not the saving
    assert solution("07-zbh1") == "6 ms" and check("07-zbh1", "0.006 s").ok


def test_pipeline_helpers():
    from distlab.sim.lessons import (pipeline_measured_table, pipeline_metrics, pipeline_sweep_table, pipeline_table,
                             pipeline_trace, plot_bubble_sweep, plot_pipeline)
    from distlab.sim.lessons.pipelines import bubble_sweep
    for p, m in ((2, 4), (4, 8), (8, 16)):
        for s in ("gpipe", "1f1b"):
            assert pipeline_metrics(s, p, m).bubble == pytest.approx((p - 1) / (m + p - 1))
        assert pipeline_metrics("interleaved", p, m, 2).bubble == pytest.approx((p - 1) / (2 * m + p - 1))
    g, o, z = (pipeline_metrics(s, 4, 16) for s in ("gpipe", "1f1b", "zbh1"))
    assert g.peak_in_flight == {s: 16 for s in range(4)} and o.peak_in_flight == {s: 4 - s for s in range(4)}
    assert z.bubble < o.bubble and max(z.peak_rank_memory) == max(o.peak_rank_memory) == 4
    assert pipeline_metrics("zbv", 4, 16, 2).bubble < z.bubble
    assert pipeline_metrics("1f1b", 4, 8, activation_bytes=96 * 2**20).peak_rank_memory[0] == 4 * 96 * 2**20
    t = pipeline_table([("gpipe", 4, 8, 1), ("zbh1", 4, 8, 1)])
    assert t.rows[0][5] == t.rows[0][6] == "27.3%" and t.rows[1][6] == "-"
    sw = bubble_sweep(4, [4, 8])
    assert sw["simulated"]["1f1b"] == pytest.approx(sw["formula"]["(p-1)/(m+p-1)"])
    assert sw["simulated"]["interleaved v=2"] == pytest.approx(sw["formula"]["(p-1)/(2m+p-1)"])
    assert plot_bubble_sweep(4, [4, 8])._repr_png_()[:4] == b"\x89PNG"
    assert plot_pipeline(pipeline_trace("zbv", 2, 4, 2))._repr_png_()[:4] == b"\x89PNG"
    from distlab.sim.scenario.pipeline import sweep_results
    rows = sweep_results(scenario("gpt2-medium", "pipeline", schedule="1f1b", stages=4, microbatches=4),
                         "microbatches", [4, 8])
    assert rows[1]["bubble"] < rows[0]["bubble"] and "bubble" in str(pipeline_sweep_table(rows, "microbatches"))
    row = {"schedule": "1f1b", "v": 1, "predicted_s": 0.05, "replay_s": 0.05, "measured_s": 0.04, "error_pct": 25.0,
           "ideal_bubble": 1 / 9, "predicted_bubble": 0.2, "measured_bubble": 0.3}
    assert pipeline_measured_table([row]).rows[0][5] == "+25.0%"


def test_verdict_shows_in_jupyter_and_in_text():
    v = check("03-nic", 3200)                              # bare: the answer in Gb/s, not GB/s
    assert str(v).startswith("✘ [03-nic] wrong unit:")
    html = v._repr_html_()
    assert 'class="distlab-verdict distlab-wrong-unit"' in html and "Gb/s" in html
    assert "distlab-correct" in check("03-nic", 400)._repr_html_()


def test_units_parse():
    assert parse("3.2 ms").to("s") == pytest.approx(0.0032)
    assert parse("400 Gbps").to("GB/s") == pytest.approx(50)
    assert parse("1 GiB").to("MiB") == 1024
    assert parse("2.5e3 µs").to("ms") == pytest.approx(2.5)
    assert parse("1,048,576 B").value == 2**20 and parse("1,024.5 B").value == 1024.5
    assert parse(7).unit is None
    with pytest.raises(UnitError):
        parse("3.2 ms").to("GB/s")
    with pytest.raises(UnitError):
        parse("ms 3")
    with pytest.raises(UnitError):
        parse(True)


# --- helpers -------------------------------------------------------------------------------------------------
def test_tables_figures_and_sweeps():
    t = ranks_table(2, 4)
    assert len(t.rows) == 8 and t.rows[6][:3] == ["1", "2", "6"]      # node 1, LOCAL_RANK 2, RANK 6
    assert "<table" in t._repr_html_() and "LOCAL_RANK" in str(t)
    rows = simulate_sweep("all_reduce", [2**20, 2**24], "dgx-h100")
    assert [r["bytes"] for r in rows] == [2**20, 2**24] and rows[1]["busbw_GBps"] > rows[0]["busbw_GBps"] > 0
    f = Figure()
    f.ax.plot([1, 2], [3, 4])
    assert f._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
    assert isinstance(Table(["a"], [[1]]), Table)


def test_sim_lessons_and_tp_launcher_do_not_import_torch():
    """sim never imports torch; nor does lesson 09's launching side (runtime/parallel/tp/lesson.py -> run.py: only its
    ranks need torch, and a kernel importing it pays ~2.7 s of CPU)."""
    import subprocess
    import sys
    code = ("import sys, distlab.sim.lessons, distlab.sim.lessons.bank, distlab.sim.commands.lessons; "
            "import distlab.runtime.parallel.tp.lesson, distlab.runtime.parallel.tp.run, distlab.runtime.parallel.tp.validate; "
            "L = distlab.sim.lessons; "
            "L.check('03-two-nodes', '5 ms'); L.check('05-best-cap', '25'); "
            "L.check('06-all-gathers', 9); L.check('07-zbh1', '6 ms'); "
            "L.plot_pipeline(L.pipeline_trace('zbv', 2, 4, 2)); "
            "assert 'torch' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --- distlab lessons ----------------------------------------------------------------------------------------
def test_lessons_command_without_jupyterlab(monkeypatch, capsys):
    import importlib.util

    from distlab.sim.commands import lessons
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jupyterlab" else real(name, *a))
    rc = lessons.run(argparse.Namespace(no_browser=True, port=None, dir=None))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and 'pip install -e ".[lessons]"' in err


def test_lessons_command_line(cli):
    from distlab.sim.commands.lessons import command, lessons_dir
    assert lessons_dir() and os.path.isfile(os.path.join(lessons_dir(), "01_processes_and_collectives.ipynb"))
    cmd = command("/x", no_browser=True, port=8899)
    assert cmd[1:3] == ["-m", "jupyterlab"] and "--no-browser" in cmd and "--port=8899" in cmd
    rc, out, _ = cli("lessons", "--help")
    assert rc == 0 and "--no-browser" in out and "--port" in out
    rc, _, err = cli("lessons", "--port", "70000", "--no-browser")
    assert rc == 2 and ("port" in err or "JupyterLab is not installed" in err)


# --- real runs (runtime/lessons/) ------------------------------------------------------------------------
@pytest.mark.slow
def test_collectives_demo_every_rank():
    from distlab.runtime.lessons import collectives_demo
    d = collectives_demo(nproc=4, ops=("all_reduce", "reduce_scatter", "all_to_all"))
    assert [e["RANK"] for e in d["env"]] == ["0", "1", "2", "3"] and d["env"][0]["WORLD_SIZE"] == "4"
    assert d["groups"][0]["metadata group"] == "gloo"
    assert all(r["after"] == [60.0, 64.0, 68.0, 72.0] for r in d["results"]["all_reduce"])
    assert [r["after"] for r in d["results"]["reduce_scatter"]] == [[60, 64], [68, 72], [76, 80], [84, 88]]
    assert d["results"]["all_to_all"][1]["after"] == [1.0, 11.0, 21.0, 31.0]


@pytest.mark.slow
def test_check_all_reduce_catches_a_wrong_ring(tmp_path):
    from distlab.runtime.lessons import check_all_reduce
    bad = tmp_path / "bad_ring.py"
    bad.write_text("import torch.distributed as dist\n"
                   "def ring(x):\n"
                   "    r, n = dist.get_rank(), dist.get_world_size()\n"
                   "    req = dist.isend(x.clone(), (r + 1) % n)\n"
                   "    buf = x.clone()\n"
                   "    dist.recv(buf, (r - 1) % n)\n"
                   "    req.wait()\n"
                   "    return x + buf\n")                       # only the left neighbour's data
    rows = check_all_reduce(f"{bad}:ring", nproc=3, world_sizes=[2, 3])    # one launch, both ring sizes
    two, three = ([r for r in rows if r["world_size"] == k] for k in (2, 3))
    assert len(two) == 2 and all(r["ok"] and r["sends"] == 1 and r["recvs"] == 1 for r in two)  # right on 2 ranks
    assert len(three) == 3 and not any(r["ok"] for r in three)                                  # wrong on 3


@pytest.mark.slow
def test_ddp_bucket_sweep_measures_and_predicts():
    from distlab.runtime.lessons import ddp_bucket_sweep
    r = ddp_bucket_sweep(CPU_DDP_MODEL, [2, 16], nproc=2, steps=2, warmup=2, calibrate=(2**20, 2**22))
    assert [x["bucket_cap_mb"] for x in r["rows"]] == [2, 16]
    assert [x["buckets"] for x in r["rows"]] == [x["measured_buckets"] for x in r["rows"]] == [6, 1]
    assert all(x["predicted_s"] > 0 and x["measured_s"] > 0 for x in r["rows"])
    assert len(r["results"][0]) == 2 and "local" in r["results"][0][0] and "local" not in r["results"][1][0]


@pytest.mark.slow
def test_pipeline_predict_measure(monkeypatch):
    from distlab.runtime.lessons import QUICK_ENV, pipeline_predict_measure
    monkeypatch.setenv(QUICK_ENV, "1")          # as the notebook test runs it: shorter block timings
    r = pipeline_predict_measure([("1f1b", 1), ("zbv", 2)], nproc=2, microbatches=4, blocks_per_rank=2, width=64,
                                 rows=8, steps=1)
    assert [x["schedule"] for x in r["rows"]] == ["1f1b", "zbv"] and len(r["measured"]) == len(r["predicted"]) == 2
    assert all(x["predicted_s"] > 0 and x["measured_s"] > 0 and x["replay_s"] > 0 for x in r["rows"])
    assert r["rows"][0]["ideal_bubble"] == pytest.approx(1 / 5) and r["rows"][1]["ideal_bubble"] is None
    from distlab.sim.parallel.pipeline import metrics as M
    assert [str(a) for a, _ in M.actions_of(r["measured"][0], 0)] == [str(a) for a, _ in
                                                                     M.actions_of(r["predicted"][0], 0)]
    assert {"F", "B", "I", "W", "latency_s", "overhead_s"} <= set(r["calibration"])


@pytest.mark.slow
def test_fsdp_predict_measure():
    """The lesson's model made small (2 blocks of width 64: 0.14M parameters, not 5.2M): the helper is the same,
    the launch cheaper. Collectives per step: all-gathers root + 2 blocks forward, the 2 blocks again backward
    when resharded, reduce-scatters root + 2 blocks."""
    from distlab.runtime.lessons import fsdp_predict_measure
    small = {**CPU_FSDP_MODEL, "layers": 2, "hidden": 64, "heads": 2, "seq_len": 16, "vocab": 101}
    r = fsdp_predict_measure(small, {"a": {}, "b": {"reshard_after_forward": False}}, steps=1)
    assert [x["variant"] for x in r["rows"]] == ["a", "b"] and all(x["sequence_match"] for x in r["rows"])
    assert [x["collectives"] for x in r["rows"]] == [3 + 2 + 3, 3 + 3]
    assert all(x["predicted_s"] > 0 and x["measured_s"] > 0 for x in r["rows"]) and len(r["traces"]) == 2


def test_quick_mode_repeats_less(monkeypatch):
    """tests/test_lessons_notebooks.py sets DISTLAB_LESSONS_QUICK=1: the real-run helpers then repeat less."""
    from distlab.runtime.lessons import QUICK_ENV, fewer, quick
    monkeypatch.delenv(QUICK_ENV, raising=False)
    assert not quick() and fewer(6, 2) == 6
    monkeypatch.setenv(QUICK_ENV, "1")
    assert quick() and fewer(6, 2) == 2 and fewer(1, 2) == 1
    monkeypatch.setenv(QUICK_ENV, "0")
    assert not quick()


def test_the_tp_diagram_draws_the_plans_collectives():
    """sim/lessons/tp_diagram.py: one block's collectives, forward in order and backward in reverse with their
    counts, equal the simulator's TP plan for the same options (per block: the 3-block plan less the 2-block
    one), which tests/test_tp_runtime.py checks against torch; the figure draws all three plans."""
    from distlab.sim.lessons.bank_tp import LESSON_MODEL, PLANS, sequence
    from distlab.sim.lessons.tp_diagram import block_collectives, block_flow, plot_block
    from distlab.sim.models import gpt
    keys = ("hidden", "heads", "kv_heads", "seq_len", "vocab", "micro_batch", "dtype", "arch", "ffn_hidden")
    spec = {k: LESSON_MODEL.config[k] for k in keys}
    for options in PLANS:
        flow = block_flow(options["sequence_parallel"], options.get("prepare_input", False))
        for phase in ("forward", "backward"):
            two, three = ([k for k, _, _, _, ph in sequence(gpt(layers=n, **spec), 2, **options) if ph == phase]
                          for n in (2, 3))
            extra = len(three) - len(two)
            assert extra == len(block_collectives(flow, phase)), (options, phase)
            # the added block's calls sit inside the sequence; as a multiset they are the diagram's
            assert sorted(block_collectives(flow, phase)) == sorted(
                k for k in set(three) for _ in range(three.count(k) - two.count(k)))
    assert plot_block()._repr_png_()[:4] == b"\x89PNG"


def test_profile_summary_and_merge_on_a_made_up_trace(tmp_path):
    """sim/lessons/profiling.py on a two-step profile written by hand in torch.profiler's layout: the last step
    from DDP's forward to the optimizer's end, busy time as the union of the main thread's ops, gloo's
    collectives on their own thread; the merged file holds the measured and the predicted processes."""
    import json

    from distlab.sim.lessons.pipelines import pipeline_trace
    from distlab.sim.lessons.profiling import merge_with_prediction, profile_table, read_profile, summary

    def x(name, ts, dur, tid=1):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}
    events = [{"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}}]
    for start in (0, 1000):
        events += [x("DistributedDataParallel.forward", start, 100), x("aten::mm", start + 20, 50),
                   x("autograd::engine::evaluate_function: AddmmBackward0", start + 150, 300),
                   x("c10d::allreduce_", start + 460, 10), x("gloo:all_reduce", start + 300, 250, tid=2),
                   x("Optimizer.step#Adam.step", start + 600, 100)]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    s = summary(read_profile(str(path)))
    assert s["start_us"] == 1000 and s["step_ms"] == pytest.approx(0.7)
    assert s["busy_ms"] == pytest.approx((100 + 300 + 10 + 100) / 1e3) and s["gaps_ms"] == pytest.approx(0.19)
    assert s["collectives"] == 1 and s["collective_ms"] == pytest.approx(0.25)
    assert profile_table([str(path)], 0.5e-3).rows[0][1] == "0.70"
    out = merge_with_prediction([str(path)], pipeline_trace("1f1b", 2, 2), str(tmp_path / "both.json"))
    merged = json.loads(open(out).read())["traceEvents"]
    names = {e["args"]["name"] for e in merged if e.get("name") == "process_name"}
    assert {"measured rank 0", "predicted rank 0", "predicted rank 1"} <= names
    first_predicted = min(e["ts"] for e in merged if e.get("ph") == "X" and e["pid"] >= 2000)
    assert first_predicted == pytest.approx(1000)
    with pytest.raises(ValueError, match="not a profile of DDP"):
        summary([x("aten::mm", 0, 1)])


def test_a_real_run_outside_its_lessons_tolerance_says_so():
    """sim/lessons/verdicts.py: the worst row's error against the tolerance, in the title the notebook test reads."""
    from distlab.sim.lessons.verdicts import OUTSIDE, TOLERANCE, verdict
    rows = [{"cap": 2, "predicted_s": 0.09, "measured_s": 0.1}, {"cap": 4, "predicted_s": 0.13, "measured_s": 0.1}]
    t = verdict(rows, "cap", label="DDP")
    assert t.title == f"DDP: worst error +30%: within the lesson's tolerance ({TOLERANCE:.0%})" and OUTSIDE not in t.title
    assert t.rows == [["2", "90.00", "100.00", "-10%"], ["4", "130.00", "100.00", "+30%"]]
    assert OUTSIDE in verdict(rows, "cap", tolerance=0.2).title


def test_lesson_06_communicator_section_says_what_the_simulator_shows():
    """sim/lessons/bank_fsdp.py group_table: on the shard group FSDP2's backward all-gathers and reduce-scatters
    never move data at once (06-one-group: 0 ms); on a group of their own they do, each slower; llama-7b's blocks
    gain nothing ('same', the prose's claim), small blocks on 8 nodes gain (the prose's latency-bound case)."""
    from distlab.sim.lessons import bank_fsdp as F
    from distlab.sim.lessons import check, solution
    cases = list(F.GROUP_CASES)
    for case in cases:
        one, own = F.group_what_if(case)
        assert not one["separate_reduce_scatter_group"] and own["separate_reduce_scatter_group"]
        assert one["ag_rs_overlap_s"] == 0 and own["ag_rs_overlap_s"] > 0
        assert own["reduce_scatter_s"] > one["reduce_scatter_s"]            # sharing the links
    assert F.separate_group_verdict(cases[0]) == "same" and F.separate_group_verdict(cases[1]) == "faster"
    assert solution("06-one-group") == "0 ms" and check("06-one-group", "0 ms").ok
    assert not check("06-one-group", "3 ms").ok and check("06-separate-rs", "same").ok
    assert len(F.group_table().rows) == 4


def test_a_busy_machine_is_not_judged_and_an_idle_one_is():
    """sim/lessons/verdicts.py: outside the tolerance with other processes using more than 10% of the cores during
    the run is "not judged" (with why); on an idle machine it stays OUTSIDE, which fails the notebook test."""
    from distlab.sim.lessons.verdicts import NOT_JUDGED, OUTSIDE, verdict
    rows = [{"cap": 1, "predicted_s": 0.2, "measured_s": 0.1}]
    busy = verdict(rows, "cap", 0.5, background={"background_cores": 0.9, "cores": 2}).title
    idle = verdict(rows, "cap", 0.5, background={"background_cores": 0.05, "cores": 2}).title
    assert NOT_JUDGED in busy and "0.90 of 2 cores" in busy and OUTSIDE not in busy
    assert OUTSIDE in idle and NOT_JUDGED not in idle
    assert OUTSIDE in verdict(rows, "cap", 0.5).title                    # no reading: judged
    within = verdict([{"cap": 1, "predicted_s": 0.11, "measured_s": 0.1}], "cap", 0.5,
                     background={"background_cores": 1.5, "cores": 2}).title
    assert "within" in within


def test_scenario_is_the_typed_object_parsed_once_and_simulate_takes_it(monkeypatch):
    """sim/lessons/training.py ``scenario`` returns the typed Scenario (sim/scenario/spec.py), the same as the
    mapping parsed; ``simulate`` runs it without parsing it again."""
    from distlab.sim import scenario as sc
    from distlab.sim.scenario.spec import Scenario
    s = scenario("gpt2-small", "ddp", cluster="localhost-cpu", micro_batch=1, bucket_cap_mb=5)
    assert isinstance(s, Scenario) and s == sc.from_dict({"model": {"preset": "gpt2-small", "micro_batch": 1},
                                                          "ddp": {"bucket_cap_mb": 5}, "cluster": "localhost-cpu"})

    def parsed_again(*a, **k):
        raise AssertionError("parsed again")
    monkeypatch.setattr(sc, "from_dict", parsed_again)
    monkeypatch.setattr(sc, "validate", parsed_again)
    assert simulate(s)["summary"]["step_s"] > 0
