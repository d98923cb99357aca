"""A collective's CPU work on a CPU cluster (sim/kernel/cores.py comm_cpu_seconds): hand-computed timelines."""
from __future__ import annotations

from dataclasses import replace

import pytest
from pytest import approx

from distlab.sim.cluster import PRESETS, cluster_from_dict
from distlab.sim.kernel.engine import simulate
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Collective, Compute, Plan

MS = 1e-3


def cpu_cluster(latency_us: float = 0.0, **fields):
    """3 ranks on one node of 1 core, a network fast enough that a collective's network part is ~0."""
    c = PRESETS["localhost-cpu"].with_world_size(3)
    return replace(c, cpu_cores=1.0, intra_node=replace(c.intra_node, bandwidth_GBps=1e6, latency_us=latency_us),
                   **fields)


def plan(nbytes: int = 1000) -> Plan:
    """Ranks 0 and 1 all-reduce; rank 2 (not in the group) computes 10 ms on the same cores."""
    ar = lambda: Collective(op="all_reduce", bytes=nbytes, group=(0, 1), name="ar")
    return Plan([[ar()], [ar()], [Compute(seconds=10 * MS, name="c")]]).validate()


def ends(trace) -> dict:
    return {(o.rank, o.name): o.end for o in trace.ops}


def test_cpu_work_shares_the_cores_with_the_other_ranks_compute():
    # 3 jobs on 1 core from t=0: rank 0's and rank 1's 2 ms of CPU work and rank 2's 10 ms compute, each at 1/3:
    # the CPU work ends at 6 ms (the collective with it: its network part is ~0), the compute has 8 ms left at
    # 6 ms, alone at rate 1: it ends at 14 ms (10 ms without the CPU work)
    assert ends(simulate(plan(), cpu_cluster()))[2, "c"] == approx(10 * MS)
    e = ends(simulate(plan(), cpu_cluster(comm_cpu_s=2 * MS)))
    assert e[0, "ar"] == e[1, "ar"] == approx(6 * MS)
    assert e[2, "c"] == approx(14 * MS)


def test_cpu_work_grows_with_the_bytes():
    # w = 0.5 ms + 1e-9 s/B x 1.5e6 B = 2 ms: the same timeline as above
    e = ends(simulate(plan(1_500_000), cpu_cluster(comm_cpu_s=0.5 * MS, comm_cpu_s_per_byte=1e-9)))
    assert e[0, "ar"] == approx(6 * MS) and e[2, "c"] == approx(14 * MS)


def test_a_collective_ends_with_its_network_part_when_that_is_longer():
    # latency 10 ms a step: the network part alone is t_net >= 10 ms > 6 ms, so the collective ends at t_net
    # (unchanged by the CPU work), while the compute beside it is still delayed to 14 ms
    t_net = ends(simulate(plan(), cpu_cluster(latency_us=10_000)))[0, "ar"]
    assert t_net >= 10 * MS
    e = ends(simulate(plan(), cpu_cluster(latency_us=10_000, comm_cpu_s=2 * MS)))
    assert e[0, "ar"] == approx(t_net)
    assert e[2, "c"] == approx(14 * MS)


def test_round_trip_and_bad_values():
    c = cpu_cluster(comm_cpu_s=1e-4, comm_cpu_s_per_byte=2e-10)
    back = cluster_from_dict(c.to_dict())
    assert (back.comm_cpu_s, back.comm_cpu_s_per_byte) == (1e-4, 2e-10)
    assert "comm_cpu_s" not in cpu_cluster().to_dict()          # the default writes nothing
    d = cpu_cluster().to_dict()
    with pytest.raises(ConfigError, match="comm_cpu_s"):
        cluster_from_dict({**d, "comm_cpu_s": -1.0})
    with pytest.raises(ConfigError, match="needs the cores"):
        cluster_from_dict({**{k: v for k, v in d.items() if k != "cpu_cores"}, "comm_cpu_s": 1e-3})


def test_a_send_recv_carries_the_cpu_work_on_both_ends():
    # rank 0 sends to rank 1 while rank 2 computes 10 ms: the same three jobs on 1 core as above
    from distlab.sim.plan import Recv, Send
    p = Plan([[Send(peer=1, bytes=1000)], [Recv(peer=0, bytes=1000)], [Compute(seconds=10 * MS, name="c")]]).validate()
    e = {(o.rank, o.kind): o.end for o in simulate(p, cpu_cluster(comm_cpu_s=2 * MS)).ops}
    assert e[0, "send"] == e[1, "recv"] == approx(6 * MS)
    assert e[2, "compute"] == approx(14 * MS)


def test_calibrated_line_of_the_cpu_work():
    from distlab.runtime.parallel.tp.fit import comm_cpu_line
    # two ranks, w = 0.5 ms + 0.1 us/B exactly at 1000 and 9000 B (the medians over ranks and rounds)
    cals = [{"comm_cpu": {"all_gather": {"1000": [0.6e-3, 0.5e-3, 0.6e-3], "9000": [1.4e-3]}}},
            {"comm_cpu": {"all_gather": {"1000": [0.6e-3, 0.7e-3, 0.6e-3], "9000": [1.4e-3]}}}]
    a, b = comm_cpu_line(cals)
    assert a == approx(0.5e-3) and b == approx(1e-7)
    falling = [{"comm_cpu": {"all_reduce": {"100": [2e-3], "800": [1e-3]}}}]
    assert comm_cpu_line(falling) == approx((1.5e-3, 0.0))          # noise: the median, no slope
    assert comm_cpu_line([{}]) == (0.0, 0.0)                          # a calibration without it


def test_fsdp2_host_cpu_per_unit_in_the_fsdp_tp_plan():
    from distlab.runtime.parallel.tp.validate import prepare, timed_plan
    from distlab.sim.io import load_yaml
    base = load_yaml("scenarios/tp-cpu.yaml")
    built, _, _ = prepare({**base, "mesh": {"dp_shard": 2, "tp": 2}, "world_size": 4}, 4)
    cluster = replace(PRESETS["localhost-cpu"].with_world_size(4), cpu_cores=2.0)
    plain, host = timed_plan(built), timed_plan(built, fsdp_host=(1 * MS, 2 * MS))
    names = [o.name for o in host.ranks[0] if isinstance(o, Compute) and o.name.startswith("fsdp host")]
    assert sorted(names) == sorted(f"fsdp host {u} {p}" for u in ("root", "h.0", "h.1") for p in ("forward", "backward"))
    # 3 units: 3 x 1 ms forward + 3 x 2 ms backward of CPU per rank, the 4 ranks in lock step on 2 cores: 2 x 9 ms
    grown = simulate(host, cluster, record_transfers=False).makespan - simulate(plain, cluster, record_transfers=False).makespan
    assert grown == approx(18 * MS)
