"""One answer per layout with expert parallelism (issue 39.2 and 39.6): a mixture-of-experts layout written as a
user's scenario (mesh with ep, an ``ep:`` section), typed as `distlab simulate --mesh ... --microbatches` flags,
and run by `distlab reproduce` as a published MoE run (sim/reproduce/scenario.py ``ep_scenario``: ep folded from
the run's dp, ZeRO-1 for zero 1) give the same step and MFU within 1%. Seeded layouts on a Mixtral-like model
(GQA, 8 experts, top-2) and a DeepSeek-V3-like one (MLA, a dense first block, 1 shared + 256 routed experts,
top-8): EP alone, EP x DP, gradient accumulation, all_reduce instead of ZeRO-1, recompute, PP x EP under 1f1b,
gpipe and interleaved, 8 to 32 GPUs; sim-only, 2 to 4 blocks. And HSDP in reproduce (layout key dp_shard).
`distlab plan` does not search expert parallelism (sim/planner/layouts.py: "Not searched"): it refuses a MoE
model in one line (it was a traceback)."""
import json
import pathlib
import random

import pytest

from cli_in_process import cli  # noqa: F401  (the fixture)
from distlab.sim import scenario as sc
from distlab.sim.reproduce.predict import predict
from distlab.sim.reproduce.runs import Run

MIXTRAL = {"preset": "mixtral-8x7b", "layers": 2, "seq_len": 2048}
DEEPSEEK = {"preset": "deepseek-v3", "layers": 3, "first_dense": 1, "seq_len": 1024}
CLUSTER = "dgx-h100"
ROOT = pathlib.Path(__file__).parent.parent


def layouts(seed: int = 396) -> list[dict]:
    """(model, gpus, dp, ep, pp, zero, micro-batches, schedule, recompute) per family, sizes drawn with ``seed``."""
    rng = random.Random(seed)
    pick = rng.choice
    L = [
        dict(model=MIXTRAL, gpus=8, dp=8, ep=8, pp=1, zero=1, m=pick([1, 2]), schedule="1f1b", recompute="none"),
        dict(model=MIXTRAL, gpus=pick([16, 32]), dp=0, ep=8, pp=1, zero=1, m=1, schedule="1f1b", recompute="none"),
        dict(model=MIXTRAL, gpus=8, dp=8, ep=pick([2, 4]), pp=1, zero=0, m=2, schedule="1f1b", recompute="full"),
        dict(model=MIXTRAL, gpus=8, dp=4, ep=4, pp=2, zero=1, m=4, schedule="1f1b", recompute="none"),
        dict(model=MIXTRAL, gpus=16, dp=8, ep=pick([4, 8]), pp=2, zero=1, m=4, schedule="gpipe", recompute="none"),
        dict(model={**MIXTRAL, "layers": 4}, gpus=8, dp=4, ep=4, pp=2, zero=1, m=4, schedule="interleaved",
             recompute="selective"),
        dict(model=DEEPSEEK, gpus=pick([8, 16]), dp=0, ep=8, pp=1, zero=1, m=1, schedule="1f1b", recompute="none"),
    ]
    for d in L:
        d["dp"] = d["dp"] or d["gpus"] // d["pp"]
    return L


def run_of(d: dict) -> Run:
    v = 2 if d["schedule"] == "interleaved" else 1
    layout = {"dp": d["dp"], "tp": 1, "pp": d["pp"], "cp": 1, "zero": d["zero"], "virtual_stages": v,
              "split": None, "ep": d["ep"]}
    return Run("consistency-ep", "test", dict(d["model"]), "h100", CLUSTER, d["gpus"], layout,
               d["dp"] * d["m"], 1, recompute=d["recompute"], schedule=d["schedule"],
               reported={"tokens_per_s_per_gpu": 1000.0})


