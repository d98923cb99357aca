"""A plan's collectives as torch.distributed calls on buffers of the planned bytes and dtype.

Byte counts follow nccl-tests (doc/PERFORMANCE.md, sim/plan.py); with ``e`` the element size and ``n`` the
group size, element counts are rounded to the nearest whole element (halves up), at least one (per rank):
  all_reduce, broadcast, reduce: one buffer of round(bytes / e) elements, in place;
  all_gather: input c, output n*c, c = round(bytes / (n*e))       (bytes = the gathered output);
  reduce_scatter: input n*c, output c, c = round(bytes / (n*e))   (bytes = the full input);
  all_to_all: input and output n*c, c = round(bytes / (n*e))      (bytes = what one rank sends in all);
  barrier: no buffer.
An all_to_all with per-peer sizes (the plan's ``splits``): input Σ_j c_ij, output Σ_i c_ij elements, c = the
split's bytes / e, sent with ``all_to_all_single``'s input_split_sizes (row i) and output_split_sizes (column i).
So the bytes moved can differ from the plan's by less than n elements; traces keep the planned bytes.
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.plan import DTYPE_BYTES

# Gloo has no int16 reduction ("Invalid scalar type", and the ranks desync after it): refused up front.
GLOO_DTYPES = tuple(d for d in DTYPE_BYTES if d != "int16")


def torch_dtype(name: str):
    import torch
    return getattr(torch, name)


def element_counts(op: str, nbytes: int, dtype: str, n: int) -> tuple[int, int]:
    """(input numel, output numel) of one rank for collective ``op`` of ``nbytes`` over ``n`` ranks."""
    e = DTYPE_BYTES[dtype]
    if op == "barrier":
        return 0, 0
    if op in ("all_reduce", "broadcast", "reduce"):
        c = max(1, int(nbytes / e + 0.5))
        return c, c
    c = max(1, int(nbytes / (n * e) + 0.5))
    if op == "all_gather":
        return c, n * c
    if op == "reduce_scatter":
        return n * c, c
    if op == "all_to_all":
        return n * c, n * c
    raise ConfigError(f"unknown collective {op!r}", "collective")


def actual_bytes(op: str, nbytes: int, dtype: str, n: int) -> int:
    """The bytes the buffers really hold, in nccl-tests terms (compare with the planned ``nbytes``)."""
    i, o = element_counts(op, nbytes, dtype, n)
    e = DTYPE_BYTES[dtype]
    return {"all_gather": o, "reduce_scatter": i, "all_to_all": i}.get(op, i) * e


def check_backend_dtype(dtype: str, backend: str, where: str) -> None:
    if backend == "gloo" and dtype not in GLOO_DTYPES:
        raise ConfigError(f"dtype {dtype!r} has no Gloo reduction; with gloo use {', '.join(GLOO_DTYPES)}", where)


def split_sizes(op, me: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input, output) split sizes in elements of group member ``me`` of an all_to_all with ``splits``."""
    e = DTYPE_BYTES[op.dtype]
    return (tuple(int(b / e + 0.5) for b in op.splits[me]), tuple(int(row[me] / e + 0.5) for row in op.splits))


def make_buffers(op: str, nbytes: int, dtype: str, n: int, device="cpu", split=None):
    """Zeroed (input, output) tensors; the same tensor twice for the in-place collectives. ``split``: an
    all_to_all's (input, output) split sizes (:func:`split_sizes`)."""
    import torch
    i, o = element_counts(op, nbytes, dtype, n) if split is None else (sum(split[0]), sum(split[1]))
    if op == "barrier":
        return None, None
    inp = torch.zeros(i, dtype=torch_dtype(dtype), device=device)
    if op in ("all_reduce", "broadcast", "reduce"):
        return inp, inp
    return inp, torch.zeros(o, dtype=torch_dtype(dtype), device=device)


def issue(op: str, inp, out, group=None, root: int = 0, async_op: bool = False, split=None):
    """Start collective ``op`` (SUM for reductions; ``root`` a global rank); a Work handle when ``async_op``.
    ``split``: an all_to_all's (input, output) split sizes."""
    import torch.distributed as dist
    if op == "all_reduce":
        return dist.all_reduce(inp, group=group, async_op=async_op)
    if op == "all_gather":
        return dist.all_gather_into_tensor(out, inp, group=group, async_op=async_op)
    if op == "reduce_scatter":
        return dist.reduce_scatter_tensor(out, inp, group=group, async_op=async_op)
    if op == "broadcast":
        return dist.broadcast(inp, src=root, group=group, async_op=async_op)
    if op == "reduce":
        return dist.reduce(inp, dst=root, group=group, async_op=async_op)
    if op == "all_to_all":
        if split is not None:
            return dist.all_to_all_single(out, inp, output_split_sizes=list(split[1]),
                                          input_split_sizes=list(split[0]), group=group, async_op=async_op)
        return dist.all_to_all_single(out, inp, group=group, async_op=async_op)
    if op == "barrier":
        return dist.barrier(group=group, async_op=async_op)
    raise ConfigError(f"unknown collective {op!r}", "collective")


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw x factor."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0
