"""Real context parallelism on gloo ranks, with torch 2.13's own ring attention code.

torch's public ``context_parallel`` does not run on CPU in torch 2.13: inside it, SDPA on CPU dispatches to
``aten._scaled_dot_product_flash_attention_for_cpu``, which has no CP handler (the handler maps only the CUDA
flash, efficient and cuDNN kernels) and no DTensor sharding strategy, so the call fails with "Operator
aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy registered". So this
run calls the functions ``context_parallel`` dispatches to, ``_templated_ring_attention`` and
``_templated_ring_attention_backward`` (torch/distributed/tensor/experimental/_context_parallel/_attention.py),
with the CPU flash-attention kernel as their attention op, under torch's own options (``set_rotate_method``,
``_cp_options.enable_load_balance``) and sharding (``_HeadTailLoadBalancer``): the rotations, their order and
sizes, and the per-step causal choices are torch's; only the SDPA kernel is the CPU one.

Layout as torchtitan: each rank holds its head-tail shard of the tokens and their labels; q/k/v projections
local; K/V heads repeated to the query heads before attention (torchtitan's repeat_kv); FSDP2 ``fully_shard``
per block and on the root over all ranks (dp_shard x cp). Every collective is recorded (kind, bytes, dtype,
group, per-peer bytes of an all_to_all) by runtime/parallel/tp/run.py's dispatch-mode capture.
"""
from __future__ import annotations

import time

import torch

from distlab.runtime.parallel.tp.capture import CollectiveCapture
from distlab.runtime.parallel.tp.run import parallelize


class Capture(CollectiveCapture):
    """runtime/parallel/tp/run.py's capture plus the per-peer bytes of each all_to_all_single (input_split_sizes x element
    size: what this rank sends to each group member); entries [kind, bytes, dtype, group, phase, per_peer]."""

    def _note(self, kind: str, args) -> list:
        out = super()._note(kind, args)
        per = None
        if kind == "all_to_all":
            t, splits = args[0], args[2]
            per = [int(n) * t.element_size() * (t.numel() // max(t.shape[0], 1) if t.dim() > 1 else 1)
                   for n in splits]
        return out + [per]

    def _note_c10d(self, kind: str, args) -> list:
        return super()._note_c10d(kind, args) + [None]


class RingSDPA(torch.autograd.Function):
    """Causal attention over the cp group by torch's ring (forward and backward), CPU flash kernel."""

    @staticmethod
    def forward(ctx, q, k, v, group):
        from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention
        out, lse = _templated_ring_attention(group, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
                                             q, k, v, is_causal=True)[:2]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, dout):
        from torch.distributed.tensor.experimental._context_parallel._attention import \
            _templated_ring_attention_backward
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _templated_ring_attention_backward(
            ctx.group, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
            dout.contiguous(), "grad_out", q, k, v, out, lse, True, dropout_p=0.0)[:3]
        return dq, dk, dv, None


def cp_attention(attn, group):
    """Make runtime/parallel/tp/model.py's Attention run ring attention over ``group``."""
    def forward(x):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, attn.head_dim).transpose(1, 2) for t in (attn.q(x), attn.k(x), attn.v(x)))
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)     # torchtitan's repeat_kv
        a = RingSDPA.apply(q, k, v, group)
        return attn.o(a.transpose(1, 2).reshape(b, s, -1))
    attn.forward = forward


def shard_tokens(x, cp: int, j: int, load_balance: bool):
    """Rank j's tokens (and the labels: the next token of each, cut from the whole sequence first)."""
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer
    y = x.roll(-1, 1)
    if load_balance:
        idx = _HeadTailLoadBalancer(x.shape[1], cp, "cpu")._generate_indices()[0]
        x, y = x[:, idx], y[:, idx]
    s = x.shape[1] // cp
    return x[:, j * s:(j + 1) * s].contiguous(), y[:, j * s:(j + 1) * s].contiguous()


def _step(module, opt, x, y, cap: CollectiveCapture) -> list[float]:
    import torch.nn.functional as F
    t0 = time.perf_counter()
    cap.phase = "forward"
    loss = F.cross_entropy(module(x).flatten(0, 1).float(), y.flatten())
    t1 = time.perf_counter()
    cap.phase = "backward"
    loss.backward()
    t2 = time.perf_counter()
    cap.phase = "optimizer"
    opt.step()
    opt.zero_grad(set_to_none=True)
    return [t1 - t0, t2 - t1, time.perf_counter() - t2]


