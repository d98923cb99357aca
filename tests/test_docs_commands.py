"""Issue 43.4: every `distlab ...` command README.md and docs/*.md give runs as written on a fresh clone. The
commands are extracted by scripts/readme_examples.py ``commands`` (fenced lines, README's command table, inline
commands that name a file). Each one: no placeholder (FILE, SCENARIO), parses, and every file it reads is shipped
or written by a command before it on the same page. The simulator's commands then run in this process (files to
a temporary folder; those listed in SLOW parse only, each with its cost), and README's run -> compare -> diagnose
sequence runs on real ranks once, on the shipped scenarios/small-plan.json."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import shlex

import pytest

from cli_in_process import run_in_process

ROOT = pathlib.Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_spec = importlib.util.spec_from_file_location("readme_examples", ROOT / "scripts" / "readme_examples.py")
examples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(examples)

OUTPUT_FLAGS = ("--out", "--save-plan", "--dump-dir", "--plot", "--perfetto", "--save", "--timeline")
# commands that measure this machine for minutes (real ranks), open JupyterLab, or need machines this test does
# not have (a Dask scheduler, a second node): parsed and their files checked, not run here
ELSEWHERE = ("bench", "calibrate", "validate", "lessons", "run", "compare", "diagnose")
# simulator commands that take longer than this suite can give one check (2-core CPU seconds, in-process): parsed
# and their files checked; benchmarks/ and the named tests run the same paths
SLOW = {"plan --model llama3-70b --nodes 8 --global-batch 256": "~60 s (tests/test_planner.py plans smaller)",
        "plan --model llama3-405b --nodes 2048 --global-batch 2048": "~100 s (benchmarks/planner_scale.py)",
        "plan --model llama3-8b --nodes 1 --global-batch 32 --as-published megatron-2021 --json": "~27 s",
        "reproduce --plot runs.png": "minutes (tests/test_reproduce.py)",
        "cluster scenarios/multi-job/cluster-1024-h100.yaml": "~60 s (tests/test_jobs_many.py)",
        "simulate --model llama3-405b --cluster dgx-h100 --nodes 2048 --mesh pp=16,dp_shard=128,tp=8 "
        "--microbatches 16": "~60 s (a smaller copy in tests/test_frontdoor.py)",
        "simulate --mesh pp=2,dp_shard=2,tp=2 --model llama3-8b --sweep microbatches=2,4,8": "~9 s",
        "simulate --mesh pp=4,tp=2 --model llama3-8b --microbatches 8": "~3 s (tests/test_compose_cli.py)",
        "simulate scenarios/fsdp-llama-7b.yaml --sweep separate_reduce_scatter_group=false,true":
            "~3 s (tests/test_communicators.py runs the sweep on a smaller FSDP)"}


def all_commands() -> list[tuple[str, str]]:
    return [(page.name, c) for page in PAGES for c in examples.commands(page.read_text())]


def argv_of(command: str) -> list[str]:
    return shlex.split(command)[1:]


def is_slow(argv: list[str]) -> bool:
    text = " ".join(argv)
    return text in SLOW or any(text.startswith(k) and "--scheduler" in argv for k in SLOW) or \
        argv[0] == "cluster" and "cluster-1024-h100.yaml" in text


def test_the_pages_give_commands():
    cmds = all_commands()
    assert len(cmds) >= 40
    pages = {p for p, _ in cmds}
    assert {"README.md", "multinode.md", "calibration.md", "plans.md", "multi-job.md"} <= pages


def test_every_command_parses_and_reads_only_files_that_exist_or_were_written_before():
    from distlab.runtime.cli import build_parser
    parser, _ = build_parser()
    written: dict[str, set] = {}
    for page, command in all_commands():
        argv = argv_of(command)
        caps = [w for w in argv if w.isupper() and len(w) > 1]
        assert not caps, f"{page}: `{command}`: placeholder {caps[0]}"
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page}: `{command}` does not parse")
        outs = written.setdefault(page, set())
        flag_values = {argv[i + 1] for i, w in enumerate(argv[:-1]) if w in OUTPUT_FLAGS}
        for word in argv[1:]:
            if word in flag_values or word.startswith("-") or not examples.FILE_WORD.search(word):
                continue
            known = (ROOT / word).exists() or word in outs or word.split("/")[-1] in {o.split("/")[-1] for o in outs}
            assert known, f"{page}: `{command}` reads {word}: not shipped, not written by a command before it"
        outs |= flag_values


def sim_commands() -> list[str]:
    """The simulator's commands to run, each once, but README's worked examples: test_docs.py runs those and
    compares their output with the page's."""
    seen = {command for _, command, _ in examples.blocks((ROOT / "README.md").read_text())}
    out = []
    for _, command in all_commands():
        argv = argv_of(command)
        if argv[0] == "calibrate" and "--from-nccl-tests" in argv:    # reads logs, starts no ranks: runs here
            pass
        elif argv[0] in ELSEWHERE or "--scheduler" in argv or "--nnodes" in argv or is_slow(argv) or command in seen:
            continue
        seen.add(command)
        out.append(command)
    return out


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory):
    """A folder that looks like the repository's for relative paths (scenarios/ linked), where written files go."""
    folder = tmp_path_factory.mktemp("clone")
    (folder / "scenarios").symlink_to(ROOT / "scenarios")
    (folder / "tests").mkdir()
    (folder / "tests" / "data").symlink_to(ROOT / "tests" / "data")      # the vendored logs and traces
    return folder


def test_every_simulator_command_runs_as_written(fresh_clone, capsys, monkeypatch):
    """In page order (a plan a page saves is there for its next command); --no-files where a command writes a
    trace and a timeline, and no --plot (their drawing is seconds of CPU; the figures have tests of their
    own)."""
    monkeypatch.chdir(fresh_clone)
    ran = []
    for command in sim_commands():
        argv = argv_of(command)
        if argv[0] in ("simulate", "cluster") and "--no-files" not in argv:
            argv.append("--no-files")            # --save-plan still writes its plan
        if "--plot" in argv:                     # a figure is seconds of drawing (test_frontdoor.py draws them)
            i = argv.index("--plot")
            del argv[i:i + 2]
        rc, out, err = run_in_process(capsys, *argv)
        assert rc == 0, f"`{command}`: exit {rc}: {err}"
        assert out.strip(), command
        ran.append(command)
    assert len(ran) >= 9, ran


@pytest.mark.slow
def test_readme_run_compare_diagnose_on_the_small_plan(fresh_clone, capsys, monkeypatch):
    """README's command table in order, on real ranks: run writes the trace and the flight records, compare reads
    the trace, diagnose the records; the plan is small enough to run in seconds on 2 CPU cores."""
    monkeypatch.chdir(fresh_clone)
    table = [c for c in examples.commands((ROOT / "README.md").read_text())
             if argv_of(c)[0] in ("check", "run", "compare", "diagnose")]
    assert [argv_of(c)[0] for c in table] == ["check", "run", "compare", "diagnose"]
    for command in table:
        rc, out, err = run_in_process(capsys, *argv_of(command))
        assert rc == 0, f"`{command}`: exit {rc}: {err}"
    assert os.path.isfile("m.trace") and os.path.isdir("m.flight")
