"""The planner's estimate of a composition from its pieces (sim/planner/composed.py, sim/parallel/parallelize.py
``action_programs``): the pieces are the rank's program, and the estimate equals simulating every rank on PP x
FSDP2 (x TP) (x CP), HSDP inside stages and PP x TP x DDP (GPipe, 1F1B), within 3% with interleaved 1F1B and
without a pipeline."""
import pytest

from distlab.sim.cluster import load_cluster
from distlab.sim.kernel.engine import simulate
from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt
from distlab.sim.parallel.fsdp.plan import FSDPOptions
from distlab.sim.parallel.parallelize import choose, parallelize
from distlab.sim.parallel.pipeline.plan import PipelineOptions
from distlab.sim.parallel.parallelize import action_programs
from distlab.sim.plan import Compute, Recv, Record, Send, Wait
from distlab.sim.planner.composed import estimate_composed

MODEL = gpt(layers=8, hidden=1024, heads=16, kv_heads=8, seq_len=2048, vocab=32768, micro_batch=1,
            dtype="bfloat16", arch="llama", ffn_hidden=2816)
CLUSTER = load_cluster("dgx-h100", nodes=4)
LAYOUTS = [  # mesh, pipeline (schedule, micro-batches, virtual stages) or None, fsdp reshard_after_forward, tolerance
    ({"pp": 4, "dp_shard": 2, "tp": 4}, ("1f1b", 8, 1), False, 0.001),
    ({"pp": 4, "dp_shard": 8}, ("gpipe", 4, 1), True, 0.001),
    ({"pp": 2, "dp_replicate": 2, "dp_shard": 2, "tp": 4}, ("1f1b", 4, 1), False, 0.001),
    ({"pp": 4, "dp_shard": 2, "cp": 2, "tp": 2}, ("1f1b", 4, 1), False, 0.001),
    ({"pp": 4, "dp": 2, "tp": 4}, ("1f1b", 8, 1), None, 0.001),
    ({"pp": 2, "dp_shard": 4, "tp": 4}, ("interleaved", 4, 2), False, 0.03),   # early receives not modelled
    ({"dp_shard": 8, "tp": 4}, None, True, 0.03),                                # contention not modelled
    ({"dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 4}, None, True, 0.03),
]


def options(dims, pipe, reshard, tolerance=None):
    mesh = Mesh(dims)
    given = {} if reshard is None else {"fsdp": FSDPOptions(reshard_after_forward=reshard)}
    if pipe:
        given["pipeline"] = PipelineOptions(schedule=pipe[0], microbatches=pipe[1], virtual_stages=pipe[2])
    return mesh, choose(mesh, given)


def test_pieces_are_the_rank_program():
    """Each piece is a run of the rank's program, in schedule order; what lies between is the pipeline's own
    (sends, receives, their events)."""
    mesh, par = options(*LAYOUTS[0])
    last = mesh.world_size - 1
    programs, meta = action_programs(MODEL, mesh, par, [0, last])
    assert meta["stage_to_rank"] == [0, 1, 2, 3]
    for g in (0, last):
        ops = parallelize(MODEL, mesh, par, only=[g]).ranks[0]
        pieces = programs[g]
        assert len([k for k in pieces if k[0] in "FB"]) == 2 * 8 and ("optimizer",) in pieces
        pos, between = 0, []
        for key, run in pieces.items():
            start = next(i for i in range(pos, len(ops) - len(run) + 1) if ops[i:i + len(run)] == run)
            between += ops[pos:start]
            pos = start + len(run)
        assert pos == len(ops)
        assert between and all(isinstance(o, (Send, Recv, Record, Wait)) for o in between)
        assert any(isinstance(o, Send) for o in between) and not any(isinstance(o, Compute) for o in between)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda L: "x".join(f"{k}{v}" for k, v in L[0].items()))
def test_estimate_equals_the_simulation(layout):
    """Equal to 0.1% where the pipeline posts receives on demand (GPipe, 1F1B), within 3% elsewhere."""
    mesh, par = options(*layout)
    simulated = simulate(parallelize(MODEL, mesh, par, cluster=CLUSTER), CLUSTER, record_transfers=False).makespan
    estimate = estimate_composed(MODEL, mesh, par, CLUSTER)
    assert abs(estimate / simulated - 1) <= layout[-1], (estimate, simulated)


def test_memory_without_building_the_plan():
    """Llama 3 405B on pp 16 x dp_shard 128 x tp 8 (torchtitan's split 7 + 14 x 8 + 7): the fullest rank holds a
    middle stage's 8 blocks, its parameters TP-local and sharded over 128 (FSDP2's fp32 shards: params 4 bytes,
    AdamW's m and v 8 per element; issue 43.2, sim/parallel/fsdp/memory.py ``precision``)."""
    from distlab.sim.models import preset
    from distlab.sim.workloads.composed_report import memory_of
    model = preset("llama3-405b")
    mesh = Mesh({"pp": 16, "dp_shard": 128, "tp": 8})
    mem = memory_of(model, mesh, choose(mesh, {"pipeline": PipelineOptions(microbatches=16)}))
    block = sum(q.numel for q in model.layers[1].params)
    assert 1 <= mem["pipeline_rank"] <= 14
    elements = mem["breakdown_bytes"]["params"] / 4
    assert 8 * block / (8 * 128) <= elements <= 8 * block / (8 * 128) * 1.001
    assert mem["breakdown_bytes"]["optimizer"] == 2 * mem["breakdown_bytes"]["params"]


def test_scenario_parts_to_estimate_gradient_accumulation():
    """docs/parallelisms.md "For the planner": a composed scenario dict -> scenario.parts -> estimate_composed
    equals `distlab simulate` of the same dict; pp 1 with micro-batches is gradient accumulation as torchtitan's
    train loop runs it (FSDP2 resharded after forward and reduce-scattering in every micro-batch's backward)."""
    from distlab.sim import scenario as sc
    d = {"name": "grad accumulation", "model": {"preset": "llama3-8b", "micro_batch": 1},
         "mesh": {"pp": 1, "dp_shard": 4, "tp": 8}, "pipeline": {"microbatches": 4},
         "fsdp": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}, "cluster": "dgx-h100", "nodes": 4}
    d2, workload, model, cluster, mesh, par = sc.parts(d)
    assert workload.name == "composed" and par.names() == ["pipeline", "tp", "fsdp"]
    assert par.fsdp.reshard_after_forward is True           # torchtitan's policy: not pp_enabled
    simulated = sc.simulate(d).trace.makespan
    # each micro-batch's pieces timed alone: its gathers and reduce-scatters overlap the next micro-batch's
    # compute in the simulation only (sim/planner/composed.py: within 3% without a pipeline)
    assert abs(estimate_composed(model, mesh, par, cluster) / simulated - 1) <= 0.03
    plan = parallelize(model, mesh, par, only=[0])
    scatters = [o for o in plan.ranks[0] if getattr(o, "op", None) == "reduce_scatter" and len(o.group) == 4]
    assert len(scatters) == 4 * (1 + 32)                    # per unit (root + 32 blocks) and micro-batch