def rank_task(ctx, payload: dict) -> dict:
    """One rank: per variant ({model, mesh: [[cp, c]], [[dp_shard, d], [cp, c]] or [[cp, c], [tp, t]] (TP + SP
    as runtime/parallel/tp/run.py, then FSDP2 over cp), rotate_method, load_balance})
    a fresh model, a warm-up step, then ``steps`` captured steps each followed by an uncaptured one (its time:
    the step without the capture's per-op Python overhead); with ``calibrate``, a calibration round
    (runtime/parallel/cp/calibrate.py) before each captured step of the first variant."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options, set_rotate_method

    from distlab.runtime.parallel.tp.model import build_llama
    from distlab.sim.models import model_from_spec
    from distlab.runtime.parallel.cp.calibrate import Calibrator, local_model
    out, cal = [], None
    for vi, v in enumerate(payload["variants"]):
        model = model_from_spec(v["model"])
        dims = v.get("mesh") or [["cp", ctx.world_size]]
        mesh = init_device_mesh("cpu", tuple(n for _, n in dims), mesh_dim_names=tuple(d for d, _ in dims))
        if "tp" in mesh.mesh_dim_names:        # CP x TP: FSDP2 over cp (the dp_shard_cp dim of the same mesh)
            shard_mesh = mesh["cp"]
        else:
            shard_mesh = init_device_mesh("cpu", (ctx.world_size,), mesh_dim_names=("dp_shard_cp",))
        set_rotate_method(v.get("rotate_method", "allgather"))
        _cp_options.enable_load_balance = v.get("load_balance", True)
        torch.manual_seed(0)
        module = build_llama(model)
        if "tp" in mesh.mesh_dim_names:        # torchtitan's order: TP (+ SP) first, then FSDP2
            parallelize(module, mesh["tp"], sequence_parallel=True)
        group, cp = mesh["cp"].get_group(), mesh["cp"].size()
        for block in module.h:
            cp_attention(block.attn, group)
            fully_shard(block, mesh=shard_mesh)
        fully_shard(module, mesh=shard_mesh)
        opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
        g = torch.Generator().manual_seed(1 + ctx.rank // cp)          # one sequence per cp group
        full = torch.randint(0, model.config["vocab"], (model.config["micro_batch"], model.config["seq_len"]),
                             generator=g)
        x, y = shard_tokens(full, cp, mesh["cp"].get_local_rank(), v.get("load_balance", True))
        for _ in range(payload.get("warmup", 1)):
            _step(module, opt, x, y, Capture())
        if payload.get("calibrate") and vi == 0:
            cal = Calibrator(payload["calibrate"], local_model(model, cp), shard_mesh.get_group())
        steps = []
        for _ in range(payload.get("steps", 1)):
            if cal and vi == 0:
                cal.round()
            cap = Capture()
            dist.barrier()
            t0 = time.perf_counter()
            with cap:
                phases = _step(module, opt, x, y, cap)
            st = {"captured_time": time.perf_counter() - t0, "captured_phases": phases, "calls": cap.calls}
            if payload.get("plain", True):
                dist.barrier()
                t0 = time.perf_counter()
                st["phases"] = _step(module, opt, x, y, Capture())
                st["time"] = time.perf_counter() - t0
            steps.append(st)
        out.append({"steps": steps})
    return {"rank": ctx.rank, "variants": out, **({"calibration": cal.results()} if cal else {})}


def measured_sequence(results: list, variant: int = 0, rank: int = 0) -> list[tuple]:
    """(kind, bytes, dtype, group, per-peer bytes) of every collective one rank issued in the last captured step
    (the format of sim/parallel/cp/plan.py ``collective_sequence``)."""
    calls = next(r for r in results if r["rank"] == rank)["variants"][variant]["steps"][-1]["calls"]
    return [(k, b, d, tuple(g), None if per is None else tuple(per)) for k, b, d, g, _, per in calls]


def run(variants: list[dict], world: int = 2, steps: int = 1, warmup: int = 1, timeout: float = 180.0,
        threads: int | None = None, calibrate: dict | None = None, plain: bool = True) -> list:
    """Launch ``world`` gloo ranks; a variant is {model: Model, mesh: [[dim, size], ...] (optional, default
    cp over all ranks), rotate_method: allgather | alltoall, load_balance: bool}. ``calibrate``: {op: [bytes]}
    (runtime/parallel/cp/calibrate.py plan_sizes) to time before each captured step of the first variant; ``plain``
    false: no uncaptured step after each captured one (sequences only, no step time)."""
    from distlab.runtime.ranks.launch import TRAINING, launch
    payload = {"variants": [{**v, "model": {**v["model"].config, "name": v["model"].name}} for v in variants],
               "steps": steps, "warmup": warmup, "calibrate": calibrate, "plain": plain}
    kw = {"threads": threads} if threads else {}
    return launch("distlab.runtime.parallel.cp.run:rank_task", payload, nproc=world, backend="gloo", timeout=timeout,
                  preload=TRAINING, **kw)
