"""Elastic restart under torchrun: rank 1 SIGKILLed as step 5 of 10 begins, checkpoints (DCP) every 2 steps,
--max-restarts 1: the group restarts, resumes from step 4, completes, and ends with the parameters of an
uninterrupted run, bit for bit."""
from __future__ import annotations

import os

import pytest

from distlab.runtime.restart.elastic import THREADS_ENV, TrainSpec, reference, run_local

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The killed run; every rank that finishes notes its threads (THREADS_ENV). The parameters of an uninterrupted
    run are ``reference``'s, computed in this process: bit for bit what real ranks compute (its docstring), as the
    killed run ending with them shows; the corrupt-checkpoint test's run is the real run without a failure."""
    d = tmp_path_factory.mktemp("elastic")
    before = os.environ.get(THREADS_ENV)
    os.environ[THREADS_ENV] = str(d / "threads.jsonl")
    try:
        killed = run_local(str(d / "killed"), TrainSpec(kill_rank=1, kill_step=5), nproc=2, max_restarts=1,
                           timeout=150)
    finally:
        if before is None:
            os.environ.pop(THREADS_ENV)
        else:
            os.environ[THREADS_ENV] = before
    return d, {"killed": killed}


def test_a_killed_rank_restarts_the_group_which_resumes_from_the_last_checkpoint(runs):
    d, out = runs
    killed = out["killed"]
    assert killed["returncode"] == 0, killed["output"][-2000:]
    s = killed["summary"]
    assert s["attempts"] == 2 and s["resumed_from_step"] == [4]
    (f,) = s["failures"]
    assert (f["rank"], f["step"], f["last_checkpoint_step"], f["lost_steps"]) == (1, 5, 4, 0)
    assert 0 <= f["lost_work_s"] < 30 and 0 < f["restart_s"] < 120
    assert "resumed from step 4" in killed["output"]
    # checkpoints at steps 2, 4 (first attempt), 6, 8, 10 (second), each sharded: one file per rank
    steps = sorted(os.listdir(d / "killed"))
    assert [n for n in steps if n.startswith("step_")] == [f"step_{k:06d}" for k in (2, 4, 6, 8, 10)]
    files = os.listdir(d / "killed" / "step_000004")
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(files)


def test_the_resumed_run_ends_with_the_parameters_of_an_uninterrupted_one(runs):
    _, out = runs
    import torch
    killed = out["killed"]["final"]
    expected = reference(TrainSpec(), world=2)                  # the same maths in one process, uninterrupted
    assert killed.keys() == expected.keys()
    assert all(torch.equal(killed[k], expected[k]) for k in expected)
    assert not all(torch.equal(killed[k], reference(TrainSpec(steps=9))[k]) for k in expected)   # steps matter


def test_a_corrupt_or_foreign_checkpoint_is_skipped_never_unpickled(runs, tmp_path):
    """Issue 32 items 2 and 7: resume only from checkpoints this run family signed. A copy of the killed run's
    folder (checkpoints at steps 2 to 10: an uninterrupted run's parameters) with step 10's shard truncated and a
    planted step 12 whose .metadata is a pickle that would create a marker file (DCP reads .metadata with
    pickle.load): each is one line naming the file and the fallback, the run resumes from step 8 and ends with the
    parameters of an uninterrupted 11-step run; the pickle never runs."""
    import json
    import pickle
    import shutil

    import torch
    d, _ = runs
    root, marker = tmp_path / "tampered", tmp_path / "marker"
    shutil.copytree(d / "killed", root, symlinks=True)
    for name in ("final.pt", "summary.json", "events.jsonl"):    # the killed run's own: this run writes its own
        (root / name).unlink()
    with open(root / "step_000010" / "__1_0.distcp", "r+b") as f:
        f.truncate(1000)
    (root / "step_000012").mkdir()
    (root / "step_000012" / ".metadata").write_bytes(pickle.dumps(_Payload(str(marker))))
    (root / "step_000012" / "MANIFEST.json").write_text(json.dumps(
        {"manifest": {"format": "distlab-checkpoint/1", "step": 12, "files": {".metadata": {}}}, "hmac": "0" * 64}))
    out = run_local(str(root), TrainSpec(steps=11), nproc=2, max_restarts=0, timeout=150)
    assert out["returncode"] == 0, out["output"][-2000:]
    assert out["summary"]["attempts"] == 1 and out["summary"]["failures"] == []    # a run without a failure
    lines = [ln for ln in out["output"].splitlines() if ln.startswith("elastic: checkpoint not used")]
    assert len(lines) == 2, out["output"][-3000:]
    assert "step_000012/MANIFEST.json is not signed with this run family's secret" in lines[0]
    assert "step_000010/__1_0.distcp is truncated" in lines[1]
    assert all(ln.endswith("step_000008 (the previous good checkpoint)") for ln in lines)
    assert "Traceback" not in out["output"]
    assert not marker.exists()
    expected = reference(TrainSpec(steps=11), world=2)
    assert all(torch.equal(out["final"][k], expected[k]) for k in expected)


class _Payload:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_finished_rank_has_no_gloo_threads_left_at_exit(runs):
    """The SIGABRT at shutdown (lesson 12's "torchrun exit code: 1"): torch.distributed.checkpoint, imported after
    init_process_group, captured the default group in default arguments (torch/distributed/nn/functional.py), so
    ProcessGroupGloo and its threads outlived destroy_process_group and were torn down with the interpreter.
    Every rank's train() under torchrun (the killed run's restarted attempt, saving checkpoints) must end with
    Gloo's threads joined: the ranks' own list of their threads after train() returned (THREADS_ENV)."""
    import json
    d, _ = runs
    with open(d / "threads.jsonl") as f:
        lines = [json.loads(line) for line in f]
    # rank 0 of the first attempt never got there (torchrun stopped it when rank 1 died), both of the second did
    assert sorted((os.path.basename(n["dir"]), n["rank"], n["attempt"]) for n in lines) == [
        ("killed", 0, 1), ("killed", 1, 1)], lines
    for n in lines:
        assert n["threads"] and not [t for t in n["threads"] if "gloo" in t], n    # pt_gloo_runloop (x2), gloo_tcp_loop
