"""Real FSDP2 (``fully_shard``) on the model the simulator plans, every collective it issues recorded.

Sharding as sim/parallel/fsdp/plan.py assumes: ``fully_shard`` on every block (``h.{i}`` / ``layers.{i}``) with the
plan's ``reshard_after_forward`` and ``MixedPrecisionPolicy``, then on the root with the defaults (the root is
not resharded after forward) or, with ``root_reshard_after_forward``, ``reshard_after_forward=True``; then the
2.13 options on the root (recursing): ``set_separate_reduce_scatter_group()`` and
``set_reduce_scatter_max_input_buffers(K)``. Mesh: ``init_device_mesh(device, (world,))``, or
``(world // S, S)`` for HSDP.
The recorder wraps ``dist.all_gather_single``, ``dist.reduce_scatter_single`` and ``dist.all_reduce`` (what
FSDP2 calls in torch 2.13) and notes kind, bytes (nccl-tests: AG output, RS input), dtype, start, end, the
group's ranks and its process group's name (``group_name``: which communicator it ran on).
On gloo the calls block, so start/end are the collective's real span; on CUDA they would be enqueue times.
Predicted against measured: runtime/parallel/fsdp/validate.py.
"""
from __future__ import annotations

import time

OPS = {"all_gather_single": "all_gather", "reduce_scatter_single": "reduce_scatter", "all_reduce": "all_reduce"}


class Recorder:
    """``with Recorder() as rec:`` ... ``rec.calls``: [op, bytes, dtype, start, end, group ranks, group name]."""

    def __init__(self, t0: float | None = None):
        self.t0 = time.perf_counter() if t0 is None else t0
        self.calls: list[list] = []
        self._saved = {}

    def __enter__(self):
        import torch.distributed as dist
        for fn, op in OPS.items():
            orig = getattr(dist, fn)
            self._saved[fn] = orig
            setattr(dist, fn, self._wrap(orig, op))
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist
        for fn, orig in self._saved.items():
            setattr(dist, fn, orig)

    def _wrap(self, orig, op):
        def wrapped(*args, **kwargs):
            import torch.distributed as dist
            if op == "all_gather":
                t = args[0] if args else kwargs.get("output_tensor", kwargs.get("output"))
            elif op == "reduce_scatter":
                t = args[1] if len(args) > 1 else kwargs.get("input", kwargs.get("input_tensor"))
            else:
                t = args[0] if args else kwargs["tensor"]
            group = kwargs.get("group")
            ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
            start = time.perf_counter()
            out = orig(*args, **kwargs)
            end = time.perf_counter()
            dtype = str(t.dtype).replace("torch.", "")
            name = group.group_name if group is not None else dist.group.WORLD.group_name
            self.calls.append([op, t.numel() * t.element_size(), dtype, start - self.t0, end - self.t0, ranks,
                               name])
            return out
        return wrapped


