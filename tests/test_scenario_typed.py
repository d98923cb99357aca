"""One typed scenario (issue 44.2, sim/scenario/spec.py) and one flag per idea (issue 43.2,
sim/scenario/flags.py): the same layout written as YAML, as flags, or as a bare ``--mesh`` is the same Scenario
object (``==``) and builds the same plan; the old per-parallelism spellings stop with the new flag's name."""
import argparse

import pytest

from distlab.sim import scenario as sc
from distlab.sim.commands import simulate
from distlab.sim.errors import ConfigError
from distlab.sim.scenario.spec import Scenario


def from_flags(*argv) -> Scenario:
    p = argparse.ArgumentParser()
    simulate.add_arguments(p)
    return simulate.scenario_from_args(p.parse_args(list(argv)))[0]


def from_yaml(tmp_path, text: str) -> Scenario:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return sc.from_dict(str(path))


def plan_json(s: Scenario) -> str:
    return sc.build(s).plan.to_json()


def from_plan_file(tmp_path, s: Scenario) -> tuple[Scenario, str]:
    """(the Scenario of the header of the plan file `distlab simulate --save-plan` writes for ``s``, its plan)."""
    from distlab.sim.plan import Plan
    from distlab.sim.scenario.header import scenario_of_plan, with_header
    path = tmp_path / "plan.json"
    with_header(sc.build(s).plan, s).save(str(path))
    plan = Plan.load(str(path))
    back = scenario_of_plan(plan, str(path))
    return back, plan_json(back)


FSDP_YAML = "model: {preset: gpt2-small, micro_batch: 8}\nmesh: {dp_shard: 8}\nfsdp: {}\ncluster: dgx-h100\nnodes: 1\n"


def test_fsdp_from_yaml_from_flags_and_from_a_bare_mesh_is_one_object_and_one_plan(tmp_path):
    yaml = from_yaml(tmp_path, FSDP_YAML)
    flags = from_flags("--zero", "3")                 # the default model on the default cluster, fsdp by its flag
    mesh = from_flags("--mesh", "dp_shard=8")         # the mesh alone names the parallelism
    header, header_plan = from_plan_file(tmp_path, flags)     # and from the plan file's header
    assert yaml == flags == mesh == header
    assert yaml.workload == "fsdp" and yaml.mesh == (("dp_shard", 8),) and yaml.batch.micro_batch == 8
    assert plan_json(yaml) == plan_json(flags) == plan_json(mesh) == header_plan


COMPOSED_YAML = ("model: llama3-8b\nmesh: {pp: 2, dp_shard: 2, tp: 2}\npipeline: {microbatches: 4}\ntp: {}\n"
                 "cluster: dgx-h100\nnodes: 1\n")


def test_a_composition_from_yaml_from_flags_and_from_a_mesh_with_its_fill_is_one_object_and_one_plan(tmp_path):
    yaml = from_yaml(tmp_path, COMPOSED_YAML)
    flags = from_flags("--model", "llama3-8b", "--mesh", "pp=2,dp_shard=2,tp=2", "--microbatches", "4",
                       "--sequence-parallel", "true")          # a tp flag: still the composition, not tp's builder
    filled = from_flags("--model", "llama3-8b", "--mesh", "pp=2,tp=2", "--microbatches", "4")   # dp_shard fills
    header, header_plan = from_plan_file(tmp_path, filled)
    assert yaml == flags == filled == header
    assert yaml.workload == "composed" and list(yaml.parallelisms) == ["pipeline", "tp", "fsdp"]
    assert yaml.parallelisms["fsdp"].reshard_after_forward is False      # torchtitan's default inside a pipeline
    assert yaml.mesh == (("pp", 2), ("dp_shard", 2), ("tp", 2))
    assert plan_json(yaml) == plan_json(filled) == header_plan


def test_a_different_layout_is_a_different_object(tmp_path):
    assert from_flags("--model", "llama3-8b", "--mesh", "dp_shard=2,tp=4") != \
        from_flags("--model", "llama3-8b", "--mesh", "tp=4,dp_shard=2")          # the mesh's order counts
    assert from_flags("--mesh", "dp_shard=8") != from_flags("--mesh", "dp_shard=8", "--zero", "2")
    assert from_flags("--mesh", "pp=2,tp=2", "--microbatches", "4") != \
        from_flags("--mesh", "pp=2,tp=2", "--microbatches", "8")


