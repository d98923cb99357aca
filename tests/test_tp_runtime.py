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


@pytest.fixture(scope="module", params=[2, 4])
def launched(request):
    from distlab.runtime.tp import run
    world = request.param
    variants = VARIANTS if world == 2 else VARIANTS[:2]        # 4 ranks: TP + SP and plain TP (suite time)
    return world, run.run([{"model": MODEL, **v} for v in variants], world=world, steps=1, warmup=1, timeout=300)


@pytest.mark.parametrize("i", range(len(VARIANTS)), ids=[str(v) for v in VARIANTS])
def test_simulated_collectives_equal_what_torch_issues(launched, i):
    from distlab.runtime.tp.run import measured_sequence
    world, results = launched
    if i >= len(results[0]["variants"]):
        pytest.skip("loss parallel runs on 2 ranks only")
    plan = tp_plan(MODEL, Mesh({"tp": world}), TPOptions(**VARIANTS[i]))
    for rank in range(world):
        measured = measured_sequence(results, i, rank)
        assert measured == collective_sequence(plan, rank)
    phases = [c[-1] for c in measured]
    assert phases.count("forward") > 0 and phases.count("backward") > 0


def test_local_parameter_shards_equal_dtensor_local_shards(launched):
    world, results = launched
    want = [[p.name, list(local_shape(p, world))] for p in MODEL.params]
    for r in results:
        for v in r["variants"]:
            assert v["local_shapes"] == want
    assert dict(want)["h.0.attn.k.weight"] == [4 * 4 // world, 32] and dict(want)["h.0.attn.o.weight"] == [32, 32 // world]
