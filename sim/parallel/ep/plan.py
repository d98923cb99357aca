"""Expert-parallel plans: per rank, the compute and collectives of one training step of a mixture-of-experts
model (sim/parallel/ep/model.py) with the routed experts sharded over mesh dimension ``ep``, as torchtitan's
ExpertParallel runs them (torchtitan/distributed/expert_parallel.py; real run: runtime/parallel/ep/run.py).

Mesh ``{pp, dp, ep}`` (pp and dp optional): ep is folded from the data-parallel ranks as torchtitan does, so
the non-expert parameters are replicated over dp x ep ranks and each expert over dp. Per MoE block, forward:
compute attention and router; all_to_all of the per-expert token counts (E int64, even: torchtitan's
``all_to_all_single(num_tokens_per_expert)``, which sizes the next two); dispatch all_to_all of the routed
token copies (splits[i][j] = tokens[i][j]·h·e bytes, sim/parallel/ep/routing.py); the local experts' grouped GEMM over
the copies that arrived; combine all_to_all (the transpose) back; the shared experts. Backward, in reverse: the
combine's adjoint all_to_all (splits = dispatch's), the experts' backward, the dispatch's adjoint (the
transpose), attention. Collectives run on stream ``ep``; compute waits for each (its result is the next op's
input), except inside a DualPipe OVERLAP_F_B pair (sim/parallel/pipeline/dualpipe.py). After the backward: gradients
reduced over the data-parallel ranks (ZeRO-1: reduce_scatter, then all_gather of the updated shards after the
optimizer; else all_reduce), non-expert ones over dp x ep, expert ones over dp; AdamW on the local shard.

``fp8_dispatch`` (DeepSeek-V3, arXiv 2412.19437 sec. 3.3.3 "Low-Precision Communication"): the activations are
quantized to FP8 before the dispatch, and so is the activation gradient before the down-projections (the
combine's adjoint, which travels the dispatch's way); "for both the forward and backward combine components,
we retain them in BF16". Each FP8 row carries one fp32 scale per 128 values (sec. 3.3.2, fine-grained
quantization: 1 x 128 tiles for activations): h + 4·ceil(h/128) bytes per token copy instead of h·e.

Compute per rank: the kernels of sim/parallel/ep/kernels.py (attention and router GEMMs, FlashAttention, the
permutation, norms: the same on every rank; the grouped GEMM of rank j over the R_j copies it received, its E/ep
experts' weights read), as every builder prices an MoE model's layers. The slowest expert rank holds everyone at
the combine all_to_all: per MoE block the step pays max_j of the expert time.
"""
from __future__ import annotations

from dataclasses import dataclass

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.ep.model import MoEConfig, config_of
from distlab.sim.parallel.ep.routing import routing, token_matrix
from distlab.sim.parallel.pipeline import dualpipe
from distlab.sim.parallel.pipeline.action import Action
from distlab.sim.parallel.pipeline.schedules import SCHEDULES
from distlab.sim.plan import DTYPE_BYTES, Collective, Compute, Plan, Record, Wait
from distlab.sim.parallel.options import option

ADAM_BYTES, ADAM_FLOPS = 28, 12      # per element: as sim/parallel/tp/plan.py
COUNT_BYTES = 8                      # torch.int64 token counts
FP8_TILE, FP8_SCALE_BYTES = 128, 4   # DeepSeek-V3 sec. 3.3.2: one fp32 scale per 1 x 128 activation tile


