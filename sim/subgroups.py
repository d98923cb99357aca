"""Sub-group symmetry: classes of ranks whose timelines are provably equal although their collectives run over
sub-groups (TP x DP meshes, FSDP x TP, pipelines with data-parallel replicas). The engine simulates one
representative per class and reads its records as every member's (trace.RankCopies).

The symmetries: Γ = {σ^a ρ^b}, where σ shifts every rank by k whole nodes (node n -> n + k mod N, the same
local rank) and ρ rotates the local rank inside every node by t (local l -> l + t mod G, the same node).
Both are automorphisms of the simulated fabric (sim.network.Topology): all nodes are built alike (GPU links,
NICs, fat-tree uplinks), every GPU of a node has the same links (NVSwitch up/down, a full NVLink mesh, PCIe),
and ρ maps rail l mod C to rail l + t mod C consistently when C (NICs per node) divides G; route(γ(a), γ(b)) is
then γ applied link by link to route(a, b), with equal capacities and latencies. Left out: degraded links,
shared CPU cores, stragglers, recorded transfers (the engine then simulates every rank).

Checked, not assumed (each check failing -> no reduction):
1. the plan is Γ-equivariant: for the generators σ (smallest k) and ρ (smallest t) and every rank r, the
   program of γ(r) is r's with every group, peer and root mapped by γ (_program_maps);
2. every collective's expansion (sim.collectives: algorithm, protocol, and per step its latency and its flows
   (src, dst, bytes)) on an image group γ(g) is γ of its expansion on g, for every γ of Γ and every group g
   of a representative (so for every group of the plan, as every group is an image of one of those);
3. each representative uses at most one group (and one peer per direction) of each orbit.
Then the full simulation commutes with γ (its input is mapped onto itself and every rule of the engine and the
max-min fair network is blind to rank names), so rank γ(r)'s records equal r's: the classes are the orbits.

The reduced simulation runs the representatives only. A collective of orbit O (the images of a group) starts
when one representative per class meeting the group has arrived (its members of one class arrive together);
a send meets the receive of the same pair orbit, in order. The network: traffic is grouped in units (one
group's collectives, one ordered pair's messages); starting from the representatives' own units, the units
sharing a link with a simulated one are added until none is left (the connected components of the
link-sharing graph: _closure). Each simulated unit of orbit O moves its flows whenever O's collective runs
(all images run at the same time, step by step, by symmetry). Max-min fair rates of link-disjoint flow sets
do not depend on each other, so the simulated flows get the rates of the full simulation, and by induction
over events every representative's records equal the full simulation's (tests/test_symmetry.py: to 1e-6).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from distlab.sim.network import SWITCH, Pairs
from distlab.sim.plan import Collective, Plan, Recv, Send


@dataclass(frozen=True)
class Shifts:
    """Γ: node shifts by multiples of ``node_step``, local rotations by multiples of ``local_step``."""
    nodes: int
    gpus: int
    node_step: int
    local_step: int

    def elements(self) -> list[tuple[int, int]]:
        return [(a, b) for a in range(0, self.nodes, self.node_step) for b in range(0, self.gpus, self.local_step)]

    def apply(self, e: tuple[int, int], r: int) -> int:
        if r == SWITCH:
            return r
        n, l = divmod(r, self.gpus)
        return (n + e[0]) % self.nodes * self.gpus + (l + e[1]) % self.gpus

    def apply_array(self, e: tuple[int, int], a: np.ndarray) -> np.ndarray:
        n, l = np.divmod(a, self.gpus)
        out = (n + e[0]) % self.nodes * self.gpus + (l + e[1]) % self.gpus
        return np.where(a == SWITCH, a, out)

    def rep(self, r: int) -> int:
        n, l = divmod(r, self.gpus)
        return n % self.node_step * self.gpus + l % self.local_step

    def compose(self, e, f) -> tuple[int, int]:
        """e after f."""
        return (e[0] + f[0]) % self.nodes, (e[1] + f[1]) % self.gpus

    def inverse(self, e) -> tuple[int, int]:
        return -e[0] % self.nodes, -e[1] % self.gpus


@dataclass
class Classes:
    """What the engine needs: the representatives, the orbit of every representative's group and pair, how many
    representatives meet at each collective orbit, and the steps of every collective (flows of all simulated
    units of its orbit)."""
    shifts: Shifts
    reps: list[int]
    group_orbit: dict = field(default_factory=dict)     # rep's group tuple -> orbit id
    arrivals: dict = field(default_factory=dict)        # orbit id -> representatives that meet there
    pair_orbit: dict = field(default_factory=dict)      # (src, dst) of a rep's send or recv -> orbit id
    steps: dict = field(default_factory=dict)           # (group, op, bytes, algorithm, root) -> (algo, proto, steps, extra flows)
    p2p: dict = field(default_factory=dict)             # pair orbit id -> (Pairs of its simulated pairs, extra flows)

    def rep_of(self, rank: int) -> int:
        return self.shifts.rep(rank)


def subgroups_apply(plan: Plan, cluster, slowdown: dict | None, record_transfers: bool,
                    link_factors: dict | None) -> bool:
    """The cases the argument covers (module docstring): the fabric's symmetries are not broken."""
    return (plan.world_size >= 2 and plan.world_size == cluster.world_size and not record_transfers
            and not cluster.cpu_cores and not link_factors and all(f == 1.0 for f in (slowdown or {}).values()))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


