"""PP x TP in the simulator (sim/parallel/tp/pipeline.py; against real torch pipelining: tests/test_tp_runtime.py): each stage's
forward and backward actions carry the TP collectives of its layers, on the rank's TP group, once per
micro-batch; stage boundaries send the TP-local (SP: sequence-sharded) tensor; dp replicas all-reduce the
TP-local stage gradients; schedules that split the backward are refused."""
import pytest

from distlab.sim import scenario as sc
from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt
from distlab.sim.parallel.pipeline.plan import PipelineSpec
from distlab.sim.plan import Collective, Recv, Send
from distlab.sim.parallel.tp.pipeline import pp_tp_plan
from distlab.sim.parallel.tp.plan import TPOptions, collective_sequence, tp_plan
from distlab.sim.parallel.tp.rules import local_numel

MODEL = gpt(layers=2, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=2, dtype="float32",
            arch="llama", ffn_hidden=64)
X = 2 * 8 * 32 * 4


@pytest.mark.parametrize("sp", [True, False])
def test_stage_collectives_per_microbatch_and_tp_local_boundaries(sp):
    m = 3
    plan = pp_tp_plan(MODEL, Mesh({"pp": 2, "tp": 2}), PipelineSpec("1f1b", 2, m), TPOptions(sequence_parallel=sp))
    one = [c for c in collective_sequence(tp_plan(MODEL, Mesh({"tp": 2}), TPOptions(sequence_parallel=sp)), 0)
           if c[-1] != "optimizer"]                  # the 1-D plan's forward + backward: stages split it
    per_rank = [collective_sequence(plan, r) for r in range(4)]
    assert len(per_rank[0]) + len(per_rank[2]) == m * len(one)
    assert {c[3] for c in per_rank[0]} == {(0, 1)} and {c[3] for c in per_rank[3]} == {(2, 3)}
    assert per_rank[0] == per_rank[1]                 # the two TP ranks of stage 0 issue the same calls
    p2p = [o for o in plan.ranks[0] if isinstance(o, (Send, Recv))]
    assert len(p2p) == 2 * m and {o.bytes for o in p2p} == {X // 2 if sp else X}
    assert {o.peer for o in p2p} == {2}                 # rank 0 (pp 0, tp 0) talks to rank 2 (pp 1, tp 0)


def test_dp_replicas_all_reduce_the_tp_local_stage_gradients():
    plan = pp_tp_plan(MODEL, Mesh({"dp": 2, "pp": 2, "tp": 2}), PipelineSpec("gpipe", 2, 2, data_parallel=2))
    dp = [o for r in range(8) for o in plan.ranks[r] if isinstance(o, Collective) and o.name.startswith("grad")]
    assert len(dp) == 8 and {o.group for o in dp if o in plan.ranks[0]} == {(0, 4)}
    assert sum(o.bytes for o in plan.ranks[0] + plan.ranks[2] if isinstance(o, Collective)
               and o.name.startswith("grad")) == local_numel(MODEL, 2) * 4


def test_scenario_simulates_and_refuses_split_backward_schedules():
    d = {"model": {"arch": "llama", "layers": 2, "hidden": 32, "heads": 8, "kv_heads": 4, "ffn_hidden": 64,
                   "seq_len": 8, "vocab": 128, "micro_batch": 2, "dtype": "float32"},
         "cluster": "dgx-h100", "world_size": 4, "mesh": {"pp": 2, "tp": 2}, "tp": {"microbatches": 2}}
    r = sc.simulate(d)
    assert r.plan.meta["builder"] == "pp_tp" and r.trace.makespan > 0
    assert any(row[0] == "pipeline stages (pp)" for row in r.report["rows"])
    with pytest.raises(ConfigError, match="allowed: gpipe, 1f1b"):
        sc.build({**d, "tp": {"schedule": "zbh1"}})


def test_an_uneven_split_builds_where_an_even_one_is_refused():
    """pp must divide the blocks unless the spec gives the split (Llama 3 405B: 126 blocks as 7 + 14 x 8 + 7,
    benchmarks/sim_scale.py)."""
    model = gpt(layers=6, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=1, arch="llama",
                ffn_hidden=64, dtype="float32")
    mesh = Mesh({"pp": 4, "tp": 2})
    with pytest.raises(ConfigError, match="pp 4 is not a divisor"):
        pp_tp_plan(model, mesh, PipelineSpec(stages=4, microbatches=4))
    plan = pp_tp_plan(model, mesh, PipelineSpec(stages=4, microbatches=4, split=[1, 2, 2, 1]))
    assert plan.meta["pipeline"]["layers_per_stage"] == [2, 2, 2, 2]    # embed and head join the end stages


def test_the_pipelining_runtime_overhead_follows_every_action():
    """``overhead`` (runtime/parallel/tp/pipeline.py RuntimeProbe: torch pipelining's own CPU per action) is one "runtime" op
    of that many seconds after each of a stage's 2m actions; with the rest of the step unchanged, a rank's busy
    time grows by exactly 2m x overhead (hand count)."""
    from distlab.sim.cluster import PRESETS
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.plan import Compute
    m, overhead = 3, 1e-3
    spec, mesh = PipelineSpec("1f1b", 2, m), Mesh({"pp": 2, "tp": 2})
    plan = pp_tp_plan(MODEL, mesh, spec, overhead=overhead)
    for r in range(4):
        runtime = [o for o in plan.ranks[r] if isinstance(o, Compute) and o.name == "runtime"]
        assert len(runtime) == 2 * m and {o.seconds for o in runtime} == {overhead}
    cluster = PRESETS["localhost-cpu"].with_world_size(4)
    busy = [sum(o.duration for o in simulate(p, cluster).for_rank(0) if o.kind == "compute")
            for p in (plan, pp_tp_plan(MODEL, mesh, spec))]
    assert busy[0] - busy[1] == pytest.approx(2 * m * overhead)
