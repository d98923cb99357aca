"""Real tensor parallelism (torch 2.13 DTensor, ``parallelize_module``, gloo) issues exactly the simulated
plan's collectives: kind, order, bytes, dtype, group and phase (forward, backward, optimizer) per rank, for a
whole Llama-style model (vocabulary-parallel embedding, grouped-query attention, SwiGLU, final norm, head), in
plain TP and TP + SP, with and without loss parallel, on 2 and 4 ranks, with the DTensor ops per phase the plan
counts; FSDP2 x TP, DDP x TP and PP x TP (torch.distributed.pipelining, p2p included) on 2 x 2 meshes, HSDP x TP
on a 1 x 2 x 2 mesh; and the
simulated local parameter shards equal the real DTensor local shards. One launch per world size; the 2-rank one also runs the calibration
rounds of `distlab validate --scenario scenarios/tp-cpu.yaml` (its model and plan are variant 0's), whose rows
(runtime/parallel/tp/validate.py) are checked here without a launch of their own."""
import pytest

from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt
from distlab.sim.parallel.tp.plan import TPOptions, collective_sequence, tp_plan
from distlab.sim.parallel.tp.rules import local_shape

pytestmark = pytest.mark.slow

MODEL = gpt(layers=2, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=2, dtype="float32",
            arch="llama", ffn_hidden=64)
VARIANTS = [{"sequence_parallel": True}, {"sequence_parallel": False},
            {"sequence_parallel": True, "loss_parallel": True}, {"sequence_parallel": False, "loss_parallel": True},
            {"sequence_parallel": False, "prepare_input": True}]   # torchtitan's PrepareModuleInput on plain TP


MESH_2X2 = [["dp_shard", 2], ["tp", 2]]
FSDP_TP = [{"sequence_parallel": True, "mesh": MESH_2X2}, {"sequence_parallel": False, "mesh": MESH_2X2}]
DDP_TP = {"sequence_parallel": True, "mesh": [["dp", 2], ["tp", 2]]}       # DDP(device_mesh=mesh["dp"])


PP_TP = [{"sequence_parallel": sp, "mesh": [["pp", 2], ["tp", 2]], "schedule": "1f1b", "microbatches": 2}
         for sp in (True, False)]
HSDP_TP = {"sequence_parallel": True, "mesh": [["dp_replicate", 1], ["dp_shard", 2], ["tp", 2]]}
FOUR = VARIANTS[:2] + FSDP_TP + [DDP_TP] + PP_TP + [HSDP_TP]    # 4 ranks: no loss parallel; 2-D, 3-D after 1-D


def _launch(world: int, variants: list, calibrate=None):
    from distlab.runtime.parallel.tp import run
    return run.run([{"model": MODEL, **v} for v in variants], world=world, steps=1, warmup=1, timeout=300,
                   calibrate=calibrate, calibrate_calls=2)      # 2 calls per calibration probe: what is checked


@pytest.fixture(scope="module")
def launch2():
    """2 ranks: the 1-D variants, with the calibration rounds of the validate hook."""
    from distlab.runtime.parallel.tp.validate import prepare
    return _launch(2, VARIANTS, prepare(SCENARIO, 2)[2])


@pytest.fixture(scope="module")
def launch4():
    """4 ranks: TP and TP + SP on 4, then FSDP2 x TP(+SP), DDP x TP+SP and PP x TP(+SP) on 2 x 2 meshes."""
    return _launch(4, FOUR)


@pytest.fixture(scope="module", params=[2, 4])
def launched(request, launch2, launch4):
    return request.param, {2: launch2, 4: launch4}[request.param]


SCENARIO = "scenarios/tp-cpu.yaml"


