"""scripts/gpu_check.sh, ready for the day a GPU is lent: its shell is valid and every module and test file it
calls exists; its measurement module (runtime/measure/gpu_check.py) runs on CPU with tiny shapes and writes each
measurement beside the compute model's prediction for the preset, with the error, as JSON."""
import importlib.util
import json
import pathlib
import re
import subprocess

import pytest

from distlab.runtime.measure import gpu_check
from distlab.sim.compute.kernels import gemm_time, memory_time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_script_is_valid_bash_and_calls_what_exists():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    text = SCRIPT.read_text()
    modules = set(re.findall(r"-m (distlab\.[\w.]+)", text))
    assert {"distlab.runtime.measure.gpu_check", "distlab.runtime.cli"} <= modules
    assert all(importlib.util.find_spec(m) is not None for m in modules), modules
    assert "runtime.cli bench" not in text.replace("distlab.runtime.cli bench", "")    # the retired path is gone
    for path in re.findall(r"(tests/\w+\.py)", text):
        assert (ROOT / path).exists(), path


@pytest.mark.parametrize("name,preset", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                         ("NVIDIA GB200", "gb200"), ("NVIDIA B200", "b200"),
                                         ("NVIDIA A100-SXM4-80GB", "a100"), ("Tesla V100", None)])
def test_preset_from_the_device_name(name, preset):
    assert gpu_check.preset_for(name) == preset


def test_quick_run_on_cpu_writes_each_measurement_beside_its_prediction(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path), "--quick", "--device", "cpu", "--preset", "h200"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = {r["what"]: r for r in report["rows"]}
    assert report["preset"] == "h200" and len(rows) == len(report["rows"]) == 8
    gpu = gpu_check.kernel_gpu("h200")
    M, N, K = rows["gemm bf16 square"]["shape"]
    assert rows["gemm bf16 square"]["predicted_s"] == pytest.approx(gemm_time(M, N, K, 2, gpu))
    assert rows["hbm copy (read + write)"]["predicted_s"] == pytest.approx(memory_time(2 * (1 << 20), gpu))
    for r in report["rows"]:
        assert r["measured_s"] > 0 and r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
    job, kernels = rows["training step (simulate, fitted sustained)"], rows["training step (kernel rates, sustained 1)"]
    assert job["predicted_s"] > kernels["predicted_s"]            # hopper's fitted sustained < 1 slows the job
    out = capsys.readouterr().out
    assert "training step" in out and "against the h200 preset" in out
    assert gpu_check.main(["--out", str(tmp_path / "missing")]) == 2
