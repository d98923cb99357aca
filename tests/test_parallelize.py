"""Parallelisms as transforms (sim/parallel/parallelize.py): for random meshes and subsets of pipeline, FSDP2 / HSDP
/ ZeRO, DDP, CP and TP, the plan checks clean (what `distlab check` runs), every collective's group lies on one
mesh dimension (or FSDP2's flattened dp_shard x cp, torchtitan's dp_shard_cp) and every send goes along pp or
around the cp ring, and the parameter elements each rank updates are the model's divided as the mesh says: its
pipeline stage's layers, TP-sharded weights over tp (norms replicated), the rest over FSDP2's dp_shard x cp."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from distlab.sim.check import plan_problems
from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt
from distlab.sim.parallel.cp.local import CPOptions
from distlab.sim.parallel.ddp.plan import DDPOptions
from distlab.sim.parallel.fsdp.plan import ADAM_FLOPS, FSDPOptions
from distlab.sim.parallel.parallelize import MESH_ORDER, choose, parallelize
from distlab.sim.parallel.pipeline.plan import PipelineOptions, stage_ranges
from distlab.sim.parallel.tp.plan import TPOptions
from distlab.sim.plan import Collective, Compute, Recv, Send

MODEL = gpt(layers=3, hidden=64, heads=8, kv_heads=4, seq_len=16, vocab=128, micro_batch=1, arch="llama",
            ffn_hidden=128, dtype="float32")


@st.composite
def layouts(draw):
    """(mesh dims in torchtitan's order, the sections' options)."""
    dims = {}
    if draw(st.booleans()):
        dims["pp"] = 2
    dp = draw(st.sampled_from(["none", "fsdp", "hsdp", "ddp"]))
    if dp == "hsdp":
        dims.update(dp_replicate=2, dp_shard=2)
    elif dp == "fsdp":
        dims["dp_shard"] = draw(st.sampled_from([2, 4]))
    elif dp == "ddp":
        dims["dp"] = 2
    if dp != "ddp" and draw(st.booleans()):
        dims["cp"] = 2
    if draw(st.booleans()) or not dims:
        dims["tp"] = 2
    tp_or_cp = "tp" in dims or "cp" in dims
    given = {"pipeline": PipelineOptions(schedule=draw(st.sampled_from(["gpipe", "1f1b"])),
                                         microbatches=draw(st.sampled_from([2, 3]))),
             "fsdp": FSDPOptions(zero=3 if tp_or_cp else draw(st.sampled_from([1, 2, 3])),
                                 reshard_after_forward=draw(st.booleans()), overlap=draw(st.booleans())),
             "tp": TPOptions(sequence_parallel=draw(st.booleans())),
             "cp": CPOptions(rotate_method=draw(st.sampled_from(["allgather", "alltoall"]))),
             "ddp": DDPOptions(bucket_cap_mb=draw(st.sampled_from([None, 0.05])))}
    return {d: dims[d] for d in MESH_ORDER if d in dims}, given


def held_elements(plan, mesh: Mesh, rank: int) -> float:
    """Parameter elements ``rank`` updates, read off its plan: AdamW's FLOPs / 12 (DDP's own op: 7 x fp32 bytes)
    when it has an optimizer, else (a pipeline without FSDP2: no optimizer modelled) its stages' parameter bytes in
    the pipeline's metadata / 4 (float32)."""
    opt = [o for o in plan.ranks[rank] if isinstance(o, Compute) and o.name in ("optimizer", "optimizer step")]
    if opt:
        return opt[0].flops / ADAM_FLOPS if opt[0].name == "optimizer" else opt[0].bytes / 7 / 4
    pipe = plan.meta["pipeline"]
    mine = [s for s, r in enumerate(pipe["stage_to_rank"]) if r == mesh.coords(rank)["pp"]]
    return sum(pipe["param_bytes"][s] for s in mine) / 4


def tp_sharded(name: str) -> bool:
    """TP shards the linears and the embedding (sim/parallel/tp/rules.py); norms are replicated."""
    return not name.split(".")[-2].startswith("norm")


