"""The simulation kernel: how a plan becomes a timeline. Nothing here knows a parallelism or a model.

- engine.py runs a plan: one simpy process per (rank, stream), collectives as rendezvous of their members;
  communicators.py runs one process group's collectives in issue order, one at a time (NCCL; two on Gloo);
  inline.py lets a stream run a collective it hands off and waits for at once, with fewer events.
- network.py is the fabric: directed links, routes, flows sharing links max-min fairly; netloop.py advances
  every collective's steps in one loop (flowgroups.py keeps one number per group of equal flows; solo.py picks
  that loop or the step-by-step reference).
- hosts.py is what a rank's host does beside the network: cores.py shares CPU cores among compute ops
  (processor sharing), skew.py delays a collective until its last member arrives.
- symmetry.py, subgroups.py and equivariance.py find ranks whose timelines are provably equal, so one
  representative per class is simulated; relabel.py builds the others' programs from it on demand.
- spans.py is the arithmetic of time spans (unions, overlaps) that reports share.
"""
