"""The ends' host CPU (runtime/parallel/tp/ends.py) and the calling thread's CPU per collective (runtime/parallel/tp/fit.py
comm_cpu_line) in the TP calibration: the host-side fits and the timed plan, hand-computed (no ranks started;
the rank side runs in tests/test_tp_runtime.py's calibrated launch)."""
from __future__ import annotations

from dataclasses import replace

from pytest import approx

from distlab.runtime.parallel.tp.ends import ends_host, with_ends_host
from distlab.sim.cluster import PRESETS
from distlab.sim.kernel.engine import simulate
from distlab.sim.plan import Collective, Compute, Plan

MS = 1e-3
OPS = {"embed fwd": 1, "embed bwd": 2, "head fwd": 11, "head bwd": 27}


def _cal(ends: dict) -> dict:
    return {"variants": [{"calibration": {"ends": ends, "ends_ops": OPS}}]}


def test_ends_host_is_the_slowest_ranks_median_minus_the_launches_already_charged():
    # rounds of rank 0 / rank 1 (ms): embed fwd 1.0/1.2, 0.9/0.8, 1.1/1.0 -> slowest 1.2, 0.9, 1.1 -> median
    # 1.1 ms; minus 1 op x 0.1 ms = 1.0 ms. head bwd 2.0 ms median minus 27 x 0.1 = -0.7 -> 0 (never negative)
    r0 = {"embed fwd": [1.0 * MS, 0.9 * MS, 1.1 * MS], "head bwd": [2 * MS] * 3}
    r1 = {"embed fwd": [1.2 * MS, 0.8 * MS, 1.0 * MS], "head bwd": [2 * MS] * 3}
    host = ends_host([_cal(r0), _cal(r1)], launch_s=0.1 * MS)
    assert host == {"embed fwd": approx(1.0 * MS), "head bwd": 0.0}
    assert ends_host([{"variants": [{"calibration": {}}]}], 0.1 * MS) == {}     # a calibration without the probe


def test_the_ends_host_cpu_follows_their_compute_ops_on_the_critical_path():
    # rank 0: fwd embed 1 ms, then an all-reduce with rank 1; rank 1: fwd lm_head 2 ms, the all-reduce, bwd lm_head
    # 1 ms. With embed fwd 3 ms and head bwd 0.5 ms of host CPU (the others 0: no op added): rank 0 is busy
    # 1 + 3 = 4 ms, rank 1 2 ms, so the all-reduce (network ~0) ends at 4 ms; rank 1 then 1 + 0.5 ms: 5.5 ms
    ar = lambda: Collective("all_reduce", 1000, group=(0, 1), name="ar", stream="compute")  # in order
    plan = Plan([[Compute("fwd embed", seconds=1 * MS), ar()],
                 [Compute("fwd lm_head", seconds=2 * MS), ar(), Compute("bwd lm_head", seconds=1 * MS)]]).validate()
    timed = with_ends_host(plan, {"embed fwd": 3 * MS, "head fwd": 0.0, "head bwd": 0.5 * MS})
    assert [o.name for o in timed.ranks[0]] == ["fwd embed", "host embed fwd", "ar"]
    assert [o.name for o in timed.ranks[1]] == ["fwd lm_head", "ar", "bwd lm_head", "host head bwd"]
    c = PRESETS["localhost-cpu"].with_world_size(2)
    c = replace(c, intra_node=replace(c.intra_node, bandwidth_GBps=1e9, latency_us=0.0))
    trace = simulate(timed, c)
    assert trace.makespan == approx(5.5 * MS, abs=1e-9)
    assert {o.name: o.end for o in trace.for_rank(1)}["ar"] == approx(4 * MS, abs=1e-9)     # waited for rank 0
    assert with_ends_host(plan, {}) is plan


