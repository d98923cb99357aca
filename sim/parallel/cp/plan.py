"""Context parallelism plans: one training step of a decoder-only transformer with its sequence sharded over
mesh dimension ``cp`` and attention run as ring attention (sim/parallel/cp/ring.py), laid out as torchtitan does
(torchtitan/models/llama3/infra/parallelize.py and torchtitan/distributed/parallel_dims.py): the parameters are
not split by cp; FSDP2 ``fully_shard`` shards them over the flattened ``dp_shard_cp`` mesh (every rank of
dp_shard x cp), so CP adds ring attention inside each block and FSDP2 does the rest (sim/parallel/fsdp/plan.py).

Per rank, with s = S/cp local tokens: the linears' FLOPs are 2·b·s·(weights) (each rank runs its own tokens),
backward 2 x forward; attention's core is the ring (sim/parallel/cp/ring.py). Norms, embedding and loss: memory-bound
bytes of the local tokens. The ring's merge of partial outputs (a few element-wise ops on s tokens) is not
counted.
"""
from __future__ import annotations

from dataclasses import dataclass

from distlab.sim.parallel.cp.ring import METHODS, Ring
from distlab.sim.errors import ConfigError
from distlab.sim.parallel.fsdp.plan import FSDPOptions, fsdp_plan
from distlab.sim.mesh import Mesh
from distlab.sim.models import Layer, Model
from distlab.sim.plan import DTYPE_BYTES, Collective, Compute, Plan, Send
from distlab.sim.parallel.tp.plan import TPOptions
from distlab.sim.workloads.base import option

DIMS = ("dp_replicate", "dp_shard", "cp", "tp")


@dataclass
class CPOptions:
    """The ``cp:`` section of a scenario; the cp group size comes from the mesh (dimension ``cp``)."""
    rotate_method: str = option("allgather", "how K/V go round the ring (torch's set_rotate_method)",
                                choices=METHODS, what="rotate method")
    load_balance: bool = option(True, "head-tail sharding (2 x cp chunks) so every rank has the same causal work")
    recompute: str = option("none", "full: activation checkpointing of every block (torchtitan's full AC): "
                                    "backward reruns the block's forward, ring included", choices=("none", "full"),
                            what="recompute", flag="--cp-recompute")
    overlap: bool = option(True, "rotation overlaps attention compute and FSDP2 runs on its own streams; false: "
                                 "every collective is waited for at once", flag="--cp-overlap")

    def validate(self, where: str = "cp") -> "CPOptions":
        return self


def check_cp(model, cp: int, load_balance: bool, where: str = "mesh.cp") -> None:
    """The sequence must split into cp shards (2 x cp chunks with load balancing)."""
    s = model.config["seq_len"]
    parts = 2 * cp if load_balance else cp
    if s % parts:
        what = f"2 x cp = {parts} chunks (load-balanced causal sharding)" if load_balance else f"cp = {cp} shards"
        allowed = [d for d in range(1, min(s, 64) + 1) if s % ((2 * d) if load_balance else d) == 0]
        hint = " (torch would silently stop balancing; say load_balance: false)" if load_balance else ""
        raise ConfigError(f"seq_len {s} does not split into {what}{hint}; allowed cp: "
                          f"{', '.join(map(str, allowed))}", where)


