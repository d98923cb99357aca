"""The program of one rank's layers, as steps 2-4 of sim/parallel/parallelize.py leave it (TP, then CP, then
activation checkpointing), for the data-parallel and pipeline steps to place.

    layers = layer_program(model, mesh, rank, tp=TPOptions(), cp=None)
    layers.forward(Compute("fwd h.0", flops=...), "h.0")     # TP: the block's TP segment replaces the op
    layers.backward(Compute("bwd h.0", flops=...), "h.0")
    layers.ops                                              # the rank's ops so far

A step that places layers (FSDP2's units, DDP's buckets, a pipeline's actions) emits each layer's plain compute
op, named ``fwd LAYER`` or ``bwd LAYER`` with the layer's FLOPs and bytes (sim/parallel/fsdp/plan.py), and hands
it here; every other op it emits goes through ``keep``. What replaces a layer's op:

- a transformer (``kind`` gpt) without TP: TP's segments on a group of one rank (:func:`kernel_layers`): the
  same kernels (GEMMs by shape, FlashAttention, memory-bound norms and loss) without collectives, under the
  model's own recompute; a mixture of experts (``kind`` moe): sim/parallel/ep/kernels.py's block program
  (attention GEMMs, router, permutation, the experts' GEMMs) on one rank;
- TP (sim/parallel/tp/plan.py ``Segments``): the layer's TP segment on the rank's tp group: compute with the
  TP-local FLOPs and the TP collectives between (the op's own FLOPs are not used: TP recomputes them per part);
- CP, with or without TP (sim/parallel/cp/compose.py ``CPSegments``): TP segments (on a group of one rank
  without TP) whose attention core is the ring (sim/parallel/cp/ring.py: one FlashAttention call per ring step),
  recompute (``CPOptions.recompute`` full) rerunning the block, ring included, before its backward;
- anything else (a model without a transformer's structure, a hand-written plan): the op itself, priced by its
  FLOPs and bytes (sim/compute/kernels.py, an upper bound) or on a CPU preset's roofline.
Every builder (DDP, FSDP2 / ZeRO / HSDP, every pipeline schedule, CP, EP and their compositions) emits its layers
through these, so one layout is priced the same whichever builder made its plan.

Activation checkpointing is part of the TP and CP rewrites (``TPOptions.recompute``: the recomputed FLOPs in
each block's backward; ``CPOptions.recompute`` full: the block's forward, ring included, rerun before its
backward), as torchtitan applies it after them (parallelize_llama: apply_tp, apply_cp, then apply_ac).
TP's Partial(sum) gradients (sequence-parallel norms) are all-reduced where the data-parallel step says
(``partial_grads``): FSDP2 before the unit's reduce-scatter, DDP at the end of backward, AdamW's reads without
either.
"""
from __future__ import annotations

from dataclasses import replace

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.tp.plan import Segments, _Program


def segments(model, o, p, rank: int):
    """The TP segments of ``rank`` (its group: ``p.group``): with ``comm_overlap`` Megatron's pipelined overlap
    (sim/parallel/tp/overlap.py), else sim/parallel/tp/plan.py's."""
    if o.comm_overlap:
        from distlab.sim.parallel.tp.overlap import OverlapSegments
        return OverlapSegments(model, o, p, rank)
    return Segments(model, o, p)


class PlainLayers:
    """No TP, no CP: each layer's op as it is."""

    def __init__(self):
        self.ops: list = []

    def forward(self, op, name: str):
        self.ops.append(op)

    backward = forward

    def keep(self, op):
        self.ops.append(op)

    def partial_grads(self, names, reads: int, phase: str):
        pass


class TPLayers:
    """TP (+ SP, loss parallel, recompute) on the rank's tp group; with ``ring`` (CP x TP) the attention core of
    every block is ring attention (CPSegments)."""

    def __init__(self, model, tp_opts, group: tuple, dtype: str, ring=None, cp_recompute: bool = False,
                 rank: int | None = None):
        self.p = _Program(group, dtype)
        if ring is None:
            self.seg = segments(model, tp_opts, self.p, group[0] if rank is None else rank)
        elif tp_opts.comm_overlap:
            raise ConfigError("comm_overlap (Megatron's TP overlap) is not built with cp", "tp.comm_overlap")
        else:
            from distlab.sim.parallel.cp.compose import CPSegments
            ring.ops = self.p.ops
            self.seg = CPSegments(model, tp_opts, self.p, ring, cp_recompute)

    @property
    def ops(self) -> list:
        return self.p.ops

    def forward(self, op, name: str):
        self.seg.forward(name)

    def backward(self, op, name: str):
        self.seg.backward(name)

    def keep(self, op):
        self.p.ops.append(op)

    def partial_grads(self, names, reads: int, phase: str):
        self.seg.partial_grads(names, reads, phase)


