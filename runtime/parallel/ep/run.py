"""Real expert parallelism on gloo (or NCCL) ranks: a stack of MoE layers with the routed experts sharded over
the ranks, dispatch and combine by ``all_to_all_single`` with input/output split sizes, as torchtitan's
ExpertParallel does (torchtitan/distributed/expert_parallel.py ``_token_dispatch`` / ``_token_combine``):

  forward, per layer: router scores softmax(x W_r^T); all_to_all_single of the per-expert token counts (int64,
  even splits) -> the split sizes; dispatch all_to_all_single(routed copies, output_splits, input_splits);
  each local expert (SwiGLU, torchtitan's GroupedExperts weights w1, w3: (E/ep, f, h), w2: (E/ep, h, f)) on
  its copies; combine all_to_all_single back (splits swapped); copies weighted by their gate score and summed
  per token; plus the shared experts and the residual.
  backward: autograd's adjoint of each all_to_all_single is an all_to_all_single with the splits swapped
  (torch/distributed/_functional_collectives.py ``all_to_all_single_backward``): combine's, then dispatch's.

Routing is given, not learned: which experts a rank's tokens go to (how many copies per expert) comes from
sim/parallel/ep/routing.py for the variant's skew, so the real run and the simulator move the same bytes; the gate
scores of those experts are real (differentiable) router outputs. Every collective is recorded by a
TorchDispatchMode (below autograd, so backward's all_to_alls are seen): kind, per-peer bytes sent, dtype, phase.
"""
from __future__ import annotations

import time

from torch.utils._python_dispatch import TorchDispatchMode