RANK_STREAM = re.compile(r"(send>|recv<)(\d+)")     # a stream per peer (sim/pipeline/plan.py): the peer maps


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
        tx = type(x)
        if tx is not type(y) or _stream(x.stream, f, streams) != y.stream:
            return False
        if tx is Collective:
            if (x.op, x.bytes, x.dtype, x.algorithm, x.name) != (y.op, y.bytes, y.dtype, y.algorithm, y.name):
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
        elif x is not y and (x != y if x.stream == y.stream else replace(x, stream=y.stream) != y):
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
    k = next((k for k in _divisors(n)[:-1] if _plan_maps(plan, Shifts(n, g, k, g), (k, 0))), n)
    inter = cluster.inter_node
    rails_ok = inter is None or n == 1 or g % inter.nics_per_node == 0
    t = next((t for t in _divisors(g)[:-1] if rails_ok and _plan_maps(plan, Shifts(n, g, n, t), (0, t))), g)
    return None if (k, t) == (n, g) else Shifts(n, g, k, t)


def _flows(steps: list, shifts: Shifts | None = None, e=None) -> list:
    """Per step: its latency and its flows (src, dst, bytes) sorted, optionally renamed by ``e``."""
    out = []
    for pairs, sizes, latency in steps:
        src, dst = pairs.src, pairs.dst
        if e is not None:
            src, dst = shifts.apply_array(e, src), shifts.apply_array(e, dst)
        sz = np.broadcast_to(np.asarray(sizes, dtype=float), (len(pairs),))
        rows = np.stack([src.astype(float), dst.astype(float), sz]) if len(pairs) else np.zeros((3, 0))
        order = np.lexsort(rows[::-1])
        out.append((latency, rows[:, order]))
    return out


def _same_flows(a: list, b: list) -> bool:
    return len(a) == len(b) and all(la == lb and fa.shape == fb.shape and np.array_equal(fa, fb)
                                    for (la, fa), (lb, fb) in zip(a, b))


def _links(steps: list) -> set:
    return set(np.concatenate([p.entry_link for p, _, _ in steps] or [np.zeros(0, dtype=np.int64)]).tolist())


def find_classes(plan: Plan, ctx) -> Classes | None:
    """The rank classes of ``plan`` on ``ctx``'s fabric (module docstring), or None when a check fails: the
    largest Γ the plan is invariant under first, then node shifts alone, then local rotations alone."""
    best = find_shifts(plan, ctx.cluster)
    if best is None:
        return None
    n, g = best.nodes, best.gpus
    tries = [best] + [s for s in (Shifts(n, g, best.node_step, g), Shifts(n, g, n, best.local_step))
                      if s != best and (s.node_step, s.local_step) != (n, g)]
    for shifts in tries:
        classes = _classes_under(plan, ctx, shifts)
        if classes is not None:
            return classes
    return None


