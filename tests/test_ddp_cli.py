"""`distlab simulate` end to end, in this process (tests/cli_in_process.py: the output, exit code and files are
the subprocess's): the default scenario, YAML scenarios, sweeps, bad input."""
import json
import os

import pytest
from cli_in_process import run_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Result:
    def __init__(self, rc, stdout, stderr):
        self.returncode, self.stdout, self.stderr = rc, stdout, stderr


@pytest.fixture
def distlab(capsys, monkeypatch):
    """``distlab(*args, cwd=None)``: `distlab simulate ARGS` run from ``cwd`` (default the repository root)."""
    def run(*args, cwd=None):
        monkeypatch.chdir(cwd or ROOT)
        return Result(*run_in_process(capsys, "simulate", *args))
    return run


def test_no_arguments_runs_the_default_scenario(tmp_path, distlab):
    r = distlab(cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for word in ("step time", "compute", "communication", "exposed communication", "overlap", "bucket", "ready",
                 "launch", "end"):
        assert word in r.stdout
    assert (tmp_path / "distlab-out" / "trace.json").stat().st_size > 1000
    assert (tmp_path / "distlab-out" / "timeline.png").stat().st_size > 1000
    trace = json.loads((tmp_path / "distlab-out" / "trace.json").read_text())
    assert any(e.get("name") == "bucket 0" for e in trace["traceEvents"])


def test_json_and_sweep(tmp_path, distlab):
    r = distlab("--json", "--out", str(tmp_path), "--bucket-cap-mb", "10")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["results"][0]
    assert d["step_s"] > 0 and 0 <= d["overlap_pct"] <= 100 and d["buckets"][0]["bytes"] > 0
    assert d["scenario"]["ddp"]["bucket_cap_mb"] == 10
    r = distlab("--sweep", "bucket_cap_mb=1,25,400", "--json", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [x["bucket_cap_mb"] for x in d["results"]] == [1, 25, 400]
    assert d["results"][-1]["buckets"] == 1
    assert (tmp_path / "sweep-bucket_cap_mb.png").exists()


def test_yaml_scenario(tmp_path, distlab):
    p = tmp_path / "s.yaml"
    p.write_text("name: tiny\nmodel: {kind: mlp, widths: [512, 512, 512], batch: 64}\n"
                 "parallelism: {kind: ddp, bucket_cap_mb: 0.5, grad_accum: 2, compress: fp16}\n"
                 "cluster: localhost-cpu\n")
    r = distlab(str(p), "--no-files", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["results"][0]
    assert d["world_size"] == 2 and len(d["buckets"]) == 2


@pytest.mark.parametrize("args, yaml_text, words", [
    (["--model", "gpt5"], None, ["gpt5", "gpt2-small", "llama-70b"]),
    (["--bucket-cap-mb", "0"], None, ["bucket_cap_mb", "> 0"]),
    (["--bucket-cap-mb", "-5"], None, ["bucket_cap_mb", "> 0"]),
    (["--sweep", "bucket_cap_mb=25,0"], None, ["bucket_cap_mb", "> 0"]),
    (["--sweep", "colour=1,2"], None, ["colour", "bucket_cap_mb"]),
    ([], "model: gpt2-small\nparallelism: {kind: ddp}\nbatch: 8\n", ["'batch'", "allowed", "parallelism"]),
    ([], "model: gpt2-large\nparallelism: {kind: ddp}\n", ["gpt2-large", "gpt2-small"]),
    ([], "model: gpt2-small\nparallelism: {kind: ddp, bucket_cap_mb: 0}\n", ["bucket_cap_mb", "> 0"]),
    ([], "model: gpt2-small\nparallelism: {kind: ddp, bucket_size: 5}\n", ["bucket_size", "bucket_cap_mb"]),
    ([], "model: {preset: gpt2-small, layerz: 3}\nparallelism: {kind: ddp}\n", ["layerz", "layers"]),
    ([], "model: gpt2-small\nparallelism: {kind: zero9}\n", ["zero9", "ddp"]),
])
def test_bad_input_is_one_line_naming_the_key_exit_2(tmp_path, args, yaml_text, words, distlab):
    if yaml_text is not None:
        p = tmp_path / "bad.yaml"
        p.write_text(yaml_text)
        args = [str(p), *args]
    r = distlab(*args, "--no-files")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words:
        assert w in r.stderr


@pytest.mark.parametrize("name", ["ddp-gpt2-small.yaml", "ddp-cpu.yaml", "ddp-llama-70b.yaml"])
def test_example_scenarios_run(name, distlab):
    path = os.path.join(ROOT, "scenarios", name)
    r = distlab(path, "--no-files", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["step_s"] > 0
