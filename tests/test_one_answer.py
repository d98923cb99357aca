"""One answer per layout (issue 39.2): the scenario a user writes (a mesh and a section per parallelism, no tp
section at tp 1, recompute on the model), the scenario `distlab plan` confirms (sim/planner/layouts.py
``Layout.scenario``: a tp section even at tp 1, what ``plan --confirm`` simulates), `distlab simulate --mesh`
with flags, and `distlab reproduce` of the same layout as a published run (ZeRO-3 runs: sim/reproduce/scenario.py)
give the same step and MFU: every builder prices the same kernels (sim/parallel/layers.py) and a tp dimension of
size 1 is not applied (sim/parallel/parallelize.py ``without_unit_tp``). The planner's fast estimate stays within
its stated +-8% of them. Seeded layouts over DDP, FSDP2, HSDP, gradient accumulation, each pipeline schedule the
planner searches, CP, CP x TP, TP x FSDP2 and PP x FSDP2, 2 to 512 GPUs; sim-only. Memory per GPU is one answer,
exactly: every report, the planner's estimate, `distlab reproduce` and `distlab memory` (flags and --scenario) call
sim/parallel/memory.py ``memory_per_gpu`` (params, grads, optimizer, unsharded params and grads, activations with
the pipeline's in-flight micro-batches and the head and loss peak, CP's ring buffers)."""
import json
import random

import pytest

from cli_in_process import cli  # noqa: F401  (the fixture)
from distlab.sim import scenario as sc
from distlab.sim.cluster import load_cluster
from distlab.sim.planner.layouts import Layout
from distlab.sim.planner.step import Estimator

MODEL = {"preset": "llama3-8b", "layers": 4, "seq_len": 2048}
CLUSTER = "dgx-h100"


def layouts(seed: int = 39) -> list:
    """One layout per family, its sizes drawn with ``seed`` (world sizes 2 to 512)."""
    rng = random.Random(seed)
    pick = rng.choice
    rc = pick(["none", "selective", "full"])
    return [
        Layout(1, 1, pick([2, 8, 16]), "ddp", 1, 1, False, rc),
        Layout(1, 1, 512, "fsdp", pick([1, 2]), 1, False, rc),
        Layout(1, 1, 256, "hsdp", 1, 1, False, rc, dp_shard=pick([8, 32])),
        Layout(1, 1, 8, "fsdp", 1, pick([2, 4]), False, "none"),                       # gradient accumulation
        Layout(1, 1, 8, "ddp", 1, pick([2, 4]), False, rc),
        Layout(pick([1, 2]), 2, 2, "ddp", 1, 4, True, rc, "gpipe"),
        Layout(pick([1, 2]), 4, pick([1, 2]), "ddp", 1, 8, True, rc, "1f1b"),
        Layout(2, 2, 2, "ddp", 1, 4, True, "none", "interleaved", virtual_stages=2),
        Layout(1, 2, pick([4, 8]), "fsdp", 1, 4, False, "full", "1f1b"),
        Layout(1, 1, pick([4, 8]), "fsdp", 1, 1, False, pick(["none", "full"]), cp=2),
        Layout(2, 1, 2, "fsdp", 1, 1, True, "full", cp=2),
        Layout(2, 1, pick([4, 32]), "fsdp", 1, 1, True, rc),
        Layout(2, 1, 4, "ddp", 1, 1, True, rc),
    ]


def user_scenario(L: Layout) -> dict:
    """The scenario a user writes for ``L`` (docs/parallelisms.md)."""
    mesh = {k: v for k, v in L.mesh().items() if not (k == "tp" and v == 1)}
    d = {"model": {**MODEL, "micro_batch": L.micro_batch}, "mesh": mesh, "cluster": CLUSTER,
         "world_size": L.world_size}
    if L.pipelined:
        d["pipeline"] = {"schedule": L.schedule, "microbatches": L.microbatches, "virtual_stages": L.virtual_stages}
    if L.dp_kind != "ddp" or L.cp > 1:
        d["fsdp"] = {"reshard_after_forward": L.pp == 1}       # torchtitan: not pp_enabled
    elif L.dp > 1 and not L.pipelined:
        d["ddp"] = {}
    if L.cp > 1:
        d["cp"] = {"recompute": L.recompute}
    if L.tp > 1:
        d["tp"] = {"sequence_parallel": L.sequence_parallel, "recompute": L.recompute}
    elif L.cp == 1:
        d["model"]["recompute"] = L.recompute
    return d


def planner_scenario(L: Layout) -> dict:
    d = L.scenario(dict(MODEL), CLUSTER, 1)
    d.pop("nodes")
    return {**d, "world_size": L.world_size}


def memory_of(result) -> dict:
    """The memory per GPU a `distlab simulate` report printed (its json), by part."""
    return result.reports[result.workload.name]["json"]["memory"]["breakdown_bytes"]


def close(a: dict, b: dict, what: str):
    for key in ("step_s", "mfu"):
        assert a[key] == pytest.approx(b[key], rel=0.01), (what, key, a[key], b[key])