def test_validate_scenario_rows_from_the_same_launch(launch2):
    """The validate hook's comparison: the scenario is tp (registered in runtime/parallel/registry.py); one row for the
    step and one per collective kind and size with its number of calls; sequences match; calibration fitted."""
    from collections import Counter

    from distlab.runtime.parallel.tp.validate import compare, prepare, rows_as_cases
    from distlab.runtime.parallel.registry import WORKLOADS, scenario_workload
    from distlab.sim.io import load_yaml
    results = launch2
    assert WORKLOADS[scenario_workload(load_yaml(SCENARIO), SCENARIO)].name == "tp"
    built, variant, _ = prepare(SCENARIO, 2)
    assert variant["model"].config == MODEL.config and variant["sequence_parallel"] == VARIANTS[0]["sequence_parallel"]
    r = compare(built, results)
    rows = rows_as_cases(r, 2)
    seq = collective_sequence(built.plan, 0)
    assert rows[0]["case"].startswith(f"tp step ({len(seq)} collectives") and rows[0]["bytes"] == sum(b for _, b, *_ in seq)
    got = {(c["case"].split()[1], c["bytes"]): int(c["case"].rsplit("x", 1)[1]) for c in rows[1:]}
    assert got == Counter((op, b) for op, b, *_ in seq)
    assert set(r["cluster"].calibration["collectives"]) == {"all_gather", "reduce_scatter", "all_reduce"}
    from distlab.sim.parallel.tp.plan import DTENSOR_OPS      # the ends probe (runtime/parallel/tp/ends.py) counts the plan's launches
    cal = results[0]["variants"][0]["calibration"]
    assert cal["ends_ops"] == {k: DTENSOR_OPS[True][k] for k in ("embed fwd", "embed bwd", "head fwd", "head bwd")}
    assert set(r["ends_host_s"]) == set(cal["ends_ops"]) and min(r["ends_host_s"].values()) >= 0
    assert all(v > 0 for t in cal["comm_main"].values() for vs in t.values() for v in vs)   # issue to wait CPU
    from distlab.runtime.parallel.tp.ends import ends_host
    from distlab.runtime.parallel.tp.fit import optimizer_host      # AdamW on DTensors costs more host CPU than on tensors
    from distlab.runtime.parallel.tp.validate import timed_plan
    from distlab.sim.kernel.engine import simulate
    assert cal["optimizer_params"] == len(MODEL.params) and optimizer_host(results) > 0
    priced = timed_plan(built, ends=ends_host(results, r["cluster"].gpu.launch_s))   # the optimizer at the block rate
    assert simulate(priced, r["cluster"]).makespan != pytest.approx(rows[0]["predicted_s"])    # compare used the probe
    for c in rows:
        assert c["kind"] == "tp scenario" and c["sequence_match"] is True and c["predicted_s"] > 0 and c["measured_s"] > 0


@pytest.mark.parametrize("world,i", [(2, i) for i in range(5)] + [(4, 0), (4, 1)],
                         ids=[f"{w}-{VARIANTS[i]}" for w, i in [(2, 0), (2, 1), (2, 2), (2, 3), (2, 4), (4, 0), (4, 1)]])
def test_simulated_collectives_equal_what_torch_issues(launch2, launch4, world, i):
    """Per rank: the collectives, and the DTensor ops per phase (the plan's launches: sim/parallel/tp/plan.py DTENSOR_OPS)."""
    from distlab.runtime.parallel.tp.run import measured_sequence
    from distlab.sim.plan import Compute
    results = {2: launch2, 4: launch4}[world]
    plan = tp_plan(MODEL, Mesh({"tp": world}), TPOptions(**VARIANTS[i]))
    for rank in range(world):
        measured = measured_sequence(results, i, rank)
        assert measured == collective_sequence(plan, rank)
    phases = [c[-1] for c in measured]
    assert phases.count("forward") > 0 and phases.count("backward") > 0
    if not VARIANTS[i].get("loss_parallel"):
        launches: dict = {}
        for o in plan.ranks[0]:
            if isinstance(o, Compute) and o.launches:
                ph = {"fwd": "forward", "bwd": "backward"}.get(o.name.split()[0], "optimizer")
                launches[ph] = launches.get(ph, 0) + o.launches
        assert all(r["variants"][i]["steps"][-1]["dtensor_ops"] == launches for r in results)


@pytest.mark.parametrize("i", range(len(FSDP_TP)), ids=["fsdp2-x-tp-sp", "fsdp2-x-tp"])
def test_fsdp2_x_tp_on_a_2x2_mesh_equals_the_simulated_plan(launch4, i):
    from distlab.runtime.parallel.tp.run import measured_sequence
    from distlab.sim.parallel.tp.compose import collective_sequence as fsdp_tp_sequence
    from distlab.sim.parallel.tp.compose import fsdp_tp_plan
    results = launch4
    v = FSDP_TP[i]
    plan = fsdp_tp_plan(MODEL, Mesh(dict(v["mesh"])), tp_opts=TPOptions(sequence_parallel=v["sequence_parallel"]))
    for rank in range(4):
        assert measured_sequence(results, 2 + i, rank) == fsdp_tp_sequence(plan, rank)
    groups = {g for *_, g, _ in fsdp_tp_sequence(plan, 3)}
    assert groups == {(1, 3), (2, 3)}                       # rank 3: dp_shard group (1, 3), tp group (2, 3)


def test_ddp_x_tp_sp_on_a_2x2_mesh_equals_the_simulated_plan(launch4):
    """TP collectives, the SP norms' gradients all-reduced over tp at the end of backward, one DDP bucket of the
    TP-local gradients over dp; nothing in the optimizer; the parameters DDP holds are the TP-local shards."""
    from distlab.runtime.parallel.tp.run import measured_sequence
    from distlab.sim.parallel.tp.ddp import ddp_tp_plan
    results = launch4
    plan = ddp_tp_plan(MODEL, Mesh(dict(DDP_TP["mesh"])), tp_opts=TPOptions(sequence_parallel=True))
    for rank in range(4):
        assert measured_sequence(results, 4, rank) == collective_sequence(plan, rank)
    assert {g for *_, g, _ in collective_sequence(plan, 3)} == {(2, 3), (1, 3)}    # tp (2, 3), dp (1, 3)
    want = [[p.name, list(local_shape(p, 2))] for p in MODEL.params]
    assert all(r["variants"][4]["local_shapes"] == want for r in results)


