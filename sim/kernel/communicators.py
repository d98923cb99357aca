"""Communicators: the collectives of one process group run one at a time, in issue order, whatever stream issued
them; different groups overlap and share the links.

    >>> from distlab.sim.plan import Collective, Plan
    >>> from distlab.sim.cluster import load_cluster
    >>> from distlab.sim.kernel.engine import simulate
    >>> ag = Collective("all_gather", 2**28, stream="ag")
    >>> rs = Collective("reduce_scatter", 2**28, stream="rs")                       # the same group: waits
    >>> rs2 = Collective("reduce_scatter", 2**28, stream="rs", group_name="rs")     # its own group: overlaps
    >>> one = simulate(Plan([[ag, rs]] * 8), load_cluster("dgx-h100")).for_rank(0)
    >>> one[1].launch >= one[0].end
    True
    >>> two = simulate(Plan([[ag, rs2]] * 8), load_cluster("dgx-h100")).for_rank(0)
    >>> two[1].launch < two[0].end
    True

The rule and its sources (torch 2.13, ../shared/REFERENCES.md):
- NCCL (GPU clusters): ProcessGroupNCCL gives a process group one NCCL communicator and one internal stream per
  device (``ncclStreams_[key]``); every collective is enqueued on that stream after it waited for the issuing
  stream (``syncStream``), so the collectives of one group run one after another in the order the host issued
  them, whatever stream issued them. ``FSDPModule.set_separate_reduce_scatter_group`` (2.13) exists for this:
  "one NCCL communicator, which processes one collective at a time and so serializes them on the wire".
  A process group is its ranks plus its identity: ``dist.new_group`` over the same ranks makes a second one
  (the plan's ``group_name``; plans without names: one group per distinct rank set).
- NCCL send/recv (``ProcessGroupNCCL::pointToPoint``, lazy initialization, the default): an unbatched send or
  recv gets a 2-rank communicator per pair (key "low:high", its own stream), so it never waits for the group's
  collectives: the engine keeps send/recv apart from every process group. Within a pair the plan's streams
  order them: torch.distributed.pipelining issues a step's sends and receives together (batch_isend_irecv, one
  NCCL group call), which the plan's per-peer streams model. (Unbatched ops of one pair would run one at a time
  on the pair's stream, and batched ones or eager initialization, ``init_process_group(device_id=...)``, use
  the group's communicator: not modelled; docs/communicators.md.)
- Gloo (CPU clusters): ProcessGroupGloo puts every collective in one work queue per group served by
  ``Options::threads`` worker threads (2 by default, ProcessGroupGloo.hpp): a collective starts in issue
  order once a worker is free, so at most 2 of one group run at a time. Send/recv bypass the queue (unbound
  buffers, posted at once): no limit. Shown on real gloo ranks: tests/test_communicators_torch.py.

In the simulation (sim/kernel/engine.py): the n-th collective a rank issues on a communicator (its plan order)
starts once the (n-1)-th has started and fewer than ``slots`` earlier ones are still running. The members of a
collective end it together and issue the same sequence, so the count of running ones is the same on every
member: one pair of counters per communicator, nothing per op.
"""
from __future__ import annotations

from collections import defaultdict

GLOO_THREADS = 2         # ProcessGroupGloo::Options::threads default (torch 2.13 ProcessGroupGloo.hpp)
NCCL_SLOTS = 1           # one NCCL communicator, one internal stream per device


def slots_for(cluster) -> int:
    """How many collectives of one communicator may run at once on ``cluster``: NCCL 1, Gloo its threads."""
    return GLOO_THREADS if cluster.gpu.arch == "cpu" else NCCL_SLOTS


class Turns:
    """Per communicator (any hashable key): its ops start in issue order, at most ``slots`` running at once."""

    def __init__(self, env, slots: int):
        self.env, self.slots = env, slots
        self.started: dict = defaultdict(int)       # communicator id -> collectives started on it
        self.ended: dict = defaultdict(int)         # communicator id -> collectives ended on it
        self.parked: dict = {}                      # (communicator id, n) -> event the n-th waits on

    def start(self, comm, n: int):
        """The ``n``-th collective on ``comm`` may start (a simpy generator: returns at once when it may)."""
        if self.started[comm] == n and n - self.ended[comm] < self.slots:
            self.started[comm] = n + 1
            self._wake(comm)
            return
        event = self.parked[comm, n] = self.env.event()
        yield event

    def end(self, comm) -> None:
        self.ended[comm] += 1
        self._wake(comm)

    def _wake(self, comm) -> None:
        while True:
            n = self.started[comm]
            event = self.parked.get((comm, n))
            if event is None or n - self.ended[comm] >= self.slots:
                return
            del self.parked[comm, n]
            self.started[comm] = n + 1
            event.succeed()
