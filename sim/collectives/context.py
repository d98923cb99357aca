"""What collective algorithms share: the topology, cached flow patterns, algorithm choice, calibration."""
from __future__ import annotations

import numpy as np

from distlab.sim.collectives import ring_cost, steps as algorithm_steps, supported
from distlab.sim.errors import ConfigError
from distlab.sim.network import Pairs, Topology

ALGORITHM_ORDER = ("ring", "tree", "hierarchical", "nvls", "direct")


class Context:
    def __init__(self, topo: Topology):
        self.topo = topo
        self.cluster = topo.cluster
        self._pairs: dict = {}
        self._estimates: dict = {}
        self._step_cost: dict = {}

    def pairs(self, key, make) -> Pairs:
        """One Pairs object per distinct flow pattern (``make()`` returns the (src, dst) list)."""
        p = self._pairs.get(key)
        if p is None:
            p = self._pairs[key] = Pairs.build(self.topo, make())
        return p

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
    def expand(self, op: str, group: tuple[int, ...], nbytes: float, algorithm: str, root: int = 0):
        """(algorithm used, steps). Calibrated clusters run the ring (or direct) with fitted α and bandwidth."""
        n = len(group)
        cal = self.calibrated(op, n, nbytes)
        if cal is not None:
            return self._calibrated_steps(op, group, nbytes, root, cal)
        if algorithm == "auto":
            algorithm = self.choose(op, group, nbytes, root)
        return algorithm, algorithm_steps(self, op, group, nbytes, algorithm, root)

    def choose(self, op: str, group, nbytes: float, root: int = 0) -> str:
        """`auto`: the algorithm with the lowest uncontended estimate for this size and cluster."""
        key = (op, tuple(group), nbytes, root)
        if key in self._estimates:
            return self._estimates[key]
        best, best_t = None, float("inf")
        for name in ALGORITHM_ORDER:
            if not supported(op)[name]:
                continue
            try:
                t = self.estimate(algorithm_steps(self, op, group, nbytes, name, root))
            except ConfigError:
                continue
            if t < best_t - 1e-15:
                best, best_t = name, t
        self._estimates[key] = best
        return best

    def estimate(self, step_iter) -> float:
        """Uncontended time of a step sequence: each step costs its latency plus the busiest link's bytes over
        its capacity (exact when a step's flows on a link are equal in size)."""
        total = 0.0
        for pairs, sizes, latency in step_iter:
            size_key = sizes if np.isscalar(sizes) else sizes.tobytes()
            key = (id(pairs), size_key)
            cost = self._step_cost.get(key)
            if cost is None:
                w = np.broadcast_to(np.asarray(sizes, dtype=float), (len(pairs),))[pairs.entry_flow]
                load = np.bincount(pairs.entry_link, weights=w, minlength=len(self.topo.capacity))
                cost = self._step_cost[key] = float(np.max(load / self.topo.capacity))
            total += (pairs.latency if latency is None else latency) + cost
        return total

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
