"""Elastic restart under torchrun: rank 1 SIGKILLed as step 5 of 10 begins, checkpoints (DCP) every 2 steps,
--max-restarts 1: the group restarts, resumes from step 4, completes, and ends with the parameters of an
uninterrupted run, bit for bit."""
from __future__ import annotations

import os
import threading

import pytest

from distlab.runtime.elastic import TrainSpec, reference, run_local

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("elastic")
    out = {}
    jobs = {"killed": (TrainSpec(kill_rank=1, kill_step=5), 1), "whole": (TrainSpec(), 0)}

    def go(name):
        spec, restarts = jobs[name]
        out[name] = run_local(str(d / name), spec, nproc=2, max_restarts=restarts, timeout=150)
    threads = [threading.Thread(target=go, args=(n,)) for n in jobs]      # both at once: half the wall time
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return d, out


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
    killed, whole = out["killed"]["final"], out["whole"]["final"]
    assert out["whole"]["summary"]["attempts"] == 1
    assert killed.keys() == whole.keys()
    assert all(torch.equal(killed[k], whole[k]) for k in whole)
    expected = reference(TrainSpec(), world=2)                  # the same maths in one process
    assert all(torch.equal(whole[k], expected[k]) for k in whole)
    assert not all(torch.equal(whole[k], reference(TrainSpec(steps=9))[k]) for k in whole)   # steps matter
