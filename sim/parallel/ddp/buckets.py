"""Gradient buckets exactly as PyTorch 2.13's DDP Reducer builds them.

Sources (torch 2.13.0): ``torch/nn/parallel/distributed.py`` (``_BucketCapacityConfig``, ``_ddp_init_helper``)
and ``torch/csrc/distributed/c10d/reducer.cpp`` (``compute_bucket_assignment_by_size``,
``Reducer::rebuild_buckets``, ``Reducer::mark_bucket_ready``); facts checked in shared/REFERENCES.md.

- Caps: ``bucket_cap_mb`` MiB (default 25). Left at None, the first bucket is capped at
  ``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB; an explicit cap applies to the first bucket too.
- Iteration 0 (``find_unused_parameters=False``): limits ``[sys.maxsize]`` over registration order, so one
  bucket per (dtype, device) holding all its parameters; no ``tensor_indices``, so torch sorts the buckets by
  their smallest index, and ``_ddp_init_helper`` hands them to the Reducer reversed.
- Steady state (``Reducer::rebuild_buckets`` after iteration 0's backward): parameters are taken in the order
  their gradients became ready (passed as ``tensor_indices``); each goes into the open bucket of its
  (dtype, device); once the bucket's bytes reach its limit (a threshold: ``size >= limit``) it is closed and
  that key's next limit applies. So a tensor larger than the cap is alone. The buckets still open at the end
  are closed in the iteration order of torch's ``std::unordered_map<BucketKey, ...>`` (see
  ``UnorderedMapOrder``, keyed by ``bucket_key_hash``), and with ``tensor_indices`` given they are NOT sorted
  afterwards: with one dtype the leftover bucket is simply last; with several, their order follows the hash
  table. float16/32/64 and bfloat16 on cpu or cuda:0 each get a hash bucket of their own (of 13), so their
  leftovers come out in REVERSE order of first appearance; keys sharing a bucket (bfloat16 and int16 on cpu)
  or more than 13 keys do not follow that shortcut, the emulation does.
  Rank 0's assignment is broadcast to all ranks (``Reducer::sync_bucket_indices``), so rank 0's device counts.
- Launch: a bucket is all-reduced once all its gradients are ready and every lower-index bucket has launched.
"""
from __future__ import annotations

import bisect
import sys
from dataclasses import dataclass

from distlab.sim.errors import ConfigError
from distlab.sim.models import Model, Param

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB

# c10::ScalarType enum values (torch/headeronly/core/ScalarType.h) and c10::DeviceType (c10/core/DeviceType.h)
SCALAR_TYPE = {"uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float16": 5, "float32": 6,
               "float64": 7, "bfloat16": 15}
DEVICE_TYPE = {"cpu": 0, "cuda": 1, "meta": 14}


@dataclass(frozen=True)
class Bucket:
    index: int
    params: tuple[int, ...]       # parameter indices (registration order numbering), in bucket order
    bytes: int
    dtype: str
    limit: int                    # the size limit it was built against
    device: str = "cpu"


def bucket_limits(bucket_cap_mb: float | None = None) -> list[int]:
    """[first bucket limit, later limit] in bytes, as ``Reducer::rebuild_buckets`` gets them."""
    if bucket_cap_mb is None:
        return [DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_MB * MIB]
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
        raise ConfigError(f"{bucket_cap_mb!r} must be a number of MiB > 0", "bucket_cap_mb")
    cap = int(bucket_cap_mb * MIB)
    return [cap, cap]


def device_hash(device: str) -> int:
    """``std::hash<c10::Device>`` (c10/core/Device.h): ``uint8(type) << 16 | uint8(index)``; CPU and meta
    tensors have index -1 (255 as uint8), CUDA ones their ordinal: "cpu" -> 255, "cuda:0" -> 65536."""
    kind, _, ordinal = device.partition(":")
    cpu_like = kind in ("cpu", "meta") and ordinal == ""
    cuda = kind == "cuda" and ordinal.isdigit() and int(ordinal) < 128
    if not (cpu_like or cuda):
        raise ConfigError(f"unknown device {device!r}; allowed: cpu, meta, cuda:N (N < 128)", "device")
    index = int(ordinal) if kind == "cuda" else -1
    return DEVICE_TYPE[kind] << 16 | (index & 0xFF)


