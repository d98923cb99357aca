"""Starting ranks: how `distlab run`, `validate`, `bench` and the lessons get N processes that form a group, and
how none is ever left behind. Change how ranks start, join, or are watched here.

- launch.py starts N local ranks (``Launch(target, payload, nproc)``), watches them, collects their results and
  reaps every one on failure or Ctrl-C; forkserver.py is the process that imported torch once and forks a rank
  per request; rundir.py owns the launcher's temporary run folders.
- worker.py is one rank (started by launch.py or by torchrun): it joins the group, runs its task, reports;
  watchdog.py bounds every op it runs by ``--timeout``.
- rendezvous.py is how a rank joins: rank 0 serves store.py's key-value store only to processes that know
  the run's secret (secret.py), and the process group is built on top.
- multinode.py runs this node's share of a multi-node run under torchrun; torchrun_rank.py runs a distlab
  command (bench, calibrate, validate) as one rank of a torchrun job.
- preflight.py checks memory, the backend and cores in the launcher before any rank starts; portability.py
  says once what differs off Linux (macOS: no fork server, no load measurement) and names the loopback.
"""
