"""Real tensor parallelism on gloo ranks: ``parallelize_module`` with torchtitan's Llama plan (TP + SP) or the
plain Megatron plan (TP), every collective torch issues recorded by a TorchDispatchMode (as torch's
CommDebugMode sees them: it lets DTensor desugar first, then notes the functional collectives it runs;
runtime/parallel/tp/capture.py).

torchtitan (torchtitan/models/llama3/infra/parallelize.py, ``apply_tp``), TP + SP:
  embed.tok RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)); norm_f SequenceParallel();
  lm_head ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()); per block: norm1/norm2
  SequenceParallel(); attn/mlp PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate());
  q, k, v, gate, up ColwiseParallel(); o, down RowwiseParallel(output_layouts=Shard(1)).
Plain TP (Megatron-LM, Shoeybi et al. 2019): embed.tok RowwiseParallel(input_layouts=Replicate()); q, k, v,
gate, up, lm_head ColwiseParallel() (lm_head output_layouts=Replicate()); o, down RowwiseParallel(); norms
replicated plain tensors. With ``prepare_input`` (plain TP only) attn and mlp also get
PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Replicate()) (use_local_output=False, its
default), as torchtitan wraps them: q, k, v (gate, up) then receive one DTensor, so backward sums their Partial
input gradients into it and all-reduces once per part (Megatron's f), not once per ColwiseParallel module
(``_FromTorchTensor.backward``, tensor/_api.py, runs for each ``from_local`` of a plain-tensor input: style.py).
"""
from __future__ import annotations

import sys
import time


def root_plan(sequence_parallel: bool = True, loss_parallel: bool = False) -> dict:
    """The plan of the embedding, final norm and head (module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    head_out = Shard(-1) if loss_parallel else Replicate()
    if sequence_parallel:
        return {"embed.tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                "norm_f": SequenceParallel(),
                "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=head_out,
                                           use_local_output=not loss_parallel)}
    return {"embed.tok": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=head_out, use_local_output=not loss_parallel)}


def block_plan(sequence_parallel: bool = True, prepare_input: bool = False) -> dict:
    """The plan of one transformer block (module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel()}
    if sequence_parallel:
        plan.update({"norm1": SequenceParallel(), "norm2": SequenceParallel(),
                     "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                     "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                     "attn.o": RowwiseParallel(output_layouts=Shard(1)),
                     "mlp.down": RowwiseParallel(output_layouts=Shard(1))})
    else:
        plan.update({"attn.o": RowwiseParallel(), "mlp.down": RowwiseParallel()})
        if prepare_input:
            plan.update({part: PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),))
                         for part in ("attn", "mlp")})
    return plan


def parallelize(module, tp_mesh, sequence_parallel: bool = True, loss_parallel: bool = False,
                prepare_input: bool = False):
    """Apply the TP (+ SP) plan above to a ``runtime.parallel.tp.model.Llama`` (or a pipeline stage of one: the root
    plan's entries whose module the stage holds; blocks in ``module.h``, a ModuleList or ModuleDict)."""
    from torch.distributed.tensor.parallel import parallelize_module
    root = {k: v for k, v in root_plan(sequence_parallel, loss_parallel).items()
            if getattr(module, k.split(".")[0], None) is not None}
    parallelize_module(module, tp_mesh, root)
    for block in (module.h.values() if hasattr(module.h, "values") else module.h):
        parallelize_module(block, tp_mesh, block_plan(sequence_parallel, prepare_input))
    return module


def local_shapes(module) -> list[list]:
    """[name, local shape] of every parameter (a DTensor's local shard, or the plain tensor; with FSDP2 the
    shard of the TP shard)."""
    from torch.distributed.tensor import DTensor
    return [[n, list((p.to_local() if isinstance(p, DTensor) else p).shape)] for n, p in module.named_parameters()]


