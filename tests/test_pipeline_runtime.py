"""Real torch.distributed.pipelining on 2 gloo CPU ranks, one launch for every schedule: the actions torch
executes on real PipelineStages are, per rank and in order, the ones sim.pipeline.schedules builds; losses
match a single-process reference; the measured trace lines up with the plan and its metrics make sense."""
import pytest

from distlab.sim.parallel.pipeline import metrics as M
from distlab.sim.parallel.pipeline import schedules as S
from distlab.sim.parallel.pipeline.plan import PipelineSpec, build_plan

pytest.importorskip("torch.distributed.pipelining")

RUNS = [dict(schedule=s, stages=2, microbatches=4, virtual_stages=v, width=32, rows=4, steps=1, warmup=1)
        for s, v in [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2)]]


@pytest.fixture(scope="module")
def measured():
    from distlab.runtime.parallel.pipeline.run import measure
    return measure(RUNS, 2, timeout=120)


@pytest.mark.slow
def test_real_pipeline_runs(measured):
    from distlab.runtime.parallel.pipeline.run import reference_loss
    for i, (cfg, trace) in enumerate(zip(RUNS, measured["traces"])):
        p, m, v = cfg["stages"], cfg["microbatches"], cfg["virtual_stages"]
        ours = S.build(cfg["schedule"], p, m, v)
        for r in range(p):
            assert [str(a) for a, _ in M.actions_of(trace, r)] == [str(a) for a in ours[r]], cfg["schedule"]
        losses = [x for rank in measured["ranks"] for x in rank["runs"][i]["losses"]]
        assert losses and all(x == pytest.approx(reference_loss(cfg), rel=1e-5) for x in losses)
        # op indices and names are the plan's compute ops
        from distlab.sim.models import Layer, Model
        plan = build_plan(Model("b", [Layer(f"b{k}", [], fwd_flops=1.0) for k in range(p * v)]),
                          PipelineSpec(cfg["schedule"], p, m, v))
        for o in trace.ops:
            assert plan.ranks[o.rank][o.index].name == o.name
        met = M.compute(trace, plan.meta["pipeline"])
        assert 0 <= met.bubble < 1 and met.makespan > 0
        if cfg["schedule"] == "1f1b":
            assert met.peak_in_flight == {s: p - s for s in range(p)}
        if cfg["schedule"] == "gpipe":
            assert met.peak_in_flight == {s: m for s in range(p)}