def test_equivalent_spellings_give_the_same_memory_and_step(cli_json):
    """Issue 43.2: with pp, dp_shard and tp, a TP flag once chose TP's own builder: on the tree before, the second
    spelling gave 51.59 GB against 40.24 GB with the identical step (1264.427 ms)."""
    common = ["--model", "llama3-8b", "--world-size", "8", "--micro-batch", "1"]
    spellings = [["--mesh", "pp=2,dp_shard=2,tp=2"],
                 ["--mesh", "pp=2,tp=2", "--sequence-parallel", "true"],                  # dp_shard fills
                 ["--mesh", "pp=2,dp_shard=2,tp=2", "--recompute", "none", "--overlap", "true"]]
    runs = [cli_json(*common, *argv) for argv in spellings[:2]]
    steps = {r["step_s"] for r in runs}
    memory = {r["memory"]["total_bytes"] for r in runs}
    assert len(steps) == 1 and len(memory) == 1, (steps, memory)
    assert {r["workload"] for r in runs} == {"composed"}
    first, *others = [from_flags(*common, *argv) for argv in spellings]
    assert all(o == first for o in others)                    # the third spelling too: the same object


@pytest.fixture
def cli_json(capsys):
    import json

    from cli_in_process import run_in_process

    def run(*argv):
        rc, out, err = run_in_process(capsys, "simulate", "--no-files", "--json", *argv)
        assert rc == 0, err
        return json.loads(out)["results"][0]
    return run


@pytest.mark.parametrize("old, new", [("--tp-microbatches", "--microbatches"), ("--cp-recompute", "--recompute"),
                                      ("--ep-overlap", "--overlap"), ("--tp-schedule", "--schedule")])
def test_old_per_parallelism_spellings_name_the_new_flag(old, new):
    with pytest.raises(ConfigError) as e:
        from_flags("--mesh", "pp=2,tp=2", old, "4")
    assert e.value.where == old and new in str(e.value)


def test_one_flag_goes_to_every_parallelism_that_has_the_idea():
    s = from_flags("--model", "llama3-8b", "--mesh", "cp=2,tp=2", "--recompute", "full", "--overlap", "false")
    assert s.parallelisms["tp"].recompute == "full" and s.parallelisms["cp"].recompute == "full"
    assert s.parallelisms["cp"].overlap is False and s.workload == "composed"
    assert s.parallelisms["fsdp"].overlap is False         # CP's overlap covers FSDP2 over dp_shard x cp
    ep = from_flags("--model", "deepseek-v3", "--mesh", "pp=2,ep=4", "--microbatches", "4", "--schedule", "gpipe")
    assert ep.workload == "ep" and ep.parallelisms["ep"].microbatches == 4 and ep.parallelisms["ep"].schedule == "gpipe"
    with pytest.raises(ConfigError, match="needs a pp dimension in --mesh"):     # no pipeline to take it
        from_flags("--model", "llama3-8b", "--mesh", "tp=2", "--microbatches", "4")


def test_a_files_pp_x_tp_in_its_tp_section_takes_the_pipeline_flags(tmp_path):
    """Megatron-LM's layout as sim/reproduce writes it: PP x TP with dp replicas, the pipeline in the tp section."""
    path = tmp_path / "megatron.yaml"
    path.write_text("model: llama3-8b\nmesh: {dp: 2, pp: 2, tp: 2}\ntp: {microbatches: 4}\ncluster: dgx-h100\n")
    s = from_flags(str(path), "--microbatches", "8")
    assert s.workload == "tp" and s.parallelisms["tp"].microbatches == 8


def test_help_is_grouped_each_flag_once_and_short(capsys):
    p = argparse.ArgumentParser(prog="distlab simulate")
    simulate.add_arguments(p)
    text = p.format_help()
    lines = text.splitlines()
    assert len(lines) <= 126 and max(map(len, lines)) <= 100     # 126: --fp8-recipe
    flags = [w for line in lines for w in line.split() if w.startswith("--") and not w.startswith("---")]
    listed = [f.rstrip(",") for f in flags if f.rstrip(",") in p._option_string_actions]
    for f in ("--microbatches", "--recompute", "--schedule", "--split", "--overlap"):
        assert text.count(f"  {f} ") == 1, f
    for group in ("model and batch:", "mesh:", "cluster:", "output:", "fsdp: FSDP2 / ZeRO"):
        assert group in text
    assert "--tp-microbatches" not in text and len(set(listed)) >= 40


def test_fsdp2_bytes_per_parameter_agree_across_builders():
    """Issue 43.2: FSDP2 keeps fp32 shards (torch MixedPrecisionPolicy: "the optimizer step uses the sharded
    parameter in the original dtype"): params 4, grads 4, AdamW m and v 8 bytes an element, in the fsdp report
    (sim/parallel/fsdp/report.py), TP's with dp_shard and the composition's alike; before, the last two showed
    ZeRO's 2 + 2 + 12 for a bf16 model."""
    from distlab.sim.parallel.fsdp.memory import precision
    from distlab.sim.workloads import composed_report, tp
    base = {"model": {"preset": "llama3-8b", "micro_batch": 1, "seq_len": 1024, "layers": 2}, "cluster": "dgx-h100",
            "nodes": 1, "mesh": {"dp_shard": 2, "tp": 4}, "tp": {}}
    by_tp = tp.memory(sc.build(base))["json"]["breakdown_bytes"]
    by_composed = composed_report.memory(sc.build({**base, "fsdp": {}}))["breakdown_bytes"]
    static = ("params", "grads", "optimizer")
    assert [by_tp[k] for k in static] == [by_composed[k] for k in static]
    assert by_tp["params"] == by_tp["grads"] and by_tp["optimizer"] == 2 * by_tp["params"]
    assert precision("bfloat16", fsdp2=True) == (4, 4, 8) and precision("bfloat16") == (2, 2, 12)


