"""Real runs for the lessons: collectives on N local ranks with every rank's result, a check of your own ring
all-reduce against dist.all_reduce, torchrun on one or several (simulated) nodes, and small benches.

Every function starts fresh rank processes through runtime.launch (gloo on CPU; NCCL where each rank has a
GPU, with backend="auto") and returns plain Python data; sim.lessons.helpers turns it into tables and figures.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

DEMO_OPS = ("all_reduce", "broadcast", "all_gather", "reduce", "reduce_scatter", "all_to_all", "barrier")
QUICK_ENV = "DISTLAB_LESSONS_QUICK"


def quick() -> bool:
    """True when DISTLAB_LESSONS_QUICK is set (tests/test_lessons_notebooks.py sets it): the helpers below then
    repeat less (iterations, steps, warm-up; one process per node in a multi-node torchrun), so CI executes
    every lesson cell at a fraction of the cost. Results stay real; medians are just noisier."""
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def fewer(n: int, quick_n: int) -> int:
    """``n``, or at most ``quick_n`` in quick mode."""
    return min(n, quick_n) if quick() else n


def run_on_ranks(target: str, payload=None, nproc: int = 4, backend: str = "gloo", timeout: float = 60.0) -> list:
    """Run ``target(ctx, payload)`` (``module:function`` or ``file.py:function``) on ``nproc`` local ranks;
    the list of what each rank returned. A failing rank raises runtime.launch.RunFailed naming it."""
    from distlab.runtime.launch import launch
    return launch(target, payload, nproc, backend=backend, timeout=timeout)


# --- every collective, every rank's view --------------------------------------------------------------------
def collectives_demo(nproc: int = 4, ops=DEMO_OPS, backend: str = "gloo") -> dict:
    """Run each collective of ``ops`` once on ``nproc`` ranks with tiny tensors. Returns
    {"env": [per rank torchrun variables], "groups": [per rank backends], "results": {op: [per rank
    {"rank", "before", "after", "note"}]}}."""
    out = run_on_ranks("distlab.runtime.lessons:_demo_task", {"ops": list(ops)}, nproc, backend)
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
    shapes = [None] * n
    dist.all_gather_object(shapes, {"rank": ctx.rank, "pid": os.getpid()}, group=meta)
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
    out = run_on_ranks("distlab.runtime.lessons:_ring_task", {"target": f"{os.path.abspath(path)}:{name}",
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

    from distlab.runtime.worker import load_target
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
    ranks' output lines (torchrun's own banner dropped), sorted."""
    import shutil
    import tempfile
    logs = tempfile.mkdtemp(prefix="distlab-torchrun-")       # torchrun's logs (else torchelastic_* stays in /tmp)
    try:
        return _torchrun(script, nproc_per_node, nnodes, timeout, logs)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def _torchrun(script: str, nproc_per_node: int, nnodes: int, timeout: float, logs: str) -> str:
    from distlab.runtime.launch import free_port
    if nnodes > 1:
        nproc_per_node = fewer(nproc_per_node, 1)
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
    """What `distlab bench` measures (runtime/sweep.py), as data: {"rows": [...], "compute": {...} if asked,
    "plan": [per rank] if a plan payload (runtime.executor.plan_task) is given}. Rows are the slowest rank's
    median time ``time_s`` and the time from launch ``launch_time_s``, with algbw and busbw."""
    payload = {"ops": list(ops), "sizes": [int(s) for s in sizes], "warmup": fewer(warmup, 1),
               "iters": fewer(iters, 2),
               "compute": compute, "plan": plan}
    results = run_on_ranks("distlab.runtime.sweep:sweep_task", payload, nproc, backend, timeout)
    out = dict(results[0])
    if plan is not None:
        out["plan"] = [r["plan"] for r in results]
    return out


