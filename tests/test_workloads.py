"""The workload registry (sim/workloads): a toy workload registered in one place gets YAML keys, CLI flags, a
sweep key, help text and validation errors; the scenario format (mesh + one section) and its bad input."""
import json
from dataclasses import dataclass

import pytest

from distlab.sim import scenario as sc
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Collective, Compute, Plan
from distlab.sim.workloads import registry
from distlab.sim.workloads.base import Workload, option
from cli_in_process import run_in_process


# --- the toy workload: everything it needs is in this block ----------------------------------------------
@dataclass
class ToyOptions:
    chunks: int = option(2, "all-reduces per step")
    mode: str = option("sum", "what the toy reduces", choices=("sum", "max"), what="toy mode")
    chunk_mib: float = option(1.0, "MiB per all-reduce")

    def validate(self, where):
        if self.chunks < 1:
            raise ConfigError(f"{self.chunks} must be >= 1", f"{where}.chunks")
        return self


def build_toy(model, mesh, opts, cluster):
    ranks = [[Compute("work", seconds=1e-3)] + [Collective("all_reduce", int(opts.chunk_mib * 2**20),
                                                           group=mesh.group_of(r, "toy_dp"), name=f"chunk {k}")
                                                for k in range(opts.chunks)] for r in range(mesh.world_size)]
    return Plan(ranks, name="toy").validate(), {}


TOY = Workload(name="toy", help="a toy: compute, then all-reduce chunks over toy_dp", dims=("toy_dp",),
               options=ToyOptions, build=build_toy, fill_dim="toy_dp", default_dim="toy_dp",
               sweep_row=lambda result: {"chunks_done": result.options.chunks})
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def toy():
    registry.register(TOY)
    yield TOY
    registry.unregister("toy")


def toy_file(tmp_path, section="{chunks: 3}", extra=""):
    p = tmp_path / "toy.yaml"
    p.write_text(f"model: {{kind: mlp, widths: [64, 64], batch: 4}}\ntoy: {section}\ncluster: localhost-cpu\n{extra}")
    return str(p)


def run_cli(capsys, *args):
    return run_in_process(capsys, "simulate", *args)


def test_toy_workload_yaml_keys_and_simulation(toy, tmp_path):
    assert toy.keys() == ("chunks", "mode", "chunk_mib")
    r = sc.simulate(sc.load(toy_file(tmp_path)))
    assert r.options.chunks == 3 and r.workload is toy and r.mesh.as_dict() == {"toy_dp": 2}
    assert sum(isinstance(o, Collective) for o in r.plan.ranks[0]) == 3 and r.summary["comm_s"] > 0
    with pytest.raises(ConfigError, match=r"unknown key 'chunkz' for toy; allowed: chunks, mode, chunk_mib"):
        sc.load(toy_file(tmp_path, "{chunkz: 3}"))
    with pytest.raises(ConfigError, match=r"unknown toy mode 'min'; allowed: sum, max"):
        sc.load(toy_file(tmp_path, "{mode: min}"))
    with pytest.raises(ConfigError, match=r"toy.chunks: 'x' must be a whole number"):
        sc.load(toy_file(tmp_path, "{chunks: x}"))
    with pytest.raises(ConfigError, match=r"toy.chunks: 0 must be >= 1"):
        sc.load(toy_file(tmp_path, "{chunks: 0}"))


def test_toy_workload_flags_help_and_sweep(toy, tmp_path, capsys):
    import json
    rc, out, _ = run_cli(capsys, "--help")
    assert rc == 0
    for text in ("--chunks", "all-reduces per step; default 2", "--mode", "(sum, max)", "--chunk-mib", "toy_dp",
                 "a toy: compute"):
        assert text in out
    path = toy_file(tmp_path)
    rc, out, err = run_cli(capsys, path, "--chunks", "5", "--chunk-mib", "0.5", "--json", "--no-files")
    assert rc == 0, err
    res = json.loads(out)["results"][0]
    assert res["options"] == {"chunks": 5, "mode": "sum", "chunk_mib": 0.5} and res["workload"] == "toy"
    rc, _, err = run_cli(capsys, path, "--mode", "min", "--no-files")
    assert rc == 2 and "unknown toy mode 'min'; allowed: sum, max" in err and len(err.strip().splitlines()) == 1
    rc, out, err = run_cli(capsys, path, "--sweep", "chunks=1,4", "--json", "--no-files")
    assert rc == 0, err
    rows = json.loads(out)["results"]
    assert [r["chunks"] for r in rows] == [1, 4] and [r["chunks_done"] for r in rows] == [1, 4]
    assert rows[1]["comm_s"] > rows[0]["comm_s"]
    rc, out, err = run_cli(capsys, path, "--sweep", "world_size=1,2", "--json", "--no-files")
    assert rc == 0, err
    assert [r["mesh"] for r in json.loads(out)["results"]] == [{"toy_dp": 1}, {"toy_dp": 2}]
    rc, _, err = run_cli(capsys, path, "--sweep", "colour=1,2", "--no-files")
    assert rc == 2 and "toy_dp, chunks, mode, chunk_mib" in err