def _classes_under(plan: Plan, ctx, shifts: Shifts) -> Classes | None:
    elements = shifts.elements()
    reps = sorted({shifts.rep(r) for r in range(plan.world_size)})
    cls = Classes(shifts, reps)
    # orbits of the representatives' groups and pairs; one (rank, op index) where each group is used
    orbit_of: dict = {}          # canonical sorted tuple -> orbit id
    images: dict = {}            # orbit id -> {sorted image tuple: element mapping the orbit's reference to it}
    reference: dict = {}         # orbit id -> (reference group tuple, a (rank, index) using it)
    to_ref: dict = {}            # rep group tuple -> element mapping the reference onto it
    pair_images: dict = {}       # pair orbit id -> list of image pairs
    keys: dict = {}              # (group, op, bytes, algorithm, root) -> None (the distinct collective keys)
    for q in reps:
        orbit_group: dict = {}       # orbit id -> the one group of it this representative uses
        orbit_pair: dict = {}        # (send or recv, orbit id) -> the one pair of it
        for i, op in enumerate(plan.ranks[q]):
            if isinstance(op, Collective):
                g = plan.group_of(op)
                if g not in cls.group_orbit:
                    arr = np.array(g, dtype=np.int64)
                    imgs = {tuple(np.sort(shifts.apply_array(e, arr)).tolist()): e for e in reversed(elements)}
                    oid = orbit_of.get(min(imgs))
                    if oid is None:
                        oid = orbit_of[min(imgs)] = len(orbit_of)
                        images[oid], reference[oid] = imgs, (g, (q, i))
                        cls.arrivals[oid] = len({shifts.rep(m) for m in g})
                    e_g = _element_between(shifts, elements, reference[oid][0], g)
                    if e_g is None:
                        return None
                    cls.group_orbit[g], to_ref[g] = oid, e_g
                if orbit_group.setdefault(cls.group_orbit[g], g) != g:
                    return None                     # check 3: two groups of one orbit
                keys[(g, op.op, op.bytes, op.algorithm, op.root)] = None
            elif isinstance(op, (Send, Recv)):
                pair = (q, op.peer) if isinstance(op, Send) else (op.peer, q)
                if pair not in cls.pair_orbit:
                    imgs = sorted({(shifts.apply(e, pair[0]), shifts.apply(e, pair[1])) for e in elements})
                    oid = orbit_of.setdefault(("pair", imgs[0]), len(orbit_of))
                    pair_images[oid] = imgs
                    cls.pair_orbit[pair] = oid
                if orbit_pair.setdefault((op.kind, cls.pair_orbit[pair]), pair) != pair:
                    return None                     # check 3: two peers of one orbit
    # check 2, and the links of every unit (image group or image pair)
    unit_links: dict = {}        # (orbit id, image) -> set of link ids
    expansions: dict = {}        # (key, image) -> (algorithm, protocol, steps)
    generators = [e for e in ((shifts.node_step % shifts.nodes, 0), (0, shifts.local_step % shifts.gpus))
                  if e != (0, 0)]
    for key in keys:
        g, op, nbytes, algorithm, root = key
        oid = cls.group_orbit[g]
        ref_rank, ref_index = reference[oid][1]
        flows = {}
        for img, e_h in images[oid].items():
            e = shifts.compose(e_h, shifts.inverse(to_ref[g]))      # g -> this image
            actual = plan.group_of(plan.ranks[shifts.apply(e_h, ref_rank)][ref_index])   # the plan's tuple
            if tuple(sorted(actual)) != img:
                return None
            exp = expansions[key, img] = _expand(ctx, op, actual, nbytes, algorithm, shifts.apply(e, root))
            flows[img] = _flows(exp[2])
            unit_links.setdefault((oid, img), set()).update(_links(exp[2]))
        for img, e_h in images[oid].items():      # check 2 for the generators: then for all of Γ
            exp = expansions[key, img]
            for e in generators:
                to = tuple(sorted(shifts.apply(e, x) for x in img))
                if expansions[key, to][:2] != exp[:2] or not _same_flows(flows[to], _flows(exp[2], shifts, e)):
                    return None
    for pair, oid in cls.pair_orbit.items():
        for p in pair_images[oid]:
            unit_links[oid, p] = set(ctx.topo.route(*p))
    start = {(cls.group_orbit[g], tuple(sorted(g))) for g in cls.group_orbit}
    start |= {(oid, pair) for pair, oid in cls.pair_orbit.items()}
    simulated = _closure(unit_links, start)
    # the steps the engine runs: the flows of every simulated unit of the orbit, step by step
    for key in keys:
        g, op, nbytes, algorithm, root = key
        oid = cls.group_orbit[g]
        members = [img for img in images[oid] if (oid, img) in simulated]
        parts = [expansions[key, img] for img in members]
        algo, proto, steps = parts[0]
        per_group = sum(len(p) for p, _, _ in steps)
        extra = per_group * (len(images[oid]) - len(members))
        if len(parts) > 1:
            steps = [_union([s[k] for _, _, s in parts]) for k in range(len(steps))]
        cls.steps[key] = (algo, proto, steps, extra)
    for oid in set(cls.pair_orbit.values()):
        members = [p for p in pair_images[oid] if (oid, p) in simulated]
        pairs = ctx.pairs(("p2p-orbit", tuple(members)), lambda: members)
        cls.p2p[oid] = (pairs, len(pair_images[oid]) - len(members))
    return cls


def _element_between(shifts: Shifts, elements, a: tuple, b: tuple):
    """An element of Γ mapping group ``a`` onto group ``b`` (as sets)."""
    target, arr = set(b), np.array(a, dtype=np.int64)
    for e in elements:
        if set(shifts.apply_array(e, arr).tolist()) == target:
            return e
    return None


def _expand(ctx, op, group, nbytes, algorithm, root):
    algo, proto, steps = ctx.expand(op, group, nbytes, algorithm, root)
    return algo, proto, list(steps)


def _closure(unit_links: dict, start: set) -> set:
    """The units connected to ``start`` through shared links."""
    by_link: dict = {}
    for unit, links in unit_links.items():
        for l in links:
            by_link.setdefault(l, []).append(unit)
    done, todo = set(start), list(start)
    while todo:
        for l in unit_links.get(todo.pop(), ()):
            for u in by_link[l]:
                if u not in done:
                    done.add(u)
                    todo.append(u)
    return done


def _union(steps: list) -> tuple:
    """One step made of the same step of several units: their flows side by side."""
    pairs = [p for p, _, _ in steps]
    offsets = np.cumsum([0] + [len(p) for p in pairs])
    union = Pairs(np.concatenate([p.src for p in pairs]), np.concatenate([p.dst for p in pairs]),
                  np.concatenate([p.entry_flow + o for p, o in zip(pairs, offsets)]),
                  np.concatenate([p.entry_link for p in pairs]), pairs[0].latency, pairs[0].hw, pairs[0].net_share)
    sizes = np.concatenate([np.broadcast_to(np.asarray(s, dtype=float), (len(p),)) for p, s, _ in steps])
    return union, sizes, steps[0][2]
