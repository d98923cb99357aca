"""Interference: compute on a rank runs ``cluster.interference`` times slower exactly while one of its
collectives is in flight (sim/kernel/engine.py, sim/kernel/cores.py); hand-computed timelines."""
from dataclasses import replace

import pytest
from pytest import approx

from distlab.sim.cluster import PRESETS, cluster_from_dict
from distlab.sim.kernel.engine import simulate, simulate_collective
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Collective, Compute, Plan, Record, Wait

CPU = PRESETS["localhost-cpu"]          # 2 ranks, no cpu_cores: each rank computes alone
NBYTES = 64 * 2**20


def overlap_plan(n: int, before: float = 1.0, during: float = 2.0, after: float = 0.5) -> Plan:
    """compute stream: A (``before`` s), Record, B (``during`` s), C (``after`` s);
    comm stream: Wait for A, then one all_reduce: it starts when A ends and overlaps B."""
    ops = [Compute(name="A", seconds=before), Record("a", stream="compute"),
           Compute(name="B", seconds=during), Compute(name="C", seconds=after),
           Wait("a", stream="comm"), Collective("all_reduce", NBYTES, name="ar", stream="comm")]
    return Plan([list(ops) for _ in range(n)]).validate()


def ends(trace, rank: int = 0) -> dict:
    return {o.name: (o.start, o.end) for o in trace.ops if o.rank == rank}


def test_only_the_compute_under_a_collective_slows():
    T = simulate_collective("all_reduce", NBYTES, CPU)[0].makespan        # the all_reduce alone
    assert 0 < T < 2.0 * 0.5                   # it ends while B runs, even at half speed
    slow = replace(CPU, interference=2.0)
    got = ends(simulate(overlap_plan(2), slow))
    assert got["A"] == approx((0.0, 1.0))                                  # before the collective: rate 1
    assert got["ar"] == approx((1.0, 1.0 + T))                             # the collective itself: unchanged
    # B: T seconds at rate 1/2 (T/2 of work done), then its 2 - T/2 s left at rate 1
    assert got["B"] == approx((1.0, 1.0 + T + (2.0 - T / 2)))
    assert got["C"][1] - got["C"][0] == approx(0.5)                        # after it: rate 1 again
    plain = ends(simulate(overlap_plan(2), CPU))
    assert plain["B"] == approx((1.0, 3.0)) and plain["ar"] == approx((1.0, 1.0 + T))


def test_compute_entirely_under_the_collective():
    # B (0.01 s of work) entirely under the collective: it takes 0.01 x 3 = 0.03 s when T > 0.03
    T = simulate_collective("all_reduce", NBYTES, CPU)[0].makespan
    assert T > 0.03
    got = ends(simulate(overlap_plan(2, during=0.01, after=0.0), replace(CPU, interference=3.0)))
    assert got["B"][1] - got["B"][0] == approx(0.03)


def test_interference_and_core_sharing_multiply():
    # 2 ranks on 1 core: B of both ranks share it (rate 1/2); under the collective also / 2 -> 1/4.
    T = simulate_collective("all_reduce", NBYTES, CPU)[0].makespan
    cluster = replace(CPU, cpu_cores=1, interference=2.0)
    got = ends(simulate(overlap_plan(2, before=1.0, during=1.0, after=0.0), cluster))
    # A: both ranks' A share the core: 1 s of work at 1/2 -> ends at 2; then the collective [2, 2 + T]
    assert got["A"] == approx((0.0, 2.0)) and got["ar"] == approx((2.0, 2.0 + T))
    # B: T s at 1/4 (T/4 done), the rest 1 - T/4 at 1/2
    assert T / 4 < 1.0
    assert got["B"][1] == approx(2.0 + T + (1.0 - T / 4) * 2)


def test_symmetric_and_full_simulation_agree_under_interference():
    cluster = PRESETS["dgx-h100"]
    plan = Plan([list(overlap_plan(1).ranks[0]) for _ in range(8)]).validate()
    sym, full = simulate(plan, cluster), simulate(plan, cluster, symmetric=False)
    assert [(o.rank, o.name, o.end) for o in sym.ops] == [(o.rank, o.name, approx(o.end)) for o in full.ops]


def test_gpu_presets_carry_the_published_default():
    assert CPU.interference == 1.0                 # calibrated per machine (distlab calibrate --compute)
    assert {c.interference for name, c in PRESETS.items() if c.gpu.arch != "cpu"} == {1.189}


@pytest.mark.parametrize("value", [0.9, 0, -1, "fast", float("nan"), 1000])
def test_bad_interference_is_refused(value):
    d = CPU.to_dict()
    d["interference"] = value
    with pytest.raises(ConfigError) as e:
        cluster_from_dict(d, where="c.yaml")
    assert e.value.where == "c.yaml: interference" and ">= 1" in str(e.value)


