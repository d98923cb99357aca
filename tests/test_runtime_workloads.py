"""The runtime's workload registry (runtime/parallel/registry.py): one record per runtime/<name>/ folder, the workload of a
scenario in either format (flat ``parallelism.kind`` or ``mesh:`` + one section per parallelism), one-line
errors listing the allowed workloads, and launch targets that resolve after the move into folders."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from distlab.runtime.cli import main
from distlab.runtime.measure.validation import workload_section
from distlab.runtime.parallel.registry import WORKLOADS, scenario_workload
from distlab.sim.errors import ConfigError
from distlab.sim.io import load_yaml

ROOT = Path(__file__).resolve().parent.parent


def test_each_workload_is_its_own_folder():
    assert list(WORKLOADS) == ["ddp", "fsdp", "pipeline", "tp", "cp", "ep", "composed"]
    for name, w in WORKLOADS.items():
        assert w.name == name and (ROOT / "runtime" / "parallel" / name / "run.py").is_file()
        assert w.run.__module__ == f"distlab.runtime.parallel.{name}.run"
        assert w.validate.__module__ == w.cases.__module__ == f"distlab.runtime.parallel.{name}.validate"


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_scenarios_name_their_workload(path):
    from distlab.sim.workloads.registry import names as simulated
    spec = load_yaml(str(path))
    kind = spec["parallelism"]["kind"] if "parallelism" in spec else next(k for k in spec if k in simulated())
    if len([k for k in spec if k in simulated()]) > 1:          # a composition (runtime/parallel/composed/)
        kind = "composed"
    if kind not in WORKLOADS:            # simulated only (tp): refused in one line that says so
        with pytest.raises(ConfigError, match=f"workload '{kind}' is simulated but has no real run yet"):
            scenario_workload(spec, str(path))
        return
    assert scenario_workload(spec, str(path)) == kind
    assert kind == "composed" or workload_section(spec, kind) is not None


def test_mesh_format_takes_the_section_named_after_a_workload():
    spec = {"model": {"preset": "gpt2-small"}, "mesh": {"dp_shard": 2}, "fsdp": {"reshard_after_forward": False}}
    assert scenario_workload(spec, "s.yaml") == "fsdp"
    assert workload_section(spec, "fsdp") == {"reshard_after_forward": False}
    assert workload_section({"mesh": {"dp": 2}, "ddp": None}, "ddp") == {}
    flat = {"parallelism": {"kind": "ddp", "bucket_cap_mb": 5}}
    assert workload_section(flat, "ddp") == {"bucket_cap_mb": 5} and workload_section(flat, "fsdp") is None


def test_several_sections_or_a_mesh_of_several_parallelisms_are_the_composed_run():
    assert scenario_workload({"mesh": {"pp": 2, "dp": 2}, "pipeline": {}, "ddp": {}}, "s.yaml") == "composed"
    assert scenario_workload({"mesh": {"pp": 2, "dp_shard": 2, "tp": 2}}, "s.yaml") == "composed"
    assert scenario_workload({"mesh": {"dp_shard": 2, "tp": 2}, "tp": {}}, "s.yaml") == "tp"     # tp's own dims


ALLOWED = "allowed: ddp, fsdp, pipeline, tp, cp, ep, composed"


@pytest.mark.parametrize("spec, message", [
    ({"parallelism": {"kind": "xp"}}, f"scenario kind 'xp' not supported yet; {ALLOWED}"),
    ({"mesh": {"dp": 2}, "bogus": {}}, f"found no workload section; {ALLOWED}"),
    (["not", "a", "mapping"], f"allowed workloads: {ALLOWED.removeprefix('allowed: ')}"),
])
def test_unknown_workloads_are_one_line_errors(spec, message):
    with pytest.raises(ConfigError) as e:
        scenario_workload(spec, "s.yaml")
    assert str(e.value).startswith("s.yaml: ") and message in str(e.value) and "\n" not in str(e.value)


def test_validate_cli_refuses_a_composition_the_real_run_does_not_build_before_starting_ranks(tmp_path, capsys):
    """Two sections compose (runtime/compose/validate.py); PP x DDP replicas is not a real run: one line."""
    path = tmp_path / "s.yaml"
    path.write_text("model: gpt2-small\nmesh: {pp: 2}\npipeline: {}\nddp: {}\ncluster: localhost-cpu\n")
    assert main(["validate", "--scenario", str(path), "--nproc", "2", "--holdout-nproc", "none"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "real composed run builds meshes of pp" in err and "dp" in err


def test_every_launch_target_in_runtime_resolves():
    """"distlab.runtime.<module>:<function>" strings (what ranks import) name existing functions."""
    pattern = re.compile(r"^distlab\.runtime\.[\w.]+:\w+$")
    targets = {node.value for path in (ROOT / "runtime").rglob("*.py")
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)
               and isinstance(node.value, str) and pattern.match(node.value)}
    assert {"distlab.runtime.parallel.ddp.run:rank_task", "distlab.runtime.parallel.fsdp.run:rank_task",
            "distlab.runtime.parallel.pipeline.run:rank_main", "distlab.runtime.parallel.ddp.buckets:bucket_task"} <= targets
    for target in targets:
        module, name = target.split(":")
        assert callable(getattr(importlib.import_module(module), name)), target


def test_a_workload_the_simulator_has_but_the_runtime_lacks_says_so():
    """A section naming a simulated-only workload is refused in one line that says it has no real run yet."""
    import dataclasses

    from distlab.sim.workloads.base import Workload
    from distlab.sim.workloads.registry import register, unregister

    @dataclasses.dataclass
    class Options:
        pass
    register(Workload(name="toyrt", help="a toy", dims=("dp",), options=Options, build=lambda *a: None,
                      fill_dim="dp", default_dim="dp"))
    try:
        with pytest.raises(ConfigError, match="workload 'toyrt' is simulated but has no real run yet"):
            scenario_workload({"mesh": {"dp": 2}, "toyrt": {}}, "s.yaml")
    finally:
        unregister("toyrt")


def test_validate_hands_each_workload_the_typed_scenario_and_never_reads_the_file_again(monkeypatch):
    """`distlab validate --scenario` parses the file once (runtime/commands/validate.py); the registry gives the
    workload's cases that very Scenario, and every prepare takes it: the same layout as from the file, no read."""
    import dataclasses

    import distlab.sim.io as io
    from distlab.runtime.parallel import registry
    from distlab.runtime.parallel.composed.validate import prepare as composed_prepare
    from distlab.runtime.parallel.cp.validate import prepare as cp_prepare
    from distlab.runtime.parallel.ep.validate import prepare as ep_prepare
    from distlab.runtime.parallel.pipeline.validate import runtime_config
    from distlab.runtime.parallel.tp.validate import prepare as tp_prepare
    from distlab.sim import scenario as sc
    files = {name: f"scenarios/{name}-cpu.yaml" for name in ("ddp", "fsdp", "pipeline", "tp", "cp", "moe", "composed")}
    parsed = {name: sc.from_dict(str(ROOT / path)) for name, path in files.items()}
    want = {"tp": tp_prepare(str(ROOT / files["tp"]), 2)[0].plan.to_json(),
            "composed": composed_prepare(str(ROOT / files["composed"]), 8)[0].plan.to_json(),
            "cp": cp_prepare(str(ROOT / files["cp"]), 2)[2].to_json(),
            "pipeline": runtime_config(str(ROOT / files["pipeline"]))}

    def no_read(*a, **k):
        raise AssertionError("the scenario file was read again")
    monkeypatch.setattr(io, "load_yaml", no_read)
    seen = []
    for s in parsed.values():
        record = dataclasses.replace(WORKLOADS[s.workload], cases=lambda scenario, args: seen.append(scenario) or [])
        monkeypatch.setitem(registry.WORKLOADS, s.workload, record)
        assert registry.scenario_cases("never-read.yaml", None, s) == []
    assert len(seen) == len(parsed) and all(a is b for a, b in zip(seen, parsed.values()))
    assert tp_prepare(parsed["tp"], 2)[0].plan.to_json() == want["tp"]
    assert composed_prepare(parsed["composed"], 8)[0].plan.to_json() == want["composed"]
    assert cp_prepare(parsed["cp"], 2)[2].to_json() == want["cp"]
    assert runtime_config(parsed["pipeline"]) == want["pipeline"]
    assert ep_prepare(parsed["moe"], 4)[1] == parsed["moe"].options("ep").skew
