"""The network: directed links with capacities, routes between ranks, and flows that share bandwidth.

Model (fluid, flow-level):
- Every link is directed and has a capacity in bytes/s (the fabric's line rate x efficiency) and a latency.
- A transfer is a *batch* of flows that start together (one step of a collective). The batch first waits the
  largest route latency among its flows (the α of that step), then its flows move bytes.
- Flows in flight share links max-min fairly (progressive filling; Bertsekas & Gallager, Data Networks, 6.5):
  a flow gets an equal share of its most contended link; what it cannot use goes to the others. Rates are
  recomputed whenever a flow starts or ends, so flows of different collectives slow each other down.
- By default the steps of every collective in flight advance together in one loop, without a simpy event per
  step (sim/kernel/netloop.py: the same events and arithmetic, the same times); ``record=True`` (every transfer kept)
  and ``sim.solo.ENABLED = False`` run each step as a simpy process and batch (``_start``, ``_run``: the reference).
Left out: packet-level effects (congestion control, head-of-line blocking, adaptive routing), protocol
overheads beyond the per-fabric efficiency, switch buffers, and latency that grows with queueing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import simpy

from distlab.sim.kernel import solo
from distlab.sim.cluster import Cluster
from distlab.sim.errors import ConfigError
from distlab.sim.kernel.netloop import StepLoop

SWITCH = -1   # an endpoint meaning "the NVSwitch of the source/destination rank's node" (in-switch reduction)


class Topology:
    """Links and routes of a cluster. Routes are tuples of link ids; latency is per route."""

    def __init__(self, cluster: Cluster, link_factors: dict[str, float] | None = None):
        self.cluster = cluster
        self.names: list[str] = []
        caps: list[float] = []
        lats: list[float] = []

        def add(name: str, gbps: float, latency_s: float) -> int:
            self.names.append(name)
            caps.append(gbps * 1e9 * (link_factors or {}).get(name, 1.0))
            lats.append(latency_s)
            return len(self.names) - 1

        c, intra = cluster, cluster.intra_node
        g = c.gpus_per_node
        bw = intra.bandwidth_GBps * intra.efficiency
        lat = intra.latency_us * 1e-6
        self._up, self._down, self._mesh = {}, {}, {}
        for r in range(c.world_size):
            if intra.kind == "nvlink-mesh":
                continue
            self._up[r] = add(f"gpu{r}.up", bw, lat)
            self._down[r] = add(f"gpu{r}.down", bw, 0.0)
        if intra.kind == "nvlink-mesh":
            for node in range(c.nodes):
                base = node * g
                for a in range(base, base + g):
                    for b in range(base, base + g):
                        if a != b:
                            self._mesh[a, b] = add(f"nvlink{a}->{b}", bw / max(g - 1, 1), lat)
        self._nic_up, self._nic_down, self._node_up, self._node_down = {}, {}, {}, {}
        self._leaf_up, self._leaf_down = {}, {}
        inter = c.inter_node
        self.nodes_per_leaf = inter.nodes_per_leaf if inter is not None and inter.oversubscription > 1 else 0
        if inter is not None and c.nodes > 1:
            nbw = inter.bandwidth_GBps * inter.efficiency
            for node in range(c.nodes):
                for k in range(inter.nics_per_node):
                    self._nic_up[node, k] = add(f"node{node}.nic{k}.up", nbw, inter.latency_us * 1e-6)
                    self._nic_down[node, k] = add(f"node{node}.nic{k}.down", nbw, 0.0)
                if inter.fabric == "fat-tree" and inter.oversubscription > 1 and not self.nodes_per_leaf:
                    agg = inter.nics_per_node * nbw / inter.oversubscription
                    self._node_up[node] = add(f"node{node}.uplink", agg, 0.0)
                    self._node_down[node] = add(f"node{node}.downlink", agg, 0.0)
            if self.nodes_per_leaf:
                self._add_leaves(add, inter, nbw)
        unknown = set(link_factors or {}) - set(self.names)
        if unknown:
            raise ConfigError(f"no link named {sorted(unknown)[0]!r}; links look like gpu0.up, gpu0.down, "
                              "node0.nic0.up, node0.uplink, leaf0.up, leaf0.rail0.up", "degraded_links")
        for name, f in (link_factors or {}).items():
            if not isinstance(f, (int, float)) or not 0 < f <= 1:
                raise ConfigError(f"factor {f!r} for link {name!r} must be in (0, 1]", "degraded_links")
        self.capacity = np.array(caps, dtype=float)
        self.latency = np.array(lats, dtype=float)
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._route_info: dict[tuple[int, int], tuple] = {}

    def _add_leaves(self, add, inter, nbw: float) -> None:
        """Leaf switches of ``nodes_per_leaf`` nodes under one spine layer. A leaf's uplink (to the spine layer)
        and downlink carry what its nodes' NICs can send over the oversubscription ratio: fat-tree, one leaf per
        group of nodes takes all their NICs; rail-optimized, one leaf per group and rail takes NIC k of each
        node (NVIDIA's DGX SuperPOD reference architectures build both ways). The spine layer itself is one
        non-blocking switch: traffic spreads evenly over the spines (ECMP collisions are left out)."""
        per_leaf, leaves = self.nodes_per_leaf, -(-self.cluster.nodes // self.nodes_per_leaf)
        rails = range(inter.nics_per_node) if inter.fabric == "rail-optimized" else (None,)
        for leaf in range(leaves):
            for k in rails:
                name = f"leaf{leaf}" if k is None else f"leaf{leaf}.rail{k}"
                agg = per_leaf * (nbw if k is not None else inter.nics_per_node * nbw) / inter.oversubscription
                self._leaf_up[leaf, k] = add(f"{name}.up", agg, 0.0)
                self._leaf_down[leaf, k] = add(f"{name}.down", agg, 0.0)

    def leaf_of(self, node: int) -> int | None:
        """The leaf switch of ``node`` (None without a leaf tier)."""
        return node // self.nodes_per_leaf if self.nodes_per_leaf else None

    def keeps(self, shifts) -> bool:
        """Does every renaming of ``shifts`` (sim/kernel/equivariance.Shifts) map this fabric onto itself? All
        nodes are built alike, so any permutation of whole nodes does, unless leaf switches group them: then it
        must map the nodes of a leaf onto the nodes of one leaf (local rotations map rail k's leaves onto rail
        k + t's, alike)."""
        if not self.nodes_per_leaf:
            return True
        return all(maps_blocks(node_map(shifts, e), self.leaf_of) for e in shifts.generators())

    def route_info(self, src: int, dst: int) -> tuple[tuple[int, ...], float, bool]:
        """(route, the sum of its link latencies, whether it crosses nodes), cached: large collectives ask for
        the same pairs step after step."""
        key = (src, dst)
        info = self._route_info.get(key)
        if info is None:
            route = self.route(src, dst)
            node_of = self.cluster.node_of
            crosses = src != SWITCH and dst != SWITCH and node_of(src) != node_of(dst)
            info = self._route_info[key] = (route, float(self.latency[list(route)].sum()), crosses)
        return info

    def rail(self, rank: int) -> int:
        return self.cluster.local_rank(rank) % self.cluster.inter_node.nics_per_node

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Links from ``src`` to ``dst``; ``SWITCH`` as src or dst means the node's NVSwitch."""
        key = (src, dst)
        if key in self._routes:
            return self._routes[key]
        c = self.cluster
        if dst == SWITCH:
            r = (self._up[src],)
        elif src == SWITCH:
            r = (self._down[dst],)
        elif c.node_of(src) == c.node_of(dst):
            r = (self._mesh[src, dst],) if self._mesh else (self._up[src], self._down[dst])
        else:
            na, nb = c.node_of(src), c.node_of(dst)
            if c.inter_node.fabric == "rail-optimized":
                # NCCL's PXN: data crosses NVLink to the GPU on the destination's rail, then one rail switch.
                ka = kb = self.rail(dst)
            else:
                ka, kb = self.rail(src), self.rail(dst)
            r = (self._nic_up[na, ka],)
            if na in self._node_up:
                r += (self._node_up[na], self._node_down[nb])
            elif self._leaf_up and na // self.nodes_per_leaf != nb // self.nodes_per_leaf:
                k = kb if c.inter_node.fabric == "rail-optimized" else None
                r += (self._leaf_up[na // self.nodes_per_leaf, k], self._leaf_down[nb // self.nodes_per_leaf, k])
            r += (self._nic_down[nb, kb],)
        self._routes[key] = r
        return r


def node_map(shifts, e) -> list[int]:
    """Where element ``e`` of ``shifts`` takes each node (its ranks move together)."""
    return [shifts.apply(e, n * shifts.gpus) // shifts.gpus for n in range(shifts.nodes)]


def maps_blocks(image: list[int], block_of) -> bool:
    """Does the node permutation ``image`` map every block (``block_of(node)``: a leaf) onto one block?"""
    to: dict = {}
    for n, m in enumerate(image):
        a, b = block_of(n), block_of(m)
        if to.setdefault(a, b) != b:
            return False
    return len(set(to.values())) == len(to)


@dataclass(eq=False)
class Pairs:
    """The (src, dst) pairs of one step's flows, with their routes as flat arrays. Steps that repeat the same
    pairs share one Pairs object, so the engine can reuse its bandwidth shares."""
    src: np.ndarray
    dst: np.ndarray
    entry_flow: np.ndarray   # for each (flow, link) entry: the flow's index
    entry_link: np.ndarray   # ... and the link id
    latency: float           # the largest route latency: the step's α
    hw: int = 0              # hardware class for protocol costs: 0 NVLink, 1 PCIe, 2 network (crosses nodes)
    net_share: float = -1.0  # >= 0: share of a chunk's hops that cross nodes, hw then the intra-node class

    @classmethod
    def build(cls, topo: Topology, pairs: list[tuple[int, int]]) -> "Pairs":
        src = np.array([p[0] for p in pairs], dtype=np.int64)
        dst = np.array([p[1] for p in pairs], dtype=np.int64)
        c = topo.cluster
        hw = 1 if c.intra_node.kind == "pcie" else 0
        infos = [topo.route_info(s, d) for s, d in pairs]          # (route, latency, crosses nodes), cached
        routes = [info[0] for info in infos]
        flows = np.repeat(np.arange(len(pairs), dtype=np.int64), [len(r) for r in routes])
        links = np.fromiter(chain.from_iterable(routes), dtype=np.int64, count=len(flows))
        lat = max([0.0] + [info[1] for info in infos])
        if any(info[2] for info in infos):
            hw = 2
        return cls(src, dst, flows, links, lat, hw)

    def __len__(self) -> int:
        return len(self.src)


@dataclass(eq=False)
class _Batch:
    pairs: Pairs
    remaining: np.ndarray
    done: simpy.Event
    start: float
    sizes: np.ndarray
    ends: np.ndarray = field(default=None)


def max_min_rates(capacity: np.ndarray, entry_flow: np.ndarray, entry_link: np.ndarray, n_flows: int) -> np.ndarray:
    """Max-min fair rates by progressive filling: raise every unfrozen flow's rate together until a link
    saturates, freeze the flows crossing it, repeat. Over the links the flows use only (renumbered 0..k-1):
    the same arithmetic per link, without a pass over every link of the cluster per round."""
    used_links, entry_link = np.unique(entry_link, return_inverse=True)
    capacity = capacity[used_links]
    rates = np.zeros(n_flows)
    frozen = np.zeros(n_flows, dtype=bool)
    cap_left = capacity.astype(float).copy()
    active_entries = np.ones(len(entry_flow), dtype=bool)
    while active_entries.any():
        counts = np.bincount(entry_link[active_entries], minlength=len(capacity))
        used = counts > 0
        share = np.full(len(capacity), np.inf)
        share[used] = cap_left[used] / counts[used]
        inc = share.min()
        rates[~frozen] += inc
        cap_left[used] -= inc * counts[used]
        saturated = share <= inc * (1 + 1e-12)      # the bottleneck links (at least one: always progresses)
        frozen[entry_flow[active_entries & saturated[entry_link]]] = True
        active_entries &= ~frozen[entry_flow]
    return rates


class Network:
    """Runs batches of flows on a topology inside a simpy environment."""

    def __init__(self, env: simpy.Environment, topo: Topology, record: bool = False):
        self.env, self.topo, self.record = env, topo, record
        self.transfers: list[tuple] = []      # (src, dst, start, end, bytes, route)
        self.flows_done = 0
        self._active: list[_Batch] = []
        self._wake = env.event()
        self._rate_cache: dict = {}
        # sim/kernel/netloop.py: every step in one loop (the default), else each step a simpy process (the reference)
        self.loop = StepLoop(self) if solo.ENABLED and not record else None
        if self.loop is None:
            env.process(self._run())

    def transfer(self, pairs: Pairs, sizes, latency: float | None = None) -> simpy.Event:
        """Start one step: flow i moves ``sizes[i]`` bytes (or ``sizes`` for all) after ``latency`` (default:
        the pairs' largest route latency). Returns an event that fires when every flow has arrived."""
        if self.loop is not None:
            return self.loop.run([(pairs, sizes, latency)])
        sizes = np.broadcast_to(np.asarray(sizes, dtype=float), (len(pairs),))
        done = self.env.event()
        self.env.process(self._start(pairs, sizes, done, pairs.latency if latency is None else latency))
        return done

    def _start(self, pairs: Pairs, sizes: np.ndarray, done: simpy.Event, latency: float):
        start = self.env.now
        if latency > 0:
            yield self.env.timeout(latency)
        if not (sizes > 0).any():
            self._finish_batch(_Batch(pairs, sizes.copy(), done, start, sizes, np.full(len(pairs), self.env.now)))
            return
        batch = _Batch(pairs, sizes.copy(), done, start, sizes, np.full(len(pairs), np.nan))
        batch.ends[sizes <= 0] = self.env.now
        self._active.append(batch)
        if not self._wake.triggered:
            self._wake.succeed()

    def _rates(self, active: list | None = None) -> list[np.ndarray]:
        """The rates of the active batches' flows (or of ``active``: (pairs, alive mask) pairs)."""
        if active is None:
            active = [(b.pairs, b.remaining > 0) for b in self._active]
        key = tuple((id(p), a.tobytes()) for p, a in active)
        cached = self._rate_cache.get(key)
        if cached is not None:
            return cached
        flows, links, offset, counts = [], [], 0, []
        for p, a in active:
            keep = a[p.entry_flow]
            index = np.cumsum(a) - 1          # alive flow -> compact index
            flows.append(index[p.entry_flow[keep]] + offset)
            links.append(p.entry_link[keep])
            offset += int(a.sum())
            counts.append(a)
        rates = max_min_rates(self.topo.capacity, np.concatenate(flows), np.concatenate(links), offset)
        out, pos = [], 0
        for a in counts:
            r = np.zeros(len(a))
            n = int(a.sum())
            r[a] = rates[pos:pos + n]
            pos += n
            out.append(r)
        if len(self._rate_cache) > 4096:
            self._rate_cache.clear()
        self._rate_cache[key] = out
        return out

    def _run(self):
        env = self.env
        while True:
            if not self._active:
                self._wake = env.event()
                yield self._wake
                continue
            rates, batches = self._rates(), self._active[:]     # batches that join meanwhile get no rate yet
            dt = min(float(np.min(np.where(r > 0, b.remaining / np.where(r > 0, r, 1), np.inf)))
                     for b, r in zip(batches, rates))
            self._wake = env.event()
            t0 = env.now
            yield env.timeout(dt) | self._wake
            elapsed = env.now - t0
            finished = []
            for b, r in zip(batches, rates):
                b.remaining = b.remaining - r * elapsed
                # done: no bytes left, or less than float resolution of the clock would move
                tol = max(env.now, 1e-9) * 1e-12
                just = np.isnan(b.ends) & ((b.remaining <= 1e-9 * np.maximum(b.sizes, 1.0)) | (b.remaining <= r * tol))
                b.remaining[just] = 0.0
                b.ends[just] = env.now
                if not np.isnan(b.ends).any():
                    finished.append(b)
            for b in finished:
                self._active.remove(b)
                self._finish_batch(b)

    def _finish_batch(self, b: _Batch) -> None:
        self.flows_done += len(b.pairs)
        if self.record:
            for i in range(len(b.pairs)):
                self.transfers.append((int(b.pairs.src[i]), int(b.pairs.dst[i]), b.start, float(b.ends[i]),
                                       float(b.sizes[i]), self.topo.route(int(b.pairs.src[i]), int(b.pairs.dst[i]))))
        b.done.succeed()
