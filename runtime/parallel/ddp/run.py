"""Real DistributedDataParallel on the model a scenario describes, timed the way the simulator predicts it.

Each rank wraps ``build_module(model)`` in DDP with the scenario's ``bucket_cap_mb`` and registers a recording
comm hook: the hook is called when the Reducer launches a bucket (``Reducer::mark_bucket_ready``), and the
future it returns completes when the all-reduce ends, so each bucket's launch and end are measured. A
``register_post_accumulate_grad_hook`` on every parameter records when its gradient is ready. Steps start
after a barrier; times are seconds from the step's start; the first ``warmup`` steps are dropped (step 0
uses one bucket; buckets are rebuilt at step 1's forward). With ``interference``, a round of
runtime/measure/compute_probe.py's InterferenceProbe runs between the steps too (compute's slowdown beside an all_reduce
and the all_reduce's beside compute, at the load the steps see). Predicted against measured:
runtime/parallel/ddp/validate.py.
"""
from __future__ import annotations

import time

from distlab.sim.errors import ConfigError


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

        from distlab.runtime.modules.bridge import build_module
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


def _all_reduce_times(sizes: list[int], log: dict, spans: dict, offset: float = 0.0) -> None:
    """Per size, this rank's duration (``log``) and its (start, end) on rank 0's clock (``spans``): the
    validation takes the time from launch, last start to last end, as runtime/measure/sweep.py does."""
    import torch
    import torch.distributed as dist
    for s in sizes:
        t = torch.ones(s // 4)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        t1 = time.perf_counter()
        log.setdefault(str(s), []).append(t1 - t0)
        spans.setdefault(str(s), []).append((t0 - offset, t1 - offset))


def rank_task(ctx, payload: dict) -> dict:
    """distlab.runtime.ranks.launch target: optional local timings and all-reduce calibration, then DDP steps."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from distlab.runtime.modules.bridge import build_module, example_input
    from distlab.sim.models import model_from_spec
    model = model_from_spec(payload["model"])
    x = example_input(model).to(ctx.device)
    out = {"rank": ctx.rank}
    local = _Local(model, x) if payload.get("local") else None
    probe = None
    if payload.get("interference") and ctx.world_size > 1:
        from distlab.runtime.measure.compute_probe import InterferenceProbe
        probe = InterferenceProbe(ctx)
    cal: dict[str, list[float]] = {}
    spans: dict[str, list[tuple]] = {}
    from distlab.runtime.execute.clock import clock_offset
    offset = clock_offset(ctx) if payload.get("calibrate") else 0.0
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
        _all_reduce_times(payload.get("calibrate") or [], cal, spans, offset)
        record = ddp_step()
        if not step % 2 and local:
            local.step()
        if probe:
            probe.round()
        if step >= warmup:
            steps.append(record)
    log = ddp._get_ddp_logging_data()
    out["rebuilt_bucket_sizes"] = [int(s) for s in str(log.get("rebuilt_bucket_sizes", "")).split(",") if s.strip()]
    out["rebuilt_per_bucket_param_indices"] = [[int(i) for i in b.split()] for b in
                                               str(log.get("rebuilt_per_bucket_param_indices", "")).split(",")]
    out["steps"] = steps
    if local:
        out["local"] = local.times[warmup:]
    if probe:
        out["interference"] = probe.result()
    if cal:
        out["calibration"] = {k: v[warmup:] or v for k, v in cal.items()}
        out["calibration_spans"] = {k: v[warmup:] or v for k, v in spans.items()}
    return out


def measure(model, ddp_opts: dict | None = None, world: int = 2, steps: int = 5, warmup: int = 2,
            local: bool = True, calibrate: list[int] | None = None, backend: str = "gloo",
            timeout: float = 300.0, interference: bool = False) -> list[dict]:
    """Launch ``world`` ranks running :func:`rank_task`; the per-rank results (``interference``: with the
    probe's factors, result["interference"])."""
    import torch

    from distlab.runtime.ranks.launch import TRAINING, launch
    if (ddp_opts or {}).get("compress") == "bf16" and (backend == "gloo" or not torch.cuda.is_available()):
        raise ConfigError("bf16 compression needs NCCL: torch's DDP takes bf16_compress_hook only with CUDA 11+ "
                          "and NCCL 2.10+ (DistributedDataParallel._check_comm_hook); with gloo use fp16", "compress")
    payload = {"model": {**model.config, "name": model.name}, "ddp": ddp_opts or {}, "steps": steps,
               "warmup": warmup, "local": local, "calibrate": calibrate, "interference": interference}
    return launch("distlab.runtime.parallel.ddp.run:rank_task", payload, nproc=world, backend=backend, timeout=timeout,
                  preload=TRAINING)


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
