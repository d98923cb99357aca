"""Issue 41, items 2, 5-7: data files run no code, resources are bounded before anything starts, names from files
reach the terminal escaped, a Dask scheduler off this machine needs TLS or an explicit flag. Every command runs in
this process (tests/cli_in_process.py); no rank is started."""
from __future__ import annotations

import os
import sys

import pytest
import yaml

from cli_in_process import cli  # noqa: F401  (the fixture)

EVIL = "import os\nopen(os.environ['PWNED_MARKER'], 'w').close()\ndef build():\n    return None\n"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """evilmod.py beside a shared YAML file (and on sys.path, as the issue's current folder was): importing it
    writes the marker."""
    (tmp_path / "evilmod.py").write_text(EVIL)
    marker = tmp_path / "PWNED"
    monkeypatch.setenv("PWNED_MARKER", str(marker))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    sys.modules.pop("evilmod", None)


def test_a_factory_in_a_scenario_or_jobs_file_is_refused_without_the_flag(cli, tmp_path, planted):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({"model": {"factory": "evilmod:build"}, "ddp": {}, "cluster": "dgx-h100"}))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"cluster": "dgx-h100", "nodes": 2, "jobs": [
        {"name": "a", "scenario": {"model": {"factory": "evilmod:build"}, "ddp": {}}, "nodes": 1}]}))
    runs = tmp_path / "runs.yaml"
    runs.write_text(yaml.safe_dump({"runs": [{"name": "r", "source": "x", "model": {"factory": "evilmod:build"},
                                              "gpu": "a100", "cluster": "dgx-a100", "gpus": 8,
                                              "layout": {"tp": 1, "pp": 1, "dp": 8}, "global_batch": 16,
                                              "micro_batch": 1, "precision": "float16",
                                              "reported": {"tflops_per_gpu": 100}}]}))
    question = tmp_path / "q.yaml"
    question.write_text(yaml.safe_dump({"model": "evilmod:build", "cluster": "dgx-h100", "nodes": 1}))
    for argv in (["simulate", scenario, "--no-files"], ["cluster", jobs, "--no-files"], ["reproduce", runs],
                 ["plan", question]):
        rc, _, err = cli(*argv)
        assert rc == 2 and err.count("\n") == 1, (argv, err)
        assert "factory 'evilmod:build' would import and run Python code" in err and "--allow-code" in err, err
        assert not planted.exists(), argv
    rc, _, err = cli("simulate", scenario, "--no-files", "--allow-code")      # asked for: it runs (and fails)
    assert rc == 2 and planted.exists() and "evilmod:build returned NoneType, not a model" in err, err


def test_a_factory_given_as_model_runs_and_the_current_folder_is_not_on_the_path(cli, tmp_path, monkeypatch):
    (tmp_path / "herefactory.py").write_text("raise SystemExit('imported from the current folder')\n")
    monkeypatch.chdir(tmp_path)
    rc, _, err = cli("memory", "--model", "herefactory:build")
    assert rc == 2 and "cannot import herefactory: ModuleNotFoundError" in err, err


@pytest.mark.parametrize("factory, message", [
    ("sys:exit", "sys:exit raised SystemExit(None): a factory must return a model, not exit"),
    ("builtins:input", "builtins:input raised EOFError: it read from stdin"),
    ("builtins:dict", "builtins:dict returned dict, not a model"),
])
def test_a_factory_that_exits_reads_stdin_or_returns_no_model_is_one_line(cli, factory, message):
    """Before: --model sys:exit exited 0 silently; builtins:input waited on stdin."""
    rc, _, err = cli("memory", "--model", factory)
    assert rc == 2 and err.count("\n") == 1 and message in err, err


