"""Real runs of lessons 01-04: every collective with every rank's view, a check of your own ring all-reduce
against dist.all_reduce, torchrun on one or several (emulated) nodes, and small benches."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from distlab.runtime.lessons.common import fewer, run_on_ranks
from distlab.runtime.execute.wire import all_gather_json

DEMO_OPS = ("all_reduce", "broadcast", "all_gather", "reduce", "reduce_scatter", "all_to_all", "barrier")


# --- every collective, every rank's view --------------------------------------------------------------------
def collectives_demo(nproc: int = 4, ops=DEMO_OPS, backend: str = "gloo") -> dict:
    """Run each collective of ``ops`` once on ``nproc`` ranks with tiny tensors. Returns
    {"env": [per rank torchrun variables], "groups": [per rank backends], "results": {op: [per rank
    {"rank", "before", "after", "note"}]}}."""
    out = run_on_ranks("distlab.runtime.lessons.collectives:_demo_task", {"ops": list(ops)}, nproc, backend)
    return {"env": [r["env"] for r in out], "groups": [r["groups"] for r in out],
            "results": {op: [r["results"][op] for r in out] for op in ops}}


def _inputs(op: str, rank: int, n: int):
    import torch
    if op in ("all_reduce", "broadcast", "reduce"):
        return torch.arange(4, dtype=torch.float32) + 10 * rank
    if op == "all_gather":
        return torch.full((2,), float(rank))
    if op == "reduce_scatter":
        return torch.arange(2 * n, dtype=torch.float32) + 10 * rank
    if op == "all_to_all":
        return torch.tensor([10.0 * rank + j for j in range(n)])
    return None


def _demo_task(ctx, payload):
    import torch
    import torch.distributed as dist
    n, dev = ctx.world_size, ctx.device
    env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                          "MASTER_PORT")}
    meta = dist.new_group(backend="gloo")               # CPU metadata beside the main backend (NCCL on GPUs)
    shapes = all_gather_json({"rank": ctx.rank, "pid": os.getpid()}, group=meta)   # JSON bytes, never pickles
    groups = {"default": dist.get_backend(), "metadata group": dist.get_backend(meta), "pids": [s["pid"] for s
                                                                                                 in shapes]}
    results = {}
    for op in payload["ops"]:
        x = _inputs(op, ctx.rank, n)
        before = x.tolist() if x is not None else []
        note = ""
        if x is not None:
            x = x.to(dev)
        if op == "all_reduce":
            dist.all_reduce(x)
            after = x
        elif op == "broadcast":
            dist.broadcast(x, src=0)
            after = x
        elif op == "reduce":
            dist.reduce(x, dst=0)
            after = x
            note = "the sum (root)" if ctx.rank == 0 else "not defined off the root: do not use"
        elif op == "all_gather":
            after = torch.empty(2 * n, device=dev)
            dist.all_gather_into_tensor(after, x)
        elif op == "reduce_scatter":
            after = torch.empty(2, device=dev)
            dist.reduce_scatter_tensor(after, x)
        elif op == "all_to_all":
            after = torch.empty(n, device=dev)
            dist.all_to_all_single(after, x)
        else:                                           # barrier: arrive late on purpose, see who waits
            time.sleep(0.05 * ctx.rank)
            t0 = time.perf_counter()
            dist.barrier()
            after = None
            before = f"arrives {50 * ctx.rank} ms late"
            note = f"waited {(time.perf_counter() - t0) * 1e3:.0f} ms in the barrier"
        results[op] = {"rank": ctx.rank, "before": before, "after": after.cpu().tolist() if after is not None else
                       "", "note": note}
    return {"env": env, "groups": groups, "results": results}


# --- your own ring all-reduce --------------------------------------------------------------------------------
def check_all_reduce(target: str, nproc: int = 4, numel=10, backend: str = "gloo", world_sizes=None) -> list[dict]:
    """Run your ``fn(tensor)`` (``path.py:function``) on ``nproc`` ranks and compare with dist.all_reduce.
    ``fn`` may return the result or reduce in place. Per rank: max_abs_error, ok, sends, recvs (counted).
    ``numel`` may be a list of tensor lengths, all checked in the same launch: then one row per (length, rank),
    each with its ``numel``. ``world_sizes`` (each <= nproc) runs ``fn`` on the first k ranks of the same launch
    for each k, with dist.get_world_size() and dist.get_rank() answering as in a k-rank job (rows get
    ``world_size``): one launch checks several ring sizes."""
    if ":" not in target:
        raise ValueError("target is 'path/to/file.py:function_name'")
    path, _, name = target.rpartition(":")
    lengths = [int(numel)] if isinstance(numel, int) else [int(k) for k in numel]
    sizes = [nproc] if world_sizes is None else [int(k) for k in world_sizes]
    if any(not 1 <= k <= nproc for k in sizes):
        raise ValueError(f"world_sizes {sizes} must each be between 1 and nproc={nproc}")
    out = run_on_ranks("distlab.runtime.lessons.collectives:_ring_task", {"target": f"{os.path.abspath(path)}:{name}",
                                                              "lengths": lengths, "world_sizes": sizes},
                       nproc, backend)
    rows = [row for per_rank in out for row in per_rank]
    rows.sort(key=lambda r: (r["world_size"], r["numel"], r["rank"]))
    if world_sizes is None and isinstance(numel, int):
        return [{k: v for k, v in r.items() if k not in ("numel", "world_size")} for r in rows]
    return rows if world_sizes is not None else [{k: v for k, v in r.items() if k != "world_size"} for r in rows]


def _ring_task(ctx, payload):
    import torch
    import torch.distributed as dist

    from distlab.runtime.ranks.worker import load_target
    fn = load_target(payload["target"])
    names = ("send", "recv", "isend", "irecv", "get_rank", "get_world_size")
    originals = {k: getattr(dist, k) for k in names}
    rows = []
    for size in payload["world_sizes"]:
        group = dist.new_group(list(range(size))) if size < ctx.world_size else None   # every rank calls new_group
        if ctx.rank >= size:
            continue
        for numel in payload["lengths"]:
            counts = {"sends": 0, "recvs": 0}

            def counting(name, f, counts=counts):
                def wrapped(*a, **k):
                    counts["sends" if "send" in name else "recvs"] += 1
                    return f(*a, **k)
                return wrapped
            gen = torch.Generator().manual_seed(1234 + ctx.rank + 100 * numel)
            x = torch.randn(numel, generator=gen).to(ctx.device)
            expected = x.clone()
            dist.all_reduce(expected, group=group)
            for k in ("send", "recv", "isend", "irecv"):
                setattr(dist, k, counting(k, originals[k]))
            dist.get_rank = lambda group=None, rank=ctx.rank: rank if group is None else originals["get_rank"](group)
            dist.get_world_size = (lambda group=None, n=size: n if group is None
                                   else originals["get_world_size"](group))
            try:
                mine = x.clone()
                got = fn(mine)
            finally:
                for k, f in originals.items():
                    setattr(dist, k, f)
            got = mine if got is None else got
            err = float((got.to(expected.device) - expected).abs().max())
            rows.append({"rank": ctx.rank, "world_size": size, "numel": numel, "max_abs_error": err,
                         "ok": err <= 1e-4 * max(1.0, float(expected.abs().max())), **counts})
    return rows


# --- torchrun ------------------------------------------------------------------------------------------------
def torchrun(script: str, nproc_per_node: int = 2, nnodes: int = 1, timeout: float = 120.0) -> str:
    """Run ``script`` under torchrun. ``nnodes`` > 1 starts one torchrun agent per 'node' on this machine
    (--nnodes, --node-rank, --master-addr 127.0.0.1), as you would on each machine of a cluster. Returns the
    ranks' output lines (torchrun's own banner dropped), sorted. Quick mode (runtime/lessons/common.py): one
    process per node (a torchrun worker is a new Python that imports torch, ~3 s of CPU on a small machine)."""
    import shutil
    import tempfile
    logs = tempfile.mkdtemp(prefix="distlab-torchrun-")       # torchrun's logs (else torchelastic_* stays in /tmp)
    try:
        return _torchrun(script, nproc_per_node, nnodes, timeout, logs)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def _torchrun(script: str, nproc_per_node: int, nnodes: int, timeout: float, logs: str) -> str:
    from distlab.runtime.ranks.launch import free_port
    nproc_per_node = fewer(nproc_per_node, 1)         # quick mode: one worker per node (each imports torch)
    base = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc_per_node),
            "--log-dir", logs]
    if nnodes == 1:
        cmds = [base + ["--standalone", script]]
    else:
        port = str(free_port())
        cmds = [base + ["--nnodes", str(nnodes), "--node-rank", str(i), "--master-addr", "127.0.0.1",
                        "--master-port", port, script] for i in range(nnodes)]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL) for c in cmds]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lines = [ln for o in outs for ln in o.splitlines() if ln.strip() and not ln.startswith(("*", "Setting OMP",
                                                                                             "W1", "W0", "[W"))]
    failed = [p.returncode for p in procs if p.returncode]
    if failed:
        raise RuntimeError(f"torchrun exited with {failed[0]}:\n" + "\n".join(lines[-20:]))
    return "\n".join(sorted(lines))


# --- measuring -----------------------------------------------------------------------------------------------
def bench(ops=("all_reduce",), sizes=(2**20,), nproc: int = 2, iters: int = 5, warmup: int = 1,
          compute: bool = False, plan=None, backend: str = "gloo", timeout: float = 60.0) -> dict:
    """What `distlab bench` measures (runtime/measure/sweep.py), as data: {"rows": [...], "compute": {...} if asked,
    "plan": [per rank] if a plan payload (runtime.execute.executor.plan_task) is given}. Rows are the slowest rank's
    median time ``time_s`` and the time from launch ``launch_time_s``, with algbw and busbw."""
    payload = {"ops": list(ops), "sizes": [int(s) for s in sizes], "warmup": fewer(warmup, 1),
               "iters": fewer(iters, 2),
               "compute": compute, "plan": plan}
    results = run_on_ranks("distlab.runtime.measure.sweep:sweep_task", payload, nproc, backend, timeout)
    out = dict(results[0])
    if plan is not None:
        out["plan"] = [r["plan"] for r in results]
    return out
