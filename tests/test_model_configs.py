"""Models people train, from their published configs: parameter counts of the shipped Hugging Face config.json
files (sim/models/configs/, SOURCES.md) against the published sizes; every ``--model`` form resolved in one
place (preset, config.json, pkg.module:factory); bad configs refused in one line with exit code 2."""
import json
import os
import subprocess
import sys

import pytest

from distlab.sim.errors import ConfigError
from distlab.sim.models import model_from_spec, spec_from_text
from distlab.sim.models.hf import spec_from_config, spec_from_file
from distlab.sim.models.moe import PRESETS as MOE_PRESETS
from distlab.sim.models.presets import CONFIGS

# published sizes (sim/models/configs/SOURCES.md): the Hugging Face model pages and model cards, Mistral AI's
# announcement, DeepSeek-V3's abstract
PUBLISHED = {"llama3.1-8b": 8.03e9, "llama3.1-70b": 70.6e9, "llama3.1-405b": 406e9, "qwen2.5-7b": 7.61e9,
             "qwen2.5-72b": 72.7e9, "mixtral-8x7b": 46.7e9, "deepseek-v3": 671e9}


@pytest.mark.parametrize("name", PUBLISHED)
def test_parameter_counts_equal_the_published_sizes(name):
    assert model_from_spec(name).num_params == pytest.approx(PUBLISHED[name], rel=0.005)


def test_gpt2_config_and_the_shapes_each_architecture_implies():
    gpt2 = model_from_spec({"hf_config": os.path.join(CONFIGS, "gpt2.json")})
    assert gpt2.num_params == pytest.approx(124e6, rel=0.005) and gpt2.config["dropout"] == 0.1
    qwen = model_from_spec("qwen2.5-7b")
    assert [p.shape for p in qwen.layers[1].params if p.name.endswith("bias")] == [(3584,), (512,), (512,)]
    mixtral = model_from_spec("mixtral-8x7b")
    assert mixtral.config["experts"] == 8 and mixtral.config["top_k"] == 2 and mixtral.config["kv_heads"] == 8
    llama = spec_from_file(os.path.join(CONFIGS, "llama-3.1-405b.json"))
    assert llama["seq_len"] == 4096 and model_from_spec("llama3.1-405b").config["seq_len"] == 8192


def test_mistral_config_and_a_scenario_beside_its_config(tmp_path):
    """Mistral 7B v0.1 (HF mistralai/Mistral-7B-v0.1 config.json: Llama's shape with 8 KV heads, SwiGLU 14336,
    vocabulary 32000, sliding window 4096): 7.24B parameters (its model page), the window in the attention FLOPs;
    a scenario names the config relative to its own folder."""
    d = {"architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
         "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
         "num_key_value_heads": 8, "sliding_window": 4096, "vocab_size": 32000, "torch_dtype": "bfloat16"}
    (tmp_path / "mistral.json").write_text(json.dumps(d))
    (tmp_path / "s.yaml").write_text("model: {hf_config: mistral.json, seq_len: 8192}\nddp: {}\n")
    from distlab.sim import scenario as sc
    m = model_from_spec(sc.load(str(tmp_path / "s.yaml"))["model"])
    assert m.num_params == pytest.approx(7.24e9, rel=0.005) and m.config["window"] == 4096
    full = model_from_spec({"hf_config": str(tmp_path / "mistral.json"), "seq_len": 8192, "window": 8192})
    # QKᵀ and AV, 4·b·s·window·(heads x head_dim): 8192 keys per query without the window, 4096 with it
    assert full.layers[1].fwd_flops - m.layers[1].fwd_flops == pytest.approx(4.0 * 8192 * (8192 - 4096) * 4096)


def test_deepseek_v3_config_gives_the_moe_preset():
    spec = spec_from_file(os.path.join(CONFIGS, "deepseek-v3.json"))
    assert spec.pop("kind") == "moe"
    preset = MOE_PRESETS["deepseek-v3"]
    assert {k: v for k, v in spec.items() if k != "seq_len"} == {k: v for k, v in preset.items() if k != "seq_len"}


def test_every_model_form_resolves_in_one_place(tmp_path):
    assert spec_from_text("llama3.1-8b") == {"preset": "llama3.1-8b"}
    assert spec_from_text("configs/x.json") == {"hf_config": "configs/x.json"}
    assert spec_from_text("mypkg.models:tiny") == {"factory": "mypkg.models:tiny"}
    folder = tmp_path / "Qwen2.5-7B"
    folder.mkdir()
    (folder / "config.json").write_text(open(os.path.join(CONFIGS, "qwen2.5-7b.json")).read())
    m = model_from_spec({**spec_from_text(str(folder)), "seq_len": 1024, "recompute": "full"})
    assert m.name == "Qwen2.5-7B" and m.config["seq_len"] == 1024 and m.config["recompute"] == "full"
    assert m.num_params == model_from_spec("qwen2.5-7b").num_params
    from distlab.sim.commands.plan import question
    args = type("A", (), {k: None for k in ("question", "model", "cluster", "nodes", "global_batch", "seq_len",
                                            "confirm")})()
    args.model = str(folder)
    assert question(args)["model"] == {"hf_config": str(folder)}