def kernel_layers(model, rank: int, dtype: str | None = None, recompute: str | None = None):
    """The layer program of a rank without TP and CP: TP's segments on the group (rank,) for a transformer,
    the mixture-of-experts block program for an MoE model, else None (flops-only ops stay as they are).
    ``dtype``: what the layers compute in (FSDP2's param_dtype; default the model's); ``recompute``: the
    activation checkpointing (default the model's own)."""
    c = model.config or {}
    if c.get("kind") not in ("gpt", "moe"):
        return None
    if dtype and dtype != c.get("dtype"):
        model = replace(model, config={**c, "dtype": dtype})
    rc = recompute or c.get("recompute", "none")
    if c["kind"] == "moe":
        from distlab.sim.parallel.ep.kernels import MoELayers
        return MoELayers(model, rank, rc)
    from distlab.sim.parallel.tp.plan import TPOptions
    return TPLayers(model, TPOptions(sequence_parallel=False, recompute=rc), (rank,), model.config["dtype"])


def dtensor_optimizer(model, par) -> bool:
    """Whether AdamW steps DTensors (each elementwise op through DTensor's dispatch, sim/parallel/tp/plan.py
    ADAMW_DTENSOR_OPS): under TP, and under FSDP2 whose ``fully_shard`` makes every parameter a DTensor
    (Shard(0)) with or without TP; counted for the models whose layers carry kernels (a flops-only model keeps
    its plain optimizer op)."""
    if par.tp is not None:
        return True
    return par.fsdp is not None and (model.config or {}).get("kind") in ("gpt", "moe")


def through(layers, ops: list) -> list:
    """``ops`` (a builder's program of plain ``fwd LAYER`` / ``bwd LAYER`` Computes and everything else) with
    each layer's op replaced by what ``layers`` (a layer program) makes of it; returns ``layers.ops``."""
    from distlab.sim.plan import Compute
    for op in ops:
        kind, _, rest = getattr(op, "name", "").partition(" ")
        if isinstance(op, Compute) and kind in ("fwd", "bwd") and op.seconds is None:
            (layers.forward if kind == "fwd" else layers.backward)(op, rest)
        else:
            layers.keep(op)
    return layers.ops


def kernel_actions(model, ranges: list, dtype: str | None = None):
    """The pipeline's ``action_ops`` (sim/parallel/pipeline/plan.py) for a model whose layers have kernels, else
    None: each action (F, B, or the split backward's I and W) runs its stage's layers through
    :func:`kernel_layers`, every op named after the action ("2F5 fwd h.3.attn"); an overlapped pair runs one
    action, then the other. I: the input-gradient GEMMs, the attention backward, the norms; W: the
    weight-gradient GEMMs (TP's backward GEMMs alternate input and weight gradient: tp/plan.py
    ``backward_gemms``)."""
    c = model.config or {}
    if c.get("kind") not in ("gpt", "moe"):
        return None
    names = [L.name for L in model.layers]
    programs: dict = {}
    full = c.get("recompute", "none") == "full"

    def ops_of(a, g: int) -> list:
        if g not in programs:
            programs[g] = kernel_layers(model, g, dtype)
        lp = programs[g]
        if c["kind"] == "moe":
            from distlab.sim.parallel.ep.kernels import layer_kernels
            from distlab.sim.parallel.ep.model import config_of
            idx = ranges[a.stage] if a.kind == "F" else list(reversed(ranges[a.stage]))
            ops = [o for i in idx for o in layer_kernels(lp.model, config_of(lp.model), i, a.kind, lp.recompute)]
        else:
            for i in (ranges[a.stage] if a.kind == "F" else reversed(ranges[a.stage])):
                (lp.forward if a.kind == "F" else lp.backward)(None, names[i])
            ops = drain(lp) if a.kind in ("F", "B") else split_backward(drain(lp), a.kind, full)
        return [replace(o, name=f"{a} {o.name}") for o in ops]

    def action_ops(a, g: int, partner) -> list:
        return ops_of(a, g) + (ops_of(partner, g) if partner is not None else [])

    return action_ops


def split_backward(ops: list, part: str, full: bool) -> list:
    """The input-gradient (``part`` I) or weight-gradient (W) share of backward Computes (see kernel_actions);
    ``full``: each op's GEMMs start with its recomputed forward's (they go with I)."""
    from distlab.sim.plan import Compute
    out = []
    for op in ops:
        if not isinstance(op, Compute) or not op.gemms:
            if part == "I" or not isinstance(op, Compute):
                out.append(op)
            continue
        g = op.gemms
        n = len(g) // (3 if full else 2)
        back = g[len(g) - 2 * n:]
        weight = back[1::2]
        w_flops = sum(2.0 * M * N * K for M, N, K in weight)
        if part == "W":
            out.append(replace(op, gemms=weight, attention=None, flops=w_flops))
        else:
            out.append(replace(op, gemms=g[:len(g) - 2 * n] + back[0::2], flops=op.flops - w_flops))
    return out


