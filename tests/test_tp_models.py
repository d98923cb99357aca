"""Transformer specs general enough for real models (issue 13 item 1): fused or separate q/k/v, grouped-query
attention, 2- or 3-matrix MLPs, norms with or without bias, tied or untied embeddings, any vocabulary, in YAML
and by preset; the Llama 3 presets have the published shapes and parameter counts."""
import pytest

from distlab.sim.errors import ConfigError
from distlab.sim.models import PRESETS, gpt, model_from_spec, preset, structure


def names(model, block=0):
    return [p.name.removeprefix(f"h.{block}.") for p in model.layers[1 + block].params]


def test_llama3_presets_have_the_published_shapes_and_sizes():
    """arXiv 2407.21783 Table 3 (layers, model dim, FFN dim, heads, KV heads); 8.03B / 70.6B / 405.9B
    parameters as the released checkpoints count them (vocabulary 128256, untied head)."""
    shapes = {n: tuple(PRESETS[n][k] for k in ("layers", "hidden", "ffn_hidden", "heads", "kv_heads"))
              for n in ("llama3-8b", "llama3-70b", "llama3-405b")}
    assert shapes == {"llama3-8b": (32, 4096, 14336, 32, 8), "llama3-70b": (80, 8192, 28672, 64, 8),
                      "llama3-405b": (126, 16384, 53248, 128, 8)}
    counts = {n: round(preset(n).num_params / 1e9, 2) for n in shapes}
    assert counts == {"llama3-8b": 8.03, "llama3-70b": 70.55, "llama3-405b": 405.85}
    m = preset("llama3-8b")
    k = next(p for p in m.params if p.name == "h.0.attn.k.weight")
    assert k.shape == (8 * 128, 4096) and m.params[-1].name == "lm_head.weight"     # GQA: 8 KV heads of 128


def test_arch_defaults_keep_the_existing_parameter_lists():
    assert names(gpt(1, 16, 2, 8, 50, arch="gpt2")) == [
        "norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.o.weight", "attn.o.bias",
        "norm2.weight", "norm2.bias", "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"]
    assert names(gpt(1, 16, 2, 8, 50, arch="llama")) == [
        "attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.o.weight", "mlp.gate.weight", "mlp.up.weight",
        "mlp.down.weight", "norm1.weight", "norm2.weight"]
    assert "qkv" not in gpt(1, 16, 2, 8, 50, arch="llama").config     # config holds only what differs


def test_each_structural_choice_changes_the_parameters():
    m = gpt(1, 16, 4, 8, 50, arch="llama", qkv="fused", kv_heads=2, mlp="gelu", norm_bias=True, bias=True,
            tied=True, positions="learned")
    assert names(m) == ["attn.qkv.weight", "attn.qkv.bias", "attn.o.weight", "attn.o.bias", "mlp.fc.weight",
                        "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias", "norm1.weight", "norm1.bias",
                        "norm2.weight", "norm2.bias"]
    assert m.layers[1].params[0].shape == (16 + 2 * 8, 16)          # q + 2 grouped kv heads of 4
    assert [p.name for p in m.layers[0].params] == ["embed.tok.weight", "embed.pos.weight"]
    assert [p.name for p in m.layers[-1].params] == ["norm_f.weight", "norm_f.bias"]      # tied: no lm_head
    g = gpt(1, 16, 2, 8, 50, arch="gpt2", qkv="separate", mlp="swiglu", ffn_hidden=24, norm_bias=False,
            bias=False, tied=False, positions="rope")
    assert names(g) == ["norm1.weight", "attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.o.weight",
                        "norm2.weight", "mlp.gate.weight", "mlp.up.weight", "mlp.down.weight"]
    assert structure(g)["mlp"] == "swiglu" and g.params[-1].shape == (50, 16)


def test_yaml_mapping_with_arch_and_round_trip_through_config():
    spec = {"arch": "llama", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "seq_len": 16, "vocab": 1001,
            "mlp": "relu", "tied": True}
    m = model_from_spec(spec)
    assert structure(m)["mlp"] == "relu" and m.config["vocab"] == 1001
    again = model_from_spec({**m.config, "name": m.name})
    assert [(p.name, p.shape) for p in again.params] == [(p.name, p.shape) for p in m.params]
    assert model_from_spec({"preset": "llama3-8b", "layers": 2}).config["kv_heads"] == 8


@pytest.mark.parametrize("spec,where", [
    ({"arch": "llama", "layers": 1, "hidden": 16, "heads": 4, "kv_heads": 3, "seq_len": 8, "vocab": 9}, "kv_heads"),
    ({"arch": "llama", "layers": 1, "hidden": 16, "heads": 4, "seq_len": 8, "vocab": 9, "mlp": "geglu"}, "mlp"),
    ({"arch": "llama", "layers": 1, "hidden": 16, "heads": 4, "seq_len": 8, "vocab": 9, "tied": "yes"}, "tied"),
    ({"arch": "llama", "layers": 1, "hidden": 16, "heads": 4, "seq_len": 8, "vocab": 9, "rope": 1}, "model")])
def test_bad_structure_is_one_line(spec, where):
    with pytest.raises(ConfigError) as e:
        model_from_spec(spec)
    assert where in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("choices", [{}, {"arch": "gpt2"}, {"qkv": "fused", "mlp": "gelu", "tied": True},
                                     {"arch": "gpt2", "qkv": "separate", "mlp": "swiglu", "norm": "rmsnorm",
                                      "norm_bias": False, "bias": False, "tied": False, "positions": "rope"},
                                     {"norm_bias": True, "bias": True, "mlp": "relu", "positions": "learned"}])
def test_runtime_builds_every_structure_parameter_for_parameter(choices):
    """runtime/models.build_module gives a real module with exactly the described parameters (it checks names,
    shapes and order) and it runs forward and backward."""
    torch = pytest.importorskip("torch")
    from distlab.runtime.modules.bridge import build_module, example_input
    spec = {"arch": "llama", "layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "seq_len": 8, "vocab": 50,
            "dtype": "float32", "micro_batch": 2, **choices}
    model = model_from_spec(spec)
    module = build_module(model)
    out = module(example_input(model))
    assert out.shape == (2, 8, 50)
    out.sum().backward()
    assert all(p.grad is not None for p in module.parameters())