def test_toy_flags_choose_the_toy_without_a_file_and_are_refused_beside_another(toy, capsys, tmp_path):
    """Without a scenario file a workload's flag chooses that workload (issue 30: every listed flag works without
    a YAML file); beside a file's other parallelism a workload that does not compose is one line."""
    rc, out, err = run_cli(capsys, "--chunks", "3", "--no-files", "--json")
    assert rc == 0, err
    assert json.loads(out)["results"][0]["workload"] == "toy"
    p = tmp_path / "ddp.yaml"
    p.write_text("model: {kind: mlp, widths: [64, 64], batch: 4}\nddp: {}\ncluster: localhost-cpu\n")
    rc, _, err = run_cli(capsys, str(p), "--chunks", "3", "--no-files")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "the toy section does not compose" in err


@pytest.mark.parametrize("text, words", [
    ("mesh: {dp: 3}\nddp: {}\n", ["mesh", "dp 3 = 3 ranks, but the world has 8"]),
    ("mesh: {dp_replicate: 3, dp_shard: 2}\nfsdp: {}\n", ["mesh", "= 6 ranks, but the world has 8"]),
    ("mesh: {dp_shard: 3}\nfsdp: {}\n", ["shard group size 3 must divide the world size 8"]),
    ("mesh: {tp: 2}\nddp: {}\n", ["tensor parallelism needs a transformer described by its structure"]),       # DDP x TP
    ("mesh: {ep: 2}\nddp: {}\n", ["unknown mesh dimension 'ep' for a composition; allowed: pp, dp_replicate"]),
    ("pipeline: {microbatches: 4}\n", ["pipeline section needs mesh dimension pp"]),
    ("mesh: {dp: 8}\npipeline: {}\n", ["needs mesh dimension 'pp' (pipeline stages)"]),
    ("ddp: {bucket_size: 5}\n", ["unknown key 'bucket_size' for ddp; allowed: bucket_cap_mb"]),
    ("fsdp: {zero: 3, shard_size: 4}\n", ["unknown key 'shard_size' for fsdp"]),
    ("ddp: {}\nfsdp: {}\n", ["give fsdp (dp_shard, dp_replicate) or ddp (dp), not both"]),
    ("mesh: {pp: 2, dp_shard: 4}\nep: {}\n", ["the ep section does not compose with others"]),
    ("cluster: dgx-h100\n", ["missing a parallelism section: one of ddp, fsdp, pipeline"]),
    ("parallelism: {kind: ddp}\nddp: {}\n", ["either the old parallelism"]),
    ("mesh: {dp: two}\nddp: {}\n", ["mesh.dp", "whole number"]),
    ("ddp: {compress: gzip}\n", ["unknown compression 'gzip'; allowed: fp16"]),
    ("fsdp: {overlap: maybe}\n", ["fsdp.overlap", "true or false"]),
])
def test_bad_scenarios_are_one_line_exit_2(tmp_path, capsys, text, words):
    p = tmp_path / "bad.yaml"
    p.write_text("model: {kind: mlp, widths: [64, 64], batch: 4}\n" + text)
    rc, out, err = run_cli(capsys, str(p), "--no-files")
    assert rc == 2 and len(err.strip().splitlines()) == 1, (out, err)
    for w in words:
        assert w in err


