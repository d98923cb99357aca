"""Sub-group symmetry: classes of ranks whose timelines are provably equal although their collectives run over
sub-groups (TP x DP meshes, FSDP x TP, pipelines with data-parallel replicas). The engine simulates one
representative per class and reads its records as every member's (trace.RankCopies).

The symmetries: Γ = {σ^a β^c ρ^b}, where σ shifts every rank by k whole nodes (node n -> n + k mod N, the
same local rank; or, with the nodes cut into blocks of B consecutive nodes, rotates the nodes inside every
block, o -> o + k mod B, and β shifts whole blocks: sim/equivariance.Shifts) and ρ rotates the local rank inside
every node by t (local l -> l + t mod G, the same node). All are automorphisms of the simulated fabric (sim.network.Topology): all nodes are built alike (GPU links,
NICs, fat-tree uplinks), every GPU of a node has the same links (NVSwitch up/down, a full NVLink mesh, PCIe),
and ρ maps rail l mod C to rail l + t mod C consistently when C (NICs per node) divides G; route(γ(a), γ(b)) is
then γ applied link by link to route(a, b), with equal capacities and latencies. With leaf switches (and for
another plan's links on a shared network, sim/jobs/) only renamings that map the fabric onto itself count
(Topology.keeps): the largest such subgroup of Γ is taken (equivariance.largest_kept). Left out: degraded links,
shared CPU cores, stragglers, recorded transfers (the engine then simulates every rank).

Checked, not assumed (a check failing -> a smaller Γ: node shifts alone, local rotations alone, else none):
1. the plan is Γ-equivariant: for the generators σ (smallest k), β and ρ (smallest t) and every rank r, the
   program of γ(r) is r's with every group, peer, root and per-peer stream name (send>p, recv<p) renamed by γ
   (sim/kernel/equivariance.py); a plan built from its representatives (sim/kernel/relabel.py) is so by construction;
2. every collective's expansion (sim.collectives: algorithm, protocol, and per step its latency and its flows
   (src, dst, bytes)) commutes with σ, β and ρ at every image of every group of a representative: the expansion
   on σ(h) is σ of the one on h (likewise ρ); by composition it then commutes with all of Γ at every group of
   the plan (each is an image of a representative's). The algorithm chosen is the same: every candidate's
   steps commute, so every estimated time is equal;
   Not every image needs an expansion and a comparison of its own: one that an element of Γ renames in order
   from another (its base) has the base's expansion renamed, a generator that renames an image in order
   commutes there, and one at an image renamed from a base commutes as at the base (sim/kernel/orbits.py):
   what is expanded and compared no longer grows with the number of nodes (tests/test_symmetry_scale.py);
3. each representative uses at most one group (and one peer per direction) of each orbit.
Then the full simulation commutes with γ (its input is renamed onto itself and no rule of the engine or of the
max-min fair network depends on a rank's or a link's name), so rank γ(r)'s records equal r's: the classes are
the orbits, one representative each (the smallest rank).

The reduced simulation runs the representatives only. A collective of orbit O (the images of a group) starts
when one representative per class meeting the group has arrived (its members of one class arrive together);
a send meets the receive of the same pair orbit, in order. The network: traffic is grouped in units (one
group's collectives, one ordered pair's messages); starting from the representatives' own units, the units
sharing a link with a simulated one are added until none is left (the connected components of the
link-sharing graph: _closure). Each simulated unit of orbit O moves its flows whenever O's collective runs
(all images run at the same time, step by step, by symmetry). Max-min fair rates of link-disjoint flow sets
do not depend on each other, so the simulated flows get the rates of the full simulation, and by induction
over events every representative's records equal the full simulation's, up to rounding (the rates are summed
in another order; tests/test_symmetry.py: to 1e-6 relative). An orbit whose simulated flows share no link with
any other unit, issued on one stream per representative, has one collective in flight at a time on links of
its own: its duration depends on (group, op, bytes, algorithm, root) alone and is reused (_exclusive). Two
process groups over the same ranks (sim/kernel/communicators.py: distinct names) are two orbits sharing links.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from distlab.sim.kernel.equivariance import (Shifts, block_kept, classes_count, find_shifts, largest_kept,
                                             leaf_blocks)
from distlab.sim.kernel.network import Pairs, Topology
from distlab.sim.kernel.orbits import images_of, link_renamer, moves_in_order, renamed_rows
from distlab.sim.plan import Collective, Plan, Recv, Send


@dataclass
class Classes:
    """What the engine needs: the representatives, the orbit of every representative's group and pair, how many
    representatives meet at each collective orbit, and the steps of every collective (flows of all simulated
    units of its orbit)."""
    shifts: Shifts
    reps: list[int]
    group_orbit: dict = field(default_factory=dict)     # rep's Communicator (group tuple, name) -> orbit id
    arrivals: dict = field(default_factory=dict)        # orbit id -> representatives that meet there
    pair_orbit: dict = field(default_factory=dict)      # (src, dst) of a rep's send or recv -> orbit id
    steps: dict = field(default_factory=dict)     # (group, name, op, bytes, alg., root) -> (algo, proto, steps, extra)
    p2p: dict = field(default_factory=dict)             # pair orbit id -> (Pairs of its simulated pairs, extra flows)
    exclusive: set = field(default_factory=set)         # orbits whose collectives' durations may be reused
    links: frozenset = frozenset()                      # every link the plan's traffic uses (all units)

    def rep_of(self, rank: int) -> int:
        return self.shifts.rep(rank)


def subgroups_apply(plan: Plan, cluster, slowdown: dict | None, record_transfers: bool,
                    link_factors: dict | None) -> bool:
    """The cases the argument covers (module docstring): the fabric's symmetries are not broken."""
    return (plan.world_size >= 2 and plan.world_size == cluster.world_size and not record_transfers
            and not cluster.cpu_cores and not link_factors and all(f == 1.0 for f in (slowdown or {}).values()))