@dataclass
class EPOptions:
    """The ``ep:`` section of a scenario; ep, dp and pp sizes come from the mesh."""
    skew: float = option(0.0, "routing imbalance: expert e gets a share (e+1)^-skew of the tokens (0 = balanced)",
                         flag="--ep-skew")
    node_limit: int | None = option(None, "node-limited routing: each rank's tokens go to experts on at most this "
                                          "many nodes (DeepSeek-V3: 4); none = any",
                                   flag="--ep-node-limit")
    zero1: bool = option(True, "ZeRO-1: reduce_scatter gradients, all_gather parameters (false: all_reduce)",
                         flag="--ep-zero1")
    schedule: str = option("1f1b", "pipeline schedule when the mesh has pp (2 stages per rank but for gpipe, 1f1b)",
                           choices=SCHEDULES, what="pipeline schedule")
    microbatches: int = option(1, "micro-batches per step (with pp: per pipeline)")
    overlap: bool = option(True, "DualPipe: overlap each OVERLAP_F_B pair's all-to-alls with the other's compute")
    split: list[int] | None = option(None, "blocks per pipeline stage (with pp), stage order; none = even")
    fp8_dispatch: bool = option(False, "DeepSeek-V3's FP8 dispatch: the dispatch all_to_all and its backward twin "
                                       "carry float8 values with an fp32 scale per 128; the combine stays in the "
                                       "model dtype", flag="--ep-fp8-dispatch")

    def validate(self, where: str = "ep") -> "EPOptions":
        if not (isinstance(self.skew, (int, float)) and 0 <= self.skew <= 8):
            raise ConfigError(f"skew {self.skew!r} must be a number in [0, 8]", f"{where}.skew")
        if self.node_limit is not None and self.node_limit < 1:
            raise ConfigError(f"node_limit {self.node_limit} must be a whole number >= 1 or none",
                              f"{where}.node_limit")
        if self.microbatches < 1:
            raise ConfigError(f"{self.microbatches} must be a whole number >= 1", f"{where}.microbatches")
        return self


def virtual_stages(schedule: str) -> int:
    """Stages per pipeline rank: 1 for gpipe and 1f1b, 2 for the multi-stage schedules (a V for zbv, dualpipev)."""
    return 1 if schedule in ("gpipe", "1f1b") else 2


def check_ep(c: MoEConfig, ep: int, where: str = "mesh.ep") -> None:
    """ep must divide the routed experts (each rank holds E/ep of them)."""
    if c.experts % ep:
        divisors = [d for d in range(1, c.experts + 1) if c.experts % d == 0]
        raise ConfigError(f"ep {ep} does not divide the {c.experts} experts; allowed: "
                          f"{', '.join(map(str, divisors[:12]))}{' ...' if len(divisors) > 12 else ''}", where)