@pytest.mark.parametrize("args, words", [(["--mesh", "pp2"], ["--mesh", "DIM=N"]),
                                         (["--zero", "5"], ["--zero", "unknown ZeRO stage 5"]),
                                         (["--mesh", "pp=2,dp=2,dp_shard=2"], ["dp (DDP) composes with pp and tp"]),
                                         (["--sweep", "stages=2,4"], ["--sweep", "bucket_cap_mb"]),
                                         (["--algo", "carrier-pigeon"], ["unknown algorithm"])])
def test_bad_flags_are_one_line_exit_2(capsys, args, words):
    rc, _, err = run_cli(capsys, *args, "--no-files")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err


def test_old_format_translates_to_mesh_and_section():
    d = sc.validate({"model": "gpt2-small", "parallelism": {"kind": "fsdp", "zero": 2, "shard_size": 4},
                     "cluster": "dgx-h100"})
    assert d["fsdp"] == {"zero": 2} and d["mesh"] == {"dp_shard": 4} and "parallelism" not in d
    assert sc.parallelism(d) == {"kind": "fsdp", "zero": 2, "shard_size": 4}
    r = sc.build(d)
    assert r.mesh.as_dict() == {"dp_replicate": 2, "dp_shard": 4} and r.plan.meta["shard_size"] == 4
    p = sc.validate({"model": "gpt2-small", "parallelism": {"kind": "pipeline", "stages": 4}})
    assert p["mesh"] == {"dp": 1, "pp": 4} and p["world_size"] == 4
    assert sc.validate({"model": "gpt2-small", "parallelism": "ddp"})["ddp"] == {}


def test_missing_mesh_dims_default_sensibly():
    base = {"model": {"kind": "mlp", "widths": [64, 64], "batch": 4}, "cluster": "dgx-h100"}
    assert sc.build({**base, "ddp": {}}).mesh.as_dict() == {"dp": 8}
    assert sc.build({**base, "fsdp": {}}).mesh.as_dict() == {"dp_shard": 8}
    assert sc.build({**base, "fsdp": {}, "mesh": {"dp_shard": 4}}).mesh.as_dict() == {"dp_replicate": 2,
                                                                                       "dp_shard": 4}
    r = sc.build({**base, "model": {"kind": "mlp", "widths": [64] * 5, "batch": 4}, "pipeline": {},
                  "mesh": {"pp": 2}, "nodes": 2})
    assert r.mesh.as_dict() == {"dp": 8, "pp": 2} and r.plan.world_size == 16


def test_pipeline_on_a_pp_outer_mesh_takes_groups_from_the_mesh():
    """mesh {pp: 2, dp: 2}: pipeline peers are ranks r and r + 2, replicas r and r + 1 (torchtitan's order)."""
    from distlab.sim.plan import Send
    base = {"model": {"kind": "mlp", "widths": [64] * 5, "batch": 4}, "cluster": "dgx-h100", "world_size": 4,
            "pipeline": {"microbatches": 2}}
    r = sc.build({**base, "mesh": {"pp": 2, "dp": 2}})
    peers = {o.peer for o in r.plan.ranks[0] if isinstance(o, Send)}
    groups = {o.group for o in r.plan.ranks[0] if isinstance(o, Collective)}
    assert peers == {2} and groups == {(0, 1)}
    default = sc.build({**base, "mesh": {"dp": 2, "pp": 2}})
    assert {o.peer for o in default.plan.ranks[0] if isinstance(o, Send)} == {1}


def test_sweeping_stages_of_an_old_pipeline_file_keeps_one_replica():
    """Old format without world_size: the world was stages x 1, and a sweep of stages keeps it so."""
    from distlab.sim.scenario.pipeline import sweep_results
    d = sc.validate({"model": {"kind": "mlp", "widths": [64] * 9, "batch": 4},
                     "parallelism": {"kind": "pipeline", "stages": 2, "microbatches": 4}, "cluster": "dgx-h100"})
    rows = sweep_results(d, "stages", [2, 4])
    assert [r["world_size"] for r in rows] == [2, 4]
    d = sc.validate({"model": {"kind": "mlp", "widths": [64] * 9, "batch": 4}, "mesh": {"pp": 2},
                     "pipeline": {"microbatches": 4}, "cluster": "dgx-h100"})
    assert [r["world_size"] for r in sweep_results(d, "pp", [2, 4])] == [8, 8]     # dp takes the rest
