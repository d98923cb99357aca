"""Hugging Face ``config.json`` files, read offline (nothing is downloaded): the model spec they describe.

    from distlab.sim.models.hf import spec_from_file
    spec_from_file("sim/models/configs/llama-3.1-8b.json")
    # {'kind': 'gpt', 'arch': 'llama', 'layers': 32, 'hidden': 4096, 'heads': 32, 'kv_heads': 8, ...}

The architecture is the config's ``architectures[0]`` (else its ``model_type``); each maps onto a builder as
transformers' modelling code defines it (transformers/models/<type>/modeling_<type>.py):
  LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM   -> gpt, arch llama (RMSNorm, SwiGLU of
      intermediate_size, GQA with num_key_value_heads, RoPE); Llama's attention_bias / mlp_bias; Qwen2's q, k, v
      biases; Mistral's sliding_window (Qwen2's when use_sliding_window); head_dim when given
  GPT2LMHeadModel          -> gpt, arch gpt2 (n_embd, n_layer, n_head, n_inner or 4 x n_embd, n_positions,
      tied head, activation_function gelu*/relu, resid_pdrop as dropout)
  MixtralForCausalLM       -> moe, GQA attention, num_local_experts SwiGLU experts of intermediate_size, top
      num_experts_per_tok, no shared experts
  DeepseekV3ForCausalLM    -> moe, MLA (q_lora_rank, kv_lora_rank, qk_nope_head_dim = v_head_dim,
      qk_rope_head_dim), first_k_dense_replace dense blocks of intermediate_size, n_routed_experts of
      moe_intermediate_size, n_shared_experts; left out: the multi-token-prediction module
      (num_nextn_predict_layers) and the routers' e_score_correction_bias (256 numbers a layer)
The sequence length is a training choice, not the config's: ``max_position_embeddings`` is the longest the
model supports, so without ``seq_len`` the spec takes min(that, 4096) (DEFAULT_SEQ_LEN). Parameters are
bfloat16 unless ``torch_dtype`` says otherwise.
"""
from __future__ import annotations

import json
import os

from distlab.sim.errors import ConfigError

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                 "GPT2LMHeadModel": "gpt2", "MixtralForCausalLM": "mixtral", "DeepseekV3ForCausalLM": "deepseek_v3"}
DEFAULT_SEQ_LEN = 4096
MAX_CONFIG_BYTES = 2**20            # a config.json is a few KiB; anything larger is not one
DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def config_path(path: str) -> str:
    """``path`` itself, or ``path/config.json`` for a model folder."""
    return os.path.join(path, "config.json") if os.path.isdir(path) else path