def _flows(steps: list, shifts: Shifts | None = None, e=None, cache: dict | None = None) -> list:
    """Per step: its latency and its flows (src, dst, bytes) sorted, optionally renamed by ``e``; steps that
    repeat a pattern (one Pairs object, the same sizes) are sorted once (``cache``)."""
    out = []
    cache = {} if cache is None else cache
    for pairs, sizes, latency in steps:
        key = (id(pairs), sizes if np.isscalar(sizes) else np.asarray(sizes).tobytes(), e)
        rows = cache.get(key)
        if rows is None:
            src, dst = pairs.src, pairs.dst
            if e is not None:
                src, dst = shifts.apply_array(e, src), shifts.apply_array(e, dst)
            sz = np.broadcast_to(np.asarray(sizes, dtype=float), (len(pairs),))
            rows = np.stack([src.astype(float), dst.astype(float), sz]) if len(pairs) else np.zeros((3, 0))
            rows = cache[key] = rows[:, np.lexsort(rows[::-1])]
        out.append((latency, rows))
    return out


def _same_flows(a: list, b: list) -> bool:
    return len(a) == len(b) and all(la == lb and (fa is fb or fa.shape == fb.shape and np.array_equal(fa, fb))
                                    for (la, fa), (lb, fb) in zip(a, b))


def _links(steps: list) -> set:
    distinct = {id(p): p.entry_link for p, _, _ in steps}          # steps repeat their Pairs
    return set(np.unique(np.concatenate(list(distinct.values()) or [np.zeros(0, dtype=np.int64)])).tolist())


def find_classes(plan: Plan, ctx, busy: frozenset = frozenset()) -> Classes | None:
    """The rank classes of ``plan`` on ``ctx``'s fabric (module docstring), or None when a check fails: the
    largest Γ the plan is invariant under first, then node shifts alone, then local rotations alone. A plan with
    all_to_alls of per-peer sizes (expert parallelism: every member of an ep group issues them, so rank 0 and the
    last rank show them) is simulated in full: their expansions are not checked under the shifts."""
    if any(getattr(op, "splits", None) is not None for r in (0, plan.world_size - 1) for op in plan.ranks[r]):
        return None
    best = find_shifts(plan, ctx.cluster)
    keeps = ctx.topo.keeps
    if best is not None and not keeps(best):      # leaf switches, or links another job uses (Topology.keeps)
        block = leaf_blocks(best.nodes, ctx.topo.leaf_of)
        options = [s for s in (block_kept(plan, best, block, keeps), largest_kept(best, keeps)) if s is not None]
        best = min(options, key=classes_count) if options else None
    if best is None:
        return None
    n, g = best.nodes, best.gpus
    w = best.width
    smaller = (Shifts(n, g, w, best.local_step, best.block, best.block_step),      # no rotation inside blocks
               Shifts(n, g, best.node_step, g, best.block, best.block_step),
               Shifts(n, g, w, g, best.block, best.block_step),
               Shifts(n, g, n, best.local_step))
    tries = [best] + [s for i, s in enumerate(smaller) if s != best and not s.trivial() and s not in smaller[:i]
                      and keeps(s)]
    for shifts in tries:
        classes = _classes_under(plan, ctx, shifts, busy)
        if classes is not None:
            return classes
    return None


