"""Pipeline plans on the simulator: bubble formulas, in-flight microbatches, ZB-H1 vs 1F1B, p2p, DP, errors."""
import pytest

from distlab.sim.cluster import PRESETS, Cluster, GPUSpec, IntraNode
from distlab.sim.kernel.engine import simulate
from distlab.sim.errors import ConfigError
from distlab.sim.models import Layer, Model, Param, mlp
from distlab.sim.parallel.pipeline import metrics as M
from distlab.sim.parallel.pipeline import schedules as S
from distlab.sim.parallel.pipeline.plan import PipelineSpec, build_plan

# 1 FLOP = 1 ms; zero-latency fabric and zero-byte messages: free p2p
FREE = Cluster("free", 1, 16, GPUSpec("unit", tflops=1e-9, hbm_GBps=1.0, memory_GiB=1.0),
               IntraNode("nvswitch", 1.0, 0.0))


def uniform(n_layers, f=1.0, act=1000.0):
    """n identical layers: forward f, backward 2f, ``act`` activation bytes each."""
    return Model("uniform", [Layer(f"l{i}", [Param(f"l{i}.w", (8, 8))], fwd_flops=f, bwd_flops=2 * f,
                                   activation_bytes=act) for i in range(n_layers)])


def run(schedule, p, m, v=1, layers=None, **kw):
    model = uniform(layers or p * v, f=1.0 / v if layers is None else 1.0)
    plan = build_plan(model, PipelineSpec(schedule, p, m, v, **kw), p2p_bytes=0)
    trace = simulate(plan, FREE)
    return plan, trace, M.compute(trace, plan.meta["pipeline"])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (3, 6), (4, 8), (4, 16), (8, 8)])
def test_bubble_gpipe_1f1b(schedule, p, m):
    _, _, met = run(schedule, p, m)
    assert met.bubble == pytest.approx((p - 1) / (m + p - 1), rel=1e-9)
    assert met.makespan == pytest.approx((m + p - 1) * 3e-3, rel=1e-9)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (3, 6, 2), (4, 16, 2), (2, 8, 3)])
def test_bubble_interleaved(p, m, v):
    _, _, met = run("interleaved", p, m, v)
    assert met.bubble == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-9)


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 16)])
def test_peak_in_flight(p, m):
    assert run("gpipe", p, m)[2].peak_in_flight == {s: m for s in range(p)}
    assert run("1f1b", p, m)[2].peak_in_flight == {s: p - s for s in range(p)}


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 16)])
def test_zbh1_beats_1f1b_at_equal_peak_memory(p, m):
    _, _, one = run("1f1b", p, m)
    _, _, zb = run("zbh1", p, m)
    assert zb.bubble < one.bubble
    assert max(zb.peak_rank_memory) == max(one.peak_rank_memory) == p * 1000.0
    # 2401.10241: ZB-H1 bubble time (p-1)(T_F + T_B - T_W) with T_F = T_B(I) = T_W = 1 ms, 1F1B (p-1)(T_F + 2 T_B)
    assert zb.makespan - m * 3e-3 == pytest.approx((p - 1) * 1e-3, rel=1e-9)