def cp_local_model(model, cp: int, recompute: str | None = None) -> Model:
    """``model`` as one cp rank runs it: s = S/cp tokens; attention's core FLOPs removed (the ring does them);
    the activations of its model family at cp (sim/models/activations.py: ring attention keeps no s x s scores;
    ``recompute`` None = the model's own)."""
    from distlab.sim.models.activations import local_layers
    c = model.config
    b, S, h = c["micro_batch"], c["seq_len"], c["hidden"]
    layers = []
    for L in model.layers:
        core = 4.0 * b * S * S * h if L.name.startswith("h.") else 0.0
        layers.append(Layer(L.name, list(L.params), fwd_flops=(L.fwd_flops - core) / cp, ready=L.ready))
    return Model(model.name, local_layers(model, layers, cp=cp, recompute=recompute), {**c, "seq_len": S // cp})


def cp_plan(model, mesh: Mesh, opts: CPOptions | None = None, fsdp: FSDPOptions | None = None,
            name: str | None = None, where: str = "cp", cluster=None, only: list[int] | None = None) -> Plan:
    """One step on ``mesh`` (dims in torchtitan's order dp_replicate, dp_shard, cp, tp; cp required): FSDP2
    over dp_shard x cp (HSDP with dp_replicate), ring attention over cp, TP (+ SP) inside each cp rank when the
    mesh has tp (sim/parallel/cp/compose.py). With ``cluster``, where the layout allows (sim/kernel/relabel.py fsdp_shifts), one
    rank per class is built and the others are its renamings; ``only``: just these ranks (not validated)."""
    opts = opts or CPOptions()
    names = tuple(mesh.names)
    if "cp" not in names or any(d not in DIMS for d in names) or list(names) != [d for d in DIMS if d in names]:
        raise ConfigError(f"the cp section needs mesh dimension cp, with dp_replicate, dp_shard and tp optional, in "
                          f"that order; this mesh has {', '.join(names)}; allowed: {', '.join(DIMS)}", f"{where}: mesh")
    cp = mesh.size("cp")
    tp = mesh.size("tp") if "tp" in mesh else 1
    check_cp(model, cp, opts.load_balance)
    local = cp_local_model(model, cp, opts.recompute)
    fsdp = fsdp or FSDPOptions(overlap=opts.overlap)
    if cluster is not None and only is None:
        from distlab.sim.kernel.relabel import fsdp_shifts, relabelled
        shifts = fsdp_shifts(mesh, cluster, fsdp.reshard_after_forward)
        if shifts is not None:
            return relabelled(lambda reps: cp_plan(model, mesh, opts, fsdp, name, where, only=reps), shifts)
    built = range(mesh.world_size) if only is None else only
    shard = {"dp_shard": (mesh.size("dp_shard") if "dp_shard" in mesh else 1) * cp}       # dp_shard_cp
    fsdp_mesh = Mesh({**({"dp_replicate": mesh.size("dp_replicate")} if "dp_replicate" in mesh else {}), **shard,
                      **({"tp": tp} if "tp" in mesh else {})})
    if tp > 1:
        ranks = _tp_ranks(model, local, mesh, fsdp_mesh, fsdp, opts, where, only)
        base_meta = {"tp": tp}
    else:
        base = fsdp_plan(local, fsdp_mesh, fsdp, where=where, only=only)
        base_meta = base.meta
        ranks = [_splice(ops, r, mesh, local, opts) for r, ops in zip(built, base.ranks)]
    c = model.config
    meta = {**base_meta, "builder": "cp", "cp": cp, "rotate_method": opts.rotate_method,
            "load_balance": opts.load_balance, "recompute": opts.recompute, "seq_len": c["seq_len"],
            "local_tokens": c["micro_batch"] * c["seq_len"] // cp}
    plan = Plan(ranks, name=name or f"cp{cp}-{opts.rotate_method}-{model.name}", meta=meta)
    return plan.validate() if only is None else plan


def _splice(ops: list, r: int, mesh: Mesh, local, opts: CPOptions) -> list:
    """FSDP2's program with each block's compute split around its ring attention."""
    c = local.config
    out: list = []
    ring = Ring(out, r, mesh.group_of(r, "cp"), c["micro_batch"], c["seq_len"], c["hidden"], c["dtype"],
                DTYPE_BYTES[c["dtype"]], opts.rotate_method, opts.load_balance, opts.overlap)
    for op in ops:
        kind, _, layer = getattr(op, "name", "").partition(" ")
        if isinstance(op, Compute) and kind in ("fwd", "bwd") and layer.startswith("h."):
            _block(out, ring, op, kind, layer, opts.recompute == "full")
        else:
            out.append(op)
    return out


def _tp_ranks(model, local, mesh: Mesh, fsdp_mesh: Mesh, fsdp: FSDPOptions, opts: CPOptions, where: str,
              only: list[int] | None = None) -> list:
    """CP x TP (+ SP, torchtitan's plan): FSDP2 on the TP-local, cp-local model, TP segments with the ring
    (recompute full: each block's forward, TP collectives and ring included, rerun before its backward)."""
    from distlab.sim.parallel.cp.compose import splice_tp
    from distlab.sim.parallel.fsdp.plan import units_of
    from distlab.sim.parallel.tp.compose import tp_local_model
    from distlab.sim.parallel.tp.rules import check_divides, partial_grad_params
    tp_opts = TPOptions(sequence_parallel=True)
    check_divides(model, mesh.size("tp"), "mesh.tp", True)
    tp_local = tp_local_model(local, mesh.size("tp"), TPOptions(sequence_parallel=True, recompute=opts.recompute))
    base = fsdp_plan(tp_local, fsdp_mesh, fsdp, where=where, only=only)
    partial = {q.name for q in partial_grad_params(model, True)}
    units = {u.name: [q.name for q in u.params if q.name in partial] for u in units_of(tp_local)}
    built = range(mesh.world_size) if only is None else only
    return [splice_tp(ops, local, mesh, r, opts, tp_opts, units) for r, ops in zip(built, base.ranks)]


def _block(out: list, ring: Ring, op: Compute, kind: str, layer: str, recompute: bool = False):
    """A block's compute split around its ring attention: forward the first half of the block's linears
    and bytes (norm1, q/k/v), the ring, the rest (o, norm2, MLP); backward the reverse, after rerunning the
    forward (half the backward's FLOPs, ring included) when ``recompute``."""
    half = Compute(f"{kind} {layer}", flops=op.flops / 2, bytes=op.bytes / 2, stream=op.stream)
    rest = Compute(f"{kind} {layer} (after attention)" if kind == "fwd" else f"{kind} {layer} (before attention)",
                   flops=op.flops / 2, bytes=op.bytes / 2, stream=op.stream)
    if kind == "fwd":
        out.append(half)
        ring.forward(f"{layer}.attn")
        out.append(rest)
    else:
        if recompute:
            redo = Compute(f"recompute {layer}", flops=op.flops / 4, bytes=op.bytes / 4, stream=op.stream)
            out.append(redo)
            ring.forward(f"{layer}.attn", "recompute")
            out.append(redo)
        out.append(rest)
        ring.backward(f"{layer}.attn")
        out.append(half)


def collective_sequence(plan: Plan, mesh: Mesh, rank: int = 0) -> list[tuple]:
    """(kind, bytes, dtype, group, per-peer bytes) of each collective of ``rank`` in issue order, bytes as
    nccl-tests count them (all_gather: the output; all_to_all: all one rank sends). A cp permute (a Send and a
    Recv of one name) is one all_to_all over the cp group whose per-peer bytes (torch's input_split_sizes) are
    B for the next rank and 0 for the others; per-peer bytes are None for the other kinds."""
    out = []
    group = mesh.group_of(rank, "cp")
    for o in plan.ranks[rank]:
        if isinstance(o, Collective):
            out.append((o.op, o.bytes, o.dtype, plan.group_of(o), None))
        elif isinstance(o, Send):
            per = tuple(o.bytes if g == o.peer else 0 for g in group)
            out.append(("all_to_all", o.bytes, o.dtype, group, per))
    return out
