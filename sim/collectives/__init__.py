"""Collective algorithms, expanded into steps of point-to-point flows that the network engine runs.

Every algorithm is a generator of steps ``(pairs, sizes, latency)``: the flows of one step start together and
the next step starts when all have arrived (bulk-synchronous steps, as in the α-β model). α is a step's
latency, β = 1 / bandwidth. Each module's docstring gives its cost on an uncontended topology and its source.

Result metrics follow nccl-tests (doc/PERFORMANCE.md): algbw = S / t; busbw = algbw x factor, with factor
2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for broadcast and reduce.
"""
from __future__ import annotations

import math

from distlab.sim.errors import ConfigError

CHUNK_BYTES = 1 << 20      # pipelining chunk for chain and tree algorithms (NCCL moves data in ~MiB chunks)
MAX_CHUNKS = 64            # cap on chunks per collective, to bound the simulation's work


def num_chunks(nbytes: float) -> int:
    """How many pipeline chunks a chain or tree splits ``nbytes`` into: ceil(S / 1 MiB), at most 64."""
    return max(1, min(MAX_CHUNKS, math.ceil(nbytes / CHUNK_BYTES)))


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


def supported(op: str) -> dict:
    """Which algorithms implement ``op``."""
    from distlab.sim.collectives import direct, hierarchical, nvls, ring, tree
    table = {"ring": ring.OPS, "tree": tree.OPS, "hierarchical": hierarchical.OPS, "nvls": nvls.OPS,
             "direct": direct.OPS}
    return {name: op in ops for name, ops in table.items()}


def steps(ctx, op: str, group: tuple[int, ...], nbytes: float, algorithm: str, root: int = 0):
    """The steps of one collective. ``ctx`` is a sim.collectives.context.Context (topology and caches)."""
    from distlab.sim.collectives import direct, hierarchical, nvls, ring, tree
    module = {"ring": ring, "tree": tree, "hierarchical": hierarchical, "nvls": nvls, "direct": direct}[algorithm]
    if op not in module.OPS:
        allowed = [a for a, ok in supported(op).items() if ok]
        raise ConfigError(f"algorithm {algorithm!r} does not implement {op}; allowed: auto, {', '.join(allowed)}",
                          "algorithm")
    module.check(ctx, group)
    return module.steps(ctx, op, group, nbytes, root)