def _classes_under(plan: Plan, ctx, shifts: Shifts, busy: frozenset = frozenset()) -> Classes | None:
    elements = shifts.elements()
    reps = sorted({shifts.rep(r) for r in range(plan.world_size)})
    cls = Classes(shifts, reps)
    # orbits of the representatives' groups and pairs; one (rank, op index) where each group is used
    orbit_of: dict = {}          # canonical sorted tuple -> orbit id
    images: dict = {}            # orbit id -> {sorted image tuple: element mapping the orbit's reference to it}
    reference: dict = {}         # orbit id -> (reference group tuple, a (rank, index) using it)
    to_ref: dict = {}            # rep Communicator -> element mapping the reference onto its group
    pair_images: dict = {}       # pair orbit id -> list of image pairs
    keys: dict = {}              # (group, name, op, bytes, algorithm, root) -> None (the distinct collectives)
    streams: dict = {}           # (representative, orbit id) -> streams it issues the orbit's collectives on
    for q in reps:
        orbit_group: dict = {}       # orbit id -> the one group of it this representative uses
        orbit_pair: dict = {}        # (send or recv, orbit id) -> the one pair of it
        for i, op in enumerate(plan.ranks[q]):
            if isinstance(op, Collective):
                c = plan.communicator_of(op)        # two groups over the same ranks: two orbits
                g = c.ranks
                if c not in cls.group_orbit:
                    imgs = images_of(shifts, elements, g)
                    oid = orbit_of.get((min(imgs), c.name))
                    if oid is None:
                        oid = orbit_of[min(imgs), c.name] = len(orbit_of)
                        images[oid], reference[oid] = imgs, (g, (q, i))
                        cls.arrivals[oid] = len({shifts.rep(m) for m in g})
                    e_g = _element_between(shifts, elements, reference[oid][0], g)
                    if e_g is None:
                        return None
                    cls.group_orbit[c], to_ref[c] = oid, e_g
                if orbit_group.setdefault(cls.group_orbit[c], g) != g:
                    return None                     # check 3: two groups of one orbit
                keys[(g, c.name, op.op, op.bytes, op.algorithm, op.root)] = None
                streams.setdefault((q, cls.group_orbit[c]), set()).add(op.stream)
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
    expansions: dict = {}        # (key, image) -> (algorithm, protocol, steps), images expanded on the fabric
    generators = shifts.generators()
    sorted_steps: dict = {}      # (Pairs id, sizes, renaming) -> its flows sorted
    actual, members, base_of = _families(plan, shifts, images, reference, {cls.group_orbit[k[:2]] for k in keys},
                                         not busy and isinstance(ctx.topo, Topology))
    if actual is None:
        return None

    explicit = {oid: _edges(shifts, generators, images[oid], members, base_of, oid)
                for oid in {cls.group_orbit[k[:2]] for k in keys}}

    def expand(key, img):
        g, name, op, nbytes, algorithm, root = key
        oid = cls.group_orbit[g, name]
        if (key, img) not in expansions:
            e = shifts.compose(images[oid][img], shifts.inverse(to_ref[g, name]))      # g -> this image
            expansions[key, img] = _expand(ctx, op, actual[oid, img], nbytes, algorithm, shifts.apply(e, root))
        return expansions[key, img]

    for key in keys:
        oid = cls.group_orbit[key[:2]]
        flows: dict = {}

        def flows_of(img, oid=oid, key=key, flows=flows):     # a renamed image: its base's flows renamed
            if img not in flows:
                base = base_of.get((oid, img))
                flows[img] = (_flows(expand(key, img)[2], cache=sorted_steps) if base is None else
                              [(lat, _renamed(rows, base[1], shifts, sorted_steps)) for lat, rows in flows_of(base[0])])
            return flows[img]

        def chosen(img, oid=oid, key=key):
            return expand(key, base_of.get((oid, img), (img,))[0])[:2]

        for img in images[oid]:
            if (oid, img) not in base_of:
                unit_links.setdefault((oid, img), set()).update(_links(expand(key, img)[2]))
        for img, e in explicit[oid]:        # check 2 for the generators: then for all of Γ
            to = _image(shifts, e, members[oid, img])
            mapped = [(lat, _renamed(rows, e, shifts, sorted_steps)) for lat, rows in flows_of(img)]
            if chosen(to) != chosen(img) or not _same_flows(flows_of(to), mapped):
                return None
    renamers: dict = {}
    for (oid, img), (b, d) in base_of.items():
        if (oid, b) not in renamers:
            renamers[oid, b] = link_renamer(ctx.topo, sorted(unit_links[oid, b]))
        unit_links[oid, img] = renamers[oid, b](lambda ranks, d=d: shifts.apply_array(d, ranks))
    for pair, oid in cls.pair_orbit.items():
        for p in pair_images[oid]:
            unit_links[oid, p] = set(ctx.topo.route(*p))
    start = {(oid, tuple(sorted(c.ranks))) for c, oid in cls.group_orbit.items()}
    start |= {(oid, pair) for pair, oid in cls.pair_orbit.items()}
    simulated = _closure(unit_links, start)
    # the steps the engine runs: the flows of every simulated unit of the orbit, step by step
    for key in keys:
        g, name, op, nbytes, algorithm, root = key
        oid = cls.group_orbit[g, name]
        simulated_images = [img for img in images[oid] if (oid, img) in simulated]
        parts = [expand(key, img) for img in simulated_images]
        algo, proto, steps = parts[0]
        per_group = sum(len(p) for p, _, _ in steps)
        extra = per_group * (len(images[oid]) - len(simulated_images))
        if len(parts) > 1:
            steps = [_union([s[k] for _, _, s in parts]) for k in range(len(steps))]
        cls.steps[key] = (algo, proto, steps, extra)
    for oid in set(cls.pair_orbit.values()):
        members = [p for p in pair_images[oid] if (oid, p) in simulated]
        pairs = ctx.pairs(("p2p-orbit", tuple(members)), lambda: members)
        cls.p2p[oid] = (pairs, len(pair_images[oid]) - len(members))
    cls.exclusive = _exclusive(unit_links, simulated, streams, busy)
    cls.links = frozenset().union(*unit_links.values())
    return cls


