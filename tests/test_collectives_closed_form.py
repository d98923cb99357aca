"""Simulated time equals each algorithm's closed-form α-β cost on an uncontended topology (rel. error < 1e-6)."""
import math

import pytest

from distlab.sim.collectives import num_chunks
from distlab.sim.collectives.nvls import NVLS_LATENCY_S
from distlab.sim.engine import simulate_collective
from tests.conftest import multi_node, one_node

NS = [2, 3, 5, 8, 64]
SIZES = [1, 1000, (1 << 20) + 3, 1 << 30]
ALPHA, BW = 2e-6, 100e9          # one_node(): 2 us per hop, 100 GB/s per GPU per direction
BETA = 1 / BW


def sim_time(op, n, size, algo, cluster=None, root=0):
    trace, used = simulate_collective(op, size, cluster or one_node(n), algo, root)
    assert used == algo
    return trace.makespan


def close(a, b):
    return abs(a - b) <= 1e-6 * max(abs(b), 1e-30)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", SIZES)
def test_ring(n, size):
    # Thakur, Rabenseifner & Gropp 2005
    assert close(sim_time("all_reduce", n, size, "ring"), 2 * (n - 1) * (ALPHA + size / n * BETA))
    assert close(sim_time("all_gather", n, size, "ring"), (n - 1) * (ALPHA + size / n * BETA))
    assert close(sim_time("reduce_scatter", n, size, "ring"), (n - 1) * (ALPHA + size / n * BETA))
    assert close(sim_time("barrier", n, size, "ring"), 2 * (n - 1) * ALPHA)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", ["broadcast", "reduce"])
def test_pipelined_chain(n, size, op):
    k = 1 if n == 2 else max(1, min(64, math.ceil(size / 2**20)))
    root = n - 1
    assert close(sim_time(op, n, size, "ring", root=root), (n - 2 + k) * (ALPHA + size / k * BETA))


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", SIZES)
def test_direct_all_to_all(n, size):
    assert close(sim_time("all_to_all", n, size, "direct"), ALPHA + (n - 1) / n * size * BETA)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", SIZES)
def test_double_binary_tree(n, size):
    D = int(math.floor(math.log2(n)))
    k = max(1, min(64, math.ceil(size / 2 / 2**20)))
    c = size / (2 * k)
    steps = 2 * (D + k - 1)
    single = steps if n == 2 else (2 if n == 2 ** D else 0)   # steps whose busiest link carries one chunk
    expected = steps * ALPHA + (2 * steps - single) * c * BETA
    assert close(sim_time("all_reduce", n, size, "tree"), expected)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", SIZES)
def test_nvls(n, size):
    k = max(1, min(64, math.ceil(size / 2**20)))
    expected = (k + 1) * (NVLS_LATENCY_S + (n + 1) / (n * k) * size * BETA)
    assert close(sim_time("all_reduce", n, size, "nvls", one_node(n, nvls=True)), expected)


@pytest.mark.parametrize("nodes,g", [(2, 1), (3, 1), (5, 1), (2, 4), (8, 8)])
@pytest.mark.parametrize("size", SIZES)
def test_hierarchical(nodes, g, size):
    ai, bi, ae, be = 2e-6, 1 / 100e9, 7e-6, 1 / 10e9
    expected = 2 * (g - 1) * (ai + size / g * bi) + 2 * (nodes - 1) * (ae + size / (g * nodes) * be)
    assert close(sim_time("all_reduce", nodes * g, size, "hierarchical", multi_node(nodes, g)), expected)


def test_num_chunks_rule():
    assert num_chunks(1) == 1 and num_chunks(2**20) == 1 and num_chunks(2**20 + 1) == 2 and num_chunks(2**40) == 64


def test_auto_picks_the_fastest():
    c = one_node(8, nvls=True)
    for size in (8, 2**30):
        times = {a: sim_time("all_reduce", 8, size, a, c) for a in ("ring", "tree", "nvls")}
        trace, used = simulate_collective("all_reduce", size, c, "auto")
        assert used == min(times, key=times.get)
        assert close(trace.makespan, min(times.values()))
    # small messages favour the log-depth tree, large ones NVLS
    assert simulate_collective("all_reduce", 8, c, "auto")[1] != "nvls"
    assert simulate_collective("all_reduce", 2**30, c, "auto")[1] == "nvls"