def read_config(path: str) -> dict:
    """The JSON object of a config file (ConfigError if missing, too large or not a JSON object)."""
    path = config_path(path)
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ConfigError(f"cannot read the Hugging Face config: {e.strerror}", path) from None
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{size} bytes is too large for a config.json (at most {MAX_CONFIG_BYTES})", path)
    from distlab.sim.io import read_text
    try:
        d = json.loads(read_text(path, "config.json"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"not valid JSON (line {e.lineno}, column {e.colno})", path) from None
    if not isinstance(d, dict):
        raise ConfigError("a config.json is a JSON object", path)
    return d


def architecture(d: dict, where: str) -> str:
    """The model_type the config describes (ConfigError naming an unknown one and the allowed)."""
    names = d.get("architectures")
    name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None
    allowed = ", ".join(ARCHITECTURES)
    if name is not None:
        if name not in ARCHITECTURES:
            raise ConfigError(f"unknown architecture {name!r}; allowed: {allowed}", f"{where}: architectures")
        return ARCHITECTURES[name]
    kind = d.get("model_type")
    if kind not in ARCHITECTURES.values():
        raise ConfigError(f"unknown model_type {kind!r} and no architectures; allowed: {allowed}", where)
    return kind


def spec_from_file(path: str, where: str | None = None) -> dict:
    where = where or config_path(path)
    return spec_from_config(read_config(path), where)


def spec_from_config(d: dict, where: str = "config.json") -> dict:
    """The model spec (sim/models/spec.py) of a parsed config: kind, builder arguments, ``seq_len``, ``dtype``."""
    kind = architecture(d, where)

    def get(key, default=..., types=(int,)):
        v = d.get(key, default)
        if v is ...:
            raise ConfigError(f"missing key {key!r} (a {kind} config needs it)", where)
        if v is not None and v is not default and (isinstance(v, bool) and bool not in types
                                                  or not isinstance(v, types)):
            raise ConfigError(f"{v!r} must be {' or '.join(t.__name__ for t in types)}", f"{where}: {key}")
        return v

    dtype = d.get("torch_dtype") or d.get("dtype") or "bfloat16"
    if dtype not in DTYPES:
        raise ConfigError(f"unknown torch_dtype {dtype!r}; allowed: {', '.join(DTYPES)}", f"{where}: torch_dtype")
    if kind == "gpt2":
        act = get("activation_function", "gelu_new", (str,))
        if not act.startswith("gelu") and act != "relu":
            raise ConfigError(f"unknown activation_function {act!r}; allowed: gelu, gelu_new, relu",
                              f"{where}: activation_function")
        positions = get("n_positions", None) or get("n_ctx")
        return {"kind": "gpt", "arch": "gpt2", "layers": get("n_layer"), "hidden": get("n_embd"),
                "heads": get("n_head"), "vocab": get("vocab_size"), "ffn_hidden": get("n_inner", None),
                "max_positions": positions, "seq_len": min(positions, DEFAULT_SEQ_LEN),
                "mlp": "relu" if act == "relu" else "gelu", "dropout": float(get("resid_pdrop", 0.1, (int, float))),
                "dtype": DTYPES[d.get("torch_dtype") or "float32"]}
    seq = min(get("max_position_embeddings", DEFAULT_SEQ_LEN), DEFAULT_SEQ_LEN)
    common = {"layers": get("num_hidden_layers"), "hidden": get("hidden_size"), "heads": get("num_attention_heads"),
              "vocab": get("vocab_size"), "seq_len": seq, "dtype": DTYPES[dtype]}
    if get("tie_word_embeddings", False, (bool,)) and kind in ("mixtral", "deepseek_v3"):
        raise ConfigError("tied embeddings are not built for mixture-of-experts models; allowed: false",
                          f"{where}: tie_word_embeddings")
    act = get("hidden_act", "silu", (str,))
    if act != "silu":
        raise ConfigError(f"unknown hidden_act {act!r} for a {kind} model; allowed: silu", f"{where}: hidden_act")
    if kind in ("llama", "mistral", "qwen2"):
        spec = {"kind": "gpt", "arch": "llama", **common, "kv_heads": get("num_key_value_heads", None),
                "ffn_hidden": get("intermediate_size"), "tied": get("tie_word_embeddings", False, (bool,))}
        head_dim = get("head_dim", None)
        if head_dim is not None and head_dim * spec["heads"] != spec["hidden"]:
            spec["head_dim"] = head_dim
        if kind == "llama":
            spec.update(attention_bias=get("attention_bias", False, (bool,)), mlp_bias=get("mlp_bias", False, (bool,)))
        if kind == "qwen2":
            spec["qkv_bias"] = True
        window = get("sliding_window", None)
        if window is not None and (kind == "mistral" or get("use_sliding_window", False, (bool,))):
            spec["window"] = window
        return {k: v for k, v in spec.items() if v is not None and v is not False or k == "tied"}
    if kind == "mixtral":
        return {"kind": "moe", **common, "attention": "gqa", "kv_heads": get("num_key_value_heads", None),
                "experts": get("num_local_experts"), "top_k": get("num_experts_per_tok"),
                "expert_ffn": get("intermediate_size")}
    nope, v = get("qk_nope_head_dim"), get("v_head_dim")
    if nope != v:
        raise ConfigError(f"qk_nope_head_dim {nope} differs from v_head_dim {v}; MLA is built with one head "
                          "dimension; allowed: equal", f"{where}: v_head_dim")
    if get("moe_layer_freq", 1) != 1:
        raise ConfigError("every block after the first dense ones is built as MoE; allowed: moe_layer_freq 1",
                          f"{where}: moe_layer_freq")
    q_lora = get("q_lora_rank")
    if q_lora is None:
        raise ConfigError("MLA is built with a compressed query; allowed: a q_lora_rank", f"{where}: q_lora_rank")
    return {"kind": "moe", **common, "attention": "mla", "head_dim": nope, "rope_dim": get("qk_rope_head_dim"),
            "q_lora": q_lora, "kv_lora": get("kv_lora_rank"), "experts": get("n_routed_experts"),
            "top_k": get("num_experts_per_tok"), "expert_ffn": get("moe_intermediate_size"),
            "shared_experts": get("n_shared_experts", 0), "first_dense": get("first_k_dense_replace", 0),
            "dense_ffn": get("intermediate_size")}