@pytest.mark.parametrize("index", range(len(layouts())))
def test_simulate_and_plan_confirm_agree(index):
    L = layouts()[index]
    user_result = sc.simulate(user_scenario(L), L.label())
    confirmed_result = sc.simulate(planner_scenario(L), L.label())
    user, confirmed = user_result.summary, confirmed_result.summary
    close(user, confirmed, L.label())
    estimator = Estimator(dict(MODEL), load_cluster(CLUSTER, 1).with_world_size(L.world_size))
    est = estimator.estimate(L)
    assert est.step_s == pytest.approx(confirmed["step_s"], rel=0.08), L.label()
    memory = memory_of(user_result)                     # exactly, part by part
    assert memory == memory_of(confirmed_result) == estimator.memory(L), L.label()
    assert memory["activations"] > 0 and memory["optimizer"] > 0, L.label()


@pytest.mark.parametrize("index", [1, 3, 8, 9])
def test_memory_command_of_the_scenario_agrees(cli, tmp_path, index):
    """`distlab memory --scenario` prints exactly what `distlab simulate` of that scenario does (FSDP2,
    gradient accumulation, PP x FSDP2, CP), without building the plan."""
    import yaml
    L = layouts()[index]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(user_scenario(L)))
    rc, out, _ = cli("memory", "--scenario", str(path), "--json")
    assert rc == 0
    result = sc.build(user_scenario(L), "user")
    from distlab.sim.parallel.memory import memory_section
    assert json.loads(out)["breakdown_bytes"] == memory_section(result)["json"]["breakdown_bytes"]


@pytest.mark.parametrize("zero,world", [("ddp", 8), ("3", 16)])
def test_memory_command_flags_agree_with_simulate(cli, zero, world):
    """`distlab memory --zero Z` of a data-parallel layout = `distlab simulate`'s report of it."""
    rc, out, _ = cli("memory", "--model", "llama3-8b", "--world-size", str(world), "--zero", zero,
                     "--micro-batch", "2", "--seq-len", "2048", "--json")
    assert rc == 0
    row = next(x for x in json.loads(out)["stages"] if x["selected"])
    kind = {"ddp": "ddp", "3": "fsdp"}[zero]
    d = {"model": {"preset": "llama3-8b", "micro_batch": 2, "seq_len": 2048}, "cluster": CLUSTER,
         "world_size": world, "mesh": {"dp" if kind == "ddp" else "dp_shard": world}, kind: {}}
    parts = memory_of(sc.simulate(d, "yaml"))
    assert {k: row[f"{k.replace(' ', '_')}_bytes"] for k in parts} == parts


def test_simulate_mesh_flags_agree_with_the_yaml(cli):
    L = Layout(1, 1, 8, "fsdp", 2, 1, False, "selective")
    rc, out, _ = cli("simulate", "--model", "llama3-8b", "--world-size", "8", "--mesh", "dp_shard=8",
                     "--micro-batch", "2", "--recompute", "selective", "--no-files", "--json")
    assert rc == 0
    flags = json.loads(out)["results"][0]
    d = {**user_scenario(L), "model": {"preset": "llama3-8b", "micro_batch": 2, "recompute": "selective"}}
    close(flags, sc.simulate(d, "yaml").summary, "--mesh vs yaml")


@pytest.mark.parametrize("shape", [(8, 1), (16, 2)])
def test_reproduce_of_a_zero3_run_agrees_with_simulate(shape):
    """A published-style FSDP2 run (ZeRO-3, dp x tp) through `distlab reproduce`'s plan equals the user's
    scenario of the same layout."""
    from distlab.sim.reproduce.predict import step_seconds
    from distlab.sim.reproduce.runs import Run
    dp, tp = shape
    run = Run("consistency", "test", {**MODEL}, "h100", CLUSTER, dp * tp,
              {"dp": dp, "tp": tp, "pp": 1, "zero": 3, "virtual_stages": 1, "split": None}, dp, 1,
              recompute="selective", sequence_parallel=tp > 1)
    L = Layout(tp, 1, dp, "fsdp", 1, 1, tp > 1, "selective")
    from distlab.sim.reproduce.scenario import memory
    user = sc.simulate(user_scenario(L), "user")
    assert step_seconds(run) == pytest.approx(user.summary["step_s"], rel=0.01)
    assert memory(run)["breakdown_bytes"] == memory_of(user)


def test_offloading_n_blocks_moves_their_saved_activations_to_the_host():
    """``offload: N`` (Transformer Engine's get_cpu_offload_context num_layers, Megatron-LM's
    --cpu-offloading-num-layers): the first N blocks' saved activations live in host memory, the same bytes in
    every report (sim/parallel/memory.py)."""
    from distlab.sim.models import model_from_spec
    from distlab.sim.models.activations import activations
    from distlab.sim.parallel.memory import memory_of_result
    spec = {**MODEL, "micro_batch": 2}
    block = activations(model_from_spec(spec, "m")).per_block()
    host = {}
    for off in (False, 1, 3, True):
        d = {"model": {**spec, "offload": off}, "mesh": {"dp_shard": 8}, "fsdp": {}, "cluster": CLUSTER,
             "world_size": 8}
        host[off] = memory_of_result(sc.build(d, "offload"))["host_bytes"]
    assert host == {False: 0, 1: block, 3: 3 * block, True: 4 * block}
    with pytest.raises(sc.ConfigError, match="offload"):
        sc.build({"model": {**spec, "offload": 5}, "mesh": {"dp_shard": 8}, "fsdp": {}, "cluster": CLUSTER,
                  "world_size": 8}, "offload")
