"""Real DistributedDataParallel on the model a scenario describes, timed the way the simulator predicts it.

Each rank wraps ``build_module(model)`` in DDP with the scenario's ``bucket_cap_mb`` and registers a recording
comm hook: the hook is called when the Reducer launches a bucket (``Reducer::mark_bucket_ready``), and the
future it returns completes when the all-reduce ends, so each bucket's launch and end are measured. A
``register_post_accumulate_grad_hook`` on every parameter records when its gradient is ready. Steps start
after a barrier; times are seconds from the step's start; the first ``warmup`` steps are dropped (step 0
uses one bucket; buckets are rebuilt at step 1's forward).

``validate_ddp`` calibrates (this machine's FLOP/s and memory bandwidth from the model run alone on every
rank, and all-reduce α and bandwidth from a few sizes), simulates the same step, and puts predicted and
measured step, backward and per-bucket times side by side.
"""
from __future__ import annotations

import statistics
import time

from distlab.sim.errors import ConfigError

CAL_SIZES = [2**20, 2**22, 2**24, 2**25]


def _hook(rec: dict, compress: str | None):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as hooks

    def hook(state, bucket):
        t = time.perf_counter() - rec["t0"]
        k = bucket.index()
        rec["buckets"][k] = {"index": k, "launch": t, "bytes": bucket.buffer().numel() * bucket.buffer().element_size()}
        chosen = {"fp16": hooks.fp16_compress_hook, "bf16": hooks.bf16_compress_hook}.get(compress, hooks.allreduce_hook)
        fut = chosen(None, bucket)

        def done(f):
            rec["buckets"][k]["end"] = time.perf_counter() - rec["t0"]
            return f.value()
        return fut.then(done)
    return hook


class _Local:
    """The same model without DDP on this rank, timed between DDP steps (every rank at once, so the
    machine's load is the same as during the DDP steps): forward, backward, Adam step."""

    def __init__(self, model, x):
        import torch

        from distlab.runtime.models import build_module
        torch.manual_seed(0)
        self.module, self.x = build_module(model), x
        self.opt = torch.optim.Adam(self.module.parameters(), lr=1e-4)
        self.times: list[dict] = []

    def step(self) -> None:
        import torch.distributed as dist
        dist.barrier()
        t0 = time.perf_counter()
        loss = self.module(self.x).float().pow(2).mean()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.times.append({"forward": t1 - t0, "backward": t2 - t1, "optimizer": time.perf_counter() - t2})


