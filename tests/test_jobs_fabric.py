"""Leaf switches under a spine layer (sim/kernel/network.py, InterNode.nodes_per_leaf): the routes, the capacity of
a leaf's uplink, and the symmetric reductions that stay exact on such a fabric (only renamings that map leaves
onto leaves: Topology.keeps)."""
from dataclasses import replace

import pytest

from distlab.sim.cluster import cluster_from_dict
from distlab.sim.errors import ConfigError
from distlab.sim.kernel.engine import simulate
from distlab.sim.kernel.equivariance import Shifts
from distlab.sim.kernel.network import Topology
from distlab.sim.plan import Collective, Plan
from distlab.sim.trace import RankCopies
from tests.conftest import multi_node


def leafy(nodes, g, per_leaf, oversubscription=2.0, fabric="fat-tree", nics=None):
    c = multi_node(nodes, g, inter_gbps=10.0, fabric=fabric, nics=nics)
    return replace(c, inter_node=replace(c.inter_node, nodes_per_leaf=per_leaf, oversubscription=oversubscription))


def test_routes_cross_a_leaf_uplink_only_between_leaves():
    topo = Topology(leafy(6, 2, 3, oversubscription=4.0))
    names = lambda a, b: [topo.names[l] for l in topo.route(a, b)]      # noqa: E731
    assert names(0, 4) == ["node0.nic0.up", "node2.nic0.down"]            # nodes 0 and 2: one leaf
    assert names(0, 6) == ["node0.nic0.up", "leaf0.up", "leaf1.down", "node3.nic0.down"]
    up = topo.names.index("leaf0.up")
    assert topo.capacity[up] == pytest.approx(3 * 2 * 10e9 / 4)           # 3 nodes x 2 NICs x 10 GB/s over 4:1
    rail = Topology(leafy(6, 2, 3, oversubscription=4.0, fabric="rail-optimized"))
    # PXN: the data crosses to the destination's rail inside the node, then that rail's leaves
    assert [rail.names[l] for l in rail.route(0, 7)] == ["node0.nic1.up", "leaf0.rail1.up", "leaf1.rail1.down",
                                                          "node3.nic1.down"]
    assert rail.capacity[rail.names.index("leaf1.rail0.down")] == pytest.approx(3 * 10e9 / 4)
    flat = Topology(leafy(6, 2, 3, oversubscription=1.0))                # non-blocking: no leaf links at all
    assert not any(n.startswith("leaf") for n in flat.names)


def test_leaf_size_is_checked():
    d = {"name": "x", "nodes": 2, "gpus_per_node": 8, "gpu": "h100", "intra_node": {},
         "inter_node": {"nodes_per_leaf": -1}}
    with pytest.raises(ConfigError, match="inter_node.nodes_per_leaf: -1 must be a whole number of nodes >= 0"):
        cluster_from_dict(d)


def test_only_renamings_that_map_leaves_onto_leaves_are_kept():
    topo = Topology(leafy(6, 2, 3))
    assert topo.keeps(Shifts(6, 2, 3, 2)) and topo.keeps(Shifts(6, 2, 6, 1))
    assert not topo.keeps(Shifts(6, 2, 2, 2)) and not topo.keeps(Shifts(6, 2, 1, 2))
    assert Topology(leafy(6, 2, 0)).keeps(Shifts(6, 2, 1, 1))


def test_symmetric_simulation_stays_exact_where_leaves_break_node_shifts():
    """Pairs of nodes (0,1), (2,3), (4,5) all-reduce over same-local-rank ranks. Node shifts by 2 map the plan onto
    itself, but with leaves {0,1,2} and {3,4,5} pair (2,3) crosses the oversubscribed spine and the others do not:
    the reduced simulation must not copy pair (0,1)'s times onto it."""
    cluster = leafy(6, 2, 3, oversubscription=4.0)
    ranks = []
    for r in range(12):
        node, local = divmod(r, 2)
        first = node - node % 2
        ranks.append([Collective("all_reduce", 64 << 20, group=(first * 2 + local, (first + 1) * 2 + local))])
    plan = Plan(ranks).validate()
    once, full = simulate(plan, cluster, record_transfers=False), simulate(plan, cluster, symmetric=False)
    assert isinstance(once.ops, RankCopies)               # local rotations are kept: half the ranks simulated
    ends = {o.rank: o.end for o in full.ops}
    assert ends[4] > 1.25 * ends[0]                       # the pair across leaves is slower
    assert [o.end for o in once.ops] == pytest.approx([o.end for o in full.ops], rel=1e-9)