def bucket_key_hash(dtype: str, device: str = "cpu") -> int:
    """``c10::hash<BucketKey>`` = ``c10::get_hash(type, device)`` (c10/util/hash.h): the tuple hash folds from
    the last element, ``hash_combine(seed=hash(device), value=hash(type))`` with
    ``hash_combine(s, v) = s ^ (v + 0x9e3779b9 + (s << 6) + (s >> 2))`` in 64-bit size_t; an enum hashes to its
    value (ScalarType: Half 5, Float 6, Double 7, BFloat16 15)."""
    if dtype not in SCALAR_TYPE:
        raise ConfigError(f"unknown dtype {dtype!r}; allowed: {', '.join(SCALAR_TYPE)}", "dtype")
    seed, value = device_hash(device), SCALAR_TYPE[dtype]
    return (seed ^ (value + 0x9E3779B9 + (seed << 6) + (seed >> 2))) % 2**64


class UnorderedMapOrder:
    """Iteration order of the keys of a libstdc++ ``std::unordered_map`` (unique keys, max load factor 1)
    that are only ever inserted, never erased (bits/hashtable.h, src/c++11/hashtable_c++0x.cc).

    All nodes sit in one singly linked list, the nodes of a bucket (``hash % bucket_count``) next to each
    other; iteration walks that list. ``_M_insert_bucket_begin``: a new key goes in front of its bucket's
    first node, or, if its bucket is empty, at the front of the whole list. ``_Prime_rehash_policy``: an
    empty map has 1 bucket; the first insertion rehashes to ``_M_next_bkt(12)`` = 13 buckets (the small-size
    table ``__fast_bkt``), and inserting key number ``bucket_count + 1`` rehashes to the first entry >= twice
    the count in ``__prime_list`` (13 -> 29 -> 59 -> 127 ...). ``_M_rehash_aux`` re-links the old list in
    order into the empty new table by the same front-of-bucket rule; the rehash happens before the new key
    is linked. Checked against the running libstdc++.so.6 (its __fast_bkt and __prime_list)."""

    FAST_BUCKETS = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)        # __fast_bkt[n], n < 14
    PRIMES = (17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 103, 109, 113,
              127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257)   # __prime_list[6:41]

    def __init__(self):
        self.keys: list = []            # in iteration order
        self._hash: dict = {}
        self.bucket_count = 1
        self._next_resize = 0           # element count that triggers the next rehash

    def insert(self, key, hash_code: int) -> None:
        if key in self._hash:
            return
        grown = self._need_rehash(len(self.keys))
        self._hash[key] = hash_code
        if grown:
            old, self.keys, self.bucket_count = self.keys, [], grown
            for other in old:
                self._link(other)
        self._link(key)

    def _link(self, key) -> None:
        bucket = self._hash[key] % self.bucket_count
        for pos, other in enumerate(self.keys):
            if self._hash[other] % self.bucket_count == bucket:
                self.keys.insert(pos, key)
                return
        self.keys.insert(0, key)

    def _need_rehash(self, count: int) -> int:
        """``_M_need_rehash(bucket_count, count, 1)``: the new bucket count, or 0 for none."""
        if count + 1 <= self._next_resize:
            return 0
        min_buckets = max(count + 1, 0 if self._next_resize else 11)
        if min_buckets >= self.bucket_count:
            return self._next_bucket_count(max(min_buckets + 1, 2 * self.bucket_count))
        self._next_resize = self.bucket_count
        return 0

    def _next_bucket_count(self, n: int) -> int:
        """``_M_next_bkt(n)``: ``__fast_bkt[n]`` below 14, else the first ``__prime_list`` entry >= n."""
        if n < len(self.FAST_BUCKETS):
            count = self.FAST_BUCKETS[n]
        else:
            pos = bisect.bisect_left(self.PRIMES, n)
            if pos == len(self.PRIMES):
                raise ConfigError(f"more than {self.PRIMES[-1]} (dtype, device) keys is not modelled", "params")
            count = self.PRIMES[pos]
        self._next_resize = count
        return count