def _step(module, opt, x, capture: CollectiveCapture, loss_parallel: bool) -> list[float]:
    """One training step (cross-entropy on next tokens, AdamW); seconds of [forward, backward, optimizer]."""
    import contextlib

    import torch.nn.functional as F
    from torch.distributed.tensor.parallel import loss_parallel as lp
    ctx = lp() if loss_parallel else contextlib.nullcontext()
    t0 = time.perf_counter()
    with ctx:
        capture.phase = "forward"
        logits = module(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), x.roll(-1, 1).flatten())
        t1 = time.perf_counter()
        capture.phase = "backward"
        loss.backward()
    t2 = time.perf_counter()
    capture.phase = "optimizer"
    opt.step()
    opt.zero_grad(set_to_none=True)
    return [t1 - t0, t2 - t1, time.perf_counter() - t2]


def rank_task(ctx, payload: dict) -> dict:
    """One rank: per variant ({model, sequence_parallel, loss_parallel, mesh}) a fresh TP module on the mesh
    (default: a 1-D tp mesh of the whole world; with a dp_shard dimension also ``fully_shard`` per block and on
    the root; with a dp dimension wrapped in ``DistributedDataParallel(device_mesh=mesh['dp'])``), a warm-up step, then ``steps`` captured steps. With ``calibrate`` (runtime/parallel/tp/calibrate.py), each
    captured step of the first variant is preceded by one round of calibration measurements on its tp group
    and followed by one uncaptured step (``plain_time``: the step time without the capture's overhead)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.runtime.parallel.tp.model import build_llama
    from distlab.sim.models import model_from_spec
    from torch.distributed.fsdp import fully_shard
    from distlab.runtime.parallel.tp.calibrate import Calibrator
    from distlab.runtime.parallel.tp.capture import CollectiveCapture
    out = []
    for vi, v in enumerate(payload["variants"]):
        if "pp" in dict(v.get("mesh") or []):
            from distlab.runtime.parallel.tp.pipeline import run_variant
            out.append(run_variant(ctx, v, payload.get("steps", 1), payload.get("warmup", 1), sys.modules[__name__],
                                   payload.get("calibrate") if vi == 0 else None, payload.get("calibrate_calls")))
            continue
        model = model_from_spec(v["model"])
        dims = v.get("mesh") or [["tp", ctx.world_size]]
        mesh = init_device_mesh("cpu", tuple(n for _, n in dims), mesh_dim_names=tuple(d for d, _ in dims))
        torch.manual_seed(0)
        module = parallelize(build_llama(model), mesh["tp"], v.get("sequence_parallel", True),
                             v.get("loss_parallel", False), v.get("prepare_input", False))
        if "dp_shard" in mesh.mesh_dim_names:       # torchtitan's order: TP first, then fully_shard blocks, root
            dp_mesh = mesh["dp_replicate", "dp_shard"] if "dp_replicate" in mesh.mesh_dim_names else mesh["dp_shard"]
            for block in module.h:                  # HSDP x TP: the 2-D (replicate, shard) sub-mesh
                fully_shard(block, mesh=dp_mesh)
            fully_shard(module, mesh=dp_mesh)
        if "dp" in mesh.mesh_dim_names:             # DDP x TP: DDP on the dp sub-mesh (TP-local gradients)
            from torch.nn.parallel import DistributedDataParallel
            module = DistributedDataParallel(module, device_mesh=mesh["dp"])
            shapes = local_shapes(module.module)    # the plain TP-local Parameters DDP holds: after a forward the
            # module's pre-hook has made them DTensor attributes, no longer registered parameters (torch 2.13)
        opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
        x = torch.randint(0, model.config["vocab"], (model.config["micro_batch"], model.config["seq_len"]))
        for _ in range(payload.get("warmup", 1)):
            _step(module, opt, x, CollectiveCapture(), v.get("loss_parallel", False))
        fsdp_meshes = (mesh["tp"], mesh["dp_shard"]) if "dp_shard" in mesh.mesh_dim_names \
            and "dp_replicate" not in mesh.mesh_dim_names else None
        cal = Calibrator(payload["calibrate"], model, mesh["tp"].get_group(),
                         block_plan(v.get("sequence_parallel", True), v.get("prepare_input", False)),
                         CollectiveCapture, fsdp_meshes,
                         None if v.get("loss_parallel") else root_plan(v.get("sequence_parallel", True)),
                         calls=payload.get("calibrate_calls")) \
            if payload.get("calibrate") and vi == 0 else None
        steps = []
        for _ in range(payload.get("steps", 1)):
            if cal:
                cal.round()
            cap = CollectiveCapture()
            dist.barrier()
            t0 = time.perf_counter()
            with cap:
                phases = _step(module, opt, x, cap, v.get("loss_parallel", False))
            st = {"time": time.perf_counter() - t0, "phases": phases, "calls": cap.calls, "dtensor_ops": cap.dtensor_ops,
                  "spans": [[a - t0, b - t0] for a, b in cap.spans]}
            if cal:             # the capture dispatches every op through Python: time one step without it too
                dist.barrier()
                t0, process, thread = time.perf_counter(), time.process_time(), time.thread_time()
                st["plain_phases"] = _step(module, opt, x, CollectiveCapture(), v.get("loss_parallel", False))
                st["plain_time"] = time.perf_counter() - t0
                st["plain_cpu"] = [time.thread_time() - thread, time.process_time() - process]
            steps.append(st)
        out.append({"local_shapes": shapes if "dp" in mesh.mesh_dim_names else local_shapes(module), "steps": steps,
                    **({"calibration": cal.results()} if cal else {})})
        if payload.get("comm_debug"):     # one more step under torch's own CommDebugMode (lesson 09)
            from torch.distributed.tensor.debug import CommDebugMode
            with CommDebugMode() as mode:
                _step(module, opt, x, CollectiveCapture(), v.get("loss_parallel", False))
            out[-1]["comm_debug"] = {str(k): n for k, n in mode.get_comm_counts().items()}
    return {"rank": ctx.rank, "variants": out}


def measured_sequence(results: list, variant: int = 0, rank: int = 0) -> list[tuple]:
    """(kind, bytes, dtype, group, phase) of every collective one rank issued in the last captured step."""
    calls = next(r for r in results if r["rank"] == rank)["variants"][variant]["steps"][-1]["calls"]
    return [(k, b, d, tuple(g), ph) for k, b, d, g, ph in calls]


def run(variants: list[dict], world: int = 2, steps: int = 1, warmup: int = 1, timeout: float = 180.0,
        calibrate: dict | None = None, comm_debug: bool = False, calibrate_calls: int | None = None) -> list:
    """Launch ``world`` gloo ranks; a variant is {model: Model, sequence_parallel: bool, loss_parallel: bool,
    prepare_input: bool (plain TP), mesh: [[dim, size], ...] (optional; dims tp and dp_shard)}. ``calibrate``: {op: [bytes, ...]} to time on
    the first variant's tp group, plus the unparallelized model's step (runtime/parallel/tp/calibrate.py). ``comm_debug``:
    one more step per variant under torch's CommDebugMode, its counts per collective kept. ``calibrate_calls``: at
    most this many calls per calibration probe (runtime/parallel/tp/calibrate.py Calibrator ``calls``; None: its defaults;
    fewer is noisier, for quick checks)."""
    from distlab.runtime.ranks.launch import PIPELINING, TRAINING, launch
    payload = {"variants": [{**v, "model": {**v["model"].config, "name": v["model"].name}} for v in variants],
               "steps": steps, "warmup": warmup, "calibrate": calibrate, "comm_debug": comm_debug,
               "calibrate_calls": calibrate_calls}
    pipelined = any("pp" in dict(v.get("mesh") or []) for v in variants)      # runtime/parallel/tp/pipeline.py's stages
    return launch("distlab.runtime.parallel.tp.run:rank_task", payload, nproc=world, backend="gloo", timeout=timeout,
                  preload=PIPELINING if pipelined else TRAINING)
