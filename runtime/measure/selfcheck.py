"""Known inputs through every collective on the real backend, outputs returned for an independent check.

Rank r's input element j is ``value(r, j)`` = (r + 1) * 10 + j % 7 (ints) or (r + 1) * 0.5 + (j % 7) * 0.25
(floats: exact in every float type, so sums are exact). tests/test_runtime_collectives.py recomputes the
expected outputs with plain Python. Also usable on GPUs (scripts/gpu_check.sh).
"""
from __future__ import annotations

from distlab.runtime.execute.collectives import element_counts, issue, make_buffers, torch_dtype

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "barrier")


def value(rank: int, j: int, dtype: str):
    if dtype.startswith(("int", "uint")):
        return (rank + 1) * 10 + j % 7
    return (rank + 1) * 0.5 + (j % 7) * 0.25


def cases(n: int, dtypes=("int32", "int64", "float32", "float64")) -> list[dict]:
    """Every op x dtype on the world (root n-1), plus all_reduce and broadcast on a subgroup when n > 2."""
    out = []
    for dtype in dtypes:
        e = {"int32": 4, "int64": 8, "float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}[dtype]
        for op in OPS:
            out.append({"op": op, "dtype": dtype, "bytes": 3 * n * e, "group": list(range(n)), "root": n - 1})
    if n > 2:
        sub = [1, n - 1]
        out.append({"op": "all_reduce", "dtype": "float32", "bytes": 20, "group": sub, "root": 1})
        out.append({"op": "broadcast", "dtype": "int64", "bytes": 40, "group": sub, "root": n - 1})
        out.append({"op": "all_gather", "dtype": "int32", "bytes": 24, "group": sub, "root": 1})
    return out


def collectives_task(ctx, payload: dict) -> dict:
    """Worker target: run every case, return {case index: output list} for the cases this rank is in."""
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    timeout = timedelta(seconds=ctx.timeout)
    n = ctx.world_size
    todo = cases(n, tuple(payload.get("dtypes", ("int32", "int64", "float32", "float64"))))
    groups = {}
    for c in todo:                                      # every rank creates every group, in one order
        key = tuple(c["group"])
        if key not in groups:
            groups[key] = dist.new_group(list(key), timeout=timeout)
    outputs = {}
    for i, c in enumerate(todo):
        if ctx.rank not in c["group"]:
            continue
        m = len(c["group"])
        inp, out = make_buffers(c["op"], c["bytes"], c["dtype"], m, ctx.device)
        if inp is not None:
            vals = [value(ctx.rank, j, c["dtype"]) for j in range(inp.numel())]
            inp.copy_(torch.tensor(vals, dtype=torch_dtype(c["dtype"])))
        work = issue(c["op"], inp, out, groups[tuple(c["group"])], c["root"], async_op=True)
        work.wait()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        outputs[str(i)] = None if out is None else out.cpu().tolist()
    # point-to-point as the executor does it: rank r sends value(r, j) to r+1 and receives from r-1 (a ring;
    # even ranks send first, odd ranks receive first, so blocking pairs cannot deadlock)
    from distlab.runtime.execute.executor import _p2p
    p2p = dist.new_group(list(range(n)), timeout=timeout)
    send = torch.tensor([value(ctx.rank, j, "float32") for j in range(5)], device=ctx.device)
    recv = torch.zeros(5, device=ctx.device)
    steps = [] if n == 1 else [(True, send, (ctx.rank + 1) % n), (False, recv, (ctx.rank - 1) % n)]
    for is_send, buf, peer in (steps if ctx.rank % 2 == 0 else steps[::-1]):
        _p2p(is_send, buf, peer, p2p)
    outputs["p2p"] = recv.cpu().tolist() if steps else send.cpu().tolist()
    result = {"rank": ctx.rank, "outputs": outputs,
              "counts": {str(i): element_counts(c["op"], c["bytes"], c["dtype"], len(c["group"]))
                         for i, c in enumerate(todo)}}
    if payload.get("plan"):
        from distlab.runtime.execute.executor import plan_task
        result["plan"] = plan_task(ctx, payload["plan"])
    return result
