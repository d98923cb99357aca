"""Real tensor parallelism (torch 2.13 DTensor, ``parallelize_module``, gloo) issues exactly the simulated
plan's collectives: kind, order, bytes, dtype, group and phase (forward, backward, optimizer) per rank, for a
whole Llama-style model (vocabulary-parallel embedding, grouped-query attention, SwiGLU, final norm, head), in
plain TP and TP + SP, with and without loss parallel, on 2 and 4 ranks; and the simulated local parameter
shards equal the real DTensor local shards. One launch per world size."""
import pytest

from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt
from distlab.sim.tp.plan import TPOptions, collective_sequence, tp_plan
from distlab.sim.tp.rules import local_shape

pytestmark = pytest.mark.slow

MODEL = gpt(layers=2, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=2, dtype="float32",
            arch="llama", ffn_hidden=64)
VARIANTS = [{"sequence_parallel": True}, {"sequence_parallel": False},
            {"sequence_parallel": True, "loss_parallel": True}, {"sequence_parallel": False, "loss_parallel": True}]


MESH_2X2 = [["dp_shard", 2], ["tp", 2]]
FSDP_TP = [{"sequence_parallel": True, "mesh": MESH_2X2}, {"sequence_parallel": False, "mesh": MESH_2X2}]


@pytest.fixture(scope="module", params=[2, 4])
def launched(request):
    """One launch per world size; 4 ranks also run FSDP2 x TP(+SP) on the 2 x 2 mesh (after the 1-D variants)."""
    from distlab.runtime.tp import run
    world = request.param
    variants = VARIANTS if world == 2 else VARIANTS[:2] + FSDP_TP      # 4 ranks: no loss parallel (suite time)
    return world, run.run([{"model": MODEL, **v} for v in variants], world=world, steps=1, warmup=1, timeout=300)


@pytest.mark.parametrize("i", range(len(VARIANTS)), ids=[str(v) for v in VARIANTS])
def test_simulated_collectives_equal_what_torch_issues(launched, i):
    from distlab.runtime.tp.run import measured_sequence
    world, results = launched
    if world == 4 and i >= 2:
        pytest.skip("loss parallel runs on 2 ranks only")
    plan = tp_plan(MODEL, Mesh({"tp": world}), TPOptions(**VARIANTS[i]))
    for rank in range(world):
        measured = measured_sequence(results, i, rank)
        assert measured == collective_sequence(plan, rank)
    phases = [c[-1] for c in measured]
    assert phases.count("forward") > 0 and phases.count("backward") > 0


@pytest.mark.parametrize("i", range(len(FSDP_TP)), ids=["fsdp2-x-tp-sp", "fsdp2-x-tp"])
def test_fsdp2_x_tp_on_a_2x2_mesh_equals_the_simulated_plan(launched, i):
    from distlab.runtime.tp.run import measured_sequence
    from distlab.sim.tp.compose import collective_sequence as fsdp_tp_sequence
    from distlab.sim.tp.compose import fsdp_tp_plan
    world, results = launched
    if world != 4:
        pytest.skip("the 2 x 2 mesh needs 4 ranks")
    v = FSDP_TP[i]
    plan = fsdp_tp_plan(MODEL, Mesh(dict(v["mesh"])), tp_opts=TPOptions(sequence_parallel=v["sequence_parallel"]))
    for rank in range(4):
        assert measured_sequence(results, 2 + i, rank) == fsdp_tp_sequence(plan, rank)
    groups = {g for *_, g, _ in fsdp_tp_sequence(plan, 3)}
    assert groups == {(1, 3), (2, 3)}                       # rank 3: dp_shard group (1, 3), tp group (2, 3)


def test_local_parameter_shards_equal_dtensor_local_shards(launched):
    from distlab.sim.fsdp.units import padded_numel
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
            for v in r["variants"][2:]:
                assert v["local_shapes"] == fsdp
    assert dict(want)["h.0.attn.k.weight"] == [4 * 4 // world, 32] and dict(want)["h.0.attn.o.weight"] == [32, 32 // world]
