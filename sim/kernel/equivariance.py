"""Is a plan invariant under renaming its ranks by node shifts and local rotations (sim/kernel/subgroups.py, check 1)?
And the consistency check (sim.check) of such a plan from its representatives' programs alone."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from distlab.sim.check import PlanMismatch, collective_problem_list, signature
from distlab.sim.kernel.network import SWITCH
from distlab.sim.plan import Collective, Plan, Record, Recv, Send, Wait, describe


@dataclass(frozen=True)
class Shifts:
    """Γ on ranks (node n, local l), the nodes cut into blocks of ``block`` consecutive nodes (n = b·block + o):
    rotations of the nodes inside every block by multiples of ``node_step`` (o -> o + i mod block), shifts of
    the blocks by multiples of ``block_step`` (b -> b + j mod nodes/block), local rotations by multiples of
    ``local_step`` (l -> l + t mod gpus); an element is (i, j, t). With one block (the default) these are the
    node shifts n -> n + i mod nodes. Every such renaming is an automorphism of the fabric: all nodes are built
    alike (sim/kernel/subgroups.py), so any permutation of whole nodes maps links onto links of equal capacity."""
    nodes: int
    gpus: int
    node_step: int
    local_step: int
    block: int = 0                # nodes per block; 0: one block of every node
    block_step: int = 1

    @property
    def width(self) -> int:
        return self.block or self.nodes

    @property
    def blocks(self) -> int:
        return self.nodes // self.width

    def elements(self) -> list[tuple[int, int, int]]:
        return [(a, j, b) for a in range(0, self.width, self.node_step) for j in range(0, self.blocks, self.block_step)
                for b in range(0, self.gpus, self.local_step)]

    def apply(self, e: tuple[int, int, int], r: int) -> int:
        if r == SWITCH:
            return r
        n, l = divmod(r, self.gpus)
        b, o = divmod(n, self.width)
        return ((b + e[1]) % self.blocks * self.width + (o + e[0]) % self.width) * self.gpus + (l + e[2]) % self.gpus

    def apply_array(self, e: tuple[int, int, int], a: np.ndarray) -> np.ndarray:
        n, l = np.divmod(a, self.gpus)
        b, o = np.divmod(n, self.width)
        out = ((b + e[1]) % self.blocks * self.width + (o + e[0]) % self.width) * self.gpus + (l + e[2]) % self.gpus
        return np.where(a == SWITCH, a, out)

    def rep(self, r: int) -> int:
        n, l = divmod(r, self.gpus)
        b, o = divmod(n, self.width)
        return (b % self.block_step * self.width + o % self.node_step) * self.gpus + l % self.local_step

    def compose(self, e, f) -> tuple[int, int, int]:
        """e after f."""
        return (e[0] + f[0]) % self.width, (e[1] + f[1]) % self.blocks, (e[2] + f[2]) % self.gpus

    def inverse(self, e) -> tuple[int, int, int]:
        return -e[0] % self.width, -e[1] % self.blocks, -e[2] % self.gpus

    def element(self, a: int, b: int) -> tuple[int, int, int]:
        """The element taking rank a to rank b (of the same class)."""
        (ba, oa), (bb, ob) = divmod(a // self.gpus, self.width), divmod(b // self.gpus, self.width)
        return (ob - oa) % self.width, (bb - ba) % self.blocks, (b - a) % self.gpus

    def generators(self) -> list[tuple[int, int, int]]:
        """The elements generating Γ (the identity left out)."""
        gens = [(self.node_step % self.width, 0, 0), (0, self.block_step % self.blocks, 0),
                (0, 0, self.local_step % self.gpus)]
        return [e for e in gens if e != (0, 0, 0)]

    def trivial(self) -> bool:
        return len(self.generators()) == 0


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


RANK_STREAM = re.compile(r"(send>|recv<)(\d+)")     # a stream per peer (sim/parallel/pipeline/plan.py): the peer maps


def _stream(name: str, f, cache: dict) -> str:
    mapped = cache.get(name)
    if mapped is None:
        m = RANK_STREAM.fullmatch(name)
        mapped = cache[name] = m.group(1) + str(f(int(m.group(2)))) if m else name
    return mapped


def _program_maps(a: list, b: list, f, groups: dict, streams: dict) -> bool:
    """Is program ``b`` program ``a`` with ranks renamed by ``f`` (groups, peers, roots, per-peer streams)?"""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        tx, sx = type(x), x.stream
        ms = streams.get(sx)
        if ms is None:
            ms = _stream(sx, f, streams)
        if tx is not type(y) or ms != y.stream:
            return False
        if tx is Collective:
            if (x.op, x.bytes, x.dtype, x.algorithm, x.name, x.group_name) != \
                    (y.op, y.bytes, y.dtype, y.algorithm, y.name, y.group_name):
                return False
            if (x.group is None) != (y.group is None):
                return False
            if x.group is not None:
                key = (id(x.group), id(y.group))
                ok = groups.get(key)
                if ok is None:
                    ok = groups[key] = len(x.group) == len(y.group) and {f(g) for g in x.group} == set(y.group)
                if not ok:
                    return False
            if x.op in ("broadcast", "reduce") and f(x.root) != y.root:
                return False
        elif tx is Send or tx is Recv:
            if (f(x.peer), x.bytes, x.dtype, x.name) != (y.peer, y.bytes, y.dtype, y.name):
                return False
        elif x is not y and (x.__dict__ != y.__dict__ if sx == ms else replace(x, stream=ms) != y):
            return False
    return True


def _plan_maps(plan: Plan, shifts: Shifts, e) -> bool:
    groups, streams = {}, {}
    f = lambda r: shifts.apply(e, r)       # noqa: E731
    return all(_program_maps(plan.ranks[r], plan.ranks[f(r)], f, groups, streams) for r in range(plan.world_size))


def find_shifts(plan: Plan, cluster) -> Shifts | None:
    """The largest Γ of node shifts and local rotations the plan and the fabric are invariant under (check 1);
    None when it has only the identity."""
    n, g = cluster.nodes, cluster.gpus_per_node
    if plan.world_size != n * g:
        return None
    made = getattr(plan.ranks, "shifts", None)       # sim/kernel/relabel.py: equivariant by construction
    if made is not None:
        return made if (made.nodes, made.gpus) == (n, g) else None
    k = next((k for k in _divisors(n)[:-1] if _plan_maps(plan, Shifts(n, g, k, g), (k, 0, 0))), n)
    inter = cluster.inter_node
    rails_ok = inter is None or n == 1 or g % inter.nics_per_node == 0
    t = next((t for t in _divisors(g)[:-1] if rails_ok and _plan_maps(plan, Shifts(n, g, n, t), (0, 0, t))), g)
    return None if (k, t) == (n, g) else Shifts(n, g, k, t)




def check_classes(plan: Plan, classes) -> None:
    """sim.check's collective, send/recv and event checks, from the representatives' programs: the n-th
    collective member m issues on its group g is its representative's n-th on the group of g's orbit it uses
    (renamed by the shift taking the representative to m), and every group and pair of the plan is an image
    of one a representative uses, so a plan whose representatives agree is consistent. Raises PlanMismatch."""
    shifts = classes.shifts
    seqs: dict = {}
    sends: dict = {}
    recvs: dict = {}
    problems = []
    for q in classes.reps:
        ops = plan.ranks[q]
        recorded = {op.event for op in ops if isinstance(op, Record)}
        for i, op in enumerate(ops):
            if isinstance(op, Collective):
                seqs.setdefault((q, classes.group_orbit[plan.communicator_of(op)]), []).append((op, i))
            elif isinstance(op, Send):
                sends.setdefault(classes.pair_orbit[q, op.peer], []).append((i, op, q))
            elif isinstance(op, Recv):
                recvs.setdefault(classes.pair_orbit[op.peer, q], []).append((i, op, q))
            elif isinstance(op, Wait) and op.event not in recorded:
                raise PlanMismatch(f"would hang: rank {q} stream {op.stream!r} waits for event {op.event!r} "
                                   f"(op #{i}), which rank {q} never records", "plan")
    sequences: dict = {}
    plain = {key: [(signature(op), describe(op), i) for op, i in ops] for key, ops in seqs.items()}
    for c, oid in classes.group_orbit.items():
        per_rank = sequences[c] = {}
        for m in c.ranks:
            q = shifts.rep(m)
            ops = seqs.get((q, oid), [])
            if m == q or not any(op.op in ("broadcast", "reduce") for op, _ in ops):
                per_rank[m] = plain.get((q, oid), [])
                continue
            e = shifts.element(q, m)
            per_rank[m] = [(signature(replace(op, root=shifts.apply(e, op.root))), describe(op), i) for op, i in ops]
    problems = collective_problem_list(sequences)
    if problems:
        raise PlanMismatch(problems[0].message, "plan")
    for oid in set(sends) | set(recvs):
        s, r = sends.get(oid, []), recvs.get(oid, [])
        for k, ((_, a, src), (j, b, dst)) in enumerate(zip(s, r)):
            if a.bytes != b.bytes:
                raise PlanMismatch(f"send/recv #{k} from rank {b.peer} to rank {dst}: rank {b.peer} calls "
                                   f"{describe(a)}; rank {dst} calls {describe(b)}", "plan")
        if len(s) != len(r):
            raise PlanMismatch(f"would hang: {len(s)} sends meet {len(r)} receives between ranks of pair orbit "
                               f"{oid} (e.g. rank {(s or r)[0][2]})", "plan")
