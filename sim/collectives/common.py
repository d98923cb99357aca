"""What the algorithm modules share: pipeline chunking and the staged pipeline that trees and NVLS run."""
from __future__ import annotations

import math

CHUNK_BYTES = 1 << 20      # pipelining chunk for chain and tree algorithms (NCCL moves data in ~MiB chunks)
MAX_CHUNKS = 64            # cap on chunks per collective, to bound the simulation's work


def num_chunks(nbytes: float) -> int:
    """How many pipeline chunks a chain or tree splits ``nbytes`` into: ceil(S / 1 MiB), at most 64."""
    return max(1, min(MAX_CHUNKS, math.ceil(nbytes / CHUNK_BYTES)))


def pipeline(ctx, key, stages: list[list[tuple[int, int, float]]], k: int, nbytes: float):
    """Steps of a pipeline of stages run by k chunks: chunk j is in stage s at step j + s.

    ``stages[s]`` lists the flows (src, dst, bytes of the whole message) of stage s; each moves bytes / k per
    step. Steps: len(stages) + k - 1. The hop latency is paid while the pipeline fills (the first len(stages)
    steps, step latency None = the route's α); later steps stream behind it (latency 0), as chunks in flight
    hide the latency of the next one. On an uncontended fabric:
        t = s·α + Σ_t (bytes on the busiest link at step t) · β
    """
    n_stages = len(stages)
    for t in range(n_stages + k - 1):
        lo, hi = max(0, t - k + 1), min(n_stages - 1, t)
        def flows(lo=lo, hi=hi):         # built only on a cache miss (large rings repeat their steps)
            return [f for s in range(lo, hi + 1) for f in stages[s]]
        pairs = ctx.pairs((key, lo, hi), lambda: [(a, b) for a, b, _ in flows()])
        sizes = ctx.sizes((key, lo, hi, k, nbytes), lambda: [b / k for _, _, b in flows()])
        yield pairs, sizes, (None if t < n_stages else 0.0)
