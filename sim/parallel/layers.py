"""The program of one rank's layers, as steps 2-4 of sim/parallel/parallelize.py leave it (TP, then CP, then
activation checkpointing), for the data-parallel and pipeline steps to place.

    layers = layer_program(model, mesh, rank, tp=TPOptions(), cp=None)
    layers.forward(Compute("fwd h.0", flops=...), "h.0")     # TP: the block's TP segment replaces the op
    layers.backward(Compute("bwd h.0", flops=...), "h.0")
    layers.ops                                              # the rank's ops so far

A step that places layers (FSDP2's units, DDP's buckets, a pipeline's actions) emits each layer's plain compute
op, named ``fwd LAYER`` or ``bwd LAYER`` with the layer's FLOPs and bytes (sim/parallel/fsdp/plan.py), and hands
it here; every other op it emits goes through ``keep``. What replaces a layer's op:

- nothing (no TP, no CP): the op itself;
- TP (sim/parallel/tp/plan.py ``Segments``): the layer's TP segment on the rank's tp group: compute with the
  TP-local FLOPs and the TP collectives between (the op's own FLOPs are not used: TP recomputes them per part);
- CP alone (sim/parallel/cp/local.py ``ring_block``): a block's op cut around its ring attention (sim/parallel/cp/
  ring.py), recompute (``CPOptions.recompute`` full) rerunning the ring before the backward;
- CP x TP (sim/parallel/cp/compose.py ``CPSegments``): TP segments whose attention core is the ring.

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
        ring = Ring([], rank, mesh.group_of(rank, "cp"), c["micro_batch"], c["seq_len"], c["hidden"] // t,
                    c["dtype"], DTYPE_BYTES[c["dtype"]], cp.rotate_method, cp.load_balance, cp.overlap)
    if tp is not None:
        return TPLayers(model, tp, mesh.group_of(rank, "tp"), c["dtype"], ring, cp is not None and cp.recompute == "full",
                        rank)
    if cp is not None:
        return CPLayers(ring, cp.recompute == "full")
    return PlainLayers()


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
