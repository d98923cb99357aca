"""What collective algorithms share: the topology, cached flow patterns, algorithm and protocol choice,
NCCL's per-call costs, calibration."""
from __future__ import annotations

import numpy as np

from distlab.sim.collectives import algorithms, ring_cost
from distlab.sim.collectives.protocols import (PROTOCOLS, ProtocolCost, check_protocol, cost, env_algorithms,
                                               env_protocols, protocols_for)
from distlab.sim.errors import ConfigError
from distlab.sim.kernel.network import Pairs, Topology


class Context:
    """``protocol``: "auto" (NCCL_PROTO, if set, limits the choice) or one of LL, LL128, Simple for every call.
    NCCL_ALGO, if set, limits what `auto` may choose (an algorithm named in the plan is always honoured).
    On CPU clusters (Gloo) both variables are ignored, as Gloo ignores them."""

    def __init__(self, topo: Topology, protocol: str = "auto"):
        self.topo = topo
        self.cluster = topo.cluster
        nccl = self.cluster.gpu.arch != "cpu"              # Gloo ignores NCCL's variables
        self.protocols = set(PROTOCOLS) if check_protocol(protocol) == "auto" else {protocol}
        if protocol == "auto" and nccl:
            self.protocols = env_protocols() or self.protocols
        self.auto_algorithms = env_algorithms(algorithms.NCCL_NAMES) if nccl else None
        self._pairs: dict = {}
        self._sizes: dict = {}
        self._derived: dict = {}
        self._choices: dict = {}
        self._step_cost: dict = {}
        self._empty = Pairs.build(topo, [])

    def pairs(self, key, make) -> Pairs:
        """One Pairs object per distinct flow pattern (``make()`` returns the (src, dst) list)."""
        p = self._pairs.get(key)
        if p is None:
            p = self._pairs[key] = Pairs.build(self.topo, make())
        return p

    def cached(self, key, make):
        """Any object derived from the topology, made once per key."""
        v = self._derived.get(key)
        if v is None:
            v = self._derived[key] = make()
        return v

    def sizes(self, key, make) -> np.ndarray:
        """One array of flow sizes per distinct pattern (``make()`` returns the list)."""
        s = self._sizes.get(key)
        if s is None:
            s = self._sizes[key] = np.asarray(make(), dtype=float)
        return s

    def nodes_of(self, group) -> dict[int, list[int]]:
        by_node: dict[int, list[int]] = {}
        for r in sorted(group, key=lambda r: (self.cluster.node_of(r), self.cluster.local_rank(r))):
            by_node.setdefault(self.cluster.node_of(r), []).append(r)
        return by_node

    # -- calibration -------------------------------------------------------------------------------------
    def calibrated(self, op: str, n: int, nbytes: float | None = None) -> tuple[float, float] | None:
        """(α seconds, bandwidth bytes/s) fitted by `distlab calibrate` for ``op`` at group size ``n`` and
        message size ``nbytes`` (its size band, sim/calibration.py), interpolated linearly in n."""
        from distlab.sim.calibration import calibrated
        return calibrated(self.cluster.calibration, op, n, nbytes)

    # -- choosing ----------------------------------------------------------------------------------------
    def expand(self, op: str, group: tuple[int, ...], nbytes: float, algorithm: str, root: int = 0,
               splits=None):
        """(algorithm, protocol, steps with the protocol's costs applied). Calibrated clusters run the ring (or
        direct) with fitted α and bandwidth. ``splits``: an all_to_all's per-peer sizes (collectives/direct.py)."""
        if splits is not None:
            from distlab.sim.collectives import direct
            cal = self.calibrated(op, len(group), nbytes)
            if cal is not None:      # fitted α and bandwidth: the busiest link's bytes at the fitted bandwidth
                alpha, bandwidth = cal
                return "direct", "Simple", iter([(self._empty, 0.0, alpha)] + [
                    (p, s * float(np.min(self.topo.capacity[p.entry_link])) / bandwidth, 0.0)
                    for p, s, _ in direct.split_steps(self, group, splits)])
            _, protocol, pc = self.choose(op, group, nbytes, "direct", root)
            return "direct", protocol, self._apply(pc, direct.split_steps(self, group, splits))
        cal = self.calibrated(op, len(group), nbytes)
        if cal is not None:
            name, step_iter = self._calibrated_steps(op, group, nbytes, root, cal)
            return name, "Simple", step_iter
        algorithm, protocol, pc = self.choose(op, group, nbytes, algorithm, root)
        return algorithm, protocol, self._apply(pc, algorithms.steps(self, op, group, nbytes, algorithm, root))

    def choose(self, op: str, group, nbytes: float, algorithm: str = "auto", root: int = 0):
        """(algorithm, protocol, its ProtocolCost) with the lowest uncontended time, as NCCL's tuner picks the
        (algorithm, protocol) pair of least predicted time (tuning.cc:630-654, enqueue.cc:2014-2048).
        ``algorithm`` may fix it."""
        key = (op, tuple(group), nbytes, algorithm, root)
        if key in self._choices:
            return self._choices[key]
        n, nodes = len(group), len(self.nodes_of(group))
        if algorithm != "auto":
            candidates = [algorithms.module(algorithm, op)]
        else:
            nccl = self.cluster.gpu.arch != "cpu"
            candidates = [m for m in algorithms.MODULES if op in m.OPS and (m.NCCL_AUTO or not nccl)
                          and (self.auto_algorithms is None or m.NAME in self.auto_algorithms)]
        best, best_t, refusal = None, float("inf"), None
        for m in candidates:
            protos = [p for p in protocols_for(m, self.cluster) if p in self.protocols]
            if not protos:
                refusal = refusal or ConfigError(
                    f"algorithm {m.NAME!r} runs only the {', '.join(protocols_for(m, self.cluster))} protocol; "
                    f"asked for {', '.join(sorted(self.protocols))}", "protocol")
                continue
            try:
                m.check(self, group)
            except ConfigError as e:
                refusal = refusal or e
                continue
            parts = self._estimate_parts(m.steps(self, op, group, nbytes, root))
            for p in protos:
                pc = cost(m.NAME, p, self.cluster, n, nodes, op, nbytes)
                t = _time(pc, parts)
                if t < best_t * (1 - 1e-12):
                    best, best_t = (m.NAME, p, pc), t
        if best is None:
            raise refusal or ConfigError(f"no algorithm implements {op} here", "algorithm")
        self._choices[key] = best
        return best

    def estimate(self, op: str, group, nbytes: float, algorithm: str = "auto", root: int = 0) -> float:
        """Uncontended time of the chosen (or given) algorithm with its protocol."""
        name, _, pc = self.choose(op, group, nbytes, algorithm, root)
        return _time(pc, self._estimate_parts(algorithms.steps(self, op, group, nbytes, name, root)))

    def _estimate_parts(self, step_iter) -> tuple:
        """(explicit latency sum, route latency sum, steps per hw class, Σ bytes on the busiest link / capacity):
        each step costs its latency plus its busiest link's bytes over its capacity (exact when a step's flows
        on a link are equal in size)."""
        explicit = route = 0.0
        per_hw = [0, 0, 0]
        transfer = 0.0
        for pairs, sizes, latency in step_iter:
            size_key = sizes if np.isscalar(sizes) else sizes.tobytes()
            key = (id(pairs), size_key)
            c = self._step_cost.get(key)
            if c is None:
                w = np.broadcast_to(np.asarray(sizes, dtype=float), (len(pairs),))[pairs.entry_flow]
                c = self._step_cost[key] = busiest(w, pairs.entry_link, self.topo.capacity) if len(pairs) else 0.0
            transfer += c
            if latency is None:
                route += pairs.latency
                if pairs.net_share >= 0:
                    per_hw[pairs.hw] += 1 - pairs.net_share
                    per_hw[2] += pairs.net_share
                else:
                    per_hw[pairs.hw] += 1
            else:
                explicit += latency
        return explicit, route, per_hw, transfer

    def _apply(self, pc: ProtocolCost, step_iter):
        """The protocol's costs on the algorithm's steps: the base latency first (one empty step), each step's
        latency + the protocol's extra per hop, bytes x stretch (collectives.protocols)."""
        if pc.base_s > 0:
            yield self._empty, 0.0, pc.base_s
        for pairs, sizes, latency in step_iter:
            if latency is None:
                latency = pairs.latency + _hop_extra(pc, pairs)
            yield pairs, (sizes * pc.stretch if pc.stretch != 1.0 else sizes), latency

    def _calibrated_steps(self, op, group, nbytes, root, cal):
        alpha, bandwidth = cal
        name = "direct" if op == "all_to_all" else "ring"
        n = len(group)
        n_steps, factor = ring_cost(op, n)
        if n_steps == 0:
            return name, iter(())
        order = sorted(group)
        pairs = self.pairs(("calibrated", tuple(order)), lambda: [(order[i], order[(i + 1) % n]) for i in range(n)])
        link_bw = float(np.min(self.topo.capacity[pairs.entry_link]))
        per_step = factor * nbytes / n_steps * link_bw / bandwidth

        def gen():
            for _ in range(n_steps):
                yield pairs, per_step, alpha
        return name, gen()


def busiest(weights: np.ndarray, entry_link: np.ndarray, capacity: np.ndarray) -> float:
    """max over links of (bytes on the link / its capacity), over the links the step uses only (a cluster of
    10^5 GPUs has ~10^6 links: counting every link per step made the cost grow with the world size). The sums
    are those of a bincount over every link (the same entries added in the same order): the same number."""
    links, at = np.unique(entry_link, return_inverse=True)
    return float(np.max(np.bincount(at, weights=weights, minlength=len(links)) / capacity[links]))


def _hop_extra(pc: ProtocolCost, pairs: Pairs) -> float:
    """The protocol's extra latency for one step: by the step's hw class, or mixed by its share of hops across
    nodes (a ring, ring.py)."""
    if pairs.net_share < 0:
        return pc.hop_extra_s[pairs.hw]
    return (1 - pairs.net_share) * pc.hop_extra_s[pairs.hw] + pairs.net_share * pc.hop_extra_s[2]


def _time(pc: ProtocolCost, parts) -> float:
    explicit, route, per_hw, transfer = parts
    extra = sum(count * pc.hop_extra_s[hw] for hw, count in enumerate(per_hw))
    return pc.base_s + explicit + route + extra + transfer * pc.stretch

