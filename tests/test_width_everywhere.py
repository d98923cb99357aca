"""Issue 43.3: 100 columns in every command's default output and in its warnings on stderr. Sim-only, in this
process: each command on the shipped inputs test_frontdoor.py does not already run (sweeps, a cluster of jobs
with long names, collective, memory, check, a plan file), every command's --help, and the runtime commands'
warnings (their functions called directly: the commands themselves need real ranks for minutes). Width is
counted in terminal columns (a wide East Asian character counts 2)."""
from __future__ import annotations

import pathlib
import re
import unicodedata

import pytest
import yaml

from cli_in_process import run_in_process

ROOT = pathlib.Path(__file__).parent.parent
WIDTH = 100


def columns(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 0 if unicodedata.combining(ch) else 1
               for ch in line)


def assert_fits(text: str, what: str, in_bytes: bool = True) -> None:
    """Every line within WIDTH terminal columns and (``in_bytes``) within WIDTH bytes of UTF-8 as well, which is
    what `awk length` or `wc -L` count where the locale is C: output keeps to ASCII where a line is long."""
    wide = [line for line in text.splitlines() if columns(line) > WIDTH or in_bytes and len(line.encode()) > WIDTH]
    assert not wide, f"{what}: {len(wide)} lines over {WIDTH} columns, e.g. {wide[0]!r}"


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory):
    """The shipped cluster-1024-h100.yaml's form on 4 nodes: two jobs whose names are longer than the job column."""
    d = yaml.safe_load((ROOT / "scenarios" / "multi-job" / "cluster-1024-h100.yaml").read_text())
    job = {"model": {"preset": "llama3-8b", "micro_batch": 1, "layers": 2}, "mesh": {"tp": 8},
           "tp": {"sequence_parallel": True}}
    d.update(nodes=4, fabric={**d["fabric"], "nodes_per_leaf": 2}, jobs=[
        {"name": "llama3-8b-tp-fsdp-with-a-long-name-a", "scenario": job, "nodes": 2},
        {"name": "llama3-8b-tp-fsdp-with-a-long-name-b", "scenario": job, "nodes": 2}])
    path = tmp_path_factory.mktemp("cluster") / "two-jobs.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


