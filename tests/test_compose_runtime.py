"""Real torch for the compositions sim/parallel/parallelize.py builds, on 8 gloo ranks in one launch (torch 2.13,
runtime/parallel/tp/pipeline.py): FSDP2 x TP x PP on a 2 x 2 x 2 mesh (pp, dp_shard, tp: torchtitan's order; each stage
``parallelize_module``-d on the tp sub-mesh, then ``fully_shard`` on every block and the stage, run by
torch.distributed.pipelining's Schedule1F1B) and PP x FSDP2 on 2 x 4 (GPipe; blocks resharded after forward,
so every micro-batch all-gathers them again). Per rank and per mesh dimension, the collectives (kind, bytes,
dtype, group, phase) and the sends and receives (bytes, peer) equal the simulated plan's, in order."""
import pytest

from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt
from distlab.sim.parallel.fsdp.plan import FSDPOptions
from distlab.sim.parallel.parallelize import Parallelisms, parallelize
from distlab.sim.parallel.pipeline.plan import PipelineOptions
from distlab.sim.parallel.tp.plan import TPOptions
from distlab.sim.workloads.composed_report import dim_of, sequence_by_dim

pytestmark = pytest.mark.slow

MODEL = gpt(layers=2, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=2, dtype="float32",
            arch="llama", ffn_hidden=64)
VARIANTS = [
    {"mesh": [["pp", 2], ["dp_shard", 2], ["tp", 2]], "sequence_parallel": True, "schedule": "1f1b",
     "microbatches": 2, "reshard_after_forward": False},
    {"mesh": [["pp", 2], ["dp_shard", 4]], "schedule": "gpipe", "microbatches": 2, "reshard_after_forward": True},
]


SCENARIO = "scenarios/composed-cpu.yaml"          # variant 0, with the calibration rounds of its validate


@pytest.fixture(scope="module")
def launch8():
    from distlab.runtime.parallel.composed.run import run
    from distlab.runtime.parallel.composed.validate import prepare
    return run([{"model": MODEL, **v} for v in VARIANTS], world=8, steps=1, warmup=1, timeout=600,
               calibrate=prepare(SCENARIO, 8)[2], calibrate_calls=2)     # 2 calls per calibration probe


def plan_of(v: dict):
    mesh = Mesh(dict(v["mesh"]))
    par = Parallelisms(pipeline=PipelineOptions(schedule=v["schedule"], microbatches=v["microbatches"]),
                       fsdp=FSDPOptions(reshard_after_forward=v["reshard_after_forward"], overlap=False),
                       tp=TPOptions(sequence_parallel=v["sequence_parallel"]) if "tp" in mesh else None)
    return mesh, parallelize(MODEL, mesh, par)


def measured_by_dim(results, i: int, rank: int, mesh: Mesh) -> dict:
    from distlab.runtime.parallel.tp.run import measured_sequence
    out: dict = {}
    for kind, nbytes, dtype, group, phase in measured_sequence(results, i, rank):
        if kind in ("send", "recv"):
            out.setdefault("pp", []).append((kind, nbytes, group[0]))
        else:
            out.setdefault(dim_of(mesh, group, rank), []).append((kind, nbytes, dtype, group, phase))
    return out


@pytest.mark.parametrize("i", range(len(VARIANTS)), ids=["fsdp2-x-tp-x-pp-2x2x2", "pp-x-fsdp2-2x4"])
def test_collectives_per_mesh_dimension_equal_real_torch(launch8, i):
    mesh, plan = plan_of(VARIANTS[i])
    for rank in range(8):
        want, got = sequence_by_dim(plan, mesh, rank), measured_by_dim(launch8, i, rank, mesh)
        assert got == want, rank
    dims = set(sequence_by_dim(plan, mesh, 0))
    assert dims == ({"pp", "dp_shard", "tp"} if "tp" in mesh else {"pp", "dp_shard"})


def test_validate_scenario_rows_from_the_same_launch(launch8):
    """`distlab validate --scenario scenarios/composed-cpu.yaml --nproc 8` (runtime/parallel/composed/validate.py): its
    variant is the test's first, its calibration ran in the same launch; the rows: the step predicted and measured,
    one row per tp collective kind and size; every rank's sequence matches per mesh dimension."""
    from distlab.runtime.parallel.composed.validate import prepare, sequences_match
    from distlab.runtime.parallel.tp.validate import compare, rows_as_cases
    built, variant, sizes = prepare(SCENARIO, 8)
    assert variant["mesh"] == VARIANTS[0]["mesh"] and variant["model"].config == MODEL.config
    assert sizes and set(sizes) <= {"all_gather", "reduce_scatter", "all_reduce"}
    report = compare(built, launch8)
    rows = rows_as_cases({**report, "sequence_match": sequences_match(built, launch8)}, 8)
    assert rows[0]["case"].startswith("tp step") and all(c["sequence_match"] for c in rows)
    assert all(c["predicted_s"] > 0 and c["measured_s"] > 0 for c in rows)