def _families(plan: Plan, shifts: Shifts, images: dict, reference: dict, orbits: set, derive: bool):
    """Per (orbit, image): the plan's group there (None, ... when it is not the image), its members sorted, and
    for an image another one's renamed in order (sim/kernel/orbits.py) that one (its base) and the element."""
    actual, members, base_of = {}, {}, {}
    for oid in sorted(orbits):
        ref_rank, ref_index = reference[oid][1]
        bases: list = []
        for img, e_h in images[oid].items():
            group = plan.group_of(_op_at(plan, shifts.apply(e_h, ref_rank), ref_index))   # the plan's tuple
            if tuple(sorted(group)) != img:
                return None, None, None
            actual[oid, img], members[oid, img] = group, np.array(img, dtype=np.int64)
            for b, e_b in bases if derive else ():
                d = shifts.compose(e_h, shifts.inverse(e_b))
                if moves_in_order(shifts, d, members[oid, b], members[oid, img]):
                    base_of[oid, img] = (b, d)
                    break
            else:
                if len(bases) < 8:
                    bases.append((img, e_h))
    return actual, members, base_of


def _edges(shifts: Shifts, generators: list, images: dict, members: dict, base_of: dict, oid) -> list:
    """The (image, generator) pairs of one orbit whose commuting check 2 has to compare expansions: not those
    the generator renames in order (it commutes: sim/kernel/orbits.py), nor those of an image renamed in order
    from a base whose own pair is checked (d commutes with every element of Γ, and renames γ(base) in order)."""
    out = []
    for img in images:
        base = base_of.get((oid, img))
        for e in generators:
            to = _image(shifts, e, members[oid, img])
            if moves_in_order(shifts, e, members[oid, img], members[oid, to]):
                continue
            if base is not None and moves_in_order(shifts, base[1], members[oid, _image(
                    shifts, e, members[oid, base[0]])], members[oid, to]):
                continue
            out.append((img, e))
    return out


def _image(shifts: Shifts, e, sorted_members: np.ndarray) -> tuple:
    return tuple(np.sort(shifts.apply_array(e, sorted_members)).tolist())


def _renamed(rows: np.ndarray, e, shifts: Shifts, cache: dict) -> np.ndarray:
    key = (id(rows), e)
    hit = cache.get(key)
    if hit is None or hit[0] is not rows:
        hit = cache[key] = (rows, renamed_rows(shifts, e, rows))
    return hit[1]


def _exclusive(unit_links: dict, simulated: set, streams: dict, busy: frozenset = frozenset()) -> set:
    """Collective orbits whose simulated flows use links no other simulated unit uses (nor another plan on the
    same network: ``busy``, sim/jobs/), issued by every representative on one stream: one collective of the
    orbit at a time (the next cannot start before the previous has ended for every member) on links nothing
    else touches, so its duration is a function of (group, op, bytes, algorithm, root) alone and the engine
    reuses it."""
    owner: dict = {}
    for unit in simulated:
        for link in unit_links[unit]:
            owner.setdefault(link, set()).add(unit[0])
    one_stream = {oid for oid in {o for _, o in streams}} - {o for (_, o), s in streams.items() if len(s) > 1}
    return {oid for oid in one_stream if all(owner[l] == {oid} and l not in busy for u in simulated if u[0] == oid
                                             for l in unit_links[u])}


def _op_at(plan: Plan, rank: int, index: int):
    op_at = getattr(plan.ranks, "op_at", None)       # sim/kernel/relabel.py: one op renamed, not a whole program
    return op_at(rank, index) if op_at else plan.ranks[rank][index]


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