class A2ACapture(TorchDispatchMode):
    """Every ``_c10d_functional.all_to_all_single``: [kind, bytes sent to each peer, dtype, group ranks, phase]."""

    def __init__(self):
        super().__init__()
        self.calls: list[list] = []
        self.phase = "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "_c10d_functional" and func._overloadpacket.__name__ == "all_to_all_single":
            import torch.distributed as dist
            from torch.distributed.distributed_c10d import _resolve_process_group
            t, in_splits, group = args[0], args[2], _resolve_process_group(args[3])
            ranks = dist.get_process_group_ranks(group)
            row = (t.numel() // t.shape[0] if t.shape[0] else 0) * t.element_size()
            splits = list(in_splits) if in_splits is not None else [t.shape[0] // len(ranks)] * len(ranks)
            self.calls.append(["all_to_all", [int(s) * row for s in splits], str(t.dtype).replace("torch.", ""),
                               ranks, self.phase])
        return out


def build_layers(c, ep: int, rank: int, dtype):
    """Per MoE layer: router (E, h), local experts w1, w3 (E/ep, f, h), w2 (E/ep, h, f), shared SwiGLU."""
    import torch
    torch.manual_seed(0)                      # the same router and shared weights on every rank
    E, h, f, local = c.experts, c.hidden, c.expert_ffn, c.experts // ep
    layers = []
    for _ in range(c.layers):
        full = [torch.randn(E, f, h) * h ** -0.5, torch.randn(E, f, h) * h ** -0.5, torch.randn(E, h, f) * f ** -0.5]
        p = {"router": torch.randn(E, h) * h ** -0.5,
             **{k: w[rank * local:(rank + 1) * local].clone() for k, w in zip(("w1", "w3", "w2"), full)}}
        if c.shared_experts:
            S = c.shared_experts * f
            p.update(s1=torch.randn(S, h) * h ** -0.5, s3=torch.randn(S, h) * h ** -0.5,
                     s2=torch.randn(h, S) * S ** -0.5)
        layers.append({k: v.to(dtype).requires_grad_() for k, v in p.items()})
    return layers


def swiglu(x, w1, w3, w2):
    import torch.nn.functional as F
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def assignment(counts: list[int], tokens: int):
    """(token index of each routed copy, its expert), copies in expert order: expert e's counts[e] copies go to
    the next tokens in turn (copy s -> token s mod T)."""
    import torch
    experts = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    return torch.arange(len(experts)) % tokens, experts


def moe_layer(x, p, counts: list[int], ep: int, group):
    """One MoE layer (module docstring); ``counts``: copies this rank routes to each expert."""
    import torch
    import torch.distributed._functional_collectives as funcol
    T, E = x.shape[0], len(counts)
    local = E // ep
    scores = torch.softmax(x @ p["router"].T, dim=-1)
    sent = torch.tensor(counts, dtype=torch.int64)
    received = funcol.all_to_all_single(sent, None, None, group).wait()
    input_splits = sent.view(ep, local).sum(1).tolist()
    output_splits = received.view(ep, local).sum(1).tolist()
    token, expert = assignment(counts, T)
    routed = funcol.all_to_all_single_autograd(x[token], output_splits, input_splits, group)
    routed = routed.wait() if hasattr(routed, "wait") else routed
    per_source = received.view(ep, local).tolist()        # copies from each source, by local expert
    index, start = [[] for _ in range(local)], 0
    for row in per_source:
        for le, n in enumerate(row):
            index[le] += range(start, start + n)
            start += n
    out = torch.zeros_like(routed)
    for le in range(local):
        if index[le]:
            idx = torch.tensor(index[le])
            out = out.index_copy(0, idx, swiglu(routed[idx], p["w1"][le], p["w3"][le], p["w2"][le]))
    back = funcol.all_to_all_single_autograd(out, input_splits, output_splits, group)
    back = back.wait() if hasattr(back, "wait") else back
    gate = scores[token, expert].unsqueeze(1).to(back.dtype)
    y = torch.zeros_like(x).index_add(0, token, back * gate)
    if "s1" in p:
        y = y + swiglu(x, p["s1"], p["s3"], p["s2"])
    return x + y


def rank_task(ctx, payload: dict) -> dict:
    """Per variant ({model: MoE spec, skew, ep}): its layers on this rank (ep < world: expert parallelism inside
    blocks of ep consecutive ranks, the mesh {dp: world / ep, ep}); then, round after round (warm-up rounds
    first), one step of every variant in turn, so that a change in the machine's load hits every variant alike:
    forward, backward of mean(y^2); per step the calls and [forward, backward] seconds. ``calibrate``: sizes of
    even all_to_alls timed first (runtime/parallel/ep/validate.py)."""
    import torch
    import torch.distributed as dist

    from distlab.sim.models import model_from_spec
    from distlab.sim.parallel.ep.model import config_of
    from distlab.sim.parallel.ep.plan import EPOptions, Layout
    import distlab.sim.workloads.registry  # noqa: F401  (registers the moe model kind)
    groups = {}
    for ep in sorted({v.get("ep") or ctx.world_size for v in payload["variants"]}):
        for start in range(0, ctx.world_size, ep):       # every rank creates every group (torch's rule)
            members = list(range(start, start + ep))
            g = dist.group.WORLD if ep == ctx.world_size else dist.new_group(members)
            if ctx.rank in members:
                groups[ep] = g
    a2a_times = {str(n): _time_all_to_all(int(n), ctx.world_size, payload.get("reps", 5))
                 for n in payload.get("calibrate") or []}
    built = []
    for v in payload["variants"]:
        c = config_of(model_from_spec(v["model"]))
        dtype = getattr(torch, c.dtype)
        torch.manual_seed(1 + ctx.rank)
        x0 = torch.randn(c.tokens, c.hidden).to(dtype)
        ep = v.get("ep") or ctx.world_size
        j = ctx.rank % ep
        built.append((Layout(c, ep, EPOptions(skew=v.get("skew", 0.0))), build_layers(c, ep, j, dtype), x0, ep, j))
    out = [{"steps": [], "received": b[0].received} for b in built]
    warmup = payload.get("warmup", 1)
    for k in range(warmup + payload.get("steps", 1)):
        for (lay, layers, x0, ep, j), record in zip(built, out):
            cap = A2ACapture()
            dist.barrier()
            t0 = time.perf_counter()
            with cap:
                y = x = x0.clone().requires_grad_()
                for p in layers:
                    y = moe_layer(y, p, lay.counts[j], ep, groups[ep])
                loss = y.float().pow(2).mean()
                t1 = time.perf_counter()
                cap.phase = "backward"
                loss.backward()
            t2 = time.perf_counter()
            for p in layers:
                for w in p.values():
                    w.grad = None
            if k >= warmup:
                record["steps"].append({"time": t2 - t0, "phases": [t1 - t0, t2 - t1], "calls": cap.calls})
    return {"rank": ctx.rank, "variants": out, "all_to_all_s": a2a_times}


def _time_all_to_all(nbytes: int, ep: int, reps: int) -> list[float]:
    """Seconds of ``reps`` even all_to_all_single calls of ``nbytes`` (float32) sent in all, each after a barrier."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    x = torch.zeros(max(nbytes // 4 // ep, 1) * ep)
    times = []
    for _ in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        funcol.all_to_all_single(x, None, None, dist.group.WORLD).wait()
        times.append(time.perf_counter() - t0)
    return times[1:]


def measured_sequence(results: list, variant: int = 0, rank: int = 0) -> list[tuple]:
    """(kind, per-peer bytes, dtype, group, phase) of every all_to_all one rank issued in its last step."""
    calls = next(r for r in results if r["rank"] == rank)["variants"][variant]["steps"][-1]["calls"]
    return [(k, tuple(b), d, tuple(g), ph) for k, b, d, g, ph in calls]


def run(variants: list[dict], world: int = 2, steps: int = 1, warmup: int = 1, timeout: float = 180.0,
        calibrate: list[int] | None = None) -> list:
    """Launch ``world`` gloo ranks; a variant is {model: Model (kind moe), skew: float, ep: int (default world)}.
    ``calibrate``: sizes (bytes) of even all_to_alls to time first (runtime/parallel/ep/validate.py fits α and bandwidth
    on them)."""
    from distlab.runtime.ranks.launch import TRAINING, launch
    payload = {"variants": [{**v, "model": {**v["model"].config, "name": v["model"].name}} for v in variants],
               "steps": steps, "warmup": warmup, "calibrate": calibrate}
    return launch("distlab.runtime.parallel.ep.run:rank_task", payload, nproc=world, backend="gloo", timeout=timeout,
                  preload=TRAINING)
