"""DDP x TP in the simulator (sim/parallel/tp/ddp.py): TP collectives as the 1-D plan, the SP norms' Partial gradients
all-reduced over tp at the end of backward (not in the optimizer), then DDP's buckets of TP-local gradients
all-reduced over dp with no overlap with backward compute. Checked against real torch in tests/test_tp_runtime.py."""
import pytest

from distlab.sim import scenario as sc
from distlab.sim.parallel.ddp.plan import DDPOptions
from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt
from distlab.sim.parallel.tp.ddp import ddp_tp_plan
from distlab.sim.parallel.tp.plan import TPOptions, collective_sequence, tp_plan
from distlab.sim.parallel.tp.rules import local_numel

MODEL = gpt(layers=2, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=2, dtype="float32",
            arch="llama", ffn_hidden=64)
CPU = {"model": {"arch": "llama", "layers": 2, "hidden": 32, "heads": 8, "kv_heads": 4, "ffn_hidden": 64,
                 "seq_len": 8, "vocab": 128, "micro_batch": 2, "dtype": "float32"},
       "cluster": "dgx-h100", "world_size": 4, "mesh": {"dp": 2, "tp": 2}, "tp": {"sequence_parallel": True}}


@pytest.mark.parametrize("sp", [True, False])
def test_tp_collectives_then_norm_grads_then_one_bucket_over_dp(sp):
    plan = ddp_tp_plan(MODEL, Mesh({"dp": 2, "tp": 2}), tp_opts=TPOptions(sequence_parallel=sp))
    alone = [c for c in collective_sequence(tp_plan(MODEL, Mesh({"tp": 2}), TPOptions(sequence_parallel=sp)), 0)
             if c[-1] != "optimizer"]
    for rank, (tp_group, dp_group) in enumerate([((0, 1), (0, 2)), ((0, 1), (1, 3)), ((2, 3), (0, 2)),
                                                 ((2, 3), (1, 3))]):
        seq = collective_sequence(plan, rank)
        assert [c[:2] + c[4:] for c in seq[:len(alone)]] == [c[:2] + c[4:] for c in alone]
        norms = seq[len(alone):-1]
        assert norms == [("all_reduce", 32 * 4, "float32", tp_group, "backward")] * (5 if sp else 0)
        assert seq[-1] == ("all_reduce", local_numel(MODEL, 2) * 4, "float32", dp_group, "backward")
        assert all(c[-1] != "optimizer" for c in seq)      # the optimizer reads plain local tensors


def test_buckets_take_tp_local_gradients_in_reverse_parameter_order():
    one = ddp_tp_plan(MODEL, Mesh({"dp": 2, "tp": 2}), DDPOptions(bucket_cap_mb=0.02))
    sizes = [b["bytes"] for b in one.meta["buckets"]]
    assert len(sizes) > 2 and sum(sizes) == local_numel(MODEL, 2) * 4
    # rebuilt buckets fill in ready order, last parameter first: bucket 0 starts with lm_head (128 x 32 / 2)
    assert sizes[0] >= 64 * 32 * 4


def test_scenario_with_dp_simulates_and_ddp_waits_for_the_whole_backward():
    r = sc.simulate(CPU)
    assert r.plan.meta["builder"] == "ddp_tp"
    ops = r.trace.for_rank(0)
    last_bwd = max(o.end for o in ops if o.kind == "compute" and o.name.startswith("bwd"))
    dp = [o for o in ops if o.kind == "collective" and o.name.startswith("dp ")]
    assert len(dp) == 1 and dp[0].start >= last_bwd and dp[0].group == (0, 2)
    table = r.report["tables"][0]["rows"]
    assert ["dp", "all_reduce", "backward", 1] == table[-1][:4]


def test_dp_and_dp_shard_together_is_refused():
    with pytest.raises(ConfigError, match="dp_shard"):
        sc.build({**CPU, "world_size": 4, "mesh": {"dp": 2, "dp_shard": 2, "tp": 1}})
