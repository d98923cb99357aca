"""The NCCL path and CUDA-event timing (skipped without a GPU). scripts/gpu_check.sh runs these."""
from __future__ import annotations

import pytest
import torch

from distlab.sim.plan import Collective, Compute, Plan, Record, Wait

pytestmark = [pytest.mark.cuda, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_collectives_on_nccl_match_independent_values():
    from distlab.runtime.ranks.launch import launch
    from distlab.runtime.measure.selfcheck import cases, value
    n = min(torch.cuda.device_count(), 2)
    results = launch("distlab.runtime.measure.selfcheck:collectives_task", {"dtypes": ["float32", "bfloat16", "int32"]}, n,
                     backend="nccl", timeout=120)
    for rank, res in enumerate(results):
        for i, c in enumerate(cases(n, ("float32", "bfloat16", "int32"))):
            got = res["outputs"].get(str(i))
            if c["op"] == "all_reduce" and got is not None:
                assert got[:3] == [sum(value(q, j, c["dtype"]) for q in c["group"]) for j in range(3)]
            if c["op"] == "broadcast" and got is not None:
                assert got[:3] == [value(c["root"], j, c["dtype"]) for j in range(3)]


def test_cuda_streams_overlap_and_event_times():
    from distlab.runtime.execute.executor import merge_results
    from distlab.runtime.ranks.launch import launch
    ops = [Compute(name="c0", seconds=0.02), Record("e", stream="compute"), Compute(name="c1", seconds=0.02),
           Wait("e", stream="comm"), Collective("all_reduce", 256 * 2**20, stream="comm")]
    plan = Plan([ops], name="cuda-overlap")
    results = launch("distlab.runtime.execute.executor:plan_task", {"plan": plan.to_dict(), "warmup": 1, "repeat": 3}, 1,
                     backend="nccl", timeout=120)
    trace = merge_results(plan, results)
    rec = {o.index: o for o in trace.ops}
    assert trace.meta["backend"] == "nccl"
    assert rec[0].duration == pytest.approx(0.02, rel=0.5)          # sized by the calibrated matmul time
    assert rec[4].start >= rec[0].end - 1e-4                        # the wait held the comm stream
    assert rec[4].start < rec[2].end                                 # ... and comm overlapped c1
