"""Presets reproduce published nccl-tests bus bandwidth at large sizes (within 5%), and NCCL's latency floor."""
import pytest

from distlab.sim.cluster import PRESETS, load_cluster
from distlab.sim.collectives import metrics
from distlab.sim.kernel.engine import simulate_collective
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process (no interpreter start)

GiB, MiB = 2**30, 2**20


def busbw(cluster, size=GiB, algo="ring", op="all_reduce"):
    t, used = simulate_collective(op, size, cluster, algo)
    assert algo in ("auto", used)
    return metrics(op, cluster.world_size, size, t.makespan)["busbw_GBps"]


@pytest.mark.parametrize("size", [GiB, 8 * GiB])
def test_dgx_h100_ring_busbw(size):
    # nccl-tests on 8 x H100 SXM, ring: ~370 GB/s all_reduce busbw (NCCL tuning: 18 links x 20.6 GB/s)
    assert busbw(load_cluster("dgx-h100"), size) == pytest.approx(370, rel=0.05)


@pytest.mark.parametrize("size", [GiB, 8 * GiB])
def test_dgx_h100_nvls_busbw(size):
    # nccl-tests on 8 x H100 SXM with NVLS (NCCL >= 2.17): ~480 GB/s all_reduce busbw (460-480, Alaya NeW,
    # "NCCL-tests in practice", 2026; NVIDIA's H100 NVLS figures)
    assert busbw(load_cluster("dgx-h100"), size, "nvls") == pytest.approx(480, rel=0.05)


def test_dgx_a100_ring_busbw():
    # nccl-tests on 8 x A100 SXM: ~232 GB/s all_reduce busbw
    assert busbw(load_cluster("dgx-a100")) == pytest.approx(232, rel=0.05)


@pytest.mark.parametrize("size", [GiB, 8 * GiB])
def test_two_dgx_h100_ring_over_8_ndr_nics(size):
    # 2 x 8 H100, 8 NDR NICs (50 GB/s each) per node: 400-450 GB/s busbw at 8 GB (Saturn Cloud, "Validating
    # Multi-Node GPU Clusters with NCCL Tests"). The ring cannot beat what the NICs carry: each of its 8 channels
    # crosses on its own NIC, busbw <= 8 x 50 GB/s = 400, the low end of that range.
    c = load_cluster("dgx-h100", nodes=2)
    bw = busbw(c, size)
    assert bw == pytest.approx(400, rel=0.05) and bw <= 400
    slow = load_cluster("dgx-a100", nodes=2)          # HDR: 25 GB/s NICs, now well below NVLink
    assert busbw(slow, size) == pytest.approx(8 * 25, rel=0.05)


def test_nvls_reaches_its_plateau_early_and_auto_picks_it():
    # NVLS pays NCCL's 25 us once per call, not once per chunk: at 64 MiB it is within 20% of its 8 GiB busbw
    c = load_cluster("dgx-h100")
    assert busbw(c, 64 * MiB, "nvls") >= 0.8 * busbw(c, 8 * GiB, "nvls")
    # NCCL's tuner: NVLS (latency 25 us) loses to ring LL (6.6 + 14 x 0.6 = 15 us) on small messages and wins
    # once its bandwidth pays for the 10 us (tuning.cc:150-175, :424-425), from about 1 MiB on 8 x H100.
    for size in (8, 4096, 256 * 1024):
        assert simulate_collective("all_reduce", size, c, "auto")[1] != "nvls"
    for size in (4 * MiB, 64 * MiB, GiB, 8 * GiB):
        assert simulate_collective("all_reduce", size, c, "auto")[1] == "nvls"


def test_small_all_reduce_is_nccl_latency_floor():
    # NCCL 2.30.7 tuning model for 8 GPUs on NVLink, 8 B: ring LL 6.6 + 14 x 0.6 = 15.0 us, tree LL
    # 6.8 + 2 x 7 x 0.6 = 15.2 us, NVLS 25 us (tuning.cc:150-175, :393-425); NCCL runs the least: 15.0-15.2 us
    t, _ = simulate_collective("all_reduce", 8, load_cluster("dgx-h100"), "auto")
    assert 15.0e-6 <= t.makespan <= 15.2e-6


@pytest.mark.parametrize("algo,protos", [("ring", ["LL", "LL128", "Simple"]), ("tree", ["LL", "LL128", "Simple"]),
                                         ("nvls", ["Simple"])])
def test_time_is_monotone_in_size_within_each_protocol(algo, protos):
    c = load_cluster("dgx-h100")
    for proto in protos:
        times = [simulate_collective("all_reduce", 2**e, c, algo, protocol=proto)[0].makespan for e in range(3, 34, 2)]
        assert all(a <= b for a, b in zip(times, times[1:])), (proto, times)


def test_protocol_switches_along_the_ring_curve():
    # LL for small messages, LL128 in the middle, Simple at the plateau, as NCCL's tuner picks them
    c = load_cluster("dgx-h100")
    chosen = [simulate_collective("all_reduce", s, c, "ring")[0].meta["protocols"][0] for s in (8, 16 * MiB, 8 * GiB)]
    assert chosen == ["LL", "LL128", "Simple"]