# --- DDP: the bucket-size sweep, measured (lesson 05) ----------------------------------------------------------
def ddp_bucket_sweep(model, caps, nproc: int = 2, steps: int = 4, warmup: int = 2,
                     calibrate=(2**18, 2**20, 2**22, 2**24), timeout: float = 240.0) -> dict:
    """Real DDP (runtime.ddp.rank_task) once per ``bucket_cap_mb`` of ``caps``, all in one launch of ``nproc``
    ranks; the first cap's run also times the model alone and a few all-reduces, which calibrate the simulator
    (runtime.ddp.calibrated) to predict every cap. Returns {"rows": per cap {bucket_cap_mb, buckets,
    measured_buckets, predicted_s, measured_s, error_pct}, "results": per cap the ranks' results, "model",
    "cluster" (calibrated), "predicted": per cap the simulated Trace}. runtime.ddp's calibration times CPU
    tensors, so this runs on gloo."""
    from distlab.runtime.ddp.validate import calibrated, slowest as _slowest
    from distlab.sim.ddp.plan import DDPOptions, ddp_plan
    from distlab.sim.engine import simulate
    from distlab.sim.models import model_from_spec
    model = model_from_spec(model)
    payload = {"model": {**model.config, "name": model.name}, "caps": list(caps), "steps": fewer(steps, 2),
               "warmup": fewer(warmup, 2), "calibrate": [int(s) for s in calibrate]}
    out = run_on_ranks("distlab.runtime.lessons:_ddp_sweep_task", payload, nproc, "gloo", timeout)
    per_cap = [[r[i] for r in out] for i in range(len(caps))]
    cal_model, cluster = calibrated(model, per_cap[0])
    rows, traces = [], []
    for cap, results in zip(caps, per_cap):
        plan, info = ddp_plan(cal_model, nproc, DDPOptions(bucket_cap_mb=cap))
        trace = simulate(plan, cluster, record_transfers=False)
        measured = _slowest(results, "steps", "step")
        rows.append({"bucket_cap_mb": cap, "buckets": len(info["buckets"]),
                     "measured_buckets": len(results[0]["rebuilt_bucket_sizes"]), "predicted_s": trace.makespan,
                     "measured_s": measured, "error_pct": 100.0 * (trace.makespan - measured) / measured})
        traces.append(trace)
    return {"rows": rows, "results": per_cap, "model": cal_model, "cluster": cluster, "predicted": traces}


def _ddp_sweep_task(ctx, payload):
    from distlab.runtime.ddp.run import rank_task
    out = []
    for i, cap in enumerate(payload["caps"]):
        out.append(rank_task(ctx, {"model": payload["model"], "ddp": {"bucket_cap_mb": cap}, "steps": payload["steps"],
                                   "warmup": payload["warmup"], "local": i == 0,
                                   "calibrate": payload["calibrate"] if i == 0 else None}))
    return out


# --- FSDP2: predicted then measured (lesson 06) ----------------------------------------------------------------
def fsdp_predict_measure(model, variants: dict, nproc: int = 2, steps: int = 3, warmup: int = 1,
                         timeout: float = 240.0) -> dict:
    """Real ``fully_shard`` (runtime.fsdp.run) for each variant (label -> fsdp options) in one launch of
    ``nproc`` gloo ranks, with the calibration runtime.fsdp_validate uses; then the simulator's prediction on
    the calibrated cluster. Returns {"rows": per variant {variant, collectives, sequence_match, predicted_s,
    measured_s, error_pct}, "results", "cluster", "traces": per variant the measured collectives as a Trace}."""
    from distlab.runtime.fsdp.run import measured_sequence, run, to_trace
    from distlab.runtime.fsdp.validate import calibrated_cluster, calibration_sizes, measured_step, predict
    from distlab.sim.fsdp.plan import build_fsdp, collective_sequence
    from distlab.sim.models import model_from_spec
    model = model_from_spec(model)
    opts = list(variants.values())
    plans = [build_fsdp(model, nproc, o) for o in opts]
    results = run(model, nproc, opts, steps=fewer(steps, 1), warmup=fewer(warmup, 1),
                  calibrate=calibration_sizes(plans), local=True, timeout=timeout)
    cluster = calibrated_cluster(results, model, nproc)
    rows = []
    for i, (label, o) in enumerate(variants.items()):
        predicted, measured = predict(model, nproc, o, cluster), measured_step(results, i)
        seq = collective_sequence(plans[i])
        rows.append({"variant": label, "collectives": len(seq), "sequence_match": seq == measured_sequence(results, i),
                     "predicted_s": predicted, "measured_s": measured,
                     "error_pct": 100.0 * (predicted - measured) / measured})
    return {"rows": rows, "results": results, "cluster": cluster,
            "traces": [to_trace(results, i) for i in range(len(opts))]}


