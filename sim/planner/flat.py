"""The fast estimate of a layout without a pipeline (DDP x TP, FSDP2 x TP, HSDP x TP, CP x TP x FSDP2/HSDP):
rank 0's program, built small, run stream by stream (estimate.py ``streams_makespan``), every collective timed
on its real group.

Built small and scaled exactly where the program is affine: blocks are identical, so the step is
T(2) + (L - 2)(T(3) - T(2)) in the number of blocks L once the per-block pattern repeats (checked:
T(4) - T(3) = T(3) - T(2); DDP's buckets, for one, repeat only once a block fills buckets of its own; else the
whole model is built). Each op's bytes and FLOPs are a + b / n in the FSDP2 shard group size n (shards, copies
and the optimizer step; padding aside), so programs at two small shard sizes give them at the real one; an HSDP
program is built with two replicas (its all-reduce over dp_replicate carries one shard whatever their number).
Collectives are classified by the mesh dimension of their group on the small mesh and timed on the group of
that dimension on the real mesh.
"""
from __future__ import annotations

from dataclasses import replace

from distlab.sim.kernel.communicators import slots_for
from distlab.sim.kernel.engine import compute_seconds
from distlab.sim.mesh import Mesh
from distlab.sim.models import model_from_spec
from distlab.sim.plan import Collective, Compute, Send

SMALL_PROGRAM = 64     # blocks x tp below which the whole model's program is built (cheap) instead of scaled


