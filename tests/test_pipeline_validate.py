"""`distlab validate --scenario` with a pipeline scenario: real 1F1B on 2 gloo ranks, calibrated and predicted in
the same launch; the cases hold the predicted and measured makespans and a per-action comparison. (Accuracy
is benchmarks/pipeline_accuracy.py's job, not asserted here.)"""
import json

import pytest
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process (its fork server's ranks)

from distlab.sim.parallel.pipeline import schedules as S

pytest.importorskip("torch.distributed.pipelining")

FAST = ["--holdout-nproc", "none", "--ops", "all_reduce", "--calib-sizes", "64KiB,512KiB", "--sizes", "128KiB",
        "--iters", "2", "--warmup", "1", "--no-overlap"]


@pytest.mark.slow
def test_validate_pipeline_scenario(cli, tmp_path):
    rc, out, err = cli("validate", "--scenario", "scenarios/pipeline-cpu.yaml", "--nproc", "2", *FAST, "--json",
                       "--plot", str(tmp_path / "v.png"), "--out", str(tmp_path / "v.json"), timeout=300)
    assert rc == 0, err
    cases = json.loads(out)["cases"]
    pipe = [c for c in cases if c["kind"] == "pipeline scenario"]
    assert [c["case"] for c in pipe] == ["pipeline makespan (1f1b p=2 m=8)", "pipeline replay (1f1b p=2 m=8)"]
    top = pipe[0]
    assert top["world_size"] == 2 and top["predicted_s"] > 0 and top["measured_s"] > 0
    assert top["error"] == pytest.approx((top["predicted_s"] - top["measured_s"]) / top["measured_s"])
    assert len(top["step_makespans_s"]) == 2 and top["measured_fastest_s"] == min(top["step_makespans_s"])
    assert 0 <= top["predicted_bubble"] < 1 and 0 <= top["measured_bubble"] < 1
    # every action of the schedule, measured and predicted, on the rank that runs it
    ours = S.build("1f1b", 2, 8, 1)
    acts = top["actions"]
    assert sorted(a["action"] for a in acts) == sorted(str(a) for r in ours for a in r)
    for r in range(2):
        assert [a["action"] for a in acts if a["rank"] == r] == [str(a) for a in ours[r]]
    for a in acts:
        assert a["measured_end_s"] > a["measured_start_s"] >= 0
        assert a["predicted_end_s"] > a["predicted_start_s"] >= 0
    # per (stage, kind) mean action time, predicted against measured
    per_action = {c["case"]: c for c in cases if c["kind"] == "pipeline action"}
    assert set(per_action) == {f"stage {s} {k} (mean)" for s in (0, 1) for k in "FB"}
    assert all(c["predicted_s"] > 0 and c["measured_s"] > 0 for c in per_action.values())
    assert (tmp_path / "v.png").stat().st_size > 0
    assert json.loads((tmp_path / "v.json").read_text())["complete"]


def test_validate_pipeline_bad_scenario(cli, tmp_path):
    """A pipeline scenario the runtime cannot run (a GPT model): one clear line, exit code 2, no ranks started."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: gpt2-small\nparallelism: {kind: pipeline, stages: 2, microbatches: 4}\n"
                   "cluster: localhost-cpu\n")
    rc, out, err = cli("validate", "--scenario", str(bad), "--nproc", "2", *FAST)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "mlp" in err, err


@pytest.mark.parametrize("name", ["pipeline-cpu", "pipeline-gpt2"])
def test_shipped_pipeline_scenarios_simulate(name, tmp_path, capsys):
    """The scenarios in scenarios/: `distlab simulate` prints the makespan and bubble and draws the diagram."""
    import os

    from distlab.runtime.cli import main
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert main(["simulate", os.path.join(root, "scenarios", f"{name}.yaml"), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pipeline makespan" in out and "bubble" in out
    assert (tmp_path / "timeline.png").stat().st_size > 0


def test_runtime_config_of_cpu_scenario():
    import os

    from distlab.runtime.parallel.pipeline.validate import runtime_config
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = runtime_config(os.path.join(root, "scenarios", "pipeline-cpu.yaml"))
    assert {k: cfg[k] for k in ("schedule", "stages", "microbatches", "virtual_stages", "layers", "width",
                                "rows")} == dict(schedule="1f1b", stages=2, microbatches=8, virtual_stages=1,
                                                 layers=8, width=256, rows=32)


def _cfg(**kw):
    return {"schedule": "1f1b", "stages": 2, "microbatches": 8, "virtual_stages": 1, "layers": 4, "width": 64,
            "rows": 8, "steps": 3, **kw}


def test_probe_has_fewer_microbatches_than_the_run_it_calibrates():
    from distlab.runtime.parallel.pipeline.validate import probe_config
    for (p, m), want in {(2, 8): 4, (4, 8): 4, (4, 16): 8, (3, 8): 3, (4, 4): 8, (2, 2): 4}.items():
        probe = probe_config(_cfg(stages=p, microbatches=m))
        assert probe["microbatches"] == want and probe["microbatches"] != m
        assert probe["steps"] == 6 and probe["schedule"] == "1f1b"
        for sched, v in (("gpipe", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2)):
            S.check(sched, p, probe["microbatches"], v)          # every schedule accepts it


def test_fit_overhead_recovers_the_runtime_time_per_action():
    """A probe simulated with a known overhead per action, on 4 ranks sharing 2 cores: the fit gives it back;
    a target below the plan without overhead gives 0."""
    from distlab.runtime.parallel.pipeline.validate import block_seconds, cluster_of, fit_overhead, simulate_cfg
    cfg = _cfg(stages=4, microbatches=4, layers=8)
    calib = [{"F": 1e-3, "B": 2e-3, "I": 1e-3, "W": 1e-3}] * 4
    cluster = cluster_of(4, {"small": 1e-4, "large": 2e-4, "bytes": 2**16}, 3e-4, cores=2)
    target = simulate_cfg(cfg, block_seconds(cfg, calib), cluster, 7e-4)[0].makespan
    assert fit_overhead(cfg, calib, cluster, target) == pytest.approx(7e-4, rel=1e-4)
    assert fit_overhead(cfg, calib, cluster, 1e-3) == 0.0


def test_runtime_overhead_is_core_time_but_not_pipeline_busy_time():
    """The "runtime" op after each action: the rank's core is busy (the makespan grows by it on the critical
    path), the bubble counts it as idle, like the gaps in a measured timeline."""
    from distlab.runtime.parallel.pipeline.validate import block_seconds, cluster_of, simulate_cfg
    from distlab.sim.parallel.pipeline import metrics as M
    cfg = _cfg()
    calib = [{"F": 1e-3, "B": 2e-3, "I": 1e-3, "W": 1e-3}] * 2
    cluster = cluster_of(2, {"small": 1e-6, "large": 1e-6, "bytes": 1}, 0.0)
    plain, plan = simulate_cfg(cfg, block_seconds(cfg, calib), cluster)
    slow, plan_o = simulate_cfg(cfg, block_seconds(cfg, calib), cluster, 1e-3)
    assert sum(getattr(o, "name", "") == "runtime" for o in plan_o.ranks[0]) == len(S.build("1f1b", 2, 8, 1)[0])
    assert slow.makespan > plain.makespan
    meta = plan.meta["pipeline"]
    busy = 2 * 8 * (2 * 1e-3 + 2 * 2e-3)           # 2 stages x 8 mb x (F, B of 2 blocks each)
    assert M.compute(slow, meta).bubble == pytest.approx(1 - busy / (2 * slow.makespan))
    # with the overhead counted inside the actions instead, the same timing but a smaller bubble
    inside, _ = simulate_cfg(cfg, block_seconds(cfg, calib, 1e-3), cluster)
    assert inside.makespan == pytest.approx(slow.makespan)
    assert M.compute(inside, meta).bubble < M.compute(slow, meta).bubble