def test_a_bench_that_cannot_fit_in_memory_is_refused_before_spawning(cli, monkeypatch):
    """Before: bench --sizes 8GiB let the ranks be killed for memory; 1024TiB failed inside the ranks."""
    from distlab.runtime.ranks import forkserver, preflight
    monkeypatch.setattr(forkserver, "spawn", lambda *a: pytest.fail("a rank was started"))
    monkeypatch.setattr(preflight, "mem_available", lambda *a: 16 * 2**30)
    rc, out, err = cli("bench", "--sizes", "8GiB", "--nproc", "4")
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert ("a sweep up to 8 GiB (float32) needs about 8.3 GiB per rank (collective buffers 8.0 GiB, torch 0.3 GiB) "
            "x 4 ranks = 33.2 GiB, but this host has 16.0 GiB available (MemAvailable)") in err, err
    rc, _, err = cli("bench", "--sizes", "4GiB", "--nproc", "4", "--ops", "all_gather")    # in and out buffers
    assert rc == 2 and "(collective buffers 5.0 GiB, torch 0.3 GiB) x 4 ranks = 21.2 GiB" in err, err


ESCAPES = "\x1b[2J\x1b]0;owned\x07\u202e"          # clear the screen, retitle the terminal, reverse the line
SHOWN = "\\x1b[2J\\x1b]0;owned\\x07\\u202e"


def test_names_from_files_reach_the_terminal_escaped(cli, tmp_path):
    """Before: plan and cluster names with escape sequences reached the terminal raw."""
    import json
    plan = tmp_path / "p.json"
    op = {"kind": "collective", "op": "all_reduce", "bytes": 1024}
    plan.write_text(json.dumps({"format": "distlab-plan/1", "name": "p" + ESCAPES, "ranks": [[op], [op]]}))
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump({"name": "c" + ESCAPES, "nodes": 1, "gpus_per_node": 2, "gpu": "h100",
                                       "intra_node": {"kind": "nvswitch", "bandwidth_GBps": 450, "latency_us": 0.6}}))
    jobs = tmp_path / "j.yaml"
    jobs.write_text(yaml.safe_dump({"cluster": "dgx-h100", "nodes": 1, "jobs": [
        {"name": "j" + ESCAPES, "scenario": {"model": {"preset": "gpt2-small"}, "ddp": {}}, "nodes": 1}]}))
    runs = [["simulate", plan, "--no-files"], ["collective", "all_reduce", "--size", "1KiB", "--cluster", cluster],
            ["cluster", jobs, "--no-files"], ["simulate", plan, "--no-files", "--cluster", "nope" + ESCAPES]]
    for argv in runs:
        rc, out, err = cli(*argv)
        assert "\\x1b[2J\\x1b]0;owned" in out + err and "\\u202e" in out + err, (argv, out, err)
        assert not any(c in out + err for c in "\x1b\x07\u202e"), argv
    assert rc == 2 and err.count("\n") == 1               # the last: an error line naming the bad cluster


def test_figure_titles_are_escaped(tmp_path):
    from matplotlib.figure import Figure

    from distlab.sim.files import save_figure
    fig = Figure()
    ax = fig.add_subplot()
    ax.set_title("plan" + ESCAPES)
    save_figure(fig, str(tmp_path / "f.png"))
    assert ax.get_title() == "plan" + SHOWN


def test_a_scheduler_off_this_machine_needs_tls_or_the_flag(cli):
    from distlab.sim.errors import ConfigError
    from distlab.sim.workers import check_scheduler
    for ok in ("tcp://127.0.0.1:8786", "localhost:8786", "tcp://[::1]:8786", "tls://10.0.0.1:8786", None):
        check_scheduler(ok)
    with pytest.raises(ConfigError, match="off this machine and not TLS"):
        check_scheduler("tcp://10.0.0.1:8786")
    check_scheduler("tcp://10.0.0.1:8786", insecure=True)
    rc, _, err = cli("cluster", "scenarios/multi-job/cluster-1024-h100.yaml", "--sweep", "oversubscription=1,2",
                     "--scheduler", "tcp://10.0.0.1:8786", "--no-files")
    assert rc == 2 and "--insecure-scheduler" in err and err.count("\n") == 1, err