def test_all_to_all_across_nodes_is_limited_by_the_nics():
    # nccl-tests alltoall: busbw = algbw x (n-1)/n (doc/PERFORMANCE.md). Across nodes each GPU sends (n-g)/n of
    # its S over the node's NICs (one per GPU, B each), so busbw = B·(n-1)/(n-g) -> B, the NIC bandwidth.
    for nodes in (2, 4):
        c = load_cluster("dgx-h100", nodes=nodes)
        n, g = c.world_size, c.gpus_per_node
        assert busbw(c, GiB, "direct", "all_to_all") == pytest.approx(50 * (n - 1) / (n - g), rel=0.02)


def test_environment_limits_auto_like_nccl(monkeypatch):
    c = load_cluster("dgx-h100")
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("NCCL_PROTO", "^LL,LL128")
    t, used = simulate_collective("all_reduce", 8, c, "auto")
    assert (used, t.meta["protocols"]) == ("ring", ["Simple"])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs_every_collective(name):
    c = PRESETS[name]
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "barrier"):
        t, algo = simulate_collective(op, 2**20, c, "auto")
        assert t.makespan > 0 and algo


def test_blackwell_and_nvl72_presets():
    b200, nvl72 = load_cluster("dgx-b200"), load_cluster("gb200-nvl72")
    assert nvl72.world_size == 72 and nvl72.intra_node.bandwidth_GBps == 900
    # NVLink 5 doubles NVLink 4: the ring's plateau is NCCL's 18 x 40.1 GB/s (topo.h SM100_NVLINK_BW)
    assert busbw(b200, 8 * GiB) == pytest.approx(18 * 40.1, rel=0.05)
    racks = load_cluster("gb200-nvl72", nodes=36)                  # 36 trays: two whole racks
    assert (racks.nodes, racks.gpus_per_node) == (2, 72)
    assert simulate_collective("all_reduce", GiB, racks, "auto")[1] == "nvls_tree"
    assert load_cluster("gb200-nvl72-roce", nodes=36).inter_node.kind == "ethernet"
    assert load_cluster("dgx-h100-roce", nodes=2).inter_node.kind == "ethernet"


def test_gb200_nvl72_all_reduce_matches_published_nccl_tests():
    """72 GB200 of one NVL72 rack, all_reduce 8 GiB: 834.6 GB/s busbw (coreweave/nccl-tests PR #43, full-rack
    all_reduce_perf); 8 of its GPUs over MNNVL: 811 GB/s (lixueduan.com GB200 MNNVL nccl-tests). Within 5%: the
    NVLS ceiling of the rack's switch fabric (sim/cluster/presets.py NVLINK5_NVL72) against NCCL's own model (~1000)."""
    nvl72 = load_cluster("gb200-nvl72")
    t, algo = simulate_collective("all_reduce", 8 * GiB, nvl72, "auto")
    assert algo == "nvls" and 8 * GiB / t.makespan / 1e9 * 2 * 71 / 72 == pytest.approx(834.6, rel=0.05)
    eight = tuple(range(8))
    t8, _ = simulate_collective("all_reduce", 8 * GiB, nvl72, "auto", group=eight)
    assert 8 * GiB / t8.makespan / 1e9 * 2 * 7 / 8 == pytest.approx(811, rel=0.05)


@pytest.mark.parametrize("args,message", [
    (["all_reduce", "--proto", "LX"], "unknown protocol 'LX'"),
    (["all_reduce", "--cluster", "dgx-a100", "--algo", "nvls"], "needs an NVSwitch"),
    (["all_gather", "--nodes", "2", "--algo", "pat"], "one GPU per node"),
])
def test_bad_input_is_one_line_exit_2(cli, args, message):
    rc, out, err = cli("collective", *args, "--size", "1MiB")
    assert rc == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("gpus,domains,per_domain", [(8, 1, 8), (64, 1, 64), (72, 1, 72), (128, 2, 64),
                                                     (256, 4, 64), (512, 8, 64)])
def test_gb200_jobs_take_compute_trays(gpus, domains, per_domain):
    """A GB200 job is whole compute trays of 4 GPUs spread evenly over the fewest 18-tray NVLink domains: NVLink
    inside a domain (one simulator node), one NIC per GPU out of it; every job size simulates a collective."""
    c = PRESETS["gb200-nvl72"].with_world_size(gpus)
    assert (c.nodes, c.gpus_per_node, c.inter_node.nics_per_node, c.trays) == (domains, per_domain, per_domain,
                                                                              gpus // 4)
    assert load_cluster("gb200-nvl72", nodes=gpus // 4) == c                   # --nodes counts trays
    if gpus <= 128:                       # one domain and two (larger jobs: the same fabric, more of it)
        t, algo = simulate_collective("all_reduce", 64 * MiB, c, "auto")
        assert t.makespan > 0 and (algo.startswith("nvls") or domains > 1)


@pytest.mark.parametrize("args", [["--world-size", "130"], ["--world-size", "6"]])
def test_gb200_job_of_partial_trays_is_one_line_exit_2(cli, args):
    rc, out, err = cli("simulate", "--model", "gpt2-small", "--cluster", "gb200-nvl72", *args, "--no-files")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "not whole compute trays of 4" in err and "error: --world-size: " in err
