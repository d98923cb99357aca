"""The suite leaves nothing in the temp folder: conftest.py gives the session a private one and fails the
session when anything but pytest's own tmp_path folders is left in it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_inner(tmp_path, body: str):
    """Run a one-test pytest session with this conftest, its temp folder under ``tmp_path``/tmp."""
    shutil.copy(os.path.join(ROOT, "tests", "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(body)
    (tmp_path / "tmp").mkdir()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(tmp_path / "test_inner.py")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=inner_env(tmp_path))
    return p, sorted(os.listdir(tmp_path / "tmp"))


def inner_env(tmp_path) -> dict:
    """The environment of the inner session: its own TMPDIR, and not a pytest-xdist worker even when this test
    runs in one (conftest.py leaves a worker's temp folder to the controller). No installed plugin is loaded
    (xdist, hypothesis, ...: ~1.5 s of CPU per session): only conftest.py's hooks are under test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["TMPDIR"] = str(tmp_path / "tmp")
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def test_a_leftover_in_the_temp_folder_fails_the_session(tmp_path):
    p, left = run_inner(tmp_path, "import tempfile\nLEAK = tempfile.mkdtemp(prefix='leak-')\n\n"
                                  "def test_ok():\n    assert True\n")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "the tests left 1 entries in the temp folder" in p.stderr and "leak-" in p.stderr
    assert len(left) == 1 and left[0].startswith("distlab-tests-")        # kept to look at


def test_a_clean_session_removes_its_temp_folder(tmp_path):
    p, left = run_inner(tmp_path, "def test_ok(tmp_path):\n    (tmp_path / 'x').write_text('pytest cleans this')\n")
    assert p.returncode == 0, p.stdout + p.stderr
    assert left == []