class Layout:
    """The routing of one micro-batch on one ep group: counts[i][e], tokens[i][j], the dispatch and combine
    split matrices (bytes), received copies per rank."""

    def __init__(self, c: MoEConfig, ep: int, opts: EPOptions, nodes: list[int] | None = None):
        self.c, self.ep = c, ep
        self.counts = routing(c.tokens, c.top_k, c.experts, ep, opts.skew, c.capacity_factor, nodes, opts.node_limit)
        self.tokens = token_matrix(self.counts, ep)
        row = c.hidden * DTYPE_BYTES[c.dtype]
        self.dispatch_dtype = "float8_e4m3fn" if opts.fp8_dispatch else c.dtype
        out_row = c.hidden + FP8_SCALE_BYTES * -(-c.hidden // FP8_TILE) if opts.fp8_dispatch else row
        self.dispatch = tuple(tuple(n * out_row for n in r) for r in self.tokens)
        self.combine = tuple(tuple(self.tokens[i][j] * row for i in range(ep)) for j in range(ep))
        self.received = [sum(r[j] for r in self.tokens) for j in range(ep)]
        even = c.experts * COUNT_BYTES // ep            # the int64 token counts: E/ep of them to each peer
        self.count_splits = tuple(tuple(even for _ in range(ep)) for _ in range(ep))
        self.largest = {id(m): max(sum(r) for r in m) for m in (self.dispatch, self.combine, self.count_splits)}

    def expert_flops(self, j: int) -> float:
        """Forward FLOPs of rank j's grouped GEMM: 2·R_j·3·h·f (SwiGLU experts)."""
        return 2.0 * self.received[j] * 3 * self.c.hidden * self.c.expert_ffn

    def expert_weight_bytes(self) -> float:
        c = self.c
        return c.experts // self.ep * 3 * c.hidden * c.expert_ffn * DTYPE_BYTES[c.dtype]


def a2a(splits, group, dtype: str, name: str, lay: "Layout") -> Collective:
    """An ep all_to_all of one of ``lay``'s split matrices; bytes = its largest row sum."""
    return Collective("all_to_all", lay.largest[id(splits)], dtype, group, name=name, stream="ep", splits=splits,
                      group_name="ep")        # the ep mesh dim's group: with dp 1 the dense grads' ranks too


def block_ops(c: MoEConfig, i: int, kind: str, j: int, lay: Layout | None, group: tuple, tag: str = "",
              recompute: str = "none") -> list:
    """Block i's Computes and ep Collectives on ep rank j (``lay`` None: no ep) for pipeline action kind F
    (forward), B (backward), I (input gradients, with the all_to_alls) or W (weight gradients, compute only):
    the kernels of sim/parallel/ep/kernels.py, the grouped GEMM over the copies rank j received."""
    from distlab.sim.parallel.ep.kernels import block_kernels
    name = f"{tag}h.{i}"
    ep = len(group) if lay is not None else 1
    parts = block_kernels(c, i, kind, lay.received[j] if lay else None, c.experts // ep, recompute, tag)
    front, experts, shared = parts["front"], parts["experts"], parts["shared"]
    if not experts or kind == "W" or lay is None or len(group) == 1:
        middle = experts
    elif kind == "F":
        middle = [a2a(lay.count_splits, group, "int64", f"ep all_to_all {name} counts fwd", lay),
                  a2a(lay.dispatch, group, lay.dispatch_dtype, f"ep all_to_all {name} dispatch fwd", lay), *experts,
                  a2a(lay.combine, group, c.dtype, f"ep all_to_all {name} combine fwd", lay)]
    else:
        middle = [a2a(lay.dispatch, group, lay.dispatch_dtype, f"ep all_to_all {name} combine bwd", lay),
                  *experts[::-1], a2a(lay.combine, group, c.dtype, f"ep all_to_all {name} dispatch bwd", lay)]
    if kind == "F":
        return front + middle + shared
    return shared[::-1] + middle + front[::-1]


def layer_ops(model, c: MoEConfig, index: int, kind: str, j: int, lay, group, tag: str = "") -> list:
    """Ops of model layer ``index`` (embed, a block, head) for action kind F, B, I or W."""
    from distlab.sim.parallel.ep.kernels import end_kernels
    layer = model.layers[index]
    recompute = (model.config or {}).get("recompute", "none")
    if layer.name.startswith("h."):
        return block_ops(c, int(layer.name[2:]), kind, j, lay, group, tag, recompute)
    return end_kernels(c, layer.name, kind, tag)


def grad_sync(model, c: MoEConfig, layers, ep: int, data_group: tuple, expert_group: tuple, zero1: bool,
              tag: str) -> tuple[list, list]:
    """(ops after the backward, ops after the optimizer): gradients of ``layers`` reduced over the data-parallel
    ranks, the optimizer on the local shard, ZeRO-1's all_gather."""
    e = DTYPE_BYTES[c.dtype]
    params = [q for i in layers for q in model.layers[i].params]
    dense = sum(q.numel for q in params if ".moe.experts." not in q.name)
    expert = sum(q.numel for q in params if ".moe.experts." in q.name) // ep
    before, after, local = [Record(f"grads {tag}", "compute")], [], 0.0
    for numel, group, what in ((dense, data_group, "dense"), (expert, expert_group, "experts")):
        if not numel:
            continue
        n = len(group)
        local += numel / (n if zero1 else 1)
        if n == 1:
            continue
        nbytes = -(-numel // n) * n * e if zero1 else numel * e       # padded to n equal shards
        before += [Wait(f"grads {tag}", f"dp {what}"),
                   Collective("reduce_scatter" if zero1 else "all_reduce", int(nbytes), c.dtype, group,
                              name=f"dp {what} grads {tag}", stream=f"dp {what}"),
                   Record(f"synced {what} {tag}", f"dp {what}"), Wait(f"synced {what} {tag}", "compute")]
        if zero1:
            after += [Record(f"updated {what} {tag}", "compute"), Wait(f"updated {what} {tag}", f"dp {what}"),
                      Collective("all_gather", int(nbytes), c.dtype, group, name=f"dp {what} params {tag}",
                                 stream=f"dp {what}")]
    return before + [Compute(f"optimizer {tag}", flops=ADAM_FLOPS * local, bytes=ADAM_BYTES * local)], after


def ep_plan(model, mesh, opts: EPOptions, cluster=None, name: str | None = None, optimizer: bool = True) -> Plan:
    """One training step on ``mesh`` (dims ep, optionally dp and pp); ``cluster`` places ranks on nodes for
    node-limited routing. ``optimizer`` False: forward and backward only (no gradient sync, no AdamW; what
    runtime/parallel/ep/run.py times)."""
    if (model.config or {}).get("kind") != "moe":          # EP on a dense model: the MoE presets named
        from distlab.sim.models.presets import moe_presets
        raise ConfigError(f"{model.name} has no experts; allowed: MoE ({', '.join(moe_presets())})", "mesh.ep")
    c = config_of(model)
    if "ep" not in mesh:
        raise ConfigError(f"the ep section needs mesh dimension 'ep'; this mesh has {', '.join(mesh.names)}",
                          "ep: mesh")
    ep = mesh.size("ep")
    check_ep(c, ep)
    lays = {}

    def layout(g: int) -> Layout:
        group = mesh.group_of(g, "ep")
        if group not in lays:
            nodes = [cluster.node_of(r) for r in group] if cluster is not None else None
            lays[group] = Layout(c, ep, opts, nodes)
        return lays[group]

    data = ("dp", "ep") if "dp" in mesh else ("ep",)
    if "pp" in mesh and mesh.size("pp") > 1:
        plan = _pp_plan(model, c, mesh, opts, layout, data)
    else:
        ranks = []
        for g in range(mesh.world_size):
            group, j = mesh.group_of(g, "ep"), mesh.coords(g)["ep"]
            lay = layout(g)
            ops = []
            for mb in range(opts.microbatches):
                tag = f"mb{mb} " if opts.microbatches > 1 else ""
                fwd = [op for i in range(len(model.layers)) for op in layer_ops(model, c, i, "F", j, lay, group, tag)]
                bwd = [op for i in reversed(range(len(model.layers)))
                       for op in layer_ops(model, c, i, "B", j, lay, group, tag)]
                ops += dualpipe.serial_ops(fwd, f"{tag}F") + dualpipe.serial_ops(bwd, f"{tag}B")
            before, after = grad_sync(model, c, range(len(model.layers)), ep, mesh.group_of(g, data),
                                      mesh.group_of(g, "dp") if "dp" in mesh else (g,), opts.zero1, "step")
            ranks.append(ops + (before + after if optimizer else []))
        plan = Plan(ranks, name=name or f"ep{ep}-{model.name}")
    lay0 = layout(0)
    plan.meta = {"builder": "ep", "model": model.name, "ep": ep, "skew": opts.skew, "node_limit": opts.node_limit,
                 "tokens": lay0.tokens, "received": lay0.received, **plan.meta}
    return plan.validate()


class StageView:
    """``mesh`` as pipeline_plan sees it: dimension pp, and every other dimension together as one "dp" (the
    ranks of a stage), the rank numbering unchanged. A rank's stage is its own pp coordinate: with ep or dp
    outside pp (mesh {ep: 4, pp: 2}, or dp filled in first) a flat {pp, dp} mesh would put the members of one
    ep group on different stages, their all_to_alls of different sizes (tests/test_ep_sim.py)."""

    def __init__(self, mesh):
        self.mesh, self.world_size = mesh, mesh.world_size
        self.others = tuple(n for n in mesh.names if n != "pp")

    def __contains__(self, dim: str) -> bool:
        return dim == "pp" or (dim == "dp" and bool(self.others))

    def size(self, dim: str) -> int:
        return self.mesh.size("pp") if dim == "pp" else self.world_size // self.mesh.size("pp")

    def as_dict(self) -> dict:
        return {"pp": self.size("pp"), "dp": self.size("dp")}

    def coords(self, g: int) -> dict:
        return {"pp": self.mesh.coords(g)["pp"]}

    def group_of(self, g: int, dim: str) -> tuple:
        return self.mesh.group_of(g, "pp" if dim == "pp" else self.others)


def _pp_plan(model, c, mesh, opts, layout, data) -> Plan:
    """PP x EP: the pipeline schedule (sim/parallel/pipeline/plan.py) with each action's ops from ``block_ops``; DualPipe's
    OVERLAP_F_B pairs overlapped (``opts.overlap``)."""
    from distlab.sim.parallel.pipeline.plan import PipelineSpec, pipeline_plan, stage_ranges
    pp, rest = mesh.size("pp"), mesh.world_size // mesh.size("pp")
    v = virtual_stages(opts.schedule)
    spec = PipelineSpec(schedule=opts.schedule, stages=pp, microbatches=opts.microbatches, virtual_stages=v,
                        data_parallel=rest, split=opts.split)
    flat = StageView(mesh)                     # a rank's stage is its pp coordinate, wherever pp sits in the mesh
    ranges = stage_ranges(model, pp * v, opts.split)
    ep = mesh.size("ep")

    def items(a: Action, g: int) -> list:
        group, j, lay = mesh.group_of(g, "ep"), mesh.coords(g)["ep"], layout(g)
        idx = ranges[a.stage] if a.kind in ("F", "W") else reversed(ranges[a.stage])
        tag = f"{a} "
        return [op for i in idx for op in layer_ops(model, c, i, a.kind, j, lay, group, tag)]

    def action_ops(a: Action, g: int, partner: Action | None) -> list:
        if partner is None:
            return dualpipe.serial_ops(items(a, g), str(a))
        if opts.overlap:
            return dualpipe.overlapped_ops(items(a, g), items(partner, g), str(a), str(partner))
        return dualpipe.serial_ops(items(a, g), str(a)) + dualpipe.serial_ops(items(partner, g), str(partner))

    def grad_ops(stage: int, g: int) -> list:
        before, after = grad_sync(model, c, ranges[stage], ep, mesh.group_of(g, data),
                                  mesh.group_of(g, "dp") if "dp" in mesh else (g,), opts.zero1, f"stage {stage}")
        return before + after

    return pipeline_plan(model, flat, spec, name=f"ep{ep}-pp{pp}-{opts.schedule}-{model.name}",
                         action_ops=action_ops, grad_ops=grad_ops)


def collective_sequence(plan: Plan, rank: int = 0) -> list[tuple]:
    """(kind, bytes sent to each ep peer, dtype, group, phase) of each ep all_to_all of ``rank`` in issue
    order: what runtime/parallel/ep/run.py's capture is compared with."""
    out = []
    for o in plan.ranks[rank]:
        if isinstance(o, Collective) and o.name.startswith("ep "):
            group = plan.group_of(o)
            out.append((o.op, tuple(o.splits[group.index(rank)]), o.dtype, group,
                        "forward" if o.name.endswith("fwd") else "backward"))
    return out