def small_mesh(L, shard: int) -> tuple[dict, str]:
    """(the mesh of the small program with FSDP2 shard group ``shard`` (DDP: dp replicas), the FSDP2 dim)."""
    if L.cp > 1:
        d = {"dp_replicate": 2} if L.dp_kind == "hsdp" else {}
        return {**d, **({"dp_shard": shard // L.cp} if shard > L.cp else {}), "cp": L.cp, "tp": L.tp}, "dp_shard"
    if L.dp_kind == "hsdp":
        return {"dp_replicate": 2, "dp_shard": shard, "tp": L.tp}, "dp_shard"
    if L.dp_kind == "fsdp" and shard > 1:
        return {"dp_shard": shard, "tp": L.tp}, "dp_shard"
    return ({"dp": shard, "tp": L.tp} if shard > 1 else {"tp": L.tp}), "dp"


def dim_groups(mesh: dict, cp: int) -> dict:
    """Rank 0's group of every dimension of ``mesh`` (FSDP2's shard group with cp: dp_shard x cp flattened,
    as sim/parallel/cp/plan.py builds it) -> the dimension's share key."""
    m = Mesh(mesh)
    out = {}
    for dim in m.names:
        out[m.group_of(0, dim)] = {"tp": "tp", "cp": "cp", "dp_replicate": "rep"}.get(dim, "dp")
    if cp > 1:                    # the ring's own ops are told apart by name (``kind_of``)
        out[m.group_of(0, tuple(d for d in ("dp_shard", "cp") if d in m.names))] = "dp"
    return out


def kind_of(op, plan, kinds: dict) -> str:
    """The share key of a collective: the ring's (named "cp ...") or its group's dimension."""
    return "cp" if op.name.startswith("cp ") else kinds[plan.group_of(op)]


class FlatEstimator:
    """Rank 0's program of a layout without a pipeline, built small (module docstring)."""

    def __init__(self, est):
        self.est, self.plans, self.real = est, {}, {}

    def estimate(self, L) -> tuple[float, dict]:
        """(step seconds, seconds by part: compute, recompute, tp, cp, dp, cp_exposed)."""
        blocks = self.est.model(1).config["layers"]
        step = part = None
        if blocks > 4 and blocks * L.tp * L.cp > SMALL_PROGRAM:
            (t2, p2), (t3, p3), (t4, p4) = (self.program(L, n) for n in (2, 3, 4))
            if abs((t4 - t3) - (t3 - t2)) <= 1e-6 * t4:          # the pattern repeats: affine in blocks
                step = t2 + (blocks - 2) * (t3 - t2)
                part = {k: p2[k] + (blocks - 2) * (p3[k] - p2[k]) for k in p2}
        if step is None:
            step, part = self.program(L, blocks)
        return step, part

    def program(self, L, blocks: int) -> tuple[float, dict]:
        """(step seconds, seconds by part) of rank 0's program for a ``blocks``-block copy of the model."""
        from distlab.sim.planner.estimate import streams_makespan
        real = L.cp * L.shard if L.cp > 1 else L.shard if L.dp_kind != "ddp" else L.dp
        base = L.cp if L.cp > 1 else 1
        sizes = sorted({min(real, 2 * base), min(real, 4 * base)}) if real > base else [real]
        plans = [self.plan(L, blocks, s) for s in sizes]
        plan, kinds = plans[sizes.index(real) if real in sizes else 0]
        ops = plan.ranks[0] if real in sizes else \
            [_at_size(a, b, sizes, real) for a, b in zip(plans[0][0].ranks[0], plans[1][0].ranks[0])]
        real_groups = self.real_groups(L)
        costs, cluster = self.est.costs, self.est.cluster
        redo = self.est.recompute_by_name(L) if L.cp == 1 else {}
        parts = {"compute": 0.0, "tp": 0.0, "cp": 0.0, "dp": 0.0, "rep": 0.0, "recompute": 0.0}

        def seconds(op) -> tuple[float, float]:
            if isinstance(op, Compute):
                t = compute_seconds(op, cluster)
                parts["compute"] += t
                parts["recompute"] += t if op.name.startswith("recompute ") else redo.get(op.name, 0.0)
                return 0.0, t
            if isinstance(op, Send):          # ring attention's permute to the next cp rank
                ring = real_groups["cp"]          # the ring moves at its slowest hop (e.g. across nodes)
                hops = list(zip(ring, ring[1:] + ring[:1]))
                total = max(costs.p2p(a, b, int(op.bytes)) for a, b in hops)
                lat = min(total, max(costs.p2p(a, b, 4) for a, b in hops))
                parts["cp"] += total
                return lat, total - lat
            key = kind_of(op, plan, kinds)
            lat, xfer = costs.split(op.op, op.bytes, real_groups[key], op.algorithm)
            parts[key] += lat + xfer
            return lat, xfer

        def share(op):
            return None if isinstance(op, Compute) else kind_of(op, plan, kinds)

        def comm(op):                      # its process group: rank 0 has one group per dimension
            return None if not isinstance(op, Collective) else (kind_of(op, plan, kinds), op.group_name)

        slots = slots_for(cluster)
        step = streams_makespan(ops, seconds, share, cluster.interference, comm, slots)
        parts["cp_exposed"] = 0.0
        if L.cp > 1:                      # exposed ring time: the step less the step with a free ring
            def no_cp(op):
                return (0.0, 0.0) if share(op) == "cp" else seconds(op)
            saved = dict(parts)
            parts["cp_exposed"] = max(0.0, step - streams_makespan(ops, no_cp, share, cluster.interference, comm,
                                                                   slots))
            parts.update({k: saved[k] for k in saved if k != "cp_exposed"})
        return step, parts

    def real_groups(self, L) -> dict:
        """Share key -> rank 0's group on the real mesh (tp, cp, and the data-parallel dim ops time on)."""
        key = (L.tp, L.cp, L.dp, L.dp_kind, L.dp_shard)
        if key not in self.real:
            mesh, fsdp_dim = small_mesh(L, L.cp * L.shard if L.cp > 1 else L.shard if L.dp_kind != "ddp" else L.dp)
            if L.dp_kind == "hsdp":
                mesh["dp_replicate"] = L.dp // L.dp_shard
            m = Mesh(mesh)
            groups = {"tp": m.group_of(0, "tp"), "cp": m.group_of(0, "cp") if L.cp > 1 else (0,),
                      "rep": m.group_of(0, "dp_replicate") if "dp_replicate" in m.names else (0,)}
            dims = tuple(d for d in (fsdp_dim, "cp") if d in m.names)
            groups["dp"] = m.group_of(0, dims) if dims else (0,)
            self.real[key] = groups
        return self.real[key]

    def plan(self, L, blocks: int, shard: int):
        """(rank 0's plan of a small copy, group -> share key)."""
        key = (L.micro_batch, L.tp, L.cp, L.sequence_parallel, L.loss_parallel, L.recompute, L.dp_kind, blocks, shard)
        if key not in self.plans:
            from distlab.sim.parallel.cp.plan import CPOptions, cp_plan
            from distlab.sim.parallel.tp.compose import fsdp_tp_plan
            from distlab.sim.parallel.tp.ddp import ddp_tp_plan
            from distlab.sim.parallel.tp.plan import tp_plan
            model = model_from_spec({**self.est.spec, "micro_batch": L.micro_batch, "layers": blocks}, "model")
            mesh, _ = small_mesh(L, shard)
            o = self.est.options(L)
            if L.cp > 1:            # rank 0 only: its collectives name their groups
                plan = cp_plan(model, Mesh(mesh), CPOptions(recompute=L.recompute), only=[0])
            elif "dp_shard" in mesh:
                plan = fsdp_tp_plan(model, Mesh(mesh), tp_opts=o, only=[0])
            elif "dp" in mesh:
                plan = ddp_tp_plan(model, Mesh(mesh), tp_opts=o)
            else:
                plan = tp_plan(model, Mesh(mesh), o)
            kinds = dim_groups(mesh, L.cp)
            kinds[plan.world_group()] = kinds.get(plan.world_group(), "dp")
            kinds[(0,)] = "dp"
            self.plans[key] = (plan, kinds)
        return self.plans[key]


def _at_size(a, b, sizes: list, n: int):
    """Op ``a`` (built at sizes[0]) with bytes and FLOPs moved to shard size ``n``, fitting value = x + y / size
    through (sizes[0], a) and (sizes[1], b)."""
    if type(a) is not type(b) or getattr(a, "name", None) != getattr(b, "name", None):
        raise ValueError("programs at two data-parallel sizes differ in structure")

    def at(u, v):
        y = (u - v) / (1 / sizes[0] - 1 / sizes[1])
        return u - y / sizes[0] + y / n
    if isinstance(a, Compute):
        return replace(a, flops=max(0.0, at(a.flops, b.flops)), bytes=max(0.0, at(a.bytes, b.bytes)))
    if isinstance(a, Collective):
        return replace(a, bytes=max(0, int(round(at(a.bytes, b.bytes)))))
    return a
