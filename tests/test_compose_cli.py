"""Compositions from scenarios and the command line (sim/workloads/composed.py, sim/commands/simulate.py): every flag
`distlab simulate --help` lists works without a scenario file (the flags and --mesh choose the parallelisms), a
scenario with a section per parallelism composes them on its mesh, the fill dimension goes to torchtitan's place,
the pipeline splits Llama 3 405B's 126 blocks as Llama 3 and torchtitan do, and bad input is one line."""
import json

import re

import pytest

from distlab.sim import scenario as sc
from distlab.sim.errors import ConfigError
from distlab.sim.parallel.pipeline.split import stage_split, torchtitan_split
from cli_in_process import run_in_process

FLAG_SETS = {   # every flag of every parallelism, none with a scenario file
    "ddp": "--bucket-cap-mb 5 --iteration 1 --grad-accum 2 --compress bf16 --algo ring --optimizer sgd --offload "
           "--autocast float16",
    "fsdp": "--zero 2 --reshard-after-forward false --prefetch 1 --backward-prefetch 1 --param-dtype bfloat16 "
            "--reduce-dtype float32 --overlap true --root-reshard-after-forward true --separate-reduce-scatter-group "
            "true --reduce-scatter-max-input-buffers 2",
    "pipeline": "--mesh pp=2 --schedule interleaved --microbatches 4 --virtual-stages 2 --split 3,3,3,3 "
                "--weight-grad-fraction 0.5 --recv early --stage-less-layers none",
    "pipeline ": "--mesh pp=2 --global-batch 4",          # m = 4 / (dp 1 x micro-batch 1)
    "tp": "--model llama3-8b --mesh tp=2 --sequence-parallel true --loss-parallel true --recompute selective "
          "--tp-comm-overlap true",
    "tp ": "--model llama3-8b --mesh tp=2 --sequence-parallel false --tp-prepare-input true",   # plain TP
    "cp": "--model llama3-8b --mesh cp=2 --rotate-method alltoall --load-balance true --recompute full "
          "--overlap false",
    "ep": "--model deepseek-v3 --mesh ep=2 --ep-skew 0.5 --ep-node-limit 1 --ep-zero1 true --schedule 1f1b "
          "--microbatches 1 --overlap true --split none --ep-fp8-dispatch true",
    "composed": "--mesh pp=1,dp_shard=2 --microbatches 2 --grad-sync false",  # FSDP2 accumulation, one sync
    "tp  ": "--model llama3-8b --mesh tp=2 --fp8-recipe torchao-tensorwise",   # float8 GEMMs on the H100 preset
}


def simulate_cli(capsys, *args):
    return run_in_process(capsys, "simulate", "--no-files", *args)


def test_every_listed_flag_works_without_a_scenario_file(capsys):
    rc, out, _ = simulate_cli(capsys, "--help")
    listed = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out))
    given = {w for text in FLAG_SETS.values() for w in text.split() if w.startswith("--")} | {
        "--model", "--micro-batch", "--world-size", "--mesh", "--no-files", "--json"}
    assert listed - given <= {"--help", "--cluster", "--nodes", "--sweep", "--save-plan", "--out", "--verbose",
                              "--from-profile",                # tests/test_ingest_profile.py
                              "--allow-code",                  # tests/test_safe_inputs.py
                              "--wide"}
    for name, text in FLAG_SETS.items():
        rc, out, err = simulate_cli(capsys, "--world-size", "2", "--micro-batch", "1", "--json", *text.split())
        assert rc == 0, (name, err)
        res = json.loads(out)["results"][0]
        assert res["workload"] == name.strip() and res["step_s"] > 0


def test_a_mesh_of_several_parallelisms_composes_them_with_the_fill_at_torchtitans_place(capsys):
    rc, out, err = simulate_cli(capsys, "--model", "llama3-8b", "--micro-batch", "1", "--mesh", "pp=2,tp=2",
                                "--microbatches", "2", "--json")
    assert rc == 0, err
    res = json.loads(out)["results"][0]
    assert res["workload"] == "composed" and res["mesh"]["dims"] == {"pp": 2, "dp_shard": 2, "tp": 2}
    assert res["parallelisms"] == ["pipeline", "tp", "fsdp"]
    assert {c["mesh_dim"] for c in res["collectives"]} == {"pp", "dp_shard", "tp"}
    assert res["options"]["fsdp"]["reshard_after_forward"] is False      # torchtitan's default with pp


