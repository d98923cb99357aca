"""Plans of thousands of ranks built from their representatives: rank r's program is its representative's
with every rank renamed by the shift of Γ (sim/equivariance.Shifts) that takes the representative to r
(groups, peers, roots, per-peer stream names), made when it is read. Such a plan is Γ-equivariant by
construction, so sim/kernel/subgroups.py takes its classes without comparing programs, and memory holds the
representatives' programs only.

A builder may use it only where the programs it would build are those renamings: tests/test_symmetry.py
builds both ways and compares every rank's program (PP x TP x DP with a tp group per node).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from distlab.sim.kernel.equivariance import RANK_STREAM, Shifts
from distlab.sim.plan import Collective, Plan, Recv, Send


class RelabelledRanks(Sequence):
    """``ranks[r]`` of a plan: the program of ``shifts.rep(r)`` renamed onto r (the last few kept)."""

    def __init__(self, programs: dict[int, list], shifts: Shifts):
        self.programs, self.shifts = programs, shifts
        self.world_size = shifts.nodes * shifts.gpus
        self._groups: dict = {}          # (id of a group, element) -> the renamed tuple, one per distinct group
        self._recent: dict = {}

    def representatives(self) -> list[int]:
        return sorted(self.programs)

    def __len__(self) -> int:
        return self.world_size

    def __getitem__(self, r):
        if isinstance(r, slice):
            return [self[i] for i in range(*r.indices(len(self)))]
        if not -len(self) <= r < len(self):
            raise IndexError("rank out of range")
        r %= len(self)
        q = self.shifts.rep(r)
        if r == q:
            return self.programs[q]
        ops = self._recent.get(r)
        if ops is None:
            if len(self._recent) >= 4:
                self._recent.clear()
            ops = self._recent[r] = self._renamed(self.programs[q], self.shifts.element(q, r))
        return ops

    def op_at(self, r: int, index: int):
        """Op ``index`` of rank r's program, renamed alone (no whole program made)."""
        q = self.shifts.rep(r)
        op = self.programs[q][index]
        return op if r == q else self._renamed([op], self.shifts.element(q, r))[0]

    def _renamed(self, program: list, e) -> list:
        f = self.shifts.apply
        streams: dict = {}
        out = []
        for op in program:
            stream = streams.get(op.stream)
            if stream is None:
                m = RANK_STREAM.fullmatch(op.stream)
                stream = streams[op.stream] = m.group(1) + str(f(e, int(m.group(2)))) if m else op.stream
            if isinstance(op, Collective):
                group = None
                if op.group is not None:
                    key = (id(op.group), e)
                    group = self._groups.get(key)
                    if group is None:
                        group = self._groups[key] = tuple(sorted(f(e, g) for g in op.group))
                root = f(e, op.root) if op.op in ("broadcast", "reduce") else op.root
                op = replace(op, group=group, root=root, stream=stream)
            elif isinstance(op, (Send, Recv)):
                op = replace(op, peer=f(e, op.peer), stream=stream)
            elif stream != op.stream:
                op = replace(op, stream=stream)
            out.append(op)
        return out


def pp_tp_shifts(mesh, cluster) -> Shifts | None:
    """PP x TP (x DP outermost) with one tp group per node: every pipeline replica (node shifts by pp nodes)
    and every tp rank of a stage (local rotations by 1) run renamings of one program per stage; None for
    other layouts (built rank by rank)."""
    g = cluster.gpus_per_node
    if mesh.names not in (("pp", "tp"), ("dp", "pp", "tp")) or mesh.size("tp") != g:
        return None
    if mesh.world_size != cluster.world_size or mesh.world_size < 2:
        return None
    return Shifts(cluster.nodes, g, mesh.size("pp"), 1)


def fsdp_shifts(mesh, cluster, reshard_after_forward=True) -> Shifts | None:
    """FSDP2 (x CP) (x TP) on mesh (dp_replicate,) dp_shard (, cp) (, tp), the inner dims (cp, tp) inside a node
    and dividing it: a local rotation by inner = cp·tp maps every cp/tp block onto the next, in order, and keeps
    every shard group (ranks of one replica with one inner index); a node shift maps replicate groups onto
    replicate groups, and shard groups onto shard groups when it moves by whole replicas (B = dp_shard·inner
    ranks, whole nodes) or when there is one replica (a shard group per inner index, over every node); with
    replicas, a rotation of the nodes inside every replica (the same in each) maps every shard group onto itself
    and every replicate group onto another. So Γ = rotations inside blocks of B/G nodes x shifts of whole blocks
    x local rotations by inner (one block: node shifts by 1), every rank of a node class a renaming of one of
    ``inner`` representatives; sim/kernel/subgroups.py checks that the collectives' expansions commute with it. None for other layouts, an int
    reshard_after_forward (its groups are not checked here), or when Γ would leave every rank its own class."""
    g, names = cluster.gpus_per_node, tuple(mesh.names)
    inner_names = tuple(d for d in ("cp", "tp") if d in names)
    if names not in (("dp_shard",) + inner_names, ("dp_replicate", "dp_shard") + inner_names):
        return None
    if mesh.world_size != cluster.world_size or mesh.world_size < 2 or not isinstance(reshard_after_forward, bool):
        return None
    inner = mesh.size(inner_names) if inner_names else 1
    block = mesh.size("dp_shard") * inner
    if g % inner:
        return None
    if block == mesh.world_size:
        shifts = Shifts(cluster.nodes, g, 1, inner)
    elif block % g == 0:
        shifts = Shifts(cluster.nodes, g, 1, inner, block // g)
    else:
        return None
    return None if shifts.trivial() else shifts


def relabelled(build_only, shifts: Shifts) -> Plan:
    """The plan whose representatives' programs ``build_only(reps)`` builds (a plan of them, in order), every
    other rank a renaming (RelabelledRanks); validated on the representatives."""
    reps = sorted({shifts.rep(r) for r in range(shifts.nodes * shifts.gpus)})
    part = build_only(reps)
    return Plan(RelabelledRanks(dict(zip(reps, part.ranks)), shifts), name=part.name, meta=part.meta).validate()
