"""Gradient buckets exactly as PyTorch 2.13's DDP Reducer builds them.

Sources (torch 2.13.0): ``torch/nn/parallel/distributed.py`` (``_BucketCapacityConfig``, ``_ddp_init_helper``)
and ``torch/csrc/distributed/c10d/reducer.cpp`` (``compute_bucket_assignment_by_size``,
``Reducer::rebuild_buckets``, ``Reducer::mark_bucket_ready``); facts checked in shared/REFERENCES.md.

- Caps: ``bucket_cap_mb`` MiB (default 25). Left at None, the first bucket is capped at
  ``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB; an explicit cap applies to the first bucket too.
- Iteration 0 (``find_unused_parameters=False``): one bucket per dtype holding every parameter.
- Steady state (after iteration 0's backward): parameters are taken in the order their gradients became
  ready; each goes into the open bucket of its dtype; once the bucket's bytes reach its limit (a threshold:
  ``size >= limit``) it is closed and the next limit applies. So a tensor larger than the cap is alone.
  Leftover open buckets are closed at the end (one per dtype, in order of first appearance here).
- Launch: a bucket is all-reduced once all its gradients are ready and every lower-index bucket has launched.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from distlab.sim.errors import ConfigError
from distlab.sim.models import Model, Param

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB


@dataclass(frozen=True)
class Bucket:
    index: int
    params: tuple[int, ...]       # parameter indices (registration order numbering), in bucket order
    bytes: int
    dtype: str
    limit: int                    # the size limit it was built against


def bucket_limits(bucket_cap_mb: float | None = None) -> list[int]:
    """[first bucket limit, later limit] in bytes, as ``Reducer::rebuild_buckets`` gets them."""
    if bucket_cap_mb is None:
        return [DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_MB * MIB]
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
        raise ConfigError(f"{bucket_cap_mb!r} must be a number of MiB > 0", "bucket_cap_mb")
    cap = int(bucket_cap_mb * MIB)
    return [cap, cap]


def assign(params: list[Param], order: list[int], limits: list[int]) -> list[Bucket]:
    """``compute_bucket_assignment_by_size`` over ``params`` taken in ``order``, one open bucket per dtype."""
    open_: dict[str, list] = {}       # dtype -> [indices, size, limit position]
    done: list[tuple[list[int], int, str, int]] = []
    for i in order:
        p = params[i]
        b = open_.setdefault(p.dtype, [[], 0, 0])
        b[0].append(i)
        b[1] += p.bytes
        limit = limits[b[2]]
        if b[1] >= limit:
            done.append((b[0], b[1], p.dtype, limit))
            open_[p.dtype] = [[], 0, min(b[2] + 1, len(limits) - 1)]
    for dtype, (idx, size, pos) in open_.items():
        if idx:
            done.append((idx, size, dtype, limits[pos]))
    return [Bucket(k, tuple(idx), size, dtype, limit) for k, (idx, size, dtype, limit) in enumerate(done)]


def ddp_buckets(model: Model, bucket_cap_mb: float | None = None, iteration: int = 1,
                order: list[int] | None = None) -> list[Bucket]:
    """The buckets DDP uses at ``iteration`` (0: the first step, one bucket; >= 1: rebuilt ones).
    ``order``: gradient-ready order (default ``model.ready_order()``)."""
    limits = bucket_limits(bucket_cap_mb)
    params = model.params
    if iteration == 0:
        # distributed.py: limits [sys.maxsize] over registration order, buckets sorted by their first
        # parameter, then handed to the Reducer reversed (one bucket per dtype).
        buckets = assign(params, list(range(len(params))), [sys.maxsize])
        buckets.sort(key=lambda b: min(b.params), reverse=True)
        return [Bucket(k, b.params, b.bytes, b.dtype, b.limit) for k, b in enumerate(buckets)]
    order = model.ready_order() if order is None else list(order)
    if sorted(order) != list(range(len(params))):
        raise ConfigError("the gradient-ready order must list every parameter once", "order")
    return assign(params, order, limits)


def launch_times(buckets: list[Bucket], ready: list[float]) -> list[float]:
    """``Reducer::mark_bucket_ready``: bucket k launches at max(its last gradient ready, launch of k-1).
    ``ready[i]``: when parameter i's gradient is ready."""
    return bucket_launch_times([max(ready[i] for i in b.params) for b in buckets])


def bucket_launch_times(bucket_ready: list) -> list:
    """The launch rule itself (its one home): launch k = max(ready k, launch k-1), buckets in index order;
    ``bucket_ready[k]`` is when bucket k's last gradient is ready (None: never, so neither is its launch)."""
    out, prev = [], float("-inf")
    for t in bucket_ready:
        prev = None if t is None or prev is None else max(prev, t)
        out.append(prev)
    return out