def test_a_scenario_with_a_section_per_parallelism(tmp_path):
    d = {"model": {"preset": "llama3-8b", "layers": 4, "micro_batch": 1, "seq_len": 1024},
         "mesh": {"pp": 2, "dp_replicate": 2, "dp_shard": 2},
         "pipeline": {"schedule": "gpipe", "microbatches": 2}, "fsdp": {"reshard_after_forward": True},
         "cluster": "dgx-h100"}
    r = sc.simulate(d)
    assert r.workload.name == "composed" and r.plan.meta["builder"] == "pp_fsdp"
    assert r.options.fsdp.reshard_after_forward is True and r.summary["step_s"] > 0
    names = [o.name for o in r.plan.ranks[0] if hasattr(o, "op") and o.op == "all_reduce"]
    assert names and all(n.startswith("all_reduce ") for n in names)       # HSDP over dp_replicate
    with pytest.raises(ConfigError, match="microbatches"):
        sc.set_value(d, "microbatch", 4)
    sc.set_value(d, "microbatches", 4)
    sc.set_value(d, "pp", 4)
    assert d["pipeline"]["microbatches"] == 4
    assert sc.build(d).mesh.as_dict() == {"pp": 4, "dp_replicate": 2, "dp_shard": 1}     # dp_shard took the rest


def test_torchtitans_split_of_llama3_405b():
    """126 blocks on 16 stages: 7 + 14 x 8 + 7 (Llama 3, arXiv 2407.21783 sec. 3.3.2; torchtitan's rule)."""
    assert torchtitan_split(126, 16) == [7] + [8] * 14 + [7]
    assert stage_split(126, 16) == torchtitan_split(126, 16) and stage_split(32, 4) is None
    assert stage_split(32, 4, less=[1, 1]) == [8, 9, 8, 7] and sum(stage_split(30, 4, less=[2, 0])) == 30
    with pytest.raises(ConfigError, match="stages"):
        torchtitan_split(4, 8)
    d = {"model": {"preset": "llama3-405b", "micro_batch": 1, "seq_len": 128}, "mesh": {"pp": 16},
         "pipeline": {"microbatches": 16}, "cluster": "dgx-h100", "nodes": 2}
    assert sc.build(d).plan.meta["pipeline"]["split"] == [7] + [8] * 14 + [7]


@pytest.mark.parametrize("args, words", [
    (["--mesh", "pp=2,dp=2,cp=2"], ["dp (DDP) composes with pp and tp only"]),
    (["--mesh", "pp=2", "--ep-skew", "1"], ["needs mesh dimension 'ep'"]),
    (["--mesh", "pp=2,ep=2", "--zero", "3"], ["unknown mesh dimension 'ep' for a composition"]),
    (["--mesh", "tp=2,pp=2", "--model", "llama3-8b", "--sweep", "colour=1,2"], ["--sweep", "microbatches"]),
    (["--mesh", "pp=3"], ["pipeline stages 3", "must divide the world size 8"]),
    (["--mesh", "pp=2,tp=2", "--model", "llama3-8b", "--microbatches", "2", "--tp-microbatches", "4"],
     ["--tp-microbatches", "is now --microbatches"]),
])
def test_bad_compositions_are_one_line_exit_2(capsys, args, words):
    rc, _, err = simulate_cli(capsys, *args)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err


def test_sweep_keys_of_a_composition():
    """An option two sections share is written section.key; TP's pipeline fields yield to the pipeline section."""
    d = {"model": {"preset": "llama3-8b", "layers": 2, "micro_batch": 1, "seq_len": 1024},
         "mesh": {"pp": 2, "cp": 2, "tp": 2}, "cluster": "dgx-h100"}
    keys = sc.composed_sweep_keys(d)
    assert {"tp.recompute", "cp.recompute", "cp.overlap", "fsdp.overlap", "microbatches"} <= set(keys)
    assert "recompute" not in keys
    sc.set_value(d, "microbatches", 8)
    sc.set_value(d, "tp.recompute", "selective")
    assert d["pipeline"] == {"microbatches": 8} and d["tp"] == {"recompute": "selective"}
    assert sc.build(d).plan.meta["pipeline"]["microbatches"] == 8


def test_recompute_goes_to_tp_with_tp_else_to_the_model(capsys):
    """--recompute is TP's option where TP is on (a tp mesh dimension or another TP flag), else the model's
    activation recomputation (sim/models/activations.py)."""
    rc, out, err = simulate_cli(capsys, "--model", "llama3-8b", "--world-size", "2", "--micro-batch", "1", "--zero",
                                "3", "--recompute", "full", "--json")
    assert rc == 0, err
    res = json.loads(out)["results"][0]
    assert res["workload"] == "fsdp"
    plain = json.loads(simulate_cli(capsys, "--model", "llama3-8b", "--world-size", "2", "--micro-batch", "1",
                                    "--zero", "3", "--json")[1])["results"][0]
    assert res["step_s"] > plain["step_s"]          # the recomputed forward costs time
    rc, out, err = simulate_cli(capsys, "--model", "llama3-8b", "--world-size", "2", "--micro-batch", "1", "--mesh",
                                "tp=2", "--recompute", "selective", "--json")
    assert rc == 0, err
    res = json.loads(out)["results"][0]
    assert res["workload"] == "tp" and res["options"]["recompute"] == "selective"
