"""A rank's watchdog: no op of a plan runs longer than ``--timeout``, whatever it is stuck in.

    dog = Watchdog(rank=0, timeout_s=10.0, on_stuck=stop)        # runtime/ranks/worker.py, once per rank
    dog.enter("compute", 3, "compute 'layer 1'")                 # runtime/execute/executor.py, around every op
    ...; dog.leave("compute")

A collective that waits for a peer fails after the process group's timeout (Gloo's and NCCL's own), but nothing
bounds the rest: a Compute op of ``seconds: 1e12`` ran on under ``distlab run --timeout 10`` for as long as
anyone waited. NCCL's watchdog thread does this for collectives (each work item checked against its timeout;
torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, ``watchdogHandler``), and its heartbeat monitor ends a process
whose watchdog itself is stuck. Here one thread per rank looks every ``min(1 s, timeout / 10)`` at the op each
stream of the rank is in; one that has run longer than ``timeout_s`` calls ``on_stuck(message)``, which writes
the flight record and the error naming the rank and the op and ends the process (runtime/ranks/worker.py), so the run
ends within ``--timeout`` plus a second or two, as a collective's timeout would end it.
"""
from __future__ import annotations

import threading
import time


class Watchdog:
    """The op each stream of one rank is in (``enter``/``leave``), checked by a daemon thread."""

    def __init__(self, rank: int, timeout_s: float, on_stuck):
        self.rank, self.timeout_s, self.on_stuck = rank, timeout_s, on_stuck
        self.active: dict[str, tuple[int, str, float]] = {}       # stream -> (op index, description, start)
        self.fired = False
        self._period = min(1.0, max(0.01, timeout_s / 10))
        threading.Thread(target=self._watch, daemon=True, name="distlab-watchdog").start()

    def enter(self, stream: str, index: int, what: str) -> None:
        self.active[stream] = (index, what, time.monotonic())

    def leave(self, stream: str) -> None:
        self.active.pop(stream, None)

    def stuck(self, now: float | None = None) -> str | None:
        """The message for the op that has run too long, or None."""
        now = time.monotonic() if now is None else now
        for stream, (index, what, start) in list(self.active.items()):
            if now - start > self.timeout_s:
                return (f"watchdog: rank {self.rank} timed out: more than {self.timeout_s:g} s (--timeout) in op "
                        f"{index}, {what} on stream {stream!r}; the rank was ended")
        return None

    def _watch(self) -> None:
        while not self.fired:
            time.sleep(self._period)
            message = self.stuck()
            if message is not None:
                self.fired = True
                self.on_stuck(message)