# --- pipeline parallelism: predicted, then measured (lesson 07) ------------------------------------------------
PIPELINE_SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2))


def pipeline_predict_measure(schedules=PIPELINE_SCHEDULES, nproc: int = 2, microbatches: int = 8,
                             blocks_per_rank: int = 4, width: int = 512, rows: int = 64, steps: int = 3,
                             timeout: float = 240.0) -> dict:
    """Real torch.distributed.pipelining (runtime/pipeline.py) for each (schedule, v) in one launch of ``nproc``
    gloo ranks: ``blocks_per_rank`` x nproc blocks of Linear(width, width) + ReLU, ``rows`` rows per microbatch.
    The launch also calibrates (runtime/pipeline_validate.py, shared with benchmarks/pipeline_accuracy.py):
    before each schedule, a shorter probe run of it (nproc microbatches) gives the p2p latency a pipeline sees
    and the runtime's CPU time per action; every rank times one block's F, B, I and W alone; a send/recv
    ping-pong gives the p2p bandwidth. The simulator, its ranks sharing this machine's cores, then predicts
    each schedule from those numbers alone; ``replay_s`` runs the same plan with each (stage, kind)'s mean
    measured action time instead, a check of the schedule and p2p model alone.
    Returns {"rows": per schedule {schedule, v, predicted_s, measured_s (median step), error_pct, replay_s,
    predicted_bubble, measured_bubble (fastest step), ideal_bubble}, "measured", "predicted" (Traces),
    "calibration": {F, B, I, W (rank 0, one block), latency_s, overhead_s (first schedule's probe), p2p}}."""
    import statistics

    from distlab.runtime.pipeline.validate import measure_and_predict
    from distlab.sim.pipeline import metrics as M
    cfgs = [dict(schedule=s, stages=nproc, microbatches=microbatches, virtual_stages=v, width=width, rows=rows,
                 layers=nproc * blocks_per_rank, steps=fewer(steps, 1), warmup=1) for s, v in schedules]
    results = measure_and_predict(cfgs, nproc, timeout=timeout)
    r0 = results[0]
    out = {"rows": [], "measured": [], "predicted": [],
           "calibration": {**r0["calibration"][0], "latency_s": r0["latency"], "overhead_s": r0["overhead"],
                           "p2p": r0["p2p"]}}
    for r in results:
        cfg, measured, predicted, meta = r["cfg"], r["measured"], r["predicted"], r["plan"].meta["pipeline"]
        mp, mm = M.compute(predicted, meta), M.compute(measured, meta)
        t_meas = statistics.median(measured.meta["step_makespans"])
        out["rows"].append({"schedule": cfg["schedule"], "v": cfg["virtual_stages"], "predicted_s": mp.makespan,
                            "measured_s": t_meas, "error_pct": 100.0 * (mp.makespan - t_meas) / t_meas,
                            "replay_s": r["replayed"].makespan,
                            "predicted_bubble": mp.bubble, "measured_bubble": mm.bubble,
                            "ideal_bubble": M.ideal_bubble(cfg["schedule"], nproc, microbatches,
                                                           cfg["virtual_stages"])})
        out["measured"].append(measured)
        out["predicted"].append(predicted)
    return out
