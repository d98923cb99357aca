"""Robust fits (runtime/measure/robust.py) and load awareness (runtime/measure/load.py): timings with injected outliers (20% of
samples 3-10x slower, as another process taking the core does) still give every fitted quantity within 5% of
the truth; the load reader on synthetic /proc contents; fractional cores in the simulator."""
from dataclasses import replace

import numpy as np
import pytest
from pytest import approx

from distlab.runtime.measure import robust
from distlab.runtime.measure.fit import calibration_from_rows, fit_warnings, ring_cost
from distlab.sim.cluster import PRESETS

RNG = np.random.default_rng(18)


def noisy(truth: float, count: int, outliers: float = 0.2, noise: float = 0.01, seed=None) -> list[float]:
    """``count`` samples of ``truth`` with 1% noise, ``outliers`` of them (scattered) 3x-10x slower."""
    rng = RNG if seed is None else np.random.default_rng(seed)
    x = truth * (1 + noise * rng.standard_normal(count))
    bad = rng.choice(count, int(round(outliers * count)), replace=False)
    x[bad] *= rng.uniform(3, 10, len(bad))
    return x.tolist()


def test_alpha_beta_per_collective_and_world_size_survive_outliers():
    rows, truth = [], {}
    for op, n, lat, bw in (("all_reduce", 2, 60e-6, 1.5e9), ("all_gather", 4, 40e-6, 3e9)):
        steps, factor = ring_cost(op, n)
        truth[op, n] = (lat, bw)
        for s in [2**k for k in range(18, 27, 2)]:
            t = steps * lat + factor * s / bw
            samples = noisy(t, 10)
            rows.append({"op": op, "world_size": n, "bytes": s, "time_s": float(np.median(samples)),
                         "launch_time_s": float(np.mean(samples)), "launch_times_s": samples})
    cal = calibration_from_rows(rows)["collectives"]
    for (op, n), (lat, bw) in truth.items():
        entry = cal[op][str(n)]
        assert entry["latency_us"] == approx(lat * 1e6, rel=0.05)
        assert entry["bandwidth_GBps"] == approx(bw / 1e9, rel=0.05)
        assert "bands" not in entry and entry["samples"] == 50


def test_a_size_spoiled_entirely_gets_no_weight_in_the_line():
    s = np.array([2**k for k in range(18, 27)], dtype=float)
    t = 100e-6 + s / 2e9
    t[3] *= 5                                   # one size measured during a long burst
    a, b, _ = robust.line(s, t)
    assert a == approx(100e-6, rel=0.05) and 1 / b == approx(2e9, rel=0.05)


def test_compute_rate_survives_outliers():
    # measure_compute: rate = work / time per round; a slowed round gives a lower rate
    work, seconds = 4e9, 0.05
    rates = [work / t for t in noisy(seconds, 10)]
    assert robust.center(rates) == approx(work / seconds, rel=0.05)
    assert robust.center(rates) > 0.95 * work / seconds > 1.1 * float(np.mean(rates))   # the mean would not


def test_noisy_fit_says_so_in_one_line():
    est = robust.estimate(noisy(1e-3, 12, outliers=0.0, noise=0.4))
    line = robust.warning("all_reduce on 2 ranks", est.spread)
    assert est.spread > robust.SPREAD_WARN and "\n" not in line and "re-run" in line
    assert robust.warning("x", 0.02) is None
    rows = [{"op": "all_reduce", "world_size": 2, "bytes": s, "time_s": 0,
             "launch_times_s": noisy(1e-4 + s / 1e9, 12, outliers=0.0, noise=0.4)} for s in (2**20, 2**24)]
    assert len(fit_warnings(calibration_from_rows(rows))) == 1


def test_reject_replaces_one_disturbed_probe():
    # per-action overheads fitted by five probes; one probe ran during a burst (issue 18: 8.2 ms vs 1.7-3.8)
    assert robust.reject([1.7e-3, 2.5e-3, 3.0e-3, 3.8e-3, 8.2e-3])[-1] == approx(3.0e-3)
    assert robust.reject([1.0, 1.1, 0.9]) == [1.0, 1.1, 0.9]