@pytest.mark.parametrize("edit, message", [
    ({"architectures": ["FalconForCausalLM"]}, "unknown architecture 'FalconForCausalLM'; allowed: LlamaForCausalLM"),
    ({"hidden_size": None}, "missing key 'hidden_size'"),
    ({"num_hidden_layers": "32"}, "num_hidden_layers: '32' must be int"),
    ({"hidden_act": "gelu"}, "unknown hidden_act 'gelu'"),
])
def test_bad_configs_are_one_line(edit, message):
    d = json.load(open(os.path.join(CONFIGS, "llama-3.1-8b.json")))
    d.update({k: v for k, v in edit.items() if v is not None})
    for k in [k for k, v in edit.items() if v is None]:
        del d[k]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        spec_from_config(d, "config.json")


TINY = '''
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Tiny(nn.Module):
    def __init__(self, vocab=1000, h=64, n=3):
        super().__init__()
        self.tok = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList(Block(h) for _ in range(n))
        self.out = nn.Linear(h, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx)
        for b in self.layers:
            x = b(x)
        return self.out(x)


def tiny():
    return Tiny()
'''


def test_cli_bad_config_and_a_factory_model(tmp_path, monkeypatch, capsys):
    """From the command line: a bad config.json is one line and exit 2 (a subprocess); ``pkg.module:factory`` on
    the path, through the command's own entry point (runtime/cli.py registers the tracer), traced on
    the meta device: its parameters and what full recomputation keeps of a block."""
    (tmp_path / "tinymodel.py").write_text(TINY)
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"architectures": ["FooForCausalLM"], "hidden_size": 8}))
    p = subprocess.run([sys.executable, "-m", "distlab.runtime.cli", "memory", "--model", str(bad)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and "unknown architecture 'FooForCausalLM'" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    pytest.importorskip("torch")
    from distlab.runtime.cli import main
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))                # installed or on the path: never the current folder
    assert main(["memory", "--model", "tinymodel:tiny", "--seq-len", "32", "--micro-batch", "2", "--json",
                 "--recompute", "full"]) == 0
    doc = json.loads(capsys.readouterr().out)
    h, T = 64, 64
    assert doc["num_params"] == 1000 * h + 3 * (2 * h + 8 * h * h + 5 * h) + 1000 * h
    assert doc["activations"]["block_terms"] == [{"term": "block input (kept by activation checkpointing)",
                                                  "bytes": T * h * 4}]


def test_factory_model_in_process(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    (tmp_path / "tinymodel2.py").write_text(TINY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import distlab.runtime.modules.bridge  # noqa: F401  (registers the tracer)
    from distlab.sim import scenario as sc
    m = model_from_spec({"factory": "tinymodel2:tiny", "seq_len": 32, "micro_batch": 2})
    assert [L.name for L in m.layers] == ["embed", "layers.0", "layers.1", "layers.2", "head"]
    h, T = 64, 64
    block = 2 * T * h * 4 + 2 * T * 4 + 2 * T * 4 * h * 4      # x, y; mean, rstd; fc1 out, gelu out
    assert m.layers[1].activation_bytes == block and m.layers[1].fwd_flops == 2 * T * (8 * h * h)
    assert m.layers[-1].fwd_flops == 2 * T * h * 1000
    plan = sc.build({"model": {"factory": "tinymodel2:tiny", "seq_len": 32}, "fsdp": {}, "cluster": "dgx-h100"}).plan
    assert plan.world_size == 8
    pipe = sc.build({"model": {"factory": "tinymodel2:tiny", "seq_len": 32, "micro_batch": 2}, "mesh": {"pp": 2},
                     "pipeline": {"microbatches": 2, "split": [2, 1]}, "cluster": "dgx-h100", "world_size": 2}).plan
    assert pipe.meta["pipeline"]["boundary_bytes"][0] == T * h * 4       # a block's traced output
    with pytest.raises(ConfigError, match="tensor parallelism needs a transformer described by its structure"):
        sc.build({"model": {"factory": "tinymodel2:tiny"}, "mesh": {"tp": 2}, "tp": {}, "cluster": "dgx-h100"})
    from argparse import ArgumentParser

    from distlab.sim.commands import plan as plan_command
    parser = ArgumentParser()
    plan_command.add_arguments(parser)           # every flag at its default, as `distlab plan` parses them
    args = parser.parse_args(["--model", "tinymodel2:tiny", "--nodes", "1", "--global-batch", "8"])
    with pytest.raises(ConfigError, match=r"distlab plan \(tp, cp, pp layouts\) needs a transformer"):
        plan_command.run(args)