@pytest.mark.parametrize("argv, flag", [(["--mesh", "cp=2", "--recompute", "selective"], "--recompute"),
                                        (["--mesh", "dp_shard=8", "--overlap", "maybe"], "--overlap"),
                                        (["--mesh", "pp=2", "--split", "a,b"], "--split")])
def test_errors_name_the_shared_flag_written(argv, flag):
    with pytest.raises(ConfigError) as e:
        from_flags("--model", "llama3-8b", *argv)
    assert e.value.where == flag


def test_a_plan_header_is_data_checked_on_load_and_old_plans_have_none(tmp_path, capsys):
    """A header is validated as any scenario (errors name plan.json: scenario: <key>), never runs a factory, must
    have the plan's world size; a plan written before headers loads as before."""
    import json

    from cli_in_process import run_in_process
    from distlab.sim.plan import Plan
    from distlab.sim.scenario.header import from_data, scenario_of_plan, to_data
    assert scenario_of_plan(Plan.load("scenarios/small-plan.json")) is None
    written = sc.from_dict({"model": "gpt2-small", "mesh": {"pp": 2, "dp_shard": 4}, "pipeline": {"schedule":
                            "gpipe"}, "fsdp": {"reshard_after_forward": True}})      # not the default in a pipeline
    assert from_data(json.loads(json.dumps(to_data(written))), "header") == written
    path = tmp_path / "plan.json"
    rc, out, err = run_in_process(capsys, "simulate", "--no-files", "--model", "gpt2-small", "--mesh", "pp=2,dp_shard=2",
                                  "--world-size", "4", "--microbatches", "4", "--save-plan", str(path))
    assert rc == 0, err
    rc, out, err = run_in_process(capsys, "simulate", str(path), "--no-files")
    assert rc == 0 and "scenario: gpt2-small · mesh pp 2 x dp_shard 2 · pipeline, fsdp" in out, err
    good = json.loads(path.read_text())
    for change, where, words in [({"fsdp": {"zero": 5}}, "scenario: fsdp.zero", "allowed"),
                                 ({"model": {"factory": "os:system"}}, "scenario: model", "code"),
                                 ({"world_size": 8, "mesh": {"pp": 2, "dp_shard": 4}}, "scenario",
                                  "not the plan's 4 ranks")]:
        path.write_text(json.dumps({**good, "scenario": {**good["scenario"], **change}}))
        with pytest.raises(ConfigError) as e:
            scenario_of_plan(Plan.load(str(path)), "plan.json")
        assert e.value.where == f"plan.json: {where}" and words in str(e.value), (change, e.value)


def test_every_shipped_scenario_is_the_same_object_from_its_plan_header():
    """The header writes the options that differ from their defaults (whole where the layout sets a default, e.g.
    FSDP2 in a pipeline): read back, each scenarios/*.yaml is the same Scenario. Parsing only, no plan built."""
    import glob
    import json

    from distlab.sim.scenario.header import from_data, to_data
    paths = sorted(glob.glob("scenarios/*.yaml"))
    assert len(paths) >= 15
    slow = {"model": "gpt2-small", "ddp": {}, "stragglers": {3: 1.5}, "degraded_links": {"node0.nic0.up": 0.5}}
    for path in paths + [slow]:
        s = sc.from_dict(path)
        assert from_data(json.loads(json.dumps(to_data(s))), "header") == s, path


def test_a_plan_file_is_simulated_on_its_headers_cluster_unless_cluster_is_given(tmp_path, capsys):
    """`distlab simulate PLAN` runs on the cluster its scenario header names (not dgx-h100); --cluster wins."""
    import json

    from cli_in_process import run_in_process
    from distlab.sim.scenario.header import with_header
    s = sc.from_dict({"model": "gpt2-small", "ddp": {}, "cluster": "hgx-h200", "world_size": 2})
    path = tmp_path / "plan.json"
    with_header(sc.build(s).plan, s).save(str(path))
    names = []
    for extra in ([], ["--cluster", "dgx-h100"]):
        rc, out, err = run_in_process(capsys, "simulate", str(path), "--no-files", "--json", *extra)
        assert rc == 0, err
        names.append(json.loads(out)["results"][0]["cluster"]["name"])
    assert names[0] != names[1] and "H200" in names[0].upper() and "H100" in names[1].upper(), names
