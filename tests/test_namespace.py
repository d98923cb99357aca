"""One namespace: installed, everything is `distlab.sim` / `distlab.runtime`; no top-level `sim` or `runtime`
import survives anywhere; `sim` never loads torch or the runtime; a user's own `sim/`, `runtime/` or `distlab/`
folder in the current directory never replaces distlab's worker."""
from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def package_folders() -> set[str]:
    out = set()
    for top in ("sim", "runtime"):
        for init in (ROOT / top).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                out.add("distlab." + ".".join(init.parent.relative_to(ROOT).parts))
    return out


def test_every_package_folder_is_installed_under_distlab():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"distlab.sim": "sim", "distlab.runtime": "runtime"}
    missing = package_folders() - set(config["packages"])
    assert not missing, f"add to pyproject.toml [tool.setuptools] packages: {sorted(missing)}"


def python_sources():
    for folder in ("sim", "runtime", "tests", "benchmarks"):
        yield from (ROOT / folder).rglob("*.py")


def notebook_sources():
    for nb in (ROOT / "lessons").glob("*.ipynb"):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                yield nb, "".join(cell["source"])


# Text that any top-level sim/runtime import contains (on one line once backslash continuations are joined): an
# ``import`` statement naming sim or runtime (not as distlab.sim), or ``from sim``/``from runtime``. Only the
# files that contain it (a few of ~400) are parsed and walked; parsing them all took ~3 s of CPU.
MAY_IMPORT = re.compile(r"\bimport\b[^\n]*(?<![.\w])(?:sim|runtime)\b|\bfrom\s+(?:sim|runtime)\b")


def test_no_top_level_sim_or_runtime_import_anywhere():
    bad = []
    for path in python_sources():
        text = path.read_text()
        if not MAY_IMPORT.search(text.replace("\\\n", " ")):
            continue
        for node in ast.walk(ast.parse(text, str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                    if n.split(".")[0] in ("sim", "runtime")]
    for nb, src in notebook_sources():
        bad += [f"{nb.name}: {m}" for m in re.findall(r"^\s*(?:from|import) (?:sim|runtime)\b.*$", src, re.M)]
    assert not bad, bad


def test_importing_every_sim_module_loads_neither_torch_nor_the_runtime():
    modules = sorted("distlab." + ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                     for p in (ROOT / "sim").rglob("*.py") if "__pycache__" not in p.parts)
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'distlab.runtime')))\n"
            "print(len(bad), bad[:5])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("0 "), out.stdout


@pytest.mark.slow
def test_run_from_a_folder_with_its_own_sim_runtime_and_distlab_packages(tmp_path):
    """`distlab run` started where the user keeps packages named like ours still runs distlab's worker."""
    from distlab.sim.plan import Collective, Plan
    for name in ("sim", "runtime", "distlab", "distlab/runtime"):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "__init__.py").write_text("raise SystemExit('the user package was imported')\n")
    (tmp_path / "runtime" / "worker.py").write_text("raise SystemExit('the user worker was started')\n")
    plan = tmp_path / "p.json"
    Plan([[Collective("all_reduce", 1024)]] * 2, name="p").save(str(plan))
    exe = pathlib.Path(sys.executable).with_name("distlab")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from distlab.runtime.cli import main; main()"]
    out = subprocess.run([*cmd, "run", "p.json", "--nproc", "2", "--json", "--out", "m.trace"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["backend"] == "gloo"
    assert "user" not in out.stderr
    assert (tmp_path / "m.trace").exists()