def test_local_parameter_shards_equal_dtensor_local_shards(launched):
    from distlab.sim.parallel.fsdp.units import padded_numel
    world, results = launched
    want = [[p.name, list(local_shape(p, world))] for p in MODEL.params]
    for r in results:
        for v in r["variants"][:2]:
            assert v["local_shapes"] == want
    if world == 4:        # FSDP2 x TP: dim 0 of the TP-local shard, padded to dp_shard 2, split in 2
        tp_local = [list(local_shape(p, 2)) for p in MODEL.params]
        fsdp = [[p.name, [padded_numel(tuple(s), 2) // 2 // (s[1] if len(s) > 1 else 1)] + s[1:]]
                for p, s in zip(MODEL.params, tp_local)]
        for r in results:
            for v in r["variants"][2:4]:
                assert v["local_shapes"] == fsdp
    assert dict(want)["h.0.attn.k.weight"] == [4 * 4 // world, 32] and dict(want)["h.0.attn.o.weight"] == [32, 32 // world]


@pytest.mark.parametrize("i", range(len(PP_TP)), ids=["pp-x-tp-sp", "pp-x-tp"])
def test_pp_x_tp_on_a_2x2_mesh_equals_the_simulated_plan(launch4, i):
    """torch.distributed.pipelining (Schedule1F1B, 2 micro-batches) over stages parallelized on the tp sub-mesh:
    per rank the TP collectives (kind, order, bytes, dtype, group, phase) and the p2p sends and receives (order,
    bytes, peer) equal the simulated PP x TP plan's; each stage's local shards equal the simulated TP-local ones."""
    from distlab.runtime.parallel.tp.run import measured_sequence
    from distlab.sim.parallel.pipeline.plan import PipelineSpec
    from distlab.sim.plan import Recv, Send
    from distlab.sim.parallel.tp.pipeline import pp_tp_plan
    v, k = PP_TP[i], FOUR.index(PP_TP[i])
    plan = pp_tp_plan(MODEL, Mesh(dict(v["mesh"])), PipelineSpec("1f1b", 2, v["microbatches"]),
                      TPOptions(sequence_parallel=v["sequence_parallel"]))
    for rank in range(4):
        measured = measured_sequence(launch4, k, rank)
        assert [c for c in measured if c[0] not in ("send", "recv")] == collective_sequence(plan, rank)
        assert [(c[0], c[1], c[3]) for c in measured if c[0] in ("send", "recv")] == \
            [("send" if isinstance(o, Send) else "recv", o.bytes, (o.peer,)) for o in plan.ranks[rank]
             if isinstance(o, (Send, Recv))]
    X = 2 * 8 * 32 * 4
    assert {c[1] for c in measured_sequence(launch4, k, 0) if c[0] == "send"} == {X // 2 if i == 0 else X}
    names = {0: [p.name for L in MODEL.layers[:2] for p in L.params],
             1: [p.name for L in MODEL.layers[2:] for p in L.params]}
    by_name = {p.name: p for p in MODEL.params}
    for r in launch4:
        got = r["variants"][k]
        assert got["local_shapes"] == [[n, list(local_shape(by_name[n], 2))] for n in names[got["stage"]]]


def test_hsdp_x_tp_on_a_1x2x2_mesh_equals_the_simulated_plan(launch4):
    """fully_shard on the (dp_replicate, dp_shard) sub-mesh of a 3-D mesh: torch all-reduces every unit's
    gradient shard over the replicate group even when it holds one rank; the plan does too (sim/parallel/tp/compose.py)."""
    from distlab.runtime.parallel.tp.run import measured_sequence
    from distlab.sim.parallel.tp.compose import collective_sequence as fsdp_tp_sequence
    from distlab.sim.parallel.tp.compose import fsdp_tp_plan
    k = FOUR.index(HSDP_TP)
    plan = fsdp_tp_plan(MODEL, Mesh(dict(HSDP_TP["mesh"])), tp_opts=TPOptions(sequence_parallel=True))
    for rank in range(4):
        assert measured_sequence(launch4, k, rank) == fsdp_tp_sequence(plan, rank)
    assert sum(1 for c in fsdp_tp_sequence(plan, 3) if c[0] == "all_reduce" and c[3] == (3,)) == 3
    assert all(r["variants"][k]["local_shapes"] == r["variants"][2]["local_shapes"] for r in launch4)