def expected_elements(mesh: Mesh, par, rank: int, split) -> float:
    """The rank's stage's parameters, TP-sharded ones over tp, everything over FSDP2's dp_shard x cp."""
    tp = mesh.size("tp") if par.tp is not None else 1
    shard = (mesh.size("dp_shard") if "dp_shard" in mesh else 1) * (mesh.size("cp") if "cp" in mesh else 1)
    layers = range(len(MODEL.layers))
    if "pp" in mesh:
        layers = stage_ranges(MODEL, mesh.size("pp"), split)[mesh.coords(rank)["pp"]]
    local = sum(q.numel // tp if tp_sharded(q.name) else q.numel for i in layers for q in MODEL.layers[i].params)
    return local / (shard if par.fsdp is not None else 1)


def groups_on_one_dimension(plan, mesh: Mesh) -> None:
    flat = ("dp_shard", "cp") if "dp_shard" in mesh and "cp" in mesh else None
    for r in range(plan.world_size):
        for o in plan.ranks[r]:
            if isinstance(o, Collective):
                g = plan.group_of(o)
                ok = any(mesh.group_of(r, d) == g for d in mesh.names) or flat and mesh.group_of(r, flat) == g
                assert ok, (r, o.name, g)
            elif isinstance(o, (Send, Recv)):
                moved = [d for d in mesh.names if mesh.coords(r)[d] != mesh.coords(o.peer)[d]]
                assert moved in (["pp"], ["cp"]), (r, o.name, o.peer)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_any_composition_checks_clean_on_mesh_dimensions_with_the_mesh_dividing_the_parameters(layout):
    dims, given = layout
    mesh = Mesh(dims)
    par = choose(mesh, {k: v for k, v in given.items() if k in ("pipeline", "fsdp", "tp", "cp", "ddp")
                        and (k != "fsdp" or "dp_shard" in mesh or "cp" in mesh) and (k != "ddp" or "dp" in mesh)
                        and (k != "pipeline" or "pp" in mesh) and (k != "tp" or "tp" in mesh)
                        and (k != "cp" or "cp" in mesh)})
    plan = parallelize(MODEL, mesh, par)
    assert plan_problems(plan) == []
    groups_on_one_dimension(plan, mesh)
    split = plan.meta.get("pipeline", {}).get("split")
    replica = [r for r in range(mesh.world_size)
               if all(mesh.coords(r)[d] == 0 for d in ("dp_replicate", "dp") if d in mesh)]
    for r in replica:
        assert held_elements(plan, mesh, r) == pytest.approx(expected_elements(mesh, par, r, split))
    tp = mesh.size("tp") if par.tp is not None else 1
    norms = sum(q.numel for q in MODEL.params if not tp_sharded(q.name))
    assert sum(held_elements(plan, mesh, r) for r in replica) == pytest.approx(MODEL.num_params + (tp - 1) * norms)


def test_tp_comm_overlap_pipelines_each_block_collective_as_ring_exchanges():
    """Megatron's TP overlap (sim/parallel/tp/overlap.py): a block's all-gathers and reduce-scatters become t - 1
    P2P exchanges of X/t each around the tp ring, pipelined with the GEMMs: the plan checks clean, the blocks issue
    no TP collective, and the step is shorter than with the collectives waited for (Llama 3 8B at tp 4: GEMMs on
    2,048-token chunks, fused as Megatron's linear_qkv and linear_fc1, still run well; docs/parallelisms.md)."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.parallel.parallelize import Parallelisms
    from distlab.sim.models import preset
    model = preset("llama3-8b", layers=2, micro_batch=1)
    t, mesh, cluster = 4, Mesh({"tp": 4}), load_cluster("dgx-h100", 1).with_world_size(4)
    plain, over = (parallelize(model, mesh, Parallelisms(tp=TPOptions(comm_overlap=ov))) for ov in (False, True))
    assert plan_problems(over) == []
    X = 1 * 8192 * 4096 * 2
    block_coll = [o for o in over.ranks[1] if isinstance(o, Collective) and ".attn" in o.name or
                  isinstance(o, Collective) and ".mlp" in o.name]
    sends = [o for o in over.ranks[1] if isinstance(o, Send)]
    assert block_coll == [] and {o.bytes for o in sends} == {X // t} and {o.peer for o in sends} == {2}
    assert len(sends) == 2 * 2 * 2 * 2 * (t - 1)          # blocks x parts x (in, out) x (fwd, bwd) x (t - 1)
    assert simulate(over, cluster).makespan < simulate(plain, cluster).makespan


def test_pp_fsdp_tp_from_representatives_equals_the_plan_built_rank_by_rank_and_simulates_alike():
    """sim/parallel/shifts.py: with a tp group per node, every rank of a stage is a renaming of one program
    (node rotations inside the stage's block of nodes, local rotations); the relabelled plan equals the plan built
    rank by rank, and its symmetric simulation (one rank per stage) the full one."""
    import math

    from distlab.sim import scenario as sc
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.kernel.relabel import RelabelledRanks
    d = {"model": {"preset": "llama3-8b", "layers": 2, "seq_len": 128, "micro_batch": 1},
         "mesh": {"pp": 2, "dp_shard": 2, "tp": 8}, "pipeline": {"microbatches": 2}, "cluster": "dgx-h100",
         "nodes": 4}
    r = sc.build(d)
    assert isinstance(r.plan.ranks, RelabelledRanks) and r.plan.ranks.representatives() == [0, 16]
    full = parallelize(r.model, r.mesh, r.options)
    assert (full.name, full.meta) == (r.plan.name, r.plan.meta)
    assert all(full.ranks[k] == r.plan.ranks[k] for k in range(full.world_size))
    once = simulate(r.plan, r.cluster, record_transfers=False)
    assert math.isclose(once.makespan, simulate(full, r.cluster, record_transfers=False, symmetric=False).makespan,
                        rel_tol=1e-6)


def test_fsdp_inside_multi_stage_schedules_unshards_the_ranks_stages_ahead():
    """torch's multi-stage runtime unshards a rank's stages before its first action (UNSHARD actions) and
    reduce-scatters each stage's gradients after its last backward (REDUCE_GRAD); it needs FSDP2 not to reshard
    after forward (sim/parallel/fsdp/stage.py)."""
    from distlab.sim.errors import ConfigError
    model = gpt(layers=4, hidden=64, heads=8, kv_heads=4, seq_len=16, vocab=128, micro_batch=1, arch="llama",
                ffn_hidden=128, dtype="float32")
    mesh = Mesh({"pp": 2, "dp_shard": 2})
    pipe = PipelineOptions(schedule="interleaved", microbatches=4, virtual_stages=2)
    plan = parallelize(model, mesh, choose(mesh, {"pipeline": pipe, "fsdp": FSDPOptions(reshard_after_forward=False)}))
    assert plan_problems(plan) == []
    ops = plan.ranks[0]
    coll = [(o.op, o.name) for o in ops if isinstance(o, Collective)]
    assert coll == [("all_gather", "all_gather root forward"), ("all_gather", "all_gather h.0 forward"),
                    ("all_gather", "all_gather h.2 forward"), ("reduce_scatter", "reduce_scatter h.2"),
                    ("reduce_scatter", "reduce_scatter root"), ("reduce_scatter", "reduce_scatter h.0")]
    first_compute = next(i for i, o in enumerate(ops) if isinstance(o, Compute) and o.name.startswith("fwd "))
    assert max(i for i, o in enumerate(ops) if isinstance(o, Collective) and o.op == "all_gather") < first_compute
    with pytest.raises(ConfigError, match="reshard_after_forward false"):
        parallelize(model, mesh, choose(mesh, {"pipeline": pipe, "fsdp": FSDPOptions(reshard_after_forward=True)}))
