"""One job's view of the shared fabric: its ranks 0..n-1 on the nodes it was given, the links of the whole cluster.

    topo = Topology(cluster)                         # every link of the cluster, once
    view = JobFabric(topo, (4, 5, 12, 13))           # a job on four nodes: its rank 8 is GPU 0 of node 12
    view.route(0, 8)                                 # -> (node4.nic0.up, leaf0.up, leaf1.down, node12.nic0.down)

The job's plan, collectives and algorithm choice see a cluster of its own nodes (``view.cluster``: the cluster with
``len(nodes)`` nodes, as NCCL sees a communicator of those ranks); every route is the physical one, named and
sized as the cluster's links, so the flows of every job on one Network share links max-min fairly.

Symmetry (sim/kernel/subgroups.py asks ``keeps``): a renaming of the job's nodes and local ranks is an automorphism
of what the job sees when it maps the job's nodes under each leaf onto the job's nodes under one leaf (the
leaves alike: equal uplinks), and when it fixes every leaf link in ``shared`` (a link another job's flows also
use): those flows are not renamed with the job's, so a renaming that moved the job's traffic off such a link
would equate timelines that sharing makes different. GPU and NIC links are the job's alone (jobs take whole
nodes), so only leaf links can be shared.
"""
from __future__ import annotations

from dataclasses import replace

from distlab.sim.kernel.network import SWITCH, Topology, maps_blocks, node_map


class JobFabric:
    """``nodes[i]`` is the physical node of the job's node i; ``shared``: link ids another job also uses."""

    def __init__(self, topo: Topology, nodes: tuple[int, ...], shared: frozenset = frozenset()):
        self.physical_topology, self.nodes, self.shared = topo, tuple(nodes), frozenset(shared)
        self.cluster = replace(topo.cluster, nodes=len(self.nodes))
        self.names, self.capacity, self.latency = topo.names, topo.capacity, topo.latency
        self.nodes_per_leaf = topo.nodes_per_leaf
        self._g = topo.cluster.gpus_per_node
        self._info: dict = {}
        self._leaf_links = {link: (*key, "up") for key, link in topo._leaf_up.items()}
        self._leaf_links.update({link: (*key, "down") for key, link in topo._leaf_down.items()})
        self.leaf_links = frozenset(self._leaf_links)
        leaves = [self.leaf_of(n) for n in range(len(self.nodes))]
        order = {leaf: i for i, leaf in enumerate(dict.fromkeys(leaves))}
        self._canon = {leaf: i for leaf, i in order.items()}
        self._leaf_at = {i: leaf for leaf, i in order.items()}
        # the job's fabric up to renaming leaves (all alike): equal patterns, equal simulations alone
        self.pattern = (len(self.nodes), tuple(order[x] for x in leaves) if self.nodes_per_leaf else None)

    def physical(self, rank: int) -> int:
        """The cluster's GPU that runs the job's ``rank``."""
        if rank == SWITCH:
            return rank
        node, local = divmod(rank, self._g)
        return self.nodes[node] * self._g + local

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        return self.physical_topology.route(self.physical(src), self.physical(dst))

    def route_info(self, src: int, dst: int) -> tuple[tuple[int, ...], float, bool]:
        info = self._info.get((src, dst))
        if info is None:
            info = self._info[src, dst] = self.physical_topology.route_info(self.physical(src), self.physical(dst))
        return info

    def rail(self, rank: int) -> int:
        return self.physical_topology.rail(rank)

    def canonical(self, links) -> frozenset:
        """Leaf links as (the job's leaf index by first use, rail, up/down): the same on every placement of the
        same pattern (``translate`` maps them back)."""
        out = set()
        for link in links:
            leaf, rail, way = self._leaf_links[link]
            out.add((self._canon[leaf], rail, way))
        return frozenset(out)

    def translate(self, canonical) -> frozenset:
        """Link ids of ``canonical`` leaf links (``canonical``'s inverse) on this placement."""
        topo = self.physical_topology
        return frozenset((topo._leaf_up if way == "up" else topo._leaf_down)[self._leaf_at[i], rail]
                         for i, rail, way in canonical)

    def leaf_of(self, node: int) -> int | None:
        """The leaf switch of the job's node ``node``."""
        return self.physical_topology.leaf_of(self.nodes[node])

    def keeps(self, shifts) -> bool:
        """Does every renaming of ``shifts`` (on the job's nodes) map the job's fabric onto itself and fix every
        shared link (module docstring)?"""
        if not self.nodes_per_leaf:
            return True
        rails = self.physical_topology.cluster.inter_node.nics_per_node
        for e in shifts.generators():
            image = node_map(shifts, e)
            if not maps_blocks(image, self.leaf_of):
                return False
            leaf_image = {self.leaf_of(n): self.leaf_of(m) for n, m in enumerate(image)}
            for link in self.shared:
                leaf, rail, _ = self._leaf_links.get(link, (None, None, None))
                if leaf not in leaf_image:
                    continue                 # not a leaf link, or a leaf without the job's nodes
                if leaf_image[leaf] != leaf or (rail is not None and e[2] % rails):
                    return False
        return True
