"""Several jobs on one cluster: placement, one shared network, and what a neighbour costs each job.

- spec.py: the multi-job file (a cluster, its fabric, the jobs: scenarios or plan files, their placement, start,
  steps); placement.py: which nodes each job gets (packed, spread, random, or listed).
- build.py: each job's plan on its nodes, repeated for its steps (steps.py: the barrier between steps and where
  each step ends in a trace).
- fabric.py: a job's view of the shared fabric (its ranks on its nodes, the cluster's links) and which renamings
  of its ranks keep the links it shares with others (the symmetric reductions it may use).
- together.py: the jobs alone and together on one network, the slowdown of each, the bytes on shared links;
  report.py: tables, JSON and the contended links; figure.py: the timeline with one track per job.
- whatif.py: sweeps over placement, oversubscription and rail layout; the interference matrix; how many GPUs a
  job mix can take before its slowdown passes a threshold. Independent simulations run through sim/workers.py
  (local processes, or Dask distributed given a scheduler's address).
"""
