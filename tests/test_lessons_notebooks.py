"""Every lesson notebook follows the conventions of lessons/README.md and runs top to bottom on CPU (nbclient),
each within 3 minutes on a 2-core machine."""
import glob
import os
import re
import time

import pytest

nbformat = pytest.importorskip("nbformat")

LESSONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lessons")
NOTEBOOKS = sorted(glob.glob(os.path.join(LESSONS, "[0-9][0-9]_*.ipynb")))
LIMIT_S = 180
# Lessons whose cells start real ranks (torch.distributed); the others are simulator-only and fast.
SLOW = {"01_processes_and_collectives.ipynb", "02_what_a_collective_costs.ipynb", "03_topologies.ipynb",
        "04_validate_on_your_machine.ipynb", "05_ddp.ipynb", "06_fsdp_zero.ipynb", "07_pipeline.ipynb",
        "08_pitfalls.ipynb", "12_failures_at_scale.ipynb"}


def _ids():
    return [os.path.basename(p) for p in NOTEBOOKS]


def test_the_lessons_are_there_and_indexed():
    names = _ids()
    assert names[:7] == ["01_processes_and_collectives.ipynb", "02_what_a_collective_costs.ipynb",
                         "03_topologies.ipynb", "04_validate_on_your_machine.ipynb", "05_ddp.ipynb",
                         "06_fsdp_zero.ipynb", "07_pipeline.ipynb"]
    assert [int(n[:2]) for n in names] == sorted({int(n[:2]) for n in names})   # numbered, unique (09-11 to come)
    with open(os.path.join(LESSONS, "README.md")) as f:
        readme = f.read()
    positions = [readme.find(f"]({n})") for n in names]
    assert all(p > 0 for p in positions) and positions == sorted(positions), "README index lists every lesson in order"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids())
def test_conventions(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.nbformat == 4 and nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, "outputs are not committed (strip them)"
            assert len(cell.source.splitlines()) <= 30, "notebooks stay thin: long logic belongs in the library"
    md = [c.source for c in nb.cells if c.cell_type == "markdown"]
    assert re.match(r"# \d\d · ", md[0]) and "**Goals.**" in md[0]
    assert "## Recap" in md[-1]
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert len(re.findall(r'^check\("\d\d-', code, re.M)) >= 2, "two or more checked exercises"
    assert re.search(r"plot_\w+\(", code), "at least one figure from the library"
    assert "from runtime." in code, "uses the real runtime"
    assert "sim." in code, "uses the simulator"


def _execute(path, workdir):
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=LIMIT_S, kernel_name="python3", resources={"metadata": {"path": workdir}})
    t0 = time.monotonic()
    client.execute()
    return nb, time.monotonic() - t0


def _marks(path):
    return [pytest.mark.slow] if os.path.basename(path) in SLOW else []


@pytest.mark.parametrize("path", [pytest.param(p, marks=_marks(p)) for p in NOTEBOOKS], ids=_ids())
def test_runs_top_to_bottom(path, tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb, elapsed = _execute(path, str(tmp_path))
    print(f"{os.path.basename(path)}: {elapsed:.1f} s")
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "a figure is shown"
    verdicts = [o for o in outputs if "distlab-verdict" in o.get("data", {}).get("text/html", "")]
    assert len(verdicts) >= 2, "exercise verdicts are shown"
    assert elapsed < LIMIT_S, f"{os.path.basename(path)} took {elapsed:.0f} s (limit {LIMIT_S} s)"
