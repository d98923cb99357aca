"""Is a plan invariant under renaming its ranks by node shifts and local rotations (sim/kernel/subgroups.py, check 1)?
And the consistency check (sim.check) of such a plan from its representatives' programs alone."""
from __future__ import annotations

import math
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
    inter = cluster.inter_node
    rails_ok = inter is None or n == 1 or g % inter.nics_per_node == 0
    if made is not None:
        if (made.nodes, made.gpus) != (n, g):
            return None
        return _with_rotations(plan, made) if rails_ok and made.local_step > 1 else made
    k = next((k for k in _divisors(n)[:-1] if _plan_maps(plan, Shifts(n, g, k, g), (k, 0, 0))), n)
    t = next((t for t in _divisors(g)[:-1] if rails_ok and _plan_maps(plan, Shifts(n, g, n, t), (0, 0, t))), g)
    return None if (k, t) == (n, g) else Shifts(n, g, k, t)




def _with_rotations(plan: Plan, made: Shifts) -> Shifts:
    """``made`` (the Γ a builder declared) with the smallest local rotation step t the plan is invariant under
    too. Local rotations commute with every element of Γ, so it is enough that each representative's image
    under the rotation runs the rotated program: for r = γ(q), program(ρ r) = γ(program(ρ q)) = γ(ρ(program q))
    = ρ(program r). The representatives' programs are all that is read."""
    reps = sorted({made.rep(r) for r in range(made.nodes * made.gpus)})
    for t in (d for d in _divisors(made.gpus) if made.local_step % d == 0 and d < made.local_step):
        s = replace(made, local_step=t)
        f = lambda r, e=(0, 0, t): s.apply(e, r)      # noqa: E731
        groups, streams = {}, {}
        if all(_program_maps(plan.ranks[q], plan.ranks[f(q)], f, groups, streams) for q in reps):
            return s
    return made


def largest_kept(shifts: Shifts, keeps) -> Shifts | None:
    """The subgroup of ``shifts``' Γ with the fewest classes whose generators the fabric keeps (``keeps(Shifts)``,
    Topology.keeps: leaf switches, or the links another job shares, sim/jobs/); None when only the identity is
    left. A subgroup keeps the plan's invariance: its steps are multiples of Γ's."""
    if keeps(shifts):
        return shifts
    options = []
    for i in (d for d in _divisors(shifts.width) if d % shifts.node_step == 0):
        for j in (d for d in _divisors(shifts.blocks) if d % shifts.block_step == 0):
            for t in (d for d in _divisors(shifts.gpus) if d % shifts.local_step == 0):
                options.append((i * j * t, (i, j, t)))
    for _, (i, j, t) in sorted(options):
        s = Shifts(shifts.nodes, shifts.gpus, i, t, shifts.block, j)
        if not s.trivial() and keeps(s):
            return s
    return None


def leaf_blocks(nodes: int, leaf_of) -> int | None:
    """The largest B such that every run of B consecutive nodes (0..B-1, B..2B-1, ...) lies under one leaf switch
    (``leaf_of(node)``), None when the nodes are all under one leaf or there are no leaves."""
    runs, start = [], 0
    for n in range(1, nodes + 1):
        if n == nodes or leaf_of(n) != leaf_of(start):
            runs.append(n - start)
            start = n
    if len(runs) < 2 or leaf_of(0) is None:
        return None
    return math.gcd(*runs)


def block_kept(plan: Plan, shifts: Shifts, block: int | None, keeps) -> Shifts | None:
    """Γ cut to the fabric's blocks (``block`` consecutive nodes under one leaf, leaf_blocks): rotations of the
    nodes inside every block and shifts of whole blocks, with ``shifts``' local rotations; the one with the
    fewest classes that ``keeps`` (the fabric) keeps and the plan is invariant under (check 1: rotations inside
    blocks are not in ``shifts``' Γ, so they are checked here; block shifts and local rotations are multiples
    of its steps). None when none does."""
    n, g = shifts.nodes, shifts.gpus
    if not block or block >= n or shifts.block or n % block:
        return None
    options = []
    for i in _divisors(block):
        for j in (d for d in _divisors(n // block) if (d * block) % shifts.node_step == 0):
            for t in (d for d in _divisors(g) if d % shifts.local_step == 0):
                options.append((i * j * t, (i, j, t)))
    rotations: dict = {}
    for _, (i, j, t) in sorted(options):
        s = Shifts(n, g, i, t, block, j)
        if s.trivial() or not keeps(s):
            continue
        if i < block and i not in rotations:
            rotations[i] = _plan_maps(plan, s, (i, 0, 0))
        if i == block or rotations[i]:
            return s
    return None


def classes_count(shifts: Shifts) -> int:
    """Classes of ranks per block position under Γ: one representative each."""
    return shifts.node_step * shifts.block_step * shifts.local_step


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
