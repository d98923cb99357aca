"""The symmetry at scale (issue 39 item 7): what sim/kernel/subgroups.py expands does not grow with the world size
(a group's images renamed in order from a base: sim/kernel/orbits.py), and the renamings it uses are the plain
ones (images from every element, links from the renamed routes). Small meshes: the 131,072-GPU step itself is
benchmarks/reproduce_speed.py's."""
from dataclasses import replace

import numpy as np
import pytest

from distlab.sim import scenario as sc
from distlab.sim.cluster import load_cluster
from distlab.sim.collectives.context import Context
from distlab.sim.kernel import subgroups
from distlab.sim.kernel.engine import simulate
from distlab.sim.kernel.equivariance import Shifts
from distlab.sim.kernel.network import Topology
from distlab.sim.kernel.orbits import images_of, link_renamer

LLAMA = {"preset": "llama3-8b", "layers": 1, "seq_len": 64, "micro_batch": 1}


def _plan(nodes: int):
    d = {"model": LLAMA, "mesh": {"dp": nodes, "tp": 8}, "tp": {}, "cluster": "dgx-h100", "nodes": nodes}
    return sc.build(sc.validate(d, "s"))


def test_expansions_do_not_grow_with_the_world_size(monkeypatch):
    calls = []
    real = subgroups._expand
    monkeypatch.setattr(subgroups, "_expand", lambda *a: calls.append(a[2]) or real(*a))
    counts = []
    for nodes in (4, 16):
        r = _plan(nodes)
        calls.clear()
        classes = subgroups.find_classes(r.plan, Context(Topology(r.cluster)))
        assert classes is not None and len(classes.reps) == 1
        counts.append((len(calls), max(len(g) for g in calls)))
    # tp groups (one node): a base per orbit, the other nodes' renamed; the dp group spans the world
    assert counts[0][0] == counts[1][0] and counts[1][1] == 16


def test_renamed_images_give_the_full_simulation():
    r = _plan(8)
    once = simulate(r.plan, r.cluster, record_transfers=False)
    full = simulate(r.plan, r.cluster, record_transfers=False, symmetric=False)
    assert once.makespan == pytest.approx(full.makespan, rel=1e-9)
    assert [o.end for o in once.ops[:50]] == pytest.approx([o.end for o in full.ops[:50]], rel=1e-9)


@pytest.mark.parametrize("group", [(0, 1), (0, 8, 16, 24), (3, 11, 19, 27), tuple(range(8, 16)), (0, 9, 18)])
def test_images_are_those_of_every_element_in_the_same_order(group):
    shifts = Shifts(nodes=8, gpus=8, node_step=1, local_step=2, block=4, block_step=1)
    elements = shifts.elements()
    arr = np.array(group)
    plain = {tuple(np.sort(shifts.apply_array(e, arr)).tolist()): e for e in reversed(elements)}
    got = images_of(shifts, elements, group)
    assert list(got.items()) == list(plain.items())


@pytest.mark.parametrize("fabric", ["rail-optimized", "fat-tree"])
def test_links_renamed_as_the_routes_of_the_renamed_ranks(fabric):
    c = load_cluster("dgx-h100", nodes=8)
    c = replace(c, inter_node=replace(c.inter_node, fabric=fabric, oversubscription=2.0, nodes_per_leaf=2))
    topo = Topology(c)
    shifts = Shifts(nodes=8, gpus=8, node_step=2, local_step=1)
    pairs = [(0, 9), (3, 60), (12, 13), (7, 40), (33, 2)]
    links = sorted({link for p in pairs for link in topo.route(*p)})
    renamer = link_renamer(topo, links)
    for e in ((2, 0, 0), (4, 0, 3), (0, 0, 5)):
        want = {link for a, b in pairs for link in topo.route(shifts.apply(e, a), shifts.apply(e, b))}
        assert renamer(lambda ranks: shifts.apply_array(e, ranks)) == want
