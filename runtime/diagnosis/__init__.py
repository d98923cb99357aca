"""Flight recording and diagnosis: what each rank was doing when a run hung or failed, and what went wrong.

- flight.py is the recorder: every rank keeps its last N collectives (issued, started, completed) and dumps
  them on failure; flight_dist.py records a task's own torch.distributed calls into it.
- flight_read.py reads the ranks' dumps back, bounded and checked; diagnose.py lines them up per communicator
  and names the mismatch or the hang in the words the static plan check uses (`distlab diagnose`).
"""
