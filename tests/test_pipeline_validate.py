"""`distlab validate --scenario` with a pipeline scenario: real 1F1B on 2 gloo ranks, calibrated and predicted in
the same launch; the cases hold the predicted and measured makespans and a per-action comparison. (Accuracy
is benchmarks/pipeline_accuracy.py's job, not asserted here.)"""
import json

import pytest

from sim.pipeline import schedules as S

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

    from runtime.cli import main
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert main(["simulate", os.path.join(root, "scenarios", f"{name}.yaml"), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pipeline makespan" in out and "bubble" in out
    assert (tmp_path / "timeline.png").stat().st_size > 0


def test_runtime_config_of_cpu_scenario():
    import os

    from runtime.pipeline_validate import runtime_config
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = runtime_config(os.path.join(root, "scenarios", "pipeline-cpu.yaml"))
    assert {k: cfg[k] for k in ("schedule", "stages", "microbatches", "virtual_stages", "layers", "width",
                                "rows")} == dict(schedule="1f1b", stages=2, microbatches=8, virtual_stages=1,
                                                 layers=8, width=256, rows=32)