def test_pp_x_tp_gives_the_embedding_to_the_first_stage_and_the_head_to_the_last():
    """In the scenario's PP x TP plan (1F1B, 2 micro-batches) each end's host CPU lands once per micro-batch on
    the stage that holds it: stage 0 (ranks 0, 1) the embedding's, stage 1 (ranks 2, 3) the head's."""
    from distlab.runtime.parallel.tp.validate import prepare, timed_plan
    from distlab.sim.io import load_yaml
    base = load_yaml("scenarios/tp-cpu.yaml")
    built, _, _ = prepare({**base, "mesh": {"pp": 2, "tp": 2}, "world_size": 4,
                           "tp": {**base["tp"], "microbatches": 2}}, 4)
    timed = timed_plan(built, 0.1 * MS, ends={k: 1 * MS for k in OPS})
    host = [sorted(o.name for o in ops if isinstance(o, Compute) and o.name.startswith("host")) for ops in timed.ranks]
    assert host[0] == host[1] == ["host embed bwd"] * 2 + ["host embed fwd"] * 2
    assert host[2] == host[3] == ["host head bwd"] * 2 + ["host head fwd"] * 2


def test_the_calling_threads_cpu_adds_to_gloos_cpu_per_collective():
    # per (kind, size) the median over ranks and rounds of gloo's CPU + the calling thread's: 0.5 + 0.2 ms at
    # 1000 B and 1.3 + 0.2 ms at 9000 B -> w = 0.6 ms + 0.1 us/B; without comm_main (older calibrations) 0.4 ms +
    # 0.1 us/B
    from distlab.runtime.parallel.tp.fit import comm_cpu_line
    gloo = {"all_gather": {"1000": [0.5 * MS] * 3, "9000": [1.3 * MS] * 3}}
    main = {"all_gather": {"1000": [0.2 * MS] * 3, "9000": [0.2 * MS] * 3}}
    a, b = comm_cpu_line([{"comm_cpu": gloo, "comm_main": main}] * 2)
    assert a == approx(0.6 * MS) and b == approx(1e-7)
    a, b = comm_cpu_line([{"comm_cpu": gloo}])
    assert a == approx(0.4 * MS) and b == approx(1e-7)


def test_adamw_on_dtensors_is_priced_by_its_own_probe_not_the_blocks_rate():
    # AdamW's step CPU per round, rank 0 / rank 1 (ms): on DTensors 3.0/3.1, 2.8/2.9, 3.2/2.7 -> slowest 3.1, 2.9,
    # 3.2 -> median 3.1; on the same plain tensors 1.0/1.2, 1.0/0.9, 1.0/1.1 -> 1.2, 1.0, 1.1 -> 1.1; 10
    # parameters: (3.1 - 1.1) / 10 = 0.2 ms per DTensor parameter. The plan's "optimizer" (8 DTensor ops per
    # DTensor parameter, 5 of them: launches 40) keeps its roofline and loses its launches; "optimizer host" of
    # 5 x 0.2 = 1 ms follows it on its stream
    from distlab.runtime.parallel.tp.fit import optimizer_host
    from distlab.runtime.parallel.tp.validate import with_optimizer_host
    from distlab.sim.parallel.tp.plan import ADAMW_DTENSOR_OPS

    def cal(dtensor, plain):
        return {"variants": [{"calibration": {"optimizer_dtensor": [t * MS for t in dtensor],
                                              "optimizer": [t * MS for t in plain], "optimizer_params": 10}}]}
    per_param = optimizer_host([cal([3.0, 2.8, 3.2], [1.0, 1.0, 1.0]), cal([3.1, 2.9, 2.7], [1.2, 0.9, 1.1])])
    assert per_param == approx(0.2 * MS)
    assert optimizer_host([{"variants": [{"calibration": {}}]}]) is None          # a calibration without the probe
    assert optimizer_host([cal([1.0], [1.5])]) == 0.0                               # never negative
    plan = Plan([[Compute("bwd x", seconds=1 * MS),
                  Compute("optimizer", flops=0.0, bytes=2e6, launches=ADAMW_DTENSOR_OPS * 5)]]).validate()
    timed = with_optimizer_host(plan, per_param)
    opt, host = timed.ranks[0][1:]
    assert (opt.name, opt.launches, opt.bytes) == ("optimizer", 0, 2e6)
    assert (host.name, host.seconds, host.stream) == ("optimizer host", approx(1 * MS), opt.stream)
    c = PRESETS["localhost-cpu"].with_world_size(1)
    c = replace(c, gpu=replace(c.gpu, hbm_GBps=1.0, launch_s=1 * MS))            # 2e6 B at 1 GB/s: 2 ms
    assert simulate(timed, c).makespan == approx((1 + 2 + 1) * MS, rel=1e-6)       # not 40 launches x 1 ms
