"""Memory formulas (ZeRO 1910.02054) against hand-computed values; the memory-over-time curve."""
import pytest

from distlab.sim.kernel.engine import simulate
from distlab.sim.errors import ConfigError
from distlab.sim.parallel.fsdp.memory import DYNAMIC, memory_curve, peak, static_bytes
from distlab.sim.parallel.memory import estimate
from distlab.sim.parallel.fsdp.plan import build_fsdp
from distlab.sim.models import Layer, Model, Param, gpt, preset

from conftest import multi_node
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process (no interpreter start)

GPT2_SMALL = 124_439_808     # 12 x 7,087,872 (block) + 50257x768 + 1024x768 (embeddings) + 1,536 (final norm)
LLAMA_7B = 6_738_415_616


def test_paper_example_7_5b_on_64_gpus():
    """ZeRO fig. 1: Ψ = 7.5B, N = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB."""
    model = Model("7.5b", [Layer("layers.0", [Param("w", (7_500_000_000,), "bfloat16")])])
    totals = [sum(static_bytes(model, 64, z).values()) for z in (0, 1, 2, 3)]
    assert totals == [120e9, 30e9 + 1.40625e9, 15e9 + 1.640625e9, 1.875e9]


def test_gpt2_small_fp32_is_4_4_8_bytes():
    m = preset("gpt2-small")
    assert m.num_params == GPT2_SMALL
    shard = (GPT2_SMALL + 3 * 768) // 4       # vocab 50257 -> 50260 rows: 3 x 768 padding elements
    assert static_bytes(m, 4, 0) == {"params": 4 * GPT2_SMALL, "grads": 4 * GPT2_SMALL, "optimizer": 8 * GPT2_SMALL}
    assert static_bytes(m, 4, 1) == {"params": 4 * GPT2_SMALL, "grads": 4 * GPT2_SMALL, "optimizer": 8 * shard}
    assert static_bytes(m, 4, 2) == {"params": 4 * GPT2_SMALL, "grads": 4 * shard, "optimizer": 8 * shard}
    assert static_bytes(m, 4, 3) == {"params": 4 * shard, "grads": 4 * shard, "optimizer": 8 * shard}


def test_padding_with_three_ranks():
    # 50257 -> 50259 and 1024 -> 1026 rows of 768; every other dim 0 (768, 2304, 3072) divides by 3
    assert static_bytes(preset("gpt2-small"), 3, 3)["params"] == 4 * (GPT2_SMALL + 4 * 768) // 3