def _all_reduce_times(sizes: list[int], log: dict) -> None:
    import torch
    import torch.distributed as dist
    for s in sizes:
        t = torch.ones(s // 4)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        log.setdefault(str(s), []).append(time.perf_counter() - t0)


def rank_task(ctx, payload: dict) -> dict:
    """distlab.runtime.launch target: optional local timings and all-reduce calibration, then DDP steps."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from distlab.runtime.models import build_module, example_input
    from distlab.sim.models import model_from_spec
    model = model_from_spec(payload["model"])
    x = example_input(model).to(ctx.device)
    out = {"rank": ctx.rank}
    local = _Local(model, x) if payload.get("local") else None
    cal: dict[str, list[float]] = {}
    opts = payload.get("ddp", {})
    torch.manual_seed(0)
    module = build_module(model).to(ctx.device)
    ddp = DDP(module, bucket_cap_mb=opts.get("bucket_cap_mb"))
    rec = {"t0": 0.0, "buckets": {}}
    ddp.register_comm_hook(None, _hook(rec, opts.get("compress")))
    ready = [0.0] * len(model.params)
    for i, p in enumerate(module.parameters()):
        p.register_post_accumulate_grad_hook(lambda p, i=i: ready.__setitem__(i, time.perf_counter() - rec["t0"]))
    opt = torch.optim.Adam(module.parameters(), lr=1e-4) if opts.get("optimizer", "adam") == "adam" \
        else torch.optim.SGD(module.parameters(), lr=1e-4)
    accum = opts.get("grad_accum", 1)
    steps = []
    warmup = payload.get("warmup", 2)

    def ddp_step() -> dict:
        torch.distributed.barrier()
        rec["buckets"] = {}
        rec["t0"] = t0 = time.perf_counter()
        for micro in range(accum):
            if micro < accum - 1:
                with ddp.no_sync():
                    ddp(x).float().pow(2).mean().backward()
                continue
            loss = ddp(x).float().pow(2).mean()
            t_fwd = time.perf_counter() - t0
            loss.backward()
        t_bwd = time.perf_counter() - t0
        opt.step()
        opt.zero_grad(set_to_none=True)
        return {"step": time.perf_counter() - t0, "forward_end": t_fwd, "backward_end": t_bwd, "ready": list(ready),
                "buckets": [rec["buckets"][k] for k in sorted(rec["buckets"])]}

    for step in range(warmup + payload.get("steps", 5)):
        # the model alone, the all-reduces and the DDP step, in alternating order so that a slow drift of
        # the machine's load biases none of them
        if step % 2 and local:
            local.step()
        _all_reduce_times(payload.get("calibrate") or [], cal)
        record = ddp_step()
        if not step % 2 and local:
            local.step()
        if step >= warmup:
            steps.append(record)
    log = ddp._get_ddp_logging_data()
    out["rebuilt_bucket_sizes"] = [int(s) for s in str(log.get("rebuilt_bucket_sizes", "")).split(",") if s.strip()]
    out["rebuilt_per_bucket_param_indices"] = [[int(i) for i in b.split()] for b in
                                               str(log.get("rebuilt_per_bucket_param_indices", "")).split(",")]
    out["steps"] = steps
    if local:
        out["local"] = local.times[warmup:]
    if cal:
        out["calibration"] = {k: v[warmup:] or v for k, v in cal.items()}
    return out


def measure(model, ddp_opts: dict | None = None, world: int = 2, steps: int = 5, warmup: int = 2,
            local: bool = True, calibrate: list[int] | None = None, backend: str = "gloo",
            timeout: float = 300.0) -> list[dict]:
    """Launch ``world`` ranks running :func:`rank_task`; the per-rank results."""
    import torch

    from distlab.runtime.launch import launch
    if (ddp_opts or {}).get("compress") == "bf16" and (backend == "gloo" or not torch.cuda.is_available()):
        raise ConfigError("bf16 compression needs NCCL: torch's DDP takes bf16_compress_hook only with CUDA 11+ "
                          "and NCCL 2.10+ (DistributedDataParallel._check_comm_hook); with gloo use fp16", "compress")
    payload = {"model": {**model.config, "name": model.name}, "ddp": ddp_opts or {}, "steps": steps,
               "warmup": warmup, "local": local, "calibrate": calibrate}
    return launch("distlab.runtime.ddp:rank_task", payload, nproc=world, backend=backend, timeout=timeout)


def calibrated(model, results: list[dict], base: str = "localhost-cpu", optimizer: str = "adam",
               stat: str = "median"):
    """(model, cluster) fitted to the measurements (slowest rank). The 'GPU' runs forward FLOPs at the
    measured forward rate; each layer's backward FLOPs are scaled so backward/forward is the measured ratio
    (about 2 in theory, more on CPUs); memory bandwidth makes the optimizer take the measured time; the
    all-reduce is fitted as t = 2(n-1)·α + 2(n-1)/n · S / B (least squares over the calibrated sizes)."""
    import copy
    from dataclasses import replace

    import numpy as np

    from distlab.sim.cluster import PRESETS
    from distlab.sim.ddp.plan import OPTIMIZERS
    n = len(results)
    t_fwd, t_bwd, t_opt = (_slowest(results, "local", k, stat=stat) for k in ("forward", "backward", "optimizer"))
    model = copy.deepcopy(model)
    scale = (t_bwd / t_fwd) / (model.bwd_flops / model.fwd_flops)
    for layer in model.layers:
        layer.bwd_flops *= scale
    gpu = replace(PRESETS[base].gpu, name="calibrated", tflops=model.fwd_flops / t_fwd / 1e12, mfu=1.0,
                  hbm_GBps=max(OPTIMIZERS[optimizer], 1) * model.param_bytes / t_opt / 1e9)
    cluster = replace(PRESETS[base], name=f"{base} (calibrated)", gpus_per_node=n, gpu=gpu)
    cal = results[0].get("calibration")
    if cal:
        sizes = np.array([float(s) for s in cal])
        times = np.array([STAT[stat]([max(r["calibration"][s][i] for r in results) for i in range(len(cal[s]))])
                          for s in cal])
        b, a = np.polyfit(sizes * 2 * (n - 1) / n, times, 1)
        alpha, bw = max(float(a), 0.0) / (2 * (n - 1)), 1.0 / float(b)
        cluster = replace(cluster, calibration={"collectives": {"all_reduce": {
            str(n): {"latency_us": alpha * 1e6, "bandwidth_GBps": bw / 1e9}}}})
    return model, cluster


def to_trace(results: list[dict], step: int = -1):
    """One measured step, every rank, as a sim Trace (source=measured): forward, backward (until the last
    gradient is ready), each bucket's all-reduce on 'comm' (start = this rank's launch, launch = the last
    rank's, end = the future's completion), and the optimizer step."""
    from distlab.sim.trace import OpRecord, Trace
    ops = []
    moves = {}           # bucket -> when its data can move: the last rank's launch
    for r in results:
        for b in r["steps"][step]["buckets"]:
            moves[b["index"]] = max(moves.get(b["index"], 0.0), b["launch"])
    for r in results:
        s = r["steps"][step]
        bwd_end = max(s["ready"])
        ops += [OpRecord(r["rank"], "compute", 0, "compute", "forward", 0.0, s["forward_end"]),
                OpRecord(r["rank"], "compute", 1, "compute", "backward", s["forward_end"], bwd_end)]
        for b in s["buckets"]:
            ops.append(OpRecord(r["rank"], "comm", 2 + b["index"], "collective", f"bucket {b['index']}",
                                b["launch"], b["end"], bytes=b["bytes"], op="all_reduce",
                                launch=min(moves[b["index"]], b["end"])))
        ops.append(OpRecord(r["rank"], "compute", 2 + len(s["buckets"]), "compute", "optimizer step",
                            s["backward_end"], s["step"]))
    return Trace(ops, [], {"source": "measured", "world_size": len(results)})


def validate_ddp(scenario, nproc: int = 2, steps: int = 5, warmup: int = 2, backend: str = "gloo",
                 timeout: float = 300.0, stat: str = "median") -> dict:
    """Predicted vs measured: rows of {what, predicted_s, measured_s, error_pct}; bucket launch errors are
    in % of the measured backward duration. Also the two traces and the calibrated cluster."""
    from distlab.sim import scenario as sc
    from distlab.sim.ddp.plan import DDPOptions
    d = sc.load(scenario)
    if d["parallelism"]["kind"] != "ddp":
        raise ValueError("validate_ddp needs parallelism kind ddp")
    model, _ = sc.resolve(d)
    opts = DDPOptions.from_dict({k: v for k, v in d["parallelism"].items() if k != "kind"})
    results = measure(model, {"bucket_cap_mb": opts.bucket_cap_mb, "compress": opts.compress,
                              "grad_accum": opts.grad_accum, "optimizer": opts.optimizer},
                      nproc, steps, warmup, True, CAL_SIZES, backend, timeout)
    return compare(model, opts, results, stat)


def compare(model, opts, results: list[dict], stat: str = "median") -> dict:
    """Calibrate on ``results`` (from :func:`measure`), simulate, and compare (see validate_ddp)."""
    from distlab.sim.ddp.plan import bucket_rows, ddp_plan
    from distlab.sim.engine import simulate
    nproc = len(results)
    model, cluster = calibrated(model, results, optimizer=opts.optimizer, stat=stat)
    plan, info = ddp_plan(model, nproc, opts)
    predicted = simulate(plan, cluster, record_transfers=False)
    pb = bucket_rows(predicted, info)
    step = _slowest(results, "steps", "step", stat=stat)
    fwd = _slowest(results, "steps", "forward_end", stat=stat)
    for r in results:
        for st in r["steps"]:
            st["backward"] = max(st["ready"]) - st["forward_end"]
    bwd = _slowest(results, "steps", "backward", stat=stat)
    p_fwd = max(o.end for o in predicted.for_rank(0) if o.name.startswith("fwd"))
    p_bwd = max(o.end for o in predicted.for_rank(0) if o.name.startswith("bwd")) - p_fwd
    rows = [_row("step", predicted.makespan, step), _row("forward", p_fwd, fwd), _row("backward", p_bwd, bwd)]
    same = [b["bytes"] for b in info["buckets"]] == results[0]["rebuilt_bucket_sizes"]
    for k, b in enumerate(pb):
        ml = _slowest(results, "steps", "buckets", lambda bs, k=k: bs[k]["launch"], stat)
        me = _slowest(results, "steps", "buckets", lambda bs, k=k: bs[k]["end"], stat)
        rows.append({**_row(f"bucket {k} launch", _ddp_launch(pb, k), ml), "error_pct_of_backward":
                     100.0 * abs(_ddp_launch(pb, k) - ml) / bwd})
        rows.append(_row(f"bucket {k} end", b["end_s"], me))
    return {"rows": rows, "buckets_match": same, "model": model,
            "predicted_buckets": [b["bytes"] for b in info["buckets"]],
            "measured_buckets": results[0]["rebuilt_bucket_sizes"], "cluster": cluster,
            "predicted": predicted, "measured": to_trace(results), "results": results}


STAT = {"median": statistics.median, "min": min}


def _slowest(results: list[dict], key: str, field: str, get=None, stat: str = "median") -> float:
    """``stat`` over iterations of the slowest rank's value (``get`` maps the field's value to a number).
    ("min" discounts other processes' bursts, but mixes the luckiest moments of different quantities.)"""
    get = get or (lambda v: v)
    n = min(len(r[key]) for r in results)
    return STAT[stat]([max(get(r[key][i][field]) for r in results) for i in range(n)])


def _ddp_launch(rows: list[dict], k: int) -> float:
    return max(r["ready_s"] for r in rows[:k + 1])


def _row(what: str, predicted: float, measured: float) -> dict:
    return {"what": what, "predicted_s": predicted, "measured_s": measured,
            "error_pct": 100.0 * (predicted - measured) / measured if measured else float("nan")}


def ddp_cases(path: str, args) -> list[dict]:
    """`distlab validate --scenario ddp.yaml` rows (runtime.validation.case format): step, forward, backward
    and per-bucket launch/end, predicted (calibrated here) against measured real DDP."""
    from distlab.runtime.validation import case
    nproc = int(str(getattr(args, "nproc", 2)).split(",")[0])
    r = validate_ddp(path, nproc=max(nproc, 2), steps=max(getattr(args, "iters", 5), 2),
                     warmup=max(getattr(args, "warmup", 2), 2))
    out = []
    sizes = dict(zip(range(len(r["measured_buckets"])), r["measured_buckets"]))
    for row in r["rows"]:
        k = int(row["what"].split()[1]) if row["what"].startswith("bucket") else None
        c = case("ddp scenario", f"ddp {row['what']}", nproc, sizes.get(k, r["model"].param_bytes),
                 row["predicted_s"], row["measured_s"])
        if "error_pct_of_backward" in row:
            c["error_of_backward"] = row["error_pct_of_backward"] / 100
        out.append(c)
    return out
