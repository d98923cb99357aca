"""Issue 21, fact 21: a model with tied embeddings (GPT-2) all-reduces the embedding gradient between the ranks of
the first and the last pipeline stage (Megatron's embedding group); torch's pipelining does not do it for you."""
import pytest

from distlab.sim.cluster import load_cluster
from distlab.sim.kernel.engine import simulate
from distlab.sim.models import gpt, model_from_spec
from distlab.sim.parallel.pipeline.plan import PipelineSpec, build_plan
from distlab.sim.parallel.pipeline.tied import ties_embeddings


def tied_ops(plan):
    return {r: [o for o in ops if getattr(o, "name", "") == "tied embedding grad all_reduce"]
            for r, ops in enumerate(plan.ranks)}


def small_gpt(arch="gpt2"):
    return gpt(layers=4, hidden=64, heads=4, seq_len=32, vocab=1000, arch=arch, dtype="float32",
               name=f"tiny-{arch}")


@pytest.mark.parametrize("schedule,p,v", [("1f1b", 4, 1), ("gpipe", 2, 1), ("interleaved", 2, 2), ("zbh1", 4, 1)])
def test_first_and_last_stage_ranks_all_reduce_the_embedding_gradient(schedule, p, v):
    model = small_gpt()
    plan = build_plan(model, PipelineSpec(schedule=schedule, stages=p, microbatches=4, virtual_stages=v))
    ops = tied_ops(plan)
    last = plan.meta["pipeline"]["stage_to_rank"][-1]
    assert {r for r, o in ops.items() if o} == {0, last} and last != 0
    for r in (0, last):
        (op,) = ops[r]
        assert op.op == "all_reduce" and op.group == (0, last) and op.bytes == 1000 * 64 * 4   # V·h·fp32
        assert plan.ranks[r][-1] is op                  # after everything else the rank does in the step


def test_each_replica_has_its_own_embedding_group():
    plan = build_plan(small_gpt(), PipelineSpec(schedule="1f1b", stages=2, microbatches=4, data_parallel=2))
    groups = sorted({o.group for ops in tied_ops(plan).values() for o in ops})
    assert groups == [(0, 1), (2, 3)]
    # after the stage's data-parallel all-reduce, as Megatron's finalize_model_grads orders them
    names = [o.name for o in plan.ranks[1] if hasattr(o, "op")]
    assert names.index("tied embedding grad all_reduce") > names.index("grad all_reduce stage 1")


def test_nothing_when_untied_or_on_one_rank():
    assert ties_embeddings(small_gpt()) and not ties_embeddings(small_gpt("llama"))
    assert not ties_embeddings(model_from_spec({"kind": "mlp", "widths": [8, 8, 8]}))
    untied = build_plan(small_gpt("llama"), PipelineSpec(schedule="1f1b", stages=4, microbatches=4))
    assert not any(tied_ops(untied).values())
    zbv = build_plan(small_gpt(), PipelineSpec(schedule="zbv", stages=2, microbatches=4, virtual_stages=2))
    assert zbv.meta["pipeline"]["stage_to_rank"][-1] == 0 and not any(tied_ops(zbv).values())


def test_it_costs_time_in_the_simulated_step():
    model = model_from_spec({"preset": "gpt2-medium", "micro_batch": 4})
    spec = PipelineSpec(schedule="1f1b", stages=4, microbatches=8)
    trace = simulate(build_plan(model, spec), load_cluster("dgx-h100").with_world_size(4))
    tied = [o for o in trace.ops if o.name == "tied embedding grad all_reduce"]
    assert sorted(o.rank for o in tied) == [0, 3] and all(o.end > o.start for o in tied)
    last_compute = max(o.end for o in trace.for_rank(3) if o.stream == "compute")
    assert min(o.start for o in tied) >= last_compute - 1e-12 and trace.makespan >= max(o.end for o in tied)