def test_short_calls_get_more_samples_per_round_in_extra_passes():
    # runtime/measure/sweep.py: a call shorter than SHORT_S scatters most (one preemption is a large part of it)
    from distlab.runtime.measure.sweep import MAX_REPEATS, SHORT_S, repeats, schedule
    assert [repeats(t, SHORT_S) for t in (1e-4, SHORT_S / 2.5, SHORT_S / 2, SHORT_S * 0.9, 0.05)] == \
        [MAX_REPEATS, 2, 2, 1, 1]
    assert repeats(1e-4, None) == 1                         # bench: one call per case per round, as nccl-tests
    first = [1e-4, 0.03, SHORT_S / 2, 0.2, 1e-4]            # each case's fastest call so far
    order = schedule(first, SHORT_S)
    assert order == [0, 1, 2, 3, 4, 0, 2, 4, 0, 4]         # every case once, then passes over the short ones
    assert all(a != b for a, b in zip(order, order[1:]))   # a case is never timed twice in a row
    assert schedule(first, None) == [0, 1, 2, 3, 4]


def _measured(noise: float, seed: int = 7) -> dict:
    """validate's measurements of all_reduce on 2 ranks (9 repeats per size) around a ring of α 50 us, 2 GB/s."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in (2**18, 2**20, 2**22, 2**24, 2**19, 2**21, 2**23):
        t = 50e-6 + s / 2e9
        x = (t * (1 + noise * rng.standard_normal(9))).clip(t / 4).tolist()
        rows.append({"op": "all_reduce", "world_size": 2, "bytes": s, "time_s": float(np.median(x)),
                     "launch_time_s": float(np.median(x)), "launch_times_s": x})
    return {2: [{"rows": rows, "compute": {}}]}


def test_validate_noise_shows_how_far_the_figure_moves_with_the_timing_noise():
    from distlab.runtime.measure.validation import summary_noise
    calib, held = {2**18, 2**20, 2**22, 2**24}, {2**19, 2**21, 2**23}
    noise = [summary_noise(_measured(x), calib, held, [2], "gloo", {2: 2})["held-out size", 2] for x in (0, .05, .3)]
    assert abs(noise[0]) < 1e-12 and 0 < noise[1] < noise[2]          # none without scatter; more, wider


# --- pipeline probe: per-action overhead and p2p latency ----------------------------------------------------
CFG = dict(schedule="1f1b", stages=2, microbatches=4, virtual_stages=1, layers=4, width=64, rows=8)
CALIB = [{"F": 1e-3, "B": 2e-3, "I": 1e-3, "W": 1e-3}] * 2


def test_per_action_overhead_survives_outliers_in_the_probe_steps():
    from distlab.runtime.parallel.pipeline.validate import block_seconds, cluster_of, fit_overhead, simulate_cfg
    cluster = cluster_of(2, {"small": 50e-6, "large": 100e-6, "bytes": 2048}, 80e-6, cores=2)
    true_overhead = 1e-3                # about an F: what the probes fitted (1.7-8.2 ms)
    span = simulate_cfg(CFG, block_seconds(CFG, CALIB), cluster, true_overhead)[0].makespan
    for seed in range(3):
        steps = noisy(span, 10, noise=0.005, seed=seed)
        assert fit_overhead(CFG, CALIB, cluster, robust.center(steps)) == approx(true_overhead, rel=0.05)
        assert fit_overhead(CFG, CALIB, cluster, float(np.mean(steps))) > 2 * true_overhead   # the mean fails


def test_cores_a_probe_shows_survive_outliers():
    # a probe faster than the load model's cores allow (overhead 0): the cores that make it last as long
    from distlab.runtime.parallel.pipeline.validate import block_seconds, cluster_of, fit_cores, fit_overhead, simulate_cfg
    cfg = {**CFG, "stages": 4, "layers": 8}
    calib = [CALIB[0]] * 4
    span = simulate_cfg(cfg, block_seconds(cfg, calib), cluster_of(4, {"small": 5e-5, "large": 1e-4, "bytes": 2048},
                                                                  8e-5, cores=3))[0].makespan
    model = cluster_of(4, {"small": 5e-5, "large": 1e-4, "bytes": 2048}, 8e-5, cores=1.5)
    steps = noisy(span, 10, noise=0.005, seed=4)
    assert fit_overhead(cfg, calib, model, robust.center(steps)) == 0.0
    assert fit_cores(cfg, calib, model, robust.center(steps)) == approx(3, rel=0.05)


def test_p2p_latency_survives_outliers():
    from distlab.runtime.parallel.pipeline.validate import block_seconds, cluster_of, p2p_latency, simulate_cfg
    latency = 300e-6
    cluster = cluster_of(2, {"small": 1e-6, "large": 2e-6, "bytes": 2**30}, latency, cores=2)   # ~1 PB/s
    trace = simulate_cfg(CFG, block_seconds(CFG, CALIB), cluster, 0.0)[0]
    clean = p2p_latency(trace)
    assert clean == approx(latency, rel=0.05)
    from distlab.sim.parallel.pipeline.metrics import actions_of
    acts = [o for a, o in actions_of(trace) if a.kind != "W" and not (a.kind == "F" and a.stage == 0)
            and not (a.kind == "B" and a.stage == 1)]                           # those that wait for a peer
    for o in acts[::5]:                                                          # 20% delayed by a burst
        o.start += RNG.uniform(2, 9) * latency
    assert p2p_latency(trace) == approx(latency, rel=0.05)


# --- load ---------------------------------------------------------------------------------------------------
def _proc(root, total: int, procs: dict):
    """Synthetic /proc: stat with an aggregate line of ``total`` jiffies and 2 CPUs; pid -> (ppid, ticks)."""
    root.mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu {total} 0 0 0 0 0 0 0 0 0\ncpu0 1 0 0 0\ncpu1 1 0 0 0\nintr 5\n")
    for pid, (ppid, ticks) in procs.items():
        (root / str(pid)).mkdir(exist_ok=True)
        # comm with spaces and parentheses, as proc(5) allows; utime, stime are fields 14, 15
        fields = ["S", str(ppid)] + ["0"] * 9 + [str(ticks - ticks // 3), str(ticks // 3)] + ["0"] * 5
        (root / str(pid) / "stat").write_text(f"{pid} (a (b) c) " + " ".join(fields) + "\n")


def test_background_share_from_synthetic_proc(tmp_path):
    from distlab.runtime.measure import load as L
    # 100 jiffies per CPU pass; pid 10 (us) and its rank 11 and grandchild 12 are ours; 20 used 50 ticks,
    # 30 used 30; 13 is our load generator (counted as someone else's)
    a, b = tmp_path / "a", tmp_path / "b"
    _proc(a, 1000, {10: (1, 0), 11: (10, 0), 12: (11, 0), 13: (10, 0), 20: (1, 100), 30: (1, 0)})
    _proc(b, 1200, {10: (1, 90), 11: (10, 95), 12: (11, 80), 13: (10, 45), 20: (1, 150), 30: (1, 30)})
    before = (L._total_jiffies(str(a)), L._processes(str(a)))
    after = (L._total_jiffies(str(b)), L._processes(str(b)))
    assert before[0] == (1000, 2)
    assert L.background_cores(before, after, own=10) == approx(0.8)
    assert L.background_cores(before, after, own=10, count_pids=[13]) == approx(1.25)
    assert L.background_shares(before, after, own=10, count_pids=[13]) == approx([0.5, 0.45, 0.3])
    assert L.available_cores(2, 0.5) == 1.5 and L.available_cores(2, 1.9) == 1.0
    reading = L.Load(1.0, 2, 0.5, 0.5, (0.5,))
    assert reading.to_dict()["available_cores"] == 1.5 and reading.to_dict()["background"] == [0.5]
    assert "1.50 cores idle" in reading.line() and "4 ranks get 1.60 cores" in reading.line(4)
    # autogroups (sched(7)): 10 and 13 in our session's group, 20 and 30 in another one's
    (b / "sys" / "kernel").mkdir(parents=True)
    (b / "sys" / "kernel" / "sched_autogroup_enabled").write_text("1\n")
    for pid, group in ((10, 7), (13, 7), (20, 9), (30, 9)):
        (b / str(pid) / "autogroup").write_text(f"/autogroup-{group} nice 0\n")
    shares = L.busy_processes(before, after, own=10, count_pids=[13])
    assert [[round(x, 6) for x in g] for g in L.grouped(shares, 10, str(b))] == [[0.45], [0.5, 0.3]]


@pytest.mark.parametrize("background, k, alone, cores", [
    ((), 4, 1, 2.0), ((), 1, 1, 1.0),                    # idle: min(k, cores)
    ((0.5,), 2, 1, 1.5), ((0.5,), 4, 1, 1.6),            # the benchmarks' generator: r(1) = 1, r(2) = .75, r(4) = .4
    ((0.5,), 4, 4, 4.0),                                 # compute timed with the 4 ranks running: no further sharing
    ((2 / 3,) * 3, 4, 1, 4 * (2 / 7) / (2 / 4)),         # 3 busy processes filling 2 cores: r(1) = 2/4, r(4) = 2/7
])
def test_effective_cores_is_fair_sharing_with_the_background(background, k, alone, cores):
    from distlab.runtime.measure import load as L
    assert L.effective_cores(2, k, background, alone) == approx(min(cores, k))
    assert L.rank_share(2, 1, (1.5,)) == approx(2 / 3)   # one process of 2 threads at 0.75: 3 threads, 2 cores


@pytest.mark.parametrize("groups, k, cores", [
    (((0.5,),), 4, 1.6), (((0.5,),), 2, 1.5),            # the generator in our session's group: as without groups
    (((), (0.5,)), 4, 1.5),                              # in another session: it keeps its half core
    (((), (1.0,), (1.0,), (1.0,)), 4, 1.0),              # 3 other sessions busy: our group's half core, alone or not
    (((), (1.0,), (1.0,), (1.0,)), 1, 1.0),
])
def test_effective_cores_with_autogroups(groups, k, cores):
    from distlab.runtime.measure import load as L
    assert L.effective_cores(2, k, (), 1, groups) == approx(cores)


def test_simulated_slowdown_is_the_fair_share_ratio():
    # 4 ranks, each w seconds of compute timed alone beside 3 busy processes on 2 cores (CFS: 1/4 of the
    # cores each alone, 1/7 of them with the 4 ranks at once): they end at w x (2/4) / (2/7) = 1.75 w
    from distlab.runtime.measure import load as L
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.plan import Compute, Plan
    plan = Plan([[Compute(name=f"c{r}", seconds=1.0)] for r in range(4)]).validate()
    cluster = replace(PRESETS["localhost-cpu"], gpus_per_node=4,
                      cpu_cores=L.Load(3.0, 2, 2.0, 0.5, (2 / 3,) * 3).effective_cores(4))
    assert simulate(plan, cluster).makespan == approx(1.75)


def test_simulator_shares_the_cores_left_by_other_processes():
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.plan import Compute, Plan
    plan = Plan([[Compute(name=f"c{r}", seconds=1.0)] for r in range(2)]).validate()
    idle = replace(PRESETS["localhost-cpu"], gpus_per_node=2, cpu_cores=2)
    busy = replace(idle, cpu_cores=1.5)             # half a core taken by another process
    assert simulate(plan, idle).makespan == approx(1.0)
    assert simulate(plan, busy).makespan == approx(2 / 1.5)


@pytest.mark.slow
def test_background_load_process_is_stopped():
    from distlab.runtime.measure.load import BackgroundLoad
    with BackgroundLoad(0.5) as gen:
        process = gen.process
        assert process.poll() is None
    assert process.poll() is not None


# --- the workloads' calibrations: the same fits, fed measurements with outliers ------------------------------
def test_ddp_calibration_survives_outliers():
    # the model alone (forward, backward, Adam) and all-reduces from launch, 12 rounds on 2 ranks, 20% of
    # every quantity's rounds 3-10x slower: FLOP/s, memory rate, α and bandwidth within 5%
    from distlab.runtime.parallel.ddp.validate import calibrated
    from distlab.sim.parallel.ddp.plan import OPTIMIZERS
    from distlab.sim.models import model_from_spec
    model = model_from_spec({"kind": "mlp", "widths": [256] * 4, "batch": 32})
    flops, bwd_ratio, mem = 20e9, 2.5, 3e9
    t_fwd, t_opt = model.fwd_flops / flops, OPTIMIZERS["adam"] * model.param_bytes / mem
    lat, bw, rounds = 150e-6, 1.2e9, 12
    steps, factor = ring_cost("all_reduce", 2)
    sizes = [2**20, 2**22, 2**24, 2**25]
    # a burst of load slows a round on every rank alike: the ranks' rounds share their outliers
    local = [{"forward": f, "backward": b, "optimizer": o} for f, b, o in
             zip(noisy(t_fwd, rounds), noisy(bwd_ratio * t_fwd, rounds), noisy(t_opt, rounds))]
    times = {s: noisy(steps * lat + factor * s / bw, rounds) for s in sizes}
    results = []
    for rank in range(2):          # rank 1 wakes up 1 ms later after the barrier; both end together
        spans = {str(s): [(k + 1e-3 * (rank == 1), k + 1e-3 + d) for k, d in enumerate(times[s])] for s in sizes}
        results.append({"local": local, "calibration": {k: [e - b for b, e in v] for k, v in spans.items()},
                        "calibration_spans": spans})
    fitted, cluster = calibrated(model, results)
    fit = cluster.calibration["collectives"]["all_reduce"]["2"]
    assert cluster.gpu.tflops * 1e12 == approx(flops, rel=0.05)
    assert fitted.bwd_flops / fitted.fwd_flops == approx(bwd_ratio, rel=0.05)
    assert cluster.gpu.hbm_GBps * 1e9 == approx(mem, rel=0.05)
    assert fit["bandwidth_GBps"] * 1e9 == approx(bw, rel=0.05)
    # from launch (the later rank's start): the 1 ms wake-up skew is not in α; the slowest rank's duration
    # (the earlier rank waits for the later one) would add it to every all-reduce
    assert fit["latency_us"] == approx(lat * 1e6, rel=0.05)


def test_fsdp_roofline_calibration_survives_outliers():
    from distlab.runtime.parallel.fsdp.validate import calibrated_cluster
    from distlab.sim.parallel.fsdp.plan import ADAM_BYTES, padded_numel
    from distlab.sim.models import gpt
    model = gpt(layers=2, hidden=64, heads=2, seq_len=16, vocab=101, dtype="float32", arch="llama")
    F, M, n, rounds = 30e9, 4e9, 2, 12
    work = [(L.fwd_flops, L.activation_bytes + L.param_bytes) for L in model.layers]
    work += [(L.bwd_flops, 2 * L.activation_bytes + L.param_bytes) for L in model.layers]
    fb = sum(max(f / F, b / M) for f, b in work)
    shard = sum(padded_numel(q.shape, n) for q in model.params) // n
    lat, bw = 80e-6, 2e9
    sizes = [2**16, 2**18, 2**20]
    # a burst of load slows a round on every rank alike: the ranks' rounds share their outliers
    rank = {"calibration": {"all_gather": {str(s): noisy(lat + (n - 1) / n * s / bw, rounds) for s in sizes}},
            "local": {"rounds": [noisy(fb, rounds), noisy(ADAM_BYTES * shard / M, rounds)]}}
    results = [rank] * n
    cluster = calibrated_cluster(results, model, n)
    fit = cluster.calibration["collectives"]["all_gather"][str(n)]
    assert cluster.gpu.tflops * 1e12 == approx(F, rel=0.05) and cluster.gpu.hbm_GBps * 1e9 == approx(M, rel=0.05)
    assert fit["latency_us"] == approx(lat * 1e6, rel=0.05) and fit["bandwidth_GBps"] * 1e9 == approx(bw, rel=0.05)
