"""PP x FSDP2 x TP x CP in the planner: ring attention inside pipeline stages, estimated from the composition's
own program (sim/planner/composed.py: one rank per pipeline index built by sim/parallel/parallelize.py, each
action timed stream by stream with the ring's sends at their hop, the schedule walked with those durations),
its memory: sim/planner/step.py ``Estimator.memory``, the one model.

    stages = CPStages(estimator)
    stages.estimate(Layout(tp=8, cp=16, pp=16, dp=8, dp_kind="fsdp", dp_shard=8, micro_batch=1, microbatches=16,
                           sequence_parallel=True, recompute="full", split=(7,) + (8,) * 14 + (7,)))

Llama 3 405B's long-context layout (arXiv 2407.21783, sec. 3.3.2 and Table 4 row 3: 16,384 H100, TP 8, CP 16,
PP 16, DP 8 at 131,072 tokens per sequence) is this family. The fast estimate's stage model (sim/planner/step.py)
times a block as TP's segments and has no ring, so this family takes the composition's path: exact for the
rank's program, without the contention between concurrent groups that simulating every rank adds
(tests/test_compose_estimate.py: within 0.1% of the simulator under 1F1B).
"""
from __future__ import annotations

from distlab.sim.planner.estimate import Estimate


class CPStages:
    """Estimates and memory of pipelined layouts with cp > 1 (module docstring); caches the costs of the
    estimator (collectives, p2p) it shares."""

    def __init__(self, est):
        self.est = est

    def estimate(self, L) -> Estimate:
        from distlab.sim.planner.confirm import composed_step
        step = composed_step(self.est, L)
        return Estimate(step, {"composed_s": step})
