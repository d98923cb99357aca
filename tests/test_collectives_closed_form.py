"""Simulated time equals each algorithm's closed-form cost on an uncontended topology (rel. error < 1e-6).

Every formula is t = B + (steps paying a hop) x (α + Δ) + bytes on the busiest link x β / e, with NCCL's per-call
terms of the protocol (sim/collectives/protocols.py): B the base latency, Δ the protocol's extra per hop, e its
efficiency. The constants below are NCCL 2.30.7's (src/graph/tuning.cc), written out here, not imported.
"""
import math

import pytest

from distlab.sim.collectives import num_chunks
from distlab.sim.kernel.engine import simulate_collective
from tests.conftest import multi_node, one_node

NS = [2, 3, 5, 8, 64]
SIZES = [1, 1000, (1 << 20) + 3, 1 << 30]
ALPHA, BW = 2e-6, 100e9          # one_node(): 2 us per hop, 100 GB/s per GPU per direction
BETA = 1 / BW
US = 1e-6
# (B, Δ over NVLink, e) per protocol: baseLatencies, hwLatencies[NVLINK] - hwLatencies[NVLINK][Ring][LL] (0.6),
# bandwidth factors (LL 0.5 capped at llMaxBw 141 GB/s on one Hopper node: 141/100 > 0.5, so 0.5).
RING = {"LL": (6.6 * US, 0.0, 0.5), "LL128": (14.0 * US, 1.3 * US, 0.92), "Simple": (8.4 * US, 2.8 * US, 1.0)}
TREE = {"LL": (6.8 * US, 0.0, 0.92 / 3.8), "LL128": (14.0 * US, 0.65 * US, 0.92 * 7 / 9),
        "Simple": (8.4 * US, 3.4 * US, 0.92)}