def drain(layers) -> list:
    """The ops ``layers`` has made so far, taken out of it."""
    out = list(layers.ops)
    del layers.ops[:]
    return out


class CPLayers(PlainLayers):
    """CP without TP: each block's op cut around its ring attention (sim/parallel/cp/local.py ``ring_block``)."""

    def __init__(self, ring, recompute: bool):
        super().__init__()
        ring.ops = self.ops
        self.ring, self.recompute = ring, recompute

    def forward(self, op, name: str):
        from distlab.sim.parallel.cp.local import ring_block
        if name.startswith("h."):
            ring_block(self.ops, self.ring, op, "fwd", name)
        else:
            self.ops.append(op)

    def backward(self, op, name: str):
        from distlab.sim.parallel.cp.local import ring_block
        if name.startswith("h."):
            ring_block(self.ops, self.ring, op, "bwd", name, self.recompute)
        else:
            self.ops.append(op)


def layer_program(model, mesh, rank: int, tp=None, cp=None):
    """The layer program of ``rank``: ``model`` as the data-parallel step sees it (for CP: the cp-local model,
    sim/parallel/cp/local.py cp_local_model), ``tp`` TPOptions when the mesh has tp, ``cp`` CPOptions when it has
    cp."""
    c = model.config
    ring = None
    if cp is not None:
        from distlab.sim.parallel.cp.ring import Ring
        from distlab.sim.plan import DTYPE_BYTES
        t = mesh.size("tp") if tp is not None else 1
        heads = c.get("heads") if c.get("kind") == "gpt" else None
        ring = Ring([], rank, mesh.group_of(rank, "cp"), c["micro_batch"], c["seq_len"], c["hidden"] // t,
                    c["dtype"], DTYPE_BYTES[c["dtype"]], cp.rotate_method, cp.load_balance, cp.overlap,
                    heads=heads // t if heads else None)
    if tp is None and c.get("kind") == "gpt":      # TP's segments on a group of one rank (module docstring)
        from distlab.sim.parallel.tp.plan import TPOptions
        rc = cp.recompute if cp is not None else c.get("recompute", "none")
        tp, group = TPOptions(sequence_parallel=False, recompute=rc), (rank,)
    else:
        group = mesh.group_of(rank, "tp") if tp is not None else None
    if tp is not None:
        return TPLayers(model, tp, group, c["dtype"], ring, cp is not None and cp.recompute == "full", rank)
    if cp is not None:
        return CPLayers(ring, cp.recompute == "full")
    return kernel_layers(model, rank) or PlainLayers()


def sizes(mesh) -> dict:
    """Every composable dimension's size (1 when absent)."""
    return {d: mesh.size(d) if d in mesh else 1 for d in ("pp", "dp_replicate", "dp_shard", "dp", "cp", "tp")}


def local_models(model, mesh, par) -> tuple:
    """(the model each rank's layers run: cp-local tokens; the model FSDP2 shards and the pipeline sizes:
    also TP-local shapes), after the TP and CP checks."""
    from distlab.sim.parallel.cp.local import check_cp, cp_local_model
    from distlab.sim.parallel.tp.rules import check_divides, tp_local_model
    n = sizes(mesh)
    local = model
    if par.cp is not None:
        check_cp(model, n["cp"], par.cp.load_balance)
        local = cp_local_model(model, n["cp"], par.cp.recompute)
    if par.tp is not None:
        check_divides(model, n["tp"], "mesh.tp", par.tp.sequence_parallel)
        tp_opts = par.tp
        if par.cp is not None and par.tp.recompute == "none":     # CP x TP: the cp section's recompute
            tp_opts = replace(par.tp, recompute=par.cp.recompute)
        return local, tp_local_model(local, n["tp"], tp_opts)
    return local, local


def layers_factory(local, mesh, par):
    """rank -> its layer program (:func:`layer_program`) on ``mesh`` with ``par``'s TP and CP. Under FSDP2's
    MixedPrecisionPolicy (``param_dtype``) the layers compute, and TP/CP move activations, in that dtype."""
    dtype = getattr(par.fsdp, "param_dtype", None) if par.fsdp is not None else None
    if dtype and local.config and dtype != local.config.get("dtype"):
        local = replace(local, config={**local.config, "dtype": dtype})
    return lambda r: layer_program(local, mesh, r, par.tp, par.cp)