def user_scenario(d: dict) -> dict:
    """What a user writes for layout ``d`` (docs/parallelisms.md): dp left to fill when pp is 1."""
    mesh = {"ep": d["ep"]} if d["pp"] == 1 else {"pp": d["pp"], "dp": d["dp"] // d["ep"], "ep": d["ep"]}
    ep = {"microbatches": d["m"], "zero1": d["zero"] == 1}
    if d["pp"] > 1:
        ep["schedule"] = d["schedule"]
    model = {**d["model"], "micro_batch": 1}
    if d["recompute"] != "none":
        model["recompute"] = d["recompute"]
    return {"model": model, "mesh": mesh, "ep": ep, "cluster": CLUSTER, "world_size": d["gpus"]}


@pytest.mark.parametrize("index", range(len(layouts())))
def test_simulate_and_reproduce_agree(index):
    d = layouts()[index]
    user = sc.simulate(user_scenario(d), "user").summary
    p = predict(run_of(d))
    assert p["expressible"], p.get("reason")
    for key, theirs in (("step_s", p["step_time_s"]), ("mfu", p["mfu"])):
        assert theirs == pytest.approx(user[key], rel=0.01), (d, key, theirs, user[key])
    assert p["tokens_per_s_per_gpu"] == pytest.approx(user["tokens_per_s_per_gpu"], rel=0.01), d


def test_simulate_mesh_flags_agree_with_the_yaml_and_reproduce(cli, tmp_path):
    """Mixtral's config.json cut to 2 blocks (its seq_len: min(max_position_embeddings, 4096), sim/models/hf.py)
    as `--model` flags, as a scenario and as a reproduce row."""
    config = json.loads((ROOT / "sim" / "models" / "configs" / "mixtral-8x7b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "num_hidden_layers": 2}))
    rc, out, err = cli("simulate", "--model", str(path), "--mesh", "ep=8", "--microbatches", "2",
                       "--micro-batch", "1", "--no-files", "--json")
    assert rc == 0, err
    flags = json.loads(out)["results"][0]
    d = dict(model={"hf_config": str(path)}, gpus=8, dp=8, ep=8, pp=1, zero=1, m=2, schedule="1f1b",
             recompute="none")
    yaml = sc.simulate(user_scenario(d), "yaml").summary
    p = predict(run_of({**d, "model": {"hf_config": str(path), "seq_len": 4096}}))
    for key, theirs in (("step_s", yaml["step_s"]), ("mfu", yaml["mfu"]), ("step_s", p["step_time_s"]),
                        ("mfu", p["mfu"])):
        assert flags[key] == pytest.approx(theirs, rel=0.01), key


@pytest.mark.parametrize("model", ["mixtral-8x7b", "deepseek-v3"])
def test_plan_refuses_a_moe_model_naming_the_missing_search(cli, model):
    """The planner's layouts hold every expert on every rank and its TP builder has no MoE block: a MoE model
    is refused in one line (it was a traceback: KeyError 'arch')."""
    rc, out, err = cli("plan", "--model", model, "--nodes", "4", "--global-batch", "32", "--seq-len", "2048")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"--model: {model} is MoE: plan has no EP search yet; allowed: dense models" in err


@pytest.mark.parametrize("tp", [1, 2])
def test_reproduce_of_an_hsdp_run_agrees_with_simulate(tp):
    """HSDP in reproduce (issue 39.6; MosaicML's HYBRID_SHARD, torchtitan's dp_replicate x dp_shard): layout key
    dp_shard under zero 3 gives the user's mesh {dp_replicate, dp_shard, tp} the same step."""
    from distlab.sim.reproduce.predict import step_seconds
    model = {"preset": "llama3-8b", "layers": 2, "seq_len": 2048}
    layout = {"dp": 16, "tp": tp, "pp": 1, "cp": 1, "zero": 3, "virtual_stages": 1, "split": None, "ep": 1,
              "dp_shard": 4}
    run = Run("hsdp", "test", dict(model), "h100", CLUSTER, 16 * tp, layout, 16, 1, recompute="selective",
              sequence_parallel=tp > 1)
    d = {"model": {**model, "micro_batch": 1}, "mesh": {"dp_replicate": 4, "dp_shard": 4},
         "fsdp": {"reshard_after_forward": True}, "cluster": CLUSTER, "world_size": 16 * tp}
    if tp > 1:
        d["mesh"]["tp"], d["tp"] = tp, {"sequence_parallel": True, "recompute": "selective"}
    else:
        d["model"]["recompute"] = "selective"
    assert step_seconds(run) == pytest.approx(sc.simulate(d, "user").summary["step_s"], rel=0.01)
