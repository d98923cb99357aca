"""Flows that share a link slow each other down (max-min fair); oversubscribed fat-trees slow inter-node rings."""
import numpy as np
import pytest

from distlab.sim.kernel.engine import simulate, simulate_collective
from distlab.sim.kernel.network import max_min_rates
from distlab.sim.plan import Plan, Recv, Send
from tests.conftest import multi_node, one_node

S = 64 * 2**20


def p2p_plan(pairs, n):
    ranks = [[] for _ in range(n)]
    for i, (a, b) in enumerate(pairs):
        ranks[a].append(Send(peer=b, bytes=S, stream=f"s{i}"))
        ranks[b].append(Recv(peer=a, bytes=S, stream=f"r{i}"))
    return Plan(ranks).validate()


def test_two_flows_into_one_link_take_twice_as_long():
    c = one_node(4, latency_us=0.0)
    alone = simulate(p2p_plan([(0, 2)], 4), c).makespan
    shared = simulate(p2p_plan([(0, 2), (1, 2)], 4), c)      # both cross gpu2.down
    assert alone == pytest.approx(S / 100e9, rel=1e-9)
    for rec in shared.ops:
        assert rec.end - rec.launch == pytest.approx(2 * alone, rel=1e-9)
    disjoint = simulate(p2p_plan([(0, 2), (1, 3)], 4), c).makespan
    assert disjoint == pytest.approx(alone, rel=1e-9)


def test_unequal_flows_release_bandwidth_when_one_ends():
    # flow a: 0->2 with S bytes, flow b: 1->2 with S/2 bytes. Both at B/2 until b ends at S/B, then a at B.
    c = one_node(3, latency_us=0.0)
    plan = Plan([[Send(peer=2, bytes=S, stream="x")], [Send(peer=2, bytes=S // 2, stream="x")],
                 [Recv(peer=0, bytes=S, stream="a"), Recv(peer=1, bytes=S // 2, stream="b")]]).validate()
    t = simulate(plan, c)
    ends = {o.rank: o.end for o in t.ops if o.kind == "send"}
    assert ends[1] == pytest.approx(S / 100e9, rel=1e-9)
    assert ends[0] == pytest.approx(1.5 * S / 100e9, rel=1e-9)


def test_max_min_gives_leftover_to_unconstrained_flows():
    # link 0 cap 10 shared by flows 0,1; link 1 cap 100 used by flows 1,2 -> rates 5, 5, 95
    rates = max_min_rates(np.array([10.0, 100.0]), np.array([0, 1, 1, 2]), np.array([0, 0, 1, 1]), 3)
    assert rates == pytest.approx([5, 5, 95])


@pytest.mark.parametrize("oversub", [1, 2, 4])
def test_fat_tree_oversubscription_slows_inter_node_ring(oversub):
    """Ring all-reduce over 2 nodes x 8 GPUs, 8 channels: each step 8 channel flows leave a node. The node
    uplink carries nics x B / o, so each flow gets min(B, 8 B / (o x 8)) = B / o. With NVLink much faster than
    the NICs: t = B_simple + 2(n-1) (α + S/(n C) / (B/o)), with NCCL's Simple-protocol terms (issue 14): base
    8.4 us, and a ring step's α the mean hop along a chunk's path, 1 of 15 hops crossing nodes (7 us + 11.3 us
    Simple extra), 14 inside (0 + 2.8 us)."""
    n, C, B = 16, 8, 10e9
    s = 1 / 15
    a = s * (7e-6 + 11.3e-6) + (1 - s) * 2.8e-6
    c = multi_node(2, 8, intra_gbps=10_000.0, intra_us=0.0, inter_gbps=10.0, inter_us=7.0, fabric="fat-tree",
                   oversubscription=oversub)
    t = simulate_collective("all_reduce", S, c, "ring", protocol="Simple")[0].makespan
    expected = 8.4e-6 + 2 * (n - 1) * (a + S / (n * C) / (B / oversub))
    assert t == pytest.approx(expected, rel=1e-6)


def test_concurrent_collectives_share_links():
    """Two all-reduces on disjoint groups that share no link run as fast as one; on the same GPUs, slower."""
    c = one_node(4, latency_us=0.0)
    from distlab.sim.plan import Collective
    one = simulate(Plan([[Collective("all_reduce", S, group=(0, 1))]] * 2 + [[]] * 2).validate(), c).makespan
    both = Plan([[Collective("all_reduce", S, group=(0, 1))]] * 2 + [[Collective("all_reduce", S, group=(2, 3))]] * 2)
    assert simulate(both.validate(), c).makespan == pytest.approx(one, rel=1e-9)
    same = Plan([[Collective("all_reduce", S, group=(0, 1), stream="a"),
                  Collective("all_reduce", S, group=(0, 1, 2, 3), stream="b")]] * 2
                + [[Collective("all_reduce", S, group=(0, 1, 2, 3), stream="b")]] * 2)
    assert simulate(same.validate(), c).makespan > one * 1.2