def assign(params: list[Param], order: list[int] | None, limits: list[int],
           devices: list[str] | None = None) -> list[Bucket]:
    """``compute_bucket_assignment_by_size(tensors, limits, {}, tensor_indices)`` (reducer.cpp).

    ``order`` is ``tensor_indices``: the parameters in the order they are taken (DDP's rebuild passes the
    gradient-ready order); buckets come out as they close, then the leftovers in hash-map order, unsorted.
    ``order=None`` is an empty ``tensor_indices``: tensors in index order and the result sorted by each
    bucket's smallest index. ``devices[i]``: parameter i's device (default all "cpu"). Keys: (dtype, device),
    each with its own open bucket and its own position in ``limits`` (the last limit repeats). torch enters a
    key in its ``buckets`` map at the key's first tensor and only resets (never erases) it when a bucket
    closes, so the leftovers are the non-empty entries in the map's order of keys."""
    devices = ["cpu"] * len(params) if devices is None else list(devices)
    if len(devices) != len(params):
        raise ConfigError(f"{len(devices)} devices for {len(params)} parameters", "devices")
    table = UnorderedMapOrder()
    open_: dict[tuple[str, str], list] = {}       # key -> [indices, size, limit position]
    done: list[tuple[list[int], int, tuple[str, str], int]] = []
    for i in (range(len(params)) if order is None else order):
        key = (params[i].dtype, devices[i])
        table.insert(key, bucket_key_hash(*key))
        b = open_.setdefault(key, [[], 0, 0])
        b[0].append(i)
        b[1] += params[i].bytes
        limit = limits[b[2]]
        if b[1] >= limit:
            done.append((b[0], b[1], key, limit))
            open_[key] = [[], 0, min(b[2] + 1, len(limits) - 1)]
    for key in table.keys:
        indices, size, pos = open_[key]
        if indices:
            done.append((indices, size, key, limits[pos]))
    if order is None:
        done.sort(key=lambda bucket: min(bucket[0]))
    return [Bucket(k, tuple(idx), size, dtype, limit, device)
            for k, (idx, size, (dtype, device), limit) in enumerate(done)]


def ddp_buckets(model: Model, bucket_cap_mb: float | None = None, iteration: int = 1,
                order: list[int] | None = None, device: str = "cpu") -> list[Bucket]:
    """The buckets DDP uses at ``iteration`` (0: the first step, one bucket per dtype; >= 1: rebuilt ones).
    ``order``: gradient-ready order (default ``model.ready_order()``); ``device``: rank 0's parameter device
    ("cpu", "cuda:0"), which sets the order of several dtypes' leftover buckets."""
    limits = bucket_limits(bucket_cap_mb)
    params = model.params
    devices = [device] * len(params)
    if iteration == 0:
        # distributed.py: limits [sys.maxsize], no tensor_indices (sorted by smallest index), then the
        # bucket list is handed to the Reducer reversed.
        buckets = list(reversed(assign(params, None, [sys.maxsize], devices)))
        return [Bucket(k, b.params, b.bytes, b.dtype, b.limit, b.device) for k, b in enumerate(buckets)]
    order = model.ready_order() if order is None else list(order)
    if sorted(order) != list(range(len(params))):
        raise ConfigError("the gradient-ready order must list every parameter once", "order")
    return assign(params, order, limits, devices)


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