@pytest.mark.parametrize("curve", [[[1e6, 0.5], [1e5, 0.6]], [[1e6, 1.5]], [[1e6]], "steep", [], [[-1, 0.5]],
                                   [[1e6, 0.5], [1e6, 0.6]]])
def test_malformed_efficiency_curve_is_refused(curve):
    d = CPU.to_dict()
    d["gpu"]["gemm_efficiency"] = curve
    with pytest.raises(ConfigError) as e:
        cluster_from_dict(d, where="c.yaml")
    assert e.value.where == "c.yaml: gpu.gemm_efficiency" and "fraction in (0, 1]" in str(e.value)


def test_compute_model_fields_round_trip_through_yaml():
    import yaml
    d = CPU.to_dict()
    d["gpu"].update(gemm_efficiency=[[1e6, 0.2], [1e9, 0.9]], launch_s=5e-6, attention_efficiency=0.6)
    d["interference"] = 1.3
    c = cluster_from_dict(yaml.safe_load(yaml.safe_dump(d)))
    assert c.gpu.gemm_efficiency == ((1e6, 0.2), (1e9, 0.9)) and c.gpu.launch_s == 5e-6
    assert c.interference == 1.3 and cluster_from_dict(yaml.safe_load(c.to_yaml())) == c
    assert "gemm_efficiency" not in CPU.to_dict()["gpu"] and "interference" not in CPU.to_dict()


# --- bad input through the CLI: one line, exit 2 ----------------------------------------------------------
def _cli(capsys, *argv):
    from distlab.runtime.cli import main
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("key, value, words", [
    ("interference", 0.5, ["interference", "must be a factor >= 1"]),
    ("gemm_efficiency", [[1e9, 0.5], [1e6, 0.9]], ["gpu.gemm_efficiency", "flops > 0 increasing"])])
def test_cluster_file_with_bad_compute_fields_is_one_line(capsys, tmp_path, key, value, words):
    import yaml
    d = CPU.to_dict()
    (d["gpu"] if key != "interference" else d)[key] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(d))
    err = _cli(capsys, "collective", "all_reduce", "--sizes", "1MiB", "--cluster", path)
    assert all(w in err for w in words), err


def test_bad_compute_budget_is_one_line(capsys):
    err = _cli(capsys, "calibrate", "--compute", "--compute-budget", "0")
    assert "--compute-budget" in err


# --- the fit of calibrate --compute (runtime/measure/compute_probe.py) on made-up timings -----------------------------
def test_fit_gemms_peak_curve_and_model():
    from distlab.runtime.measure.compute_probe import efficiency_at, fit_gemms, model_time
    launch, peak = 1e-6, 1e11
    eff = {64: 0.25, 256: 0.8, 1024: 1.0}                      # square GEMMs: fraction of the peak
    rows = [{"m": n, "n": n, "k": n, "kind": "square", "flops": 2.0 * n**3,
             "time_s": launch + 2.0 * n**3 / (peak * e)} for n, e in eff.items()]
    rows.append({"m": 8, "n": 1024, "k": 1024, "kind": "skinny", "flops": 2.0 * 8 * 1024**2,
                 "time_s": launch + 2.0 * 8 * 1024**2 / (peak * 0.1)})
    fit = fit_gemms({"dtype": "float32", "launch_s": launch, "copy_Bps": 1e10, "gemms": rows})
    assert fit["tflops"] == approx(peak / 1e12) and fit["launch_s"] == launch and fit["hbm_GBps"] == 10
    assert fit["gemm_efficiency"] == tuple((2.0 * n**3, approx(e)) for n, e in eff.items())
    for r in rows[:3]:                                          # the curve reproduces the square shapes
        assert r["model_error"] == approx(0, abs=1e-3)
    # linear in log10(FLOPs) between points, clamped at both ends
    (f0, e0), (f1, e1) = fit["gemm_efficiency"][:2]
    assert efficiency_at(fit["gemm_efficiency"], (f0 * f1) ** 0.5) == approx((e0 + e1) / 2)
    assert efficiency_at(fit["gemm_efficiency"], 1.0) == approx(0.25)
    assert efficiency_at(fit["gemm_efficiency"], 1e15) == approx(1.0)
    skinny = rows[3]         # 8 x 1024 x 1024 = 1.7e7 FLOPs: the curve says 0.8 x ..., bytes 4.2 MB / 10 GB/s
    bytes_s = (8 * 1024 * 2 + 1024**2) * 4 / 1e10
    assert skinny["model_time_s"] == approx(model_time(8, 1024, 1024, 4, fit))
    assert skinny["model_time_s"] == approx(launch + max(skinny["flops"] / (peak * skinny["curve_efficiency"]),
                                                         bytes_s))
    assert skinny["efficiency"] == approx(0.1, rel=1e-3) and skinny["model_error"] < -0.5   # reported, not hidden