NVLS_B, NVLS_E = 25 * US, 0.85     # NVLS latency; nvlsEfficiency (Hopper)
# treeCorrectionFactor (tuning.cc:623-627): a tree all_reduce's e x CORRECTION[proto][log2(S / 64 B)], 1 beyond
CORRECTION = {"LL": (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1, 1),
              "LL128": (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1, 1),
              "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9)}


def corrected(proto, size):
    i = int(math.log2(size // 64)) if size >= 64 else None
    return 1.0 if i is None or i >= 24 else CORRECTION[proto][i]


def sim_time(op, n, size, algo, cluster=None, root=0, proto="auto"):
    trace, used = simulate_collective(op, size, cluster or one_node(n), algo, root, protocol=proto)
    assert used == algo
    return trace.makespan


def close(a, b, rel=1e-6):
    return abs(a - b) <= rel * max(abs(b), 1e-30)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("proto", sorted(RING))
def test_ring(n, size, proto):
    # Thakur, Rabenseifner & Gropp 2005, with NCCL's protocol terms
    B, d, e = RING[proto]
    a = ALPHA + d
    assert close(sim_time("all_reduce", n, size, "ring", proto=proto), B + 2 * (n - 1) * (a + size / n * BETA / e))
    assert close(sim_time("all_gather", n, size, "ring", proto=proto), B + (n - 1) * (a + size / n * BETA / e))
    assert close(sim_time("reduce_scatter", n, size, "ring", proto=proto), B + (n - 1) * (a + size / n * BETA / e))
    assert close(sim_time("barrier", n, size, "ring", proto=proto), B + 2 * (n - 1) * a)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", ["broadcast", "reduce"])
def test_pipelined_chain(n, size, op):
    k = 1 if n == 2 else max(1, min(64, math.ceil(size / 2**20)))
    B, d, e = RING["Simple"]
    assert close(sim_time(op, n, size, "ring", root=n - 1, proto="Simple"),
                 B + (n - 2 + k) * (ALPHA + d + size / k * BETA / e))


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", SIZES)
def test_direct_all_to_all(n, size):
    B, d, _ = RING["Simple"]
    assert close(sim_time("all_to_all", n, size, "direct"), B + ALPHA + d + (n - 1) / n * size * BETA)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("proto", sorted(TREE))
def test_tree_of_two_overlaps_reduce_and_broadcast(size, proto):
    # n = 2: both trees are one edge; with the phases overlapped each link carries S once: 2α + S·β
    B, d, e = TREE[proto]
    e *= corrected(proto, size)
    assert close(sim_time("all_reduce", 2, size, "tree", proto=proto), B + 2 * (ALPHA + d) + size * BETA / e)


@pytest.mark.parametrize("n", [3, 5, 8, 64])
def test_tree_latency_and_bandwidth(n):
    # one node: NCCL's tree is two opposite chains of depth n-1; latency is paid per level, 2(n-1) hops
    B, d, e = TREE["LL"]
    assert close(sim_time("all_reduce", n, 1, "tree", proto="LL"), B + 2 * (n - 1) * (ALPHA + d), rel=1e-3)
    # large sizes: a chain rank sends 4 chunks of S/2k a step, so t -> 2·S·β / e (+ the pipeline fill)
    size = 1 << 30
    t = sim_time("all_reduce", n, size, "tree", proto="Simple")
    k = num_chunks(size / 2)
    bw_part = t - TREE["Simple"][0] - 2 * (n - 1) * (ALPHA + TREE["Simple"][1])
    assert 2 * size * BETA / 0.92 <= bw_part * (1 + 1e-9) <= 2 * size * BETA / 0.92 * (k + 2 * n) / k


def test_tree_overlap_beats_sequential_phases():
    # sequential reduce then broadcast would pay 2(D + k - 1) hop latencies; overlapped only 2D
    n, size = 8, 64 << 20
    k = num_chunks(size / 2)
    t = sim_time("all_reduce", n, size, "tree", one_node(n, latency_us=50.0), proto="Simple")
    sequential_latency = 2 * (n - 1 + k - 1) * 50e-6
    assert t < sequential_latency


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", SIZES)
def test_nvls(n, size):
    # base latency once per call (NCCL: 25 us); the 2 fill steps pay the hop latency of their links (the
    # up-link's α, down-links have none), so α with one chunk, 2α with more; (k+1)/k fill cost
    k = max(1, min(64, math.ceil(size / 2**20)))
    expected = NVLS_B + (1 if k == 1 else 2) * ALPHA + (k + 1) / k * (n + 1) / n * size * BETA / NVLS_E
    assert close(sim_time("all_reduce", n, size, "nvls", one_node(n, nvls=True)), expected)


@pytest.mark.parametrize("nodes", [2, 3, 5, 8, 64])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_pat(nodes, size, op):
    # Bruck: ceil(log2 n) steps, n-1 blocks of S/n in all; NCCL: base 8 us + 2.8 us x n, bandwidth x 0.75
    ae, be = 7e-6, 1 / 10e9
    expected = 8 * US + 2.8 * US * nodes + math.ceil(math.log2(nodes)) * ae + (nodes - 1) / nodes * size * be / 0.75
    assert close(sim_time(op, nodes, size, "pat", multi_node(nodes, 1)), expected)


@pytest.mark.parametrize("nodes,g", [(2, 1), (3, 1), (5, 1), (2, 4), (8, 8)])
@pytest.mark.parametrize("size", SIZES)
def test_hierarchical(nodes, g, size):
    # Simple: +2.8 us per NVLink hop and +11.3 us per network hop (hwLatencies Ring Simple - Ring LL)
    ai, bi, ae, be = 2e-6 + 2.8 * US, 1 / 100e9, 7e-6 + 11.3 * US, 1 / 10e9
    expected = 8.4 * US + 2 * (g - 1) * (ai + size / g * bi) + 2 * (nodes - 1) * (ae + size / (g * nodes) * be)
    assert close(sim_time("all_reduce", nodes * g, size, "hierarchical", multi_node(nodes, g), proto="Simple"),
                 expected)


def test_num_chunks_rule():
    assert num_chunks(1) == 1 and num_chunks(2**20) == 1 and num_chunks(2**20 + 1) == 2 and num_chunks(2**40) == 64


def test_auto_picks_the_fastest_pair():
    c = one_node(8, nvls=True)
    for size in (8, 2**20, 2**30):
        times = {(a, p): sim_time("all_reduce", 8, size, a, c, proto=p)
                 for a, p in [("ring", "LL"), ("ring", "LL128"), ("ring", "Simple"), ("tree", "LL"),
                              ("tree", "LL128"), ("tree", "Simple"), ("nvls", "Simple")]}
        trace, used = simulate_collective("all_reduce", size, c, "auto")
        assert (used, trace.meta["protocols"][0]) == min(times, key=times.get)
        assert close(trace.makespan, min(times.values()))


@pytest.mark.parametrize("g", [2, 4])
@pytest.mark.parametrize("size", SIZES)
def test_nvls_tree_two_nodes(g, size):
    # 6 pipeline stages per chunk (u = S/k): 0 GPU->switch u, 1 switch->GPU u/g, 2 tree up and 3 tree down on the
    # rail NICs (u/2g per tree; with 2 nodes each NIC carries one up and one down flow), 4 GPU->switch u/g,
    # 5 switch->GPU u. A step costs its busiest link; fill steps (t < 6) pay the route latency, those using the
    # network NCCL's NVLSTree extra (20.9 - 2.7 us). B = 25 us, e = 0.85.
    from dataclasses import replace
    c = multi_node(2, g)
    c = replace(c, intra_node=replace(c.intra_node, nvls=True))
    k = max(1, min(64, math.ceil(size / 2**20)))
    u, bi, be = size / k, 1 / 100e9, 1 / 10e9
    expected = NVLS_B
    for t in range(6 + k - 1):
        on = [s for s in range(6) if 0 <= t - s <= k - 1]
        up = (u if 0 in on else 0) + (u / g if 4 in on else 0)
        down = (u / g if 1 in on else 0) + (u if 5 in on else 0)
        nic = u / (2 * g) * ((2 in on) + (3 in on))
        expected += max(up * bi, down * bi, nic * be) / NVLS_E
        if t < 6:
            net = 2 in on or 3 in on
            expected += (7e-6 + 18.2 * US) if net else (2e-6 if (0 in on or 4 in on) else 0.0)
    assert close(sim_time("all_reduce", 2 * g, size, "nvls_tree", c), expected)


@pytest.mark.parametrize("nodes, cap", [(1, 141.0), (2, 39.0), (4, 20.4)])
def test_ring_ll_bus_bandwidth_stays_under_ncclS_llmaxbw(nodes, cap):
    # tuning.cc: ring LL busBw = min(llMaxBw, 0.5 x nChannels x bw), bw = bwIntra on up to 2 nodes: across 2 nodes
    # LL moves at most 39 GB/s of busbw (Intel row), not half the NICs' rate (sim/collectives/protocols.py). The
    # cap is a fraction of NVLink's bus bandwidth, as NCCL's; the simulated 2-node ring moves up to 10% more.
    from distlab.sim.cluster import load_cluster
    c = load_cluster("dgx-h100").with_world_size(8 * nodes)
    n, size = 8 * nodes, 1 << 30
    trace, _ = simulate_collective("all_reduce", size, c, "ring", protocol="LL")
    busbw = size / trace.makespan * 2 * (n - 1) / n / 1e9
    assert 0.75 * cap < busbw <= 1.1 * cap
