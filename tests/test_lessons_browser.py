"""A lesson in a real browser: JupyterLab on localhost (a free port, a token), headless Chromium driven by
Playwright's Python package (Debian's chromium, never a downloaded browser). Runs every cell of lesson 02,
checks that a figure (img) and exercise verdicts appear, then answers an exercise the way a learner would and
checks the verdict. Skips, with the reason, where Chromium, Playwright or JupyterLab is missing."""
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSON = "02_what_a_collective_costs.ipynb"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]


def chromium_path():
    for p in (os.environ.get("DISTLAB_CHROMIUM"), "/usr/lib/chromium/chromium", shutil.which("chromium"),
              shutil.which("chromium-browser")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


@pytest.fixture
def jupyterlab(tmp_path):
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install -e '.[lessons]')")
    from distlab.runtime.ranks.launch import free_port
    root = tmp_path / "lessons"
    root.mkdir()
    shutil.copy(os.path.join(ROOT, "lessons", LESSON), root)
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               DISTLAB_LESSONS_QUICK="1")                    # smaller real runs, as in test_lessons_notebooks
    (tmp_path / "cfg" / "labconfig").mkdir(parents=True)      # no "get Jupyter news?" toast over the cells
    (tmp_path / "cfg" / "labconfig" / "page_config.json").write_text(
        '{"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": true}}')
    log = open(tmp_path / "jupyterlab.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
                             "--ServerApp.port_retries=0", "--LabApp.news_url=",
                             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
                            + (["--allow-root"] if os.geteuid() == 0 else []),
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, cwd=str(root))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("JupyterLab did not start:\n" + (tmp_path / "jupyterlab.log").read_text()[-3000:])
            time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _accept_kernel_dialog(page) -> bool:
    """JupyterLab sometimes asks which kernel to start (slow kernelspec fetch on a busy machine): take python3."""
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    if dialog.count() and dialog.first.is_visible():
        dialog.first.locator("button.jp-mod-accept").click()
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
        return True
    return False


def _run_all(page) -> None:
    _accept_kernel_dialog(page)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def test_lesson_runs_in_headless_chromium(jupyterlab, tmp_path):
    exe = chromium_path()
    if exe is None:
        pytest.skip("Chromium not found (Debian: apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    base, token = jupyterlab
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=exe, headless=True,
                                                   args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1000})
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{base}/lab/tree/{LESSON}?token={token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
            time.sleep(2)
            _run_all(page)
            # every code cell has run when the last one shows an execution count
            first = page.locator(".jp-CodeCell .jp-InputPrompt").first
            last = page.locator(".jp-CodeCell .jp-InputPrompt").last
            deadline = time.monotonic() + 170
            while not last.inner_text().strip().strip("[]:").isdigit():
                assert time.monotonic() < deadline, "the lesson did not finish in the browser"
                if _accept_kernel_dialog(page) and first.inner_text().strip() in ("[ ]:", "[]:"):
                    _run_all(page)             # the dialog came up before the run started
                time.sleep(1)
            assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'] "
                                ".jp-RenderedText", has_text="Traceback").count() == 0
            assert page.locator("[data-mime-type='application/vnd.jupyter.error']").count() == 0
            assert page.locator(".jp-OutputArea-output img").count() >= 1, "a figure"
            assert page.locator(".jp-OutputArea-output img").first.evaluate("e => e.naturalWidth") > 100
            assert page.locator(".distlab-verdict").count() >= 2, "exercise verdicts"
            # a learner answers an exercise: first in the wrong unit, then right
            cell = page.locator(".jp-CodeCell", has_text='check("02-busbw"')
            for answer, verdict in (("0.324", ".distlab-wrong-unit"), ('"324 GB/s"', ".distlab-correct")):
                cell.locator(".cm-content").click()
                page.keyboard.press("Control+a")
                page.keyboard.insert_text(f'check("02-busbw", {answer})')
                page.keyboard.press("Shift+Enter")
                cell.locator(verdict).wait_for(timeout=30_000)
            assert "correct: 324 GB/s" in cell.inner_text()
            if os.environ.get("DISTLAB_SCREENSHOT"):          # to look at the result: a PNG of the answered cell
                cell.scroll_into_view_if_needed()
                page.screenshot(path=os.environ["DISTLAB_SCREENSHOT"])
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"))
            raise
        finally:
            ctx.close()
