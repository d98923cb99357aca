"""Checks before any rank starts: memory per rank, the NCCL backend, ranks against cores; and what a run writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process (no torch import each)

from distlab.runtime.ranks import preflight
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Collective, Plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_line_error(rc, out, err):
    assert rc == 2, err
    assert out == "" and len(err.strip().splitlines()) == 1 and "error" in err, err


def test_a_7b_model_on_cpu_ranks_is_refused_at_once(cli):
    t0 = time.monotonic()
    rc, out, err = cli("validate", "--scenario", "scenarios/fsdp-llama-7b.yaml", "--nproc", "2")
    one_line_error(rc, out, err)
    assert time.monotonic() - t0 < 30                       # no rank started, nothing built
    assert "llama-7b" in err and "GiB per rank" in err and "GiB available (MemAvailable)" in err
    assert "use a smaller model" in err


def test_memory_estimate_and_what_fits():
    from distlab.sim import scenario as sc
    d = sc.load(os.path.join(ROOT, "scenarios/fsdp-llama-7b.yaml"))
    model, _ = sc.resolve(d)
    parts = preflight.model_rank_bytes(model, "fsdp", 2, sc.parallelism(d))
    P = model.param_bytes                                   # 6.7e9 bf16 parameters: 12.6 GiB, every rank
    assert parts["whole model + reference"] == 4 * P
    assert parts["shards (params, grads, Adam)"] == pytest.approx(4 * P / 2, rel=0.01)
    assert sum(parts.values()) > 6 * P
    ddp = preflight.model_rank_bytes(model, "ddp", 2)
    assert sum(v for k, v in ddp.items() if k != "activations") == 7 * P
    # the shipped CPU scenarios fit on a host with 4 GiB free; the 7B one (104 GiB per rank) does not fit in 100
    for name in ("ddp-cpu", "fsdp-cpu", "pipeline-cpu"):
        preflight.check_scenario(os.path.join(ROOT, "scenarios", f"{name}.yaml"), 2, available=4 * 2**30)
    with pytest.raises(ConfigError, match="fewer ranks do not help"):
        preflight.check_scenario(os.path.join(ROOT, "scenarios/fsdp-llama-7b.yaml"), 2, available=100 * 2**30)
    assert preflight.mem_available() > 0                    # Linux: MemAvailable in /proc/meminfo


def test_plan_buffers_are_counted_per_distinct_collective():
    MiB = 2**20
    plan = Plan([[Collective("all_reduce", 64 * MiB), Collective("all_reduce", 64 * MiB),
                  Collective("all_gather", 64 * MiB)]] * 4, name="p")
    # all_reduce in place: 64 MiB once; all_gather: 16 MiB in + 64 MiB out
    assert preflight.plan_rank_bytes(plan) == {"collective buffers": 64 * MiB + 80 * MiB}


def test_a_plan_whose_buffers_cannot_fit_is_refused_before_launch(cli, tmp_path):
    path = tmp_path / "huge.json"
    Plan([[Collective("all_gather", 2**43)]] * 2, name="huge").save(str(path))     # 8 TiB gathered per rank
    rc, out, err = cli("run", str(path), "--nproc", "2")
    one_line_error(rc, out, err)
    assert "plan 'huge' needs about" in err and "MemAvailable" in err
    assert sorted(os.listdir(tmp_path)) == ["huge.json"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a host without CUDA")
def test_nccl_without_cuda_is_one_line_in_the_launcher(cli, tmp_path):
    path = tmp_path / "p.json"
    Plan([[Collective("all_reduce", 1024)]] * 2, name="p").save(str(path))
    rc, out, err = cli("run", str(path), "--backend", "nccl", "-v")      # -v would print each rank's pid
    one_line_error(rc, out, err)
    assert err.startswith("distlab run: error: --backend: NCCL needs") and " pid " not in err
    assert "CPU build" in err or "is_available() is False" in err
    rc, out, err = cli("bench", "--backend", "nccl", "--sizes", "1KiB")
    one_line_error(rc, out, err)


def test_the_cores_warning_is_one_line_once(monkeypatch, capsys):
    monkeypatch.setattr(preflight, "cpu_cores", lambda: 2)
    monkeypatch.setattr(preflight, "_warned", set())
    assert not preflight.warn_cores(2, 1, "distlab bench")
    assert preflight.warn_cores(4, 1, "distlab bench")
    assert not preflight.warn_cores(8, 1, "distlab bench")           # once per command
    err = capsys.readouterr().err
    assert err.startswith("distlab bench: warning: 4 ranks x 1 thread on 2 CPU cores") and err.count("warning") == 1
    assert all(len(line) <= 100 for line in err.splitlines()) and "--nproc 2 or fewer" in " ".join(err.split())


@pytest.mark.slow
def test_run_on_one_core_warns_and_writes_a_perfetto_trace(tmp_path):
    """Two ranks pinned to one core: the warning line; the run writes its trace and a Perfetto JSON."""
    path = tmp_path / "p.json"
    Plan([[Collective("all_reduce", 4096), Collective("all_gather", 4096)]] * 2, name="p").save(str(path))
    p = subprocess.run([sys.executable, "-m", "distlab.runtime.cli", "run", str(path), "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    assert p.returncode == 0, p.stderr
    warnings = [ln for ln in p.stderr.splitlines() if "warning" in ln]
    assert warnings == [warnings[0]] and warnings[0].startswith("distlab run: warning: 2 ranks x 1 thread on 1 CPU "
                                                                  "core")
    summary = json.loads(p.stdout)
    assert summary["trace"] == str(tmp_path / "p.measured.trace")
    assert summary["perfetto"] == str(tmp_path / "p.measured.perfetto.json")
    events = json.loads((tmp_path / "p.measured.perfetto.json").read_text())["traceEvents"]
    slices = [(e["pid"], e["name"]) for e in events if e["ph"] == "X" and not e["name"].startswith("wait")]
    assert sorted(slices) == [(0, "all_gather"), (0, "all_reduce"), (1, "all_gather"), (1, "all_reduce")]
