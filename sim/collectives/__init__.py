"""Collective algorithms, expanded into steps of point-to-point flows that the network engine runs.

Every algorithm is a generator of steps ``(pairs, sizes, latency)``: the flows of one step start together and
the next step starts when all have arrived (bulk-synchronous steps, as in the α-β model). α is a step's
latency, β = 1 / bandwidth. Each module's docstring gives its cost on an uncontended topology and its source;
collectives.algorithms lists the modules, collectives.protocols adds NCCL's per-call costs (LL, LL128, Simple).

Result metrics follow nccl-tests (doc/PERFORMANCE.md): algbw = S / t; busbw = algbw x factor, with factor
2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for broadcast and reduce.
"""
from __future__ import annotations

from distlab.sim.collectives.common import CHUNK_BYTES, MAX_CHUNKS, num_chunks  # noqa: F401 (re-exported)


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md)."""
    if n <= 1:
        return 0.0 if op not in ("broadcast", "reduce") else 1.0
    if op in ("all_reduce", "barrier"):
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def ring_cost(op: str, n: int) -> tuple[int, float]:
    """(steps, bytes factor) of the ring model: t = steps x α + factor x S x β.
    all_reduce 2(n-1), 2(n-1)/n; all_gather / reduce_scatter n-1, (n-1)/n (Thakur, Rabenseifner & Gropp 2005);
    broadcast / reduce as a chain without pipelining n-1, 1; all_to_all direct 1, (n-1)/n; barrier 2(n-1), 0."""
    if n <= 1:
        return 0, 0.0
    return {"all_reduce": (2 * (n - 1), 2 * (n - 1) / n), "all_gather": (n - 1, (n - 1) / n),
            "reduce_scatter": (n - 1, (n - 1) / n), "broadcast": (n - 1, 1.0), "reduce": (n - 1, 1.0),
            "all_to_all": (1, (n - 1) / n), "barrier": (2 * (n - 1), 0.0)}[op]


def metrics(op: str, n: int, nbytes: float, seconds: float) -> dict:
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return {"time_s": seconds, "algbw_GBps": algbw, "busbw_GBps": algbw * busbw_factor(op, n)}