def test_zbv_smallest_bubble():
    bubbles = {s: run(s, 4, 8, v)[2].bubble for s, v in [("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2)]}
    assert bubbles["zbv"] < bubbles["zbh1"] < bubbles["1f1b"] and bubbles["interleaved"] < bubbles["1f1b"]


@pytest.mark.parametrize("schedule,p,m,v", [(s, p, m, v) for s, v in [("gpipe", 1), ("1f1b", 1), ("interleaved", 2),
                                                                     ("interleaved", 3), ("zbh1", 1), ("zbv", 2)]
                                             for p in (1, 2, 3, 4) for m in (4, 5, 8)
                                             if m >= p and m % max(1, m // p) == 0])
def test_engine_matches_ideal_and_real_network_runs(schedule, p, m, v):
    plan, trace, met = run(schedule, p, m, v)
    ideal = M.ideal_trace(S.build(schedule, p, m, v), lambda a: {"F": 1, "B": 2, "I": 1, "W": 1}[a.kind] * 1e-3 / v)
    assert met.makespan == pytest.approx(ideal.makespan, rel=1e-9)
    # with real bytes on a real fabric: no deadlock, every boundary crossing is one send
    model = mlp(*[256] * (p * v * 2 + 1), batch=16, dtype="bfloat16")
    plan = build_plan(model, PipelineSpec(schedule, p, m, v))
    met = M.compute(simulate(plan, PRESETS["dgx-h100"]), plan.meta["pipeline"])
    place = S.stage_to_rank(schedule, p, v)
    crossings = sum(place[s] != place[s + 1] for s in range(p * v - 1))
    assert met.p2p_bytes == 2 * m * crossings * 16 * 256 * 2 and (met.p2p_seconds > 0) == (crossings > 0)


def test_data_parallel_all_reduce_per_stage():
    model = mlp(*[512] * 9, batch=8)
    plan = build_plan(model, PipelineSpec("interleaved", 2, 4, 2, data_parallel=3))
    assert plan.world_size == 6
    trace = simulate(plan, PRESETS["dgx-h100"])
    ars = [o for o in trace.ops if o.kind == "collective"]
    assert len(ars) == 6 * 2 and all(o.op == "all_reduce" for o in ars)
    assert {o.group for o in ars} == {(0, 2, 4), (1, 3, 5)}
    assert all(o.bytes == 2 * (512 * 512 + 512) * 4 for o in ars)


def test_split_and_memory():
    plan, trace, met = run("1f1b", 2, 4, layers=6, split=[4, 2])
    assert plan.meta["pipeline"]["layers_per_stage"] == [4, 2]
    assert met.peak_stage_memory == {0: 2 * 4000.0, 1: 1 * 2000.0}


@pytest.mark.parametrize("kw,match", [
    (dict(schedule="1f1b", stages=4, microbatches=2), "at least as many microbatches"),
    (dict(schedule="interleaved", stages=2, microbatches=4, virtual_stages=3), "do not split evenly"),
    (dict(schedule="gpipe", stages=2, microbatches=4, split=[3, 3]), "summing to 8"),
    (dict(schedule="zbv", stages=2, microbatches=4, virtual_stages=1), "exactly 2 stages"),
    (dict(schedule="zbh1", stages=3, microbatches=7), "multiple of the rounds"),
])
def test_config_errors_are_one_line(kw, match):
    with pytest.raises(ConfigError, match=match) as e:
        build_plan(uniform(8), PipelineSpec(**kw))
    assert "\n" not in str(e.value)


def test_diagram_png(tmp_path):
    from distlab.sim.parallel.pipeline import diagram
    plan, trace, met = run("zbv", 2, 4, 2)
    path = tmp_path / "pp.png"
    diagram.draw(trace, str(path), title=diagram.title_for(plan.meta["pipeline"], met), p=2)
    assert path.read_bytes()[:4] == b"\x89PNG"


def _scenario(tmp_path, par: str) -> str:
    path = tmp_path / "pp.yaml"
    path.write_text("model: {kind: mlp, widths: [64, 64, 64, 64, 64], batch: 8}\n"
                    f"parallelism: {par}\ncluster: dgx-h100\n")
    return str(path)


@pytest.mark.parametrize("par,match", [
    ("{kind: pipeline, schedule: 1f1b, stages: 4, microbatches: 2}", "at least as many microbatches"),
    ("{kind: pipeline, schedule: interleaved, stages: 2, virtual_stages: 3, microbatches: 4}", "split evenly"),
    ("{kind: pipeline, schedule: nope}", "unknown pipeline schedule"),
    ("{kind: pipeline, stagez: 2}", "unknown key 'stagez'"),
])
def test_cli_bad_input_one_line_exit_2(tmp_path, capsys, par, match):
    from distlab.runtime.cli import main
    assert main(["simulate", _scenario(tmp_path, par), "--no-files"]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


def test_cli_simulate_and_sweep(tmp_path, capsys):
    import json

    from distlab.runtime.cli import main
    path = _scenario(tmp_path, "{kind: pipeline, schedule: 1f1b, stages: 2, microbatches: 4}")
    assert main(["simulate", path, "--out", str(tmp_path / "out")]) == 0
    assert "bubble" in capsys.readouterr().out and (tmp_path / "out" / "timeline.png").exists()
    assert main(["simulate", path, "--sweep", "microbatches=2,4,8,16", "--json", "--out", str(tmp_path / "out")]) == 0
    res = json.loads(capsys.readouterr().out)["results"]
    bubbles = [r["bubble"] for r in res]
    assert bubbles == sorted(bubbles, reverse=True) and (tmp_path / "out" / "sweep-microbatches.png").exists()


def test_bubble_counts_only_compute_as_busy():
    """GPipe/1F1B receive on the compute stream; the wait and the transfer are bubble, not work."""
    model = uniform(4)
    slow = Cluster("slow", 1, 4, GPUSpec("unit", tflops=1e-9, hbm_GBps=1.0, memory_GiB=1.0),
                   IntraNode("pcie", 1e-3, 100.0))   # 1 MB/s: a 1000-byte message takes 1 ms
    plan = build_plan(model, PipelineSpec("1f1b", 4, 4), p2p_bytes=1000)
    met = M.compute(simulate(plan, slow), plan.meta["pipeline"])
    assert met.busy == pytest.approx([4 * 3e-3] * 4)
    assert met.makespan > 7 * 3e-3 and met.p2p_seconds > 0


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_receive_on_demand_vs_early(schedule):
    """torch's single-stage schedules post a receive just before it is needed: its latency is exposed;
    posted early (as the multi-stage lowering does) the transfer overlaps the receiver's compute."""
    lat = Cluster("lat", 1, 4, GPUSpec("unit", tflops=1e-9, hbm_GBps=1.0, memory_GiB=1.0),
                  IntraNode("pcie", 1.0, 200.0))     # 0.2 ms per message
    span = {}
    for recv in ("on-demand", "early"):
        plan = build_plan(uniform(4), PipelineSpec(schedule, 4, 8, recv=recv), p2p_bytes=0)
        kinds = {op.kind for op in plan.ranks[1] if op.stream == "compute"}
        assert ("recv" in kinds) == (recv == "on-demand")
        span[recv] = simulate(plan, lat).makespan
    assert span["early"] < span["on-demand"]
    auto = build_plan(uniform(4), PipelineSpec(schedule, 4, 8), p2p_bytes=0)
    assert simulate(auto, lat).makespan == pytest.approx(span["on-demand"])