def shard_module(module, mesh, opts: dict):
    """``fully_shard`` each block, then the root, as the simulator's fsdp plan assumes (ZeRO-3 only)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from distlab.sim.parallel.fsdp.plan import BLOCK
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    mp = MixedPrecisionPolicy(param_dtype=dt.get(opts.get("param_dtype")),
                              reduce_dtype=dt.get(opts.get("reduce_dtype")))
    raf = opts.get("reshard_after_forward", True)
    blocks = [sub for name, sub in module.named_modules()
              if name and BLOCK.match(name) and any(True for _ in sub.parameters())]
    for sub in blocks:
        fully_shard(sub, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
    root_raf = {"reshard_after_forward": True} if opts.get("root_reshard_after_forward") else {}
    fully_shard(module, mesh=mesh, mp_policy=mp, **root_raf)
    if opts.get("separate_reduce_scatter_group"):
        module.set_separate_reduce_scatter_group()
    if opts.get("reduce_scatter_max_input_buffers", 1) != 1:
        module.set_reduce_scatter_max_input_buffers(opts["reduce_scatter_max_input_buffers"])
    fp, bp = opts.get("prefetch", 1), opts.get("backward_prefetch", 1)
    for i, sub in enumerate(blocks):          # explicit prefetch beyond FSDP2's implicit one unit
        if fp > 1:
            sub.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + fp])
        if bp > 1 and i:
            sub.set_modules_to_backward_prefetch(blocks[max(i - bp, 0):i][::-1])
    return module


def make_mesh(world: int, shard_size: int | None, device: str):
    from torch.distributed.device_mesh import init_device_mesh
    S = shard_size or world
    if S == world:
        return init_device_mesh(device, (world,))
    return init_device_mesh(device, (world // S, S), mesh_dim_names=("replicate", "shard"))


def _step(module, opt, x) -> list[float]:
    """One training step; seconds of [forward, backward, optimizer]."""
    t0 = time.perf_counter()
    loss = module(x).float().pow(2).mean()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad()
    return [t1 - t0, t2 - t1, time.perf_counter() - t2]


def rank_task(ctx, payload: dict) -> dict:
    """One rank (runtime.ranks.launch target). Shards a fresh model per variant, warms up, then runs ``steps`` rounds;
    each round times the calibration collectives (``calibrate``: op -> sizes in bytes), one unsharded step of
    the whole model on this rank plus Adam on plain tensors the size of its shards (``local``), and one recorded
    step of every variant, so that load from other processes falls on all of them alike. Calibration and local
    times: every round's (runtime/parallel/fsdp/validate.py takes their robust center)."""
    import torch
    import torch.distributed as dist

    from distlab.runtime.modules.bridge import build_module, example_input
    from distlab.sim.parallel.fsdp.plan import padded_numel
    from distlab.sim.models import model_from_spec
    model = model_from_spec(payload["model"])
    runs = []
    for opts in payload["variants"]:
        opts = dict(opts)
        m = model_from_spec(opts.pop("model")) if "model" in opts else model
        torch.manual_seed(0)
        module = shard_module(build_module(m).to(ctx.device),
                              make_mesh(ctx.world_size, opts.get("shard_size"), ctx.device.type), opts)
        runs.append((opts, module, torch.optim.Adam(module.parameters(), lr=1e-4), example_input(m).to(ctx.device)))
    local = None
    if payload.get("local"):
        torch.manual_seed(0)
        module = build_module(model)
        local = (module, torch.optim.Adam(module.parameters(), lr=1e-4), example_input(model))
        shard = [torch.zeros(padded_numel(q.shape, ctx.world_size) // ctx.world_size, requires_grad=True)
                 for q in model.params]            # plain tensors the size of this rank's shards
        for t in shard:
            t.grad = torch.zeros_like(t)
        shard_opt = torch.optim.Adam(shard, lr=1e-4)
    for _ in range(payload.get("warmup", 1)):
        for _, module, opt, x in runs + ([(None, *local)] if local else []):
            _step(module, opt, x)
    cal = {op: {str(b): [] for b in sizes} for op, sizes in (payload.get("calibrate") or {}).items()}
    out = {"rank": ctx.rank, "variants": [{"opts": o, "steps": []} for o, *_ in runs], "local": None}
    fb, st = [], []
    for _ in range(payload.get("steps", 1)):
        for op, table in cal.items():
            for size, times in table.items():
                times.append(_time_collective(op, int(size), ctx.world_size))
        if local:
            dist.barrier()
            f, bw, _ = _step(*local)
            fb.append(f + bw)
            t0 = time.perf_counter()
            shard_opt.step()
            st.append(time.perf_counter() - t0)
        for (opts, module, opt, x), res in zip(runs, out["variants"]):
            dist.barrier()
            t0 = time.perf_counter()
            with Recorder(t0) as rec:
                phases = _step(module, opt, x)
            res["steps"].append({"time": time.perf_counter() - t0, "phases": phases, "calls": rec.calls})
    out["calibration"] = cal
    if local:
        out["local"] = {"fwd_bwd": min(fb), "optimizer": min(st), "rounds": [fb, st]}
    return out


def _time_collective(op: str, nbytes: int, n: int) -> float:
    """Seconds of one float32 all_gather_single (``nbytes`` gathered) or reduce_scatter_single (``nbytes`` in), on
    buffers as FSDP2 makes them (torch 2.13 _fsdp_collectives.py: foreach_all_gather allocates the output with
    torch.empty and copies this rank's shard into its slice, the input being that slice; foreach_reduce
    allocates the input, copies the gradients in, and allocates the output with torch.empty): the collective
    writes into memory it did not touch before, as in the step, where first-touch page faults cost (measured
    here, 4.2 MB all-gather: 5.8 ms into fresh memory vs 3.8 ms into one reused buffer; whether the allocator
    hands out fresh pages depends on what was freed before)."""
    import torch
    import torch.distributed as dist
    numel = max(nbytes // 4 // n * n, n)
    if op == "all_gather":
        out = torch.empty(numel)
        mine = out[dist.get_rank() * (numel // n):(dist.get_rank() + 1) * (numel // n)]
        mine.fill_(1.0)                            # the copy-in (timed apart, as the plan's copy-in op)
    else:
        inp = torch.empty(numel)
        inp.fill_(1.0)
        out = torch.empty(numel // n)
    dist.barrier()
    t0 = time.perf_counter()
    if op == "all_gather":
        dist.all_gather_single(out, mine)
    else:                                # FSDP2 reduces fp32/bf16 gradients with AVG
        dist.reduce_scatter_single(out, inp, op=dist.ReduceOp.AVG)
    return time.perf_counter() - t0


def run(model, world: int = 2, variants: list | None = None, steps: int = 1, warmup: int = 1,
        calibrate: dict | None = None, local: bool = False, timeout: float = 120.0) -> list[dict]:
    """Launch ``world`` gloo ranks running :func:`rank_task`; the per-rank results. A variant is the plan's
    options, or ``(model, options)`` to run another model in the same launch."""
    from distlab.runtime.ranks.launch import TRAINING, launch
    variants = [{**v[1], "model": spec(v[0])} if isinstance(v, tuple) else v for v in (variants or [{}])]
    payload = {"model": spec(model), "variants": variants, "steps": steps,
               "warmup": warmup, "calibrate": calibrate, "local": local}
    return launch("distlab.runtime.parallel.fsdp.run:rank_task", payload, nproc=world, backend="gloo", timeout=timeout,
                  preload=TRAINING)


def spec(model) -> dict:
    """A JSON description ``sim.models.model_from_spec`` rebuilds the model from."""
    return {**model.config, "name": model.name}


def to_trace(results: list[dict], variant: int = 0, step: int = -1):
    """The recorded collectives of one measured step, all ranks, as a sim Trace (source=measured)."""
    from distlab.sim.trace import OpRecord, Trace
    ops = []
    for res in results:
        s = res["variants"][variant]["steps"][step]
        for i, (op, nbytes, dtype, start, end, group, *_) in enumerate(s["calls"]):
            ops.append(OpRecord(res["rank"], "comm", i, "collective", f"{op} {dtype}", start, end, nbytes, op,
                                launch=start, group=tuple(group)))
    return Trace(ops, meta={"source": "measured", "runtime": "fsdp2", "opts": results[0]["variants"][variant]["opts"]})


def measured_sequence(results: list[dict], variant: int = 0, rank: int = 0, groups: bool = False) -> list[tuple]:
    calls = next(r for r in results if r["rank"] == rank)["variants"][variant]["steps"][-1]["calls"]
    return [(op, nbytes, dtype) + ((tuple(g),) if groups else ()) for op, nbytes, dtype, _, _, g, *_ in calls]


def measured_group_names(results: list[dict], variant: int = 0, rank: int = 0) -> list[str]:
    """The process group (its ``group_name``) of each recorded collective, in issue order."""
    calls = next(r for r in results if r["rank"] == rank)["variants"][variant]["steps"][-1]["calls"]
    return [c[6] for c in calls]
