"""Real runs for the lessons: collectives on N local ranks with every rank's result, a check of your own ring
all-reduce against dist.all_reduce, torchrun on one or several (simulated) nodes, and small benches.

- common.py: quick mode and a launch of N local ranks (what every lesson's real run shares);
- collectives.py (lessons 01-04) and training.py (DDP, FSDP, pipeline predicted and measured: 05-07), whose
  functions are importable from here;
- pitfalls.py: lesson 08's real runs (sharding, checkpoints, seeds, a hang the flight recorder names);
- compute.py: lesson 13's real GEMMs; shared.py: lesson 14's two jobs on this machine;
- profile.py: lesson 04's torch.profiler trace of the learner's own gloo ranks; precision.py: lesson 15's bf16
  autocast against fp32 on this CPU.

Every function starts fresh rank processes through runtime.ranks.launch (gloo on CPU; NCCL where each rank has a
GPU, with backend="auto") and returns plain Python data; sim.lessons.helpers turns it into tables and figures.
"""
from __future__ import annotations

from distlab.runtime.lessons.collectives import DEMO_OPS, bench, check_all_reduce, collectives_demo, torchrun
from distlab.runtime.lessons.common import QUICK_ENV, fewer, quick, run_on_ranks
from distlab.runtime.lessons.training import (PIPELINE_SCHEDULES, ddp_bucket_sweep, fsdp_predict_measure,
                                              pipeline_predict_measure)

__all__ = ["DEMO_OPS", "PIPELINE_SCHEDULES", "QUICK_ENV", "bench", "check_all_reduce", "collectives_demo",
           "ddp_bucket_sweep", "fewer", "fsdp_predict_measure", "pipeline_predict_measure", "quick", "run_on_ranks",
           "torchrun"]
