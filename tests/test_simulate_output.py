"""`distlab simulate`: plans as files (--save-plan, a plan .json as input), labels and assumptions that follow
the overrides, FSDP2's mixed-precision memory split, configurations that do not fit, JSON conventions."""
import json
import pathlib

import pytest

from distlab.sim.plan import Plan

ROOT = pathlib.Path(__file__).parent.parent


def run_cli(capsys, *args):
    from distlab.runtime.cli import main
    rc = main(["simulate", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_save_plan_then_simulate_the_plan_file(tmp_path, capsys):
    path = tmp_path / "plan.json"
    rc, out, err = run_cli(capsys, str(ROOT / "scenarios" / "ddp-cpu.yaml"), "--save-plan", str(path), "--json",
                           "--no-files")
    assert rc == 0, err
    scenario_run = json.loads(out)
    plan = Plan.load(str(path))
    assert plan.world_size == 2 and plan.meta["builder"] == "ddp"
    rc, out, err = run_cli(capsys, str(path), "--cluster", "localhost-cpu", "--json", "--no-files")
    assert rc == 0, err
    plan_run = json.loads(out)
    assert list(plan_run) == ["schema", "results", "files"] and plan_run["schema"] == "distlab.simulate/1"
    assert plan_run["results"][0]["step_s"] == pytest.approx(scenario_run["results"][0]["step_s"])
    assert plan_run["results"][0]["world_size"] == 2


def test_example_plan_in_the_repository_simulates(tmp_path, capsys):
    rc, out, err = run_cli(capsys, str(ROOT / "scenarios" / "example-plan.json"), "--out", str(tmp_path))
    assert rc == 0, err
    assert "step time" in out and "exposed communication" in out
    assert (tmp_path / "timeline.png").stat().st_size > 0 and (tmp_path / "trace.json").stat().st_size > 0


@pytest.mark.parametrize("content, args, words", [
    ('{"format": "distlab-plan/1", "ranks": [[{"kind": "teleport"}]]}', [], ["unknown op kind 'teleport'"]),
    ("not json", [], ["not valid JSON"]),
    (None, ["--model", "llama-7b"], ["--model does not apply to a plan file"]),
])
def test_bad_plan_files_are_one_line_exit_2(tmp_path, capsys, content, args, words):
    path = tmp_path / "p.json"
    path.write_text(content if content is not None else (ROOT / "scenarios" / "example-plan.json").read_text())
    rc, _, err = run_cli(capsys, str(path), *args, "--no-files")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err


def test_labels_and_assumptions_follow_the_overrides(capsys):
    rc, out, err = run_cli(capsys, "--model", "llama-70b", "--nodes", "2", "--no-files")
    assert rc == 0, err
    out = " ".join(out.split())            # lines wrap at 100 columns (sim/cli.py)
    assert "gpt2-small" not in out and "one DGX H100" not in out
    assert "scenario: llama-70b ddp on 2 x dgx-h100 (16 ranks)" in out
    assert "80 blocks" in out and "micro_batch=1, seq_len=4096, blocks=80" in out
    assert "activation_checkpointing=false" in out and "grad_dtype=bfloat16" in out   # DDP: none
    # 70B with DDP holds 16 bytes per parameter on every GPU: flagged as `distlab memory` does
    assert "fits the GPU" in out and "NO: over 80 GiB" in out and "warning: does not fit" in out
    # every marker explained: exposed / overlap and the bucket table's columns and '-'
    assert "exposed: communication during which rank 0 computes nothing" in out
    assert "launch: DDP's rule" in out and "'-': never" in out


def test_file_scenario_with_overrides_says_so(capsys):
    from distlab.sim.commands.simulate_output import title
    rc, out, err = run_cli(capsys, str(ROOT / "scenarios" / "ddp-gpt2-small.yaml"), "--model", "llama-7b",
                           "--json", "--no-files")
    res = json.loads(out)["results"][0]
    assert res["label"] == "llama-7b ddp on dgx-h100 (8 ranks)" and res["overrides"] == ["--model llama-7b"]
    assert res["model"]["name"] == "llama-7b" and res["assumptions"]["blocks"] == 32
    from distlab.sim import scenario as sc
    r = sc.simulate(res["scenario"])
    assert title(r).startswith("llama-7b ddp on dgx-h100 (8 ranks): step")


def test_gpt2_small_has_12_blocks(capsys):
    rc, out, _ = run_cli(capsys, "--no-files")
    assert "12 blocks + embedding, head" in out and "14 layers" not in out


def test_fsdp2_mixed_precision_breakdown(capsys):
    rc, out, err = run_cli(capsys, str(ROOT / "scenarios" / "fsdp-llama-7b.yaml"), "--json", "--no-files")
    assert rc == 0, err
    res = json.loads(out)["results"][0]
    shown = res["peak_memory"]["fsdp2_breakdown_bytes"]
    plan_view = res["peak_memory"]["breakdown_bytes"]
    n = plan_view["params"] // 2                                  # bf16 shard elements in the plan's accounting
    assert shown["params (fp32 shards; bfloat16 gathered below)"] == 4 * n
    assert shown["grads (fp32 shards)"] == 4 * n and shown["optimizer (Adam m, v: fp32 shards)"] == 8 * n
    assert shown["unsharded params (bfloat16, gathered)"] == plan_view["unsharded params"]
    assert sum(shown.values()) == res["peak_memory"]["total_bytes"]       # the same 16 bytes per element in all
    assert res["assumptions"]["sharded_param_dtype"] == "float32" and res["assumptions"]["param_dtype"] == "bfloat16"


def test_hsdp_mesh_placement_and_warning(capsys):
    rc, out, err = run_cli(capsys, str(ROOT / "scenarios" / "fsdp-llama-7b.yaml"), "--mesh",
                           "dp_shard=8,dp_replicate=2", "--json", "--no-files")
    res = json.loads(out)["results"][0]
    assert res["mesh"]["dims"] == {"dp_shard": 8, "dp_replicate": 2}
    place = {p["dim"]: p for p in res["mesh"]["placement"]}
    assert not place["dp_shard"].get("intra_node") and place["dp_shard"]["nodes_per_group"] == 2
    assert any("'dp_shard'" in w for w in res["warnings"])
    rc, out, err = run_cli(capsys, str(ROOT / "scenarios" / "fsdp-llama-7b.yaml"), "--mesh",
                           "dp_replicate=2,dp_shard=8", "--json", "--no-files")
    res = json.loads(out)["results"][0]
    assert all(p["intra_node"] for p in res["mesh"]["placement"] if p["dim"] == "dp_shard")
    assert res["warnings"] == []
