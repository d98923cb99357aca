"""Presets reproduce published large-message ring all-reduce bus bandwidth."""
import pytest

from distlab.sim.cluster import PRESETS, load_cluster
from distlab.sim.collectives import metrics
from distlab.sim.engine import simulate_collective

GiB = 2**30


def busbw(cluster, size=4 * GiB, algo="ring"):
    t, _ = simulate_collective("all_reduce", size, cluster, algo)
    return metrics("all_reduce", cluster.world_size, size, t.makespan)["busbw_GBps"]


def test_dgx_h100_ring_busbw():
    # nccl-tests on 8 x H100 SXM: ~370 GB/s all_reduce busbw at 2-4 GB (NCCL tuning.cc: 18 x 20.6 GB/s)
    assert busbw(load_cluster("dgx-h100")) == pytest.approx(370, rel=0.10)


def test_dgx_a100_ring_busbw():
    # nccl-tests on 8 x A100 SXM: ~232 GB/s all_reduce busbw
    assert busbw(load_cluster("dgx-a100")) == pytest.approx(232, rel=0.10)


def test_two_node_ring_is_limited_by_the_nics():
    # 2 x DGX H100, 8 NDR NICs (50 GB/s each) per node: a ring crossing nodes cannot beat what the NICs carry:
    # each of 8 channels crosses on its own NIC, so busbw <= 8 x 50 GB/s x (per-GPU share) = 400 GB/s.
    c = load_cluster("dgx-h100", nodes=2)
    bw = busbw(c)
    nic_bound = c.inter_node.nics_per_node * c.inter_node.bandwidth_GBps
    assert bw <= nic_bound
    assert bw == pytest.approx(nic_bound, rel=0.05)
    slow = load_cluster("dgx-a100", nodes=2)          # HDR: 25 GB/s NICs, now well below NVLink
    assert busbw(slow) == pytest.approx(8 * 25, rel=0.05)
    assert busbw(slow) < busbw(load_cluster("dgx-a100"))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs_every_collective(name):
    c = PRESETS[name]
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "barrier"):
        t, algo = simulate_collective(op, 2**20, c, "auto")
        assert t.makespan > 0 and algo