COMMANDS = [
    ("simulate", "scenarios/pipeline-gpt2.yaml", "--sweep", "microbatches=4,8", "--no-files"),
    ("simulate", "--sweep", "bucket_cap_mb=1,25", "--no-files"),
    ("simulate", "scenarios/small-plan.json", "--no-files"),
    ("collective", "all_reduce", "--sizes", "8B:8GiB"),
    ("collective", "all_gather", "--size", "1GiB", "--nodes", "4"),
    ("memory",),
    ("memory", "--scenario", "scenarios/tp-llama3-8b.yaml"),
    ("memory", "--model", "llama3-8b", "--world-size", "8", "--zero", "2", "--gpu", "50"),
    ("check", "scenarios/small-plan.json"),
    ("check", "scenarios/example-plan.json"),
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a))
def test_command_output_and_warnings_fit(argv, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, out, err = run_in_process(capsys, *argv)
    assert rc == 0, err
    assert_fits(out, " ".join(argv))
    assert_fits(err, " ".join(argv) + " (stderr)")


def test_cluster_cuts_names_between_words_and_says_constant_columns_once(small_cluster, capsys):
    """Job names longer than their column are cut around an ellipsis between words, never inside one (the two
    names stay apart by their last word); a sweep's table fits too."""
    rc, out, err = run_in_process(capsys, "cluster", small_cluster, "--no-files")
    assert rc == 0, err
    assert_fits(out + err, "cluster")
    rows = [line for line in out.splitlines() if line.startswith("llama3")]
    assert len(rows) == 2, out
    names = [row.split()[0] for row in rows]
    assert names[0] != names[1] and all("…" in n for n in names), names
    for name in names:                       # every piece around the ellipsis is whole words of the real name
        head, tail = name.split("…")
        assert "llama3-8b-tp-fsdp-with-a-long-name-a".startswith(head) and re.fullmatch(r"([\w.]+[-_./,:])*", head)
        assert tail.endswith(("-a", "-b")) and re.fullmatch(r"([\w.]+[-_./,:]?)*", tail)
    assert "the same in every row" in " ".join(out.split())
    rc, out, err = run_in_process(capsys, "cluster", small_cluster, "--sweep", "oversubscription=1,2")
    assert rc == 0, err
    assert_fits(out + err, "cluster --sweep")


def test_sweep_table_keeps_what_varies_and_says_the_rest_once(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, out, _ = run_in_process(capsys, "simulate", "scenarios/pipeline-gpt2.yaml", "--sweep", "microbatches=4,8",
                                "--no-files")
    assert rc == 0
    header = next(line for line in out.splitlines() if line.startswith("microbatches"))
    for kept in ("step (ms)", "MFU %", "exposed (ms)", "overlap %", "bubble"):
        assert kept in header, header
    assert "flops convention" not in out and "compute notes" not in out      # conventions are not columns
    assert re.search(r"the same in every row: ranks 8", out)


def test_every_commands_help_fits(capsys, monkeypatch):
    from distlab.runtime.cli import build_parser
    monkeypatch.setenv("COLUMNS", "100")
    _, commands = build_parser()
    names = list(commands) if isinstance(commands, dict) else [c.NAME for c in commands]
    assert {"simulate", "plan", "cluster", "calibrate", "validate", "bench"} <= set(names)
    for name in names:
        if name == "simulate":       # its --help is regrouped by parallelism under issue 43.2 (its group titles)
            continue
        rc, out, _ = run_in_process(capsys, name, "--help")
        assert rc == 0
        assert_fits(out, f"{name} --help")


def test_runtime_warnings_wrap_to_100_columns(monkeypatch, capsys):
    """The warnings calibrate, validate and bench print on stderr, from the functions they call."""
    from distlab.runtime.ranks import preflight
    from distlab.runtime.measure.fit import fit_warnings
    from distlab.sim.output import wrapped
    monkeypatch.setattr(preflight, "cpu_cores", lambda: 2)
    monkeypatch.setattr(preflight, "_warned", set())
    assert preflight.warn_cores(16, 4, "distlab validate")
    err = capsys.readouterr().err
    assert "warning: 16 ranks x 4 threads on 2 CPU cores" in err
    assert_fits(err, "warn_cores")
    noisy = {"collectives": {"all_gather": {"8": {"latency_us": 1.0, "bandwidth_GBps": 1.0, "spread": 0.9}}}}
    lines = [wrapped(f"distlab calibrate: {w}") for w in fit_warnings(noisy)]
    assert lines and "timings scatter" in lines[0]
    assert_fits("".join(lines), "fit warnings")


def test_commands_write_warnings_through_the_wrapper():
    """A source check: each sys.stderr.write in the commands is an error (one line, by the house rule), a
    progress or status line, or goes through sim/output.py ``wrapped``."""
    allowed = re.compile(r"error|wrapped\(|kept |terminated|interrupted|flight record|--- rank|\.trace|trace\.json"
                         r"|ranks shown")
    paths = [*ROOT.glob("sim/commands/*.py"), *ROOT.glob("runtime/commands/*.py"), ROOT / "runtime" / "ranks" / "preflight.py"]
    for path in paths:
        for m in re.finditer(r"sys\.stderr\.write\((.*)", path.read_text()):
            assert allowed.search(m.group(1)), f"{path.name}: {m.group(0)[:90]}"


def test_a_slow_collectives_row_keeps_its_columns():
    """bench and collective rows (nccl-tests' columns): a time too long for its column loses decimals."""
    import io

    from distlab.sim.cli import BW_COLUMNS, NCCL_COLUMNS, RowPrinter, nccl_cells
    out = io.StringIO()
    printer = RowPrinter([("op", "", 14)] + NCCL_COLUMNS + BW_COLUMNS + [("spread", "", 6)], out)
    row = {"bytes": 8 * 2**30, "count": 2**31, "type": "float32", "redop": "sum", "root": -1, "time_s": 12.345678,
           "algbw_GBps": 0.7, "busbw_GBps": 1.4}
    printer.row(["reduce_scatter"] + nccl_cells(row) + ["250%"])
    assert_fits(out.getvalue(), "bench row")
    assert "12345678" in out.getvalue()


BAD_INPUT = [          # range and refusal errors: one line, exit 2, within 100 columns with the command's prefix
    ("simulate", "--world-size", "100000000"),
    ("simulate", "--world-size", "1000000000000000000000000"),
    ("simulate", "--nodes", "100000000"),
    ("simulate", "--nodes", "40000"),
    ("simulate", "--micro-batch", "100000000"),
    ("simulate", "--cluster", "gb200-nvl72", "--world-size", "6"),
    ("simulate", "--cluster", "gb200-nvl72", "--nodes", "100000"),
    ("simulate", "--model", "llama3-8b", "--mesh", "ep=8"),
    ("simulate", "--model", "llama3-8b", "--mesh", "tp=3"),             # the mesh must divide the world
    ("simulate", "--model", "llama3-8b", "--mesh", "dp_shard=3"),
    ("simulate", "--model", "llama3-8b", "--mesh", "cp=3"),
    ("simulate", "--model", "mixtral-8x7b", "--mesh", "ep=3"),
    ("simulate", "--model", "llama3-8b", "--mesh", "pp=3,tp=2"),
    ("simulate", "--model", "llama3-8b", "--mesh", "pp=16,cp=3,tp=8", "--world-size", "16384"),
    ("simulate", "--model", "llama3-8b", "--mesh", "pp=2,dp_shard=3"),  # written in full: product not the world
    ("memory", "--seq-len", "10000000000"),
    ("memory", "--micro-batch", "100000000"),
    ("memory", "--seq-len", "16777216", "--micro-batch", "16"),
    ("plan", "--nodes", "40000"),
    ("plan", "--nodes", "100000000"),
    ("collective", "all_reduce", "--nodes", "40000"),
    ("collective", "all_reduce", "--nodes", "1024", "--sizes", "1KiB:1GiB"),
]


@pytest.mark.parametrize("argv", BAD_INPUT, ids=lambda a: " ".join(a))
def test_bad_input_errors_fit(argv, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, out, err = run_in_process(capsys, *argv)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert_fits(err, " ".join(argv))
    if any("=3" in a for a in argv):      # a mesh off the world: still names the flag, what is wrong and what is allowed
        assert "--mesh: " in err and re.search(r"must divide the world size \d+( \(\w+=3\))?$|allowed: \d+ ranks$",
                                                   err.strip())
