import os
import subprocess
import sys

import pytest

from distlab.sim.cluster import Cluster, GPUS, InterNode, IntraNode


def one_node(n: int, gbps: float = 100.0, latency_us: float = 2.0, nvls: bool = False) -> Cluster:
    """An uncontended single-node cluster: n GPUs on a non-blocking switch."""
    return Cluster("test-node", 1, n, GPUS["h100"], IntraNode("nvswitch", gbps, latency_us, 1.0, nvls))


def multi_node(nodes: int, g: int, intra_gbps=100.0, intra_us=2.0, inter_gbps=10.0, inter_us=7.0,
               fabric="rail-optimized", oversubscription=1.0, nics=None) -> Cluster:
    return Cluster("test-multi", nodes, g, GPUS["h100"], IntraNode("nvswitch", intra_gbps, intra_us),
                   InterNode("infiniband", nics or g, inter_gbps, inter_us, fabric, oversubscription))


def run_cli(*args, timeout=120):
    """Run `distlab ARGS` in a subprocess: (returncode, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "distlab.runtime.cli", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=os.path.dirname(os.path.dirname(__file__)))
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def cli():
    return run_cli


# --- torch's threads in the test process -------------------------------------------------------------------------
# The two pytest-xdist workers share 2 cores; a worker's own torch ops on torch's default 2 intra-op threads (OpenMP)
# spin-wait for the core the other worker holds. Measured (2026-12-08, load 5-8): test_ddp_buckets_torch's 40 DDP
# models in one process, 7.0 s CPU and 38 s wall on 2 threads, 1.9 s and 6.8 s on 1; test_activations_torch 5.0 s
# of CPU -> 1.1 s. Ranks already run 1 thread each (runtime/ranks/launch.py ``threads``). A file whose tests run torch
# in the test process and do not depend on torch's thread count opts in:
#     pytestmark = pytest.mark.usefixtures("one_torch_thread")
@pytest.fixture
def one_torch_thread():
    """torch's intra-op threads at 1 in this process for the test, torch's setting before it restored after."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --- the order of the files --------------------------------------------------------------------------------------
# pytest-xdist (--dist loadfile --no-loadscope-reorder, pyproject.toml) hands each of the two workers one whole
# file at a time, in the order collected: the longest files go first, so that no worker starts a long file
# when the other has little left (longest processing time first); the others follow in name order. The longest
# on a 2-core machine, by the CPU seconds of every process each file starts alone (benchmarks/suite_time.py --
# -n 0 FILE, 2026-12-07 22:35-23:05, load 9-20; the notebooks ~250 s of one worker on 2026-12-02): the lesson
# notebooks, then test_tp_runtime 34, test_lessons_lib 33, test_multinode 32, test_compose_runtime 29,
# test_elastic 28, test_runtime_launch 20, test_frontdoor 19, test_rendezvous_security 19, test_forkserver 14,
# then the other real-rank files in their earlier order (not measured again). Only the order changes,
# never a test.
LONGEST_FIRST = ("test_lessons_notebooks.py", "test_tp_runtime.py", "test_lessons_lib.py", "test_multinode.py",
                 "test_compose_runtime.py", "test_elastic.py", "test_runtime_launch.py", "test_frontdoor.py",
                 "test_rendezvous_security.py", "test_forkserver.py", "test_runtime_cli.py",
                 "test_pipeline_validate.py", "test_fsdp_runtime.py", "test_flight_diagnose.py", "test_safe_runs.py",
                 "test_planner.py", "test_cp_runtime.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))      # stable: a file keeps its order


# --- the temp folder --------------------------------------------------------------------------------------------
# Every test, and every process it starts (CLI runs, ranks, torchrun), gets a private temp folder for the
# session (TMPDIR and tempfile.tempdir). At the end the folder must hold nothing but pytest's own tmp_path
# folders: anything else was left behind by the code under test (a run folder, torchelastic_* logs, a
# module-level mkdtemp) and fails the session. The folder is then removed, so the suite leaves nothing in the
# system's temp folder. torch's own compile cache (created empty by `import torch._dynamo`, e.g. through
# torch.distributed.pipelining: torch/_inductor/runtime/cache_dir_utils.py) goes to TORCHINDUCTOR_CACHE below,
# a cache by design, removed with the folder.
_SESSION_TMP: dict = {}
TORCHINDUCTOR_CACHE = "torchinductor-cache"


def pytest_configure(config):
    import tempfile
    if os.environ.get("DISTLAB_TEST_TMPDIR_CHECK", "1") == "0":
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return       # a pytest-xdist worker: TMPDIR is already the controller's folder, checked there at the end
    path = tempfile.mkdtemp(prefix="distlab-tests-")
    _SESSION_TMP.update(path=path, environ=os.environ.get("TMPDIR"), tempdir=tempfile.tempdir)
    os.environ["TMPDIR"] = path
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(path, TORCHINDUCTOR_CACHE))
    tempfile.tempdir = path


def leftovers(path: str) -> list[str]:
    """Entries of the session's temp folder other than pytest's tmp_path base (pytest-of-USER) and torch's cache."""
    return sorted(n for n in os.listdir(path) if not n.startswith("pytest-of-") and n != TORCHINDUCTOR_CACHE)


def pytest_sessionfinish(session, exitstatus):
    import shutil
    import tempfile
    path = _SESSION_TMP.get("path")
    if not path:
        return
    left = leftovers(path)
    if left:
        sys.stderr.write(f"\nconftest: the tests left {len(left)} entries in the temp folder {path}: "
                         f"{', '.join(left[:10])}\n")
        session.exitstatus = 1
    if exitstatus == 0 and not left:
        shutil.rmtree(path, ignore_errors=True)
    else:
        sys.stderr.write(f"conftest: kept {path} to look at\n")
    if _SESSION_TMP["environ"] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = _SESSION_TMP["environ"]
    tempfile.tempdir = _SESSION_TMP["tempdir"]