@pytest.mark.parametrize("world,shard", [(8, None), (16, 8), (64, 64)])
def test_llama_7b_mixed_precision_2_2_12(world, shard):
    n = shard or world
    m = preset("llama-7b")
    assert m.num_params == LLAMA_7B
    assert static_bytes(m, world, 1, shard) == {"params": 2 * LLAMA_7B, "grads": 2 * LLAMA_7B,
                                                "optimizer": 12 * LLAMA_7B // n}
    assert static_bytes(m, world, 2, shard)["grads"] == 2 * LLAMA_7B // n
    assert sum(static_bytes(m, world, 3, shard).values()) == 16 * LLAMA_7B // n


def test_param_dtype_overrides_the_model_dtype():
    assert static_bytes(preset("gpt2-small"), 4, 0, dtype="bfloat16")["optimizer"] == 12 * GPT2_SMALL


def test_estimate_adds_unsharded_units_and_activations():
    m = preset("llama-7b")
    block = 4 * 4096 * 4096 + 3 * 11008 * 4096 + 2 * 4096
    root = 2 * 32000 * 4096 + 4096
    e = estimate(m, 8, 3)
    # FSDP2 keeps the root gathered and two blocks at once: the one computing and the one prefetched
    assert e["unsharded params"] == 2 * (root + 2 * block)
    assert estimate(m, 8, 3, reshard_after_forward=False)["unsharded params"] == 2 * (root + 32 * block)
    saved = sum(layer.activation_bytes for layer in m.layers)       # all layers' stash, and the head's logits
    assert e["activations"] == int(saved + m.layers[-1].transient_bytes)
    assert estimate(m, 8, 2)["unsharded params"] == 0


def test_unknown_stage_or_bad_shard_group():
    with pytest.raises(ConfigError, match="unknown ZeRO stage 4"):
        static_bytes(preset("gpt2-small"), 8, 4)
    with pytest.raises(ConfigError, match="must divide"):
        static_bytes(preset("gpt2-small"), 8, 3, shard_size=3)


@pytest.mark.parametrize("opts", [{}, {"reshard_after_forward": False}, {"reshard_after_forward": 2},
                                  {"zero": 1}, {"zero": 2}, {"shard_size": 4}, {"overlap": False},
                                  {"prefetch": 2, "backward_prefetch": 2, "param_dtype": "bfloat16"}])
def test_memory_over_time_never_negative_and_returns_to_steady_state(opts):
    model = gpt(layers=4, hidden=512, heads=8, seq_len=256, vocab=1000, micro_batch=2, arch="llama")
    plan = build_fsdp(model, 8, opts)
    trace = simulate(plan, multi_node(2, 4), record_transfers=False)
    static = sum(plan.meta["memory"]["static"].values())
    for rank in (0, 5):
        times, totals, parts = memory_curve(plan, trace, rank)
        assert times == sorted(times)
        assert all(p[k] >= 0 for p in parts for k in DYNAMIC)
        assert totals[0] == totals[-1] == static
        assert max(totals) > static
    pk = peak(plan, trace)
    assert sum(pk["breakdown"].values()) == pk["total"]
    assert pk["breakdown"]["activations"] > 0


def test_resharding_lowers_the_peak():
    model = gpt(layers=8, hidden=1024, heads=8, seq_len=128, vocab=1000, micro_batch=1, arch="llama")
    cluster = multi_node(2, 4)
    peaks = {raf: peak(p := build_fsdp(model, 8, {"reshard_after_forward": raf}),
                       simulate(p, cluster, record_transfers=False))["total"] for raf in (True, False)}
    assert peaks[True] < peaks[False]


def test_cli_memory_table_and_json(cli):
    import json
    rc, out, err = cli("memory", "--model", "llama-7b", "--world", "64", "--zero", "3")
    assert rc == 0, err
    assert "ZeRO-3 / FSDP <" in out and "DDP" in out
    rc, out, err = cli("memory", "--model", "llama-7b", "--world", "64", "--zero", "3", "--json")
    d = json.loads(out)
    stages = {s["stage"]: s for s in d["stages"]}
    selected = next(s for s in d["stages"] if s["selected"])
    # FSDP2 holds fp32 shards of params and grads and AdamW's m, v: 4 + 4 + 8 bytes an element, as every
    # report counts ZeRO-3 (sim/parallel/memory.py); ZeRO-1 keeps ZeRO's 16-bit params, 2 bytes
    assert selected["params_bytes"] == 4 * LLAMA_7B // 64 and selected["optimizer_bytes"] == 8 * LLAMA_7B // 64
    assert stages["ZeRO-1"]["params_bytes"] == 2 * LLAMA_7B and stages["ZeRO-1"]["optimizer_bytes"] == \
        12 * LLAMA_7B // 64
    assert stages["DDP"]["fits"] is False and selected["fits"] is True and selected["stage"] == "ZeRO-3 / FSDP"


@pytest.mark.parametrize("args,text", [(("--zero", "7"), "unknown stage '7'"),
                                       (("--world", "64", "--shard-size", "3"), "must divide"),
                                       (("--gpu", "tpu"), "unknown GPU")])
def test_cli_memory_bad_input_one_line_exit_2(cli, args, text):
    rc, out, err = cli("memory", *args)
    assert rc == 2 and text in err and len(err.strip().splitlines()) == 1


ACCUMULATE = {"arch": "llama", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128,
              "vocab": 256, "seq_len": 16, "micro_batch": 1, "dtype": "bfloat16"}


def _accumulated(sync_each: bool | None, m: int = 3) -> dict:
    fsdp = {} if sync_each is None else {"sync_each_microbatch": sync_each}
    return {"model": ACCUMULATE, "mesh": {"pp": 1, "dp_shard": 4}, "pipeline": {"microbatches": m}, "fsdp": fsdp,
            "cluster": "dgx-h100", "world_size": 4}


def test_gradient_accumulation_reduce_scatters_each_micro_batch_as_fsdp2_does():
    """FSDP2 without a pipeline (torchtitan's train loop: one forward_backward_step per micro-batch, the sync
    never disabled): m micro-batches issue exactly m copies of one FSDP2 step's collectives (the sequence
    tests/test_fsdp_runtime.py checks against real FSDP2 on gloo ranks), the sharded gradients accumulate and
    nothing unsharded is kept. ``sync_each_microbatch: false`` (set_requires_gradient_sync(False) until the last
    micro-batch): one reduce-scatter per unit, the unsharded gradients kept; memory and step follow."""
    from distlab.sim import scenario as sc
    from distlab.sim.parallel.memory import memory_of_result
    from distlab.sim.plan import Collective

    def seq(d):
        return [(o.op, o.bytes, o.name.split(" ")[1]) for o in sc.build(d).plan.ranks[0] if isinstance(o, Collective)]
    plain = {k: v for k, v in _accumulated(None).items() if k != "pipeline"}
    one = seq({**plain, "mesh": {"dp_shard": 4}})
    assert seq(_accumulated(None)) == seq(_accumulated(True)) == 3 * one
    assert sum(op == "reduce_scatter" for op, _, _ in one) == 5                     # root and 4 blocks
    kept = seq(_accumulated(False))
    rs = sorted(c for c in kept if c[0] == "reduce_scatter")     # after the last backward, in FSDP2's unit order
    assert rs == sorted(c for c in one if c[0] == "reduce_scatter")
    each, last = (memory_of_result(sc.build(_accumulated(s)))["breakdown_bytes"] for s in (True, False))
    assert "unsharded grads" not in each and {k: v for k, v in last.items() if k != "unsharded grads"} == each
    n = sum(q.numel for L in sc.build(_accumulated(False)).model.layers for q in L.params)
    assert last["unsharded grads"] == pytest.approx(2 * n, rel=0.01)             # bf16, the whole model
    rs_bytes = {s: sum(b for op, b, _ in seq(_accumulated(s)) if op == "reduce_scatter") for s in (True, False)}
    assert rs_bytes[True] == 3 * rs_bytes[False]       # the step carries them: overlapped with the backward
    steps = {s: sc.simulate(_accumulated(s)).summary["step_s"] for s in (True, False)}     # each, or exposed
    assert steps[True] != steps[False]                 # at the end of the last
