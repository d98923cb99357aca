"""Real context parallelism (torch 2.13's ring attention, ``_templated_ring_attention`` and its backward, on
gloo ranks; runtime/parallel/cp/run.py says why not ``context_parallel`` itself) issues exactly the simulated plan's
collectives: kind, order, bytes, dtype, group and, for the all_to_all permutes, the bytes sent to each peer;
FSDP2's all-gathers and reduce-scatters around them as well. Two shapes and both rotate methods at 2 and 4
ranks, plus at 4 a dp_shard 2 x cp 2 mesh without load balancing and CP x TP (+ SP, parallelize_module first,
then FSDP2 over cp, as torchtitan) on a cp 2 x tp 2 mesh; one launch per world size."""
import pytest

from distlab.sim.parallel.cp.plan import CPOptions, collective_sequence, cp_plan
from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt

pytestmark = pytest.mark.slow

SHAPE_A = gpt(layers=1, hidden=32, heads=4, kv_heads=2, seq_len=16, vocab=64, micro_batch=1, dtype="float32",
              arch="llama", ffn_hidden=64)
SHAPE_B = gpt(layers=2, hidden=16, heads=2, kv_heads=1, seq_len=24, vocab=32, micro_batch=2, dtype="float32",
              arch="llama", ffn_hidden=32)
VARIANTS = [{"model": SHAPE_A, "rotate_method": "allgather"}, {"model": SHAPE_B, "rotate_method": "alltoall"}]
MESH_2X2 = {"model": SHAPE_A, "rotate_method": "alltoall", "load_balance": False,
            "mesh": [["dp_shard", 2], ["cp", 2]]}
CP_X_TP = {"model": SHAPE_A, "rotate_method": "allgather", "mesh": [["cp", 2], ["tp", 2]]}   # TP + SP, FSDP2 on cp


@pytest.fixture(scope="module", params=[2, 4])
def launched(request):
    from distlab.runtime.parallel.cp import run
    world = request.param
    variants = VARIANTS + ([MESH_2X2, CP_X_TP] if world == 4 else [])
    # no warm-up step and no uncaptured step: the first step issues what later steps do (seen with torch 2.13);
    # the launch itself is most of this module's time
    return world, variants, run.run(variants, world=world, steps=1, warmup=0, plain=False, timeout=300)


def test_collective_sequences_equal_the_simulated_plans(launched):
    from distlab.runtime.parallel.cp.run import measured_sequence
    world, variants, results = launched
    for i, v in enumerate(variants):
        mesh = Mesh(dict(v.get("mesh", [["cp", world]])))
        plan = cp_plan(v["model"], mesh, CPOptions(rotate_method=v["rotate_method"],
                                                   load_balance=v.get("load_balance", True)))
        for rank in range(world):
            assert measured_sequence(results, i, rank) == collective_sequence(plan, mesh, rank), (i, rank)
        kinds = {k for k, *_ in collective_sequence(plan, mesh, 0)}
        assert "all_to_all" in kinds                        # the dK/dV permutes, whatever the K/V method
        assert ("all_gather" in kinds) and ("reduce_scatter" in kinds)
        if "tp" in mesh:                                    # TP's collectives over (0, 1) beside the ring's (0, 2)
            assert {g for *_, g, _ in collective_sequence(plan, mesh, 0)} == {(0, 1), (0, 2)}


def test_every_rank_reports_a_step_time(launched):
    world, variants, results = launched
    assert len(results) == world
    for r in results:
        for v in r["variants"]:
            st = v["steps"][-1]
            assert st["captured_time"] > 0 and len(st["captured_phases"]) == 3
