"""The memory widget (lessons 06, 11) is `distlab simulate` and `distlab memory`, for every combination of ZeRO
stage, TP, PP, CP and recomputation, with the sequence length, the precision and a user's own model
(config.json) as controls: a property test (hypothesis), sim-only, on a 2-block Llama of one's own on 8 GPUs.
Every figure is sim/parallel/memory.py ``memory_per_gpu`` (issue 39.2): equal to the byte, no exceptions.

What the widget may not do is refused in one line, never computed silently as something else: with cp > 1
torchtitan shards the parameters with FSDP2 over dp_shard x cp (ZeRO 0-2 do not apply, issue 42 item 7), and ring
attention has no selective recomputation.
"""
import json

import pytest

pytest.importorskip("ipywidgets")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, example, given, settings, strategies as st  # noqa: E402

from cli_in_process import run_in_process  # noqa: E402
from distlab.sim.lessons import sliders as S  # noqa: E402

GPUS = 8
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1024,
        "max_position_embeddings": 2048, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False}
@pytest.fixture(scope="module")
def own_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("own") / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def _widget(own_model, **values):
    from distlab.sim.lessons.widgets import MemoryWidget
    w = MemoryWidget(**{"model": own_model, "gpus": GPUS, "zero": 3, "recompute": "none", **values})
    assert w.values() == {**w.values(), **values}         # the controls hold what was asked (one render, not one
    return w                                              # per control: tests/test_lessons_widgets.py moves them)


def _simulated(d: dict) -> dict:
    from distlab.sim.lessons.training import simulate
    return simulate(d)["report"]["memory"]


def _memory_scenario(cli_capsys, tmp_path, d: dict) -> dict:
    import yaml
    path = tmp_path / "widget.yaml"
    path.write_text(yaml.safe_dump(d))
    rc, out, err = run_in_process(cli_capsys, "memory", "--scenario", str(path), "--json")
    assert rc == 0, err
    return json.loads(out)


LAYOUTS = st.tuples(st.sampled_from((0, 1, 2, 3)), st.sampled_from((1, 2, 4)), st.sampled_from((1, 2)),
                    st.sampled_from((1, 2)), st.sampled_from(S.RECOMPUTE), st.sampled_from((1024, 2048)),
                    st.sampled_from(S.DTYPES))


@example((3, 1, 2, 1, "full", 1024, "bfloat16"))       # FSDP2 inside pipeline stages (once two answers)
@example((3, 2, 1, 2, "none", 1024, "bfloat16"))       # CP x TP: FSDP2's gathered units over dp_shard x cp
@example((2, 1, 2, 1, "selective", 1024, "bfloat16"))  # ZeRO-2 inside a pipeline: unsharded grads kept
@example((1, 2, 1, 1, "full", 2048, "float32"))        # ZeRO-1 x TP: distlab memory only (simulate refuses)
@settings(max_examples=8, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.function_scoped_fixture])     # capsys read out after each call
@given(LAYOUTS)
def test_the_widget_is_simulate_and_distlab_memory(own_model, capsys, tmp_path_factory, layout):
    zero, tp, pp, cp, recompute, seq_len, dtype = layout
    values = dict(zero=zero, tp=tp, pp=pp, cp=cp, recompute=recompute, seq_len=seq_len, dtype=dtype)
    w = _widget(own_model, **values)
    if tp * pp * cp > GPUS:              # no such mesh: said in one line
        assert w.message and "does not divide" in w.message
        return
    if cp > 1 and (zero != 3 or recompute == "selective"):
        assert w.message and ("ZeRO 0-2 do not apply" in w.message or "selective" in w.message)
        with pytest.raises(ValueError):
            S.memory_per_gpu(own_model, GPUS, zero, tp, pp, cp, recompute=recompute, seq_len=seq_len, dtype=dtype)
        return
    from distlab.sim.errors import ConfigError
    d = S.memory_scenario(own_model, GPUS, zero, tp, pp, cp, recompute=recompute, seq_len=seq_len, dtype=dtype)
    if w.message:                        # refused: simulate refuses the same layout of this model
        with pytest.raises(ConfigError):
            _simulated(d)
        return
    got = w.result
    assert got == S.memory_per_gpu(own_model, GPUS, zero, tp, pp, cp, recompute=recompute, seq_len=seq_len,
                                   dtype=dtype)
    mem = _memory_scenario(capsys, tmp_path_factory.mktemp("w"), d)      # `distlab memory --scenario`
    assert got["total"] == mem["total_bytes"] and {k: got[k] for k in mem["breakdown_bytes"]} == \
        mem["breakdown_bytes"], (values, got, mem)
    if zero in (1, 2) and tp > 1:        # simulate builds ZeRO-1/2 without TP only (sim/parallel/fsdp/step.py)
        with pytest.raises(ConfigError, match="ZeRO-3"):
            _simulated(d)
        return
    report = _simulated(d)
    assert got["total"] == report["total_bytes"] and report["breakdown_bytes"] == mem["breakdown_bytes"], \
        (values, got, report)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", S.DTYPES)
def test_data_parallel_alone_is_distlab_memory(own_model, capsys, zero, dtype):
    """tp = pp = cp = 1: every term `distlab memory --json` prints for the stage, FSDP2's gathered units (the
    root and two blocks: the one computing and the one prefetched) included, and the total: to the byte."""
    w = _widget(own_model, zero=zero, dtype=dtype, seq_len=1024, recompute="full")
    rc, out, _ = run_in_process(capsys, "memory", "--model", own_model, "--world", GPUS, "--zero", zero, "--json",
                                "--seq-len", 1024, "--dtype", dtype, "--recompute", "full")
    stage = json.loads(out)["stages"][zero]
    assert rc == 0
    for term in ("params", "grads", "optimizer", "unsharded params", "activations"):
        assert w.result.get(term, 0) == stage[f"{term.replace(' ', '_')}_bytes"], term
    assert w.result["total"] == stage["total_bytes"]
    assert (w.result.get("unsharded params", 0) > 0) == (zero == 3)


def test_precision_and_sequence_controls_move_what_they_should(own_model):
    bf16 = _widget(own_model, zero=0, dtype="bfloat16", seq_len=1024).result
    fp32 = _widget(own_model, zero=0, dtype="float32", seq_len=1024).result
    longer = _widget(own_model, zero=0, dtype="bfloat16", seq_len=2048).result
    n = bf16["params"] / 2                                                # bf16: 2 + 2 + 12 bytes per parameter
    assert bf16["optimizer"] == pytest.approx(12 * n) and fp32["params"] == pytest.approx(4 * n)
    assert fp32["optimizer"] == pytest.approx(8 * n)                      # fp32: 4 + 4 + 8
    assert longer["activations"] > 1.9 * bf16["activations"] and longer["params"] == bf16["params"]


def test_a_factory_is_refused_and_a_bad_path_said(own_model):
    with pytest.raises(ValueError, match="preset name or a config.json"):
        S.memory_per_gpu("os:system")
    w = _widget(own_model)
    w.controls["model"].value = "/nonexistent/config.json"
    assert w.message and w.result["params"] > 0                           # said; the last result kept
