"""Named models: ``distlab ... --model NAME``. Each preset is the builder's arguments from a cited source.

    from distlab.sim.models.presets import preset_spec
    preset_spec("qwen2.5-7b")["hidden"]          # 3584 (from configs/qwen2.5-7b.json)

``GPT_PRESETS`` are written out from their papers; ``HF_PRESETS`` are read from the Hugging Face config.json
files shipped in sim/models/configs/ (SOURCES.md gives each file's URL and published size) with the sequence
length the model was pre-trained at; DeepSeek-V3 lives with the MoE family (sim/models/moe.py PRESETS, checked
against configs/deepseek-v3.json by tests/test_model_configs.py).
"""
from __future__ import annotations

import os

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")

GPT_PRESETS = {
    # HF openai-community/gpt2 config.json: n_layer 12, n_embd 768, n_head 12, n_ctx 1024, vocab 50257 (124M).
    "gpt2-small": dict(arch="gpt2", layers=12, hidden=768, heads=12, seq_len=1024, vocab=50257, dtype="float32"),
    # HF openai-community/gpt2-medium: n_layer 24, n_embd 1024, n_head 16 (355M).
    "gpt2-medium": dict(arch="gpt2", layers=24, hidden=1024, heads=16, seq_len=1024, vocab=50257,
                        dtype="float32"),
    # LLaMA 7B (2302.13971 table 2; HF config): 32 layers, 4096 hidden, 32 heads, SwiGLU 11008, vocab 32000.
    "llama-7b": dict(arch="llama", layers=32, hidden=4096, heads=32, seq_len=2048, vocab=32000, ffn_hidden=11008),
    # Llama 2 70B (2307.09288; HF config): 80 layers, 8192 hidden, 64 heads, 8 KV heads, 28672 FFN, 4096 ctx.
    "llama-70b": dict(arch="llama", layers=80, hidden=8192, heads=64, kv_heads=8, seq_len=4096, vocab=32000,
                      ffn_hidden=28672),
    # Llama 3 (Llama Team, "The Llama 3 Herd of Models", 2024, arXiv 2407.21783, Table 3): layers, model
    # dimension, FFN dimension, attention heads, 8 key/value heads, vocabulary "128,000" (the released tokenizer:
    # 128,000 tokens + 256 special = 128256, HF config vocab_size), 8192-token pre-training context; untied head.
    "llama3-8b": dict(arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
                      seq_len=8192),
    "llama3-70b": dict(arch="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672,
                       vocab=128256, seq_len=8192),
    "llama3-405b": dict(arch="llama", layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248,
                        vocab=128256, seq_len=8192),
}

# name -> (config file, pre-training sequence length, its source)
HF_PRESETS = {
    "llama3.1-8b": ("llama-3.1-8b.json", 8192, "2407.21783 sec. 3.4.1: pre-training on 8K-token sequences"),
    "llama3.1-70b": ("llama-3.1-70b.json", 8192, "2407.21783 sec. 3.4.1"),
    "llama3.1-405b": ("llama-3.1-405b.json", 8192, "2407.21783 sec. 3.4.1"),
    "qwen2.5-7b": ("qwen2.5-7b.json", 4096, "Qwen2.5 Technical Report, arXiv 2412.15115 sec. 3.3: 4,096 tokens "
                                            "in the initial pre-training phase"),
    "qwen2.5-72b": ("qwen2.5-72b.json", 4096, "2412.15115 sec. 3.3"),
    "mixtral-8x7b": ("mixtral-8x7b.json", 32768, "Mixtral of Experts, arXiv 2401.04088 sec. 2: trained with a "
                                                 "context size of 32k tokens"),
}


def preset_names() -> list[str]:
    from distlab.sim.models.moe import PRESETS as MOE_PRESETS
    return list(GPT_PRESETS) + list(HF_PRESETS) + list(MOE_PRESETS)


def moe_presets() -> list[str]:
    """The presets that have experts (DeepSeek-V3 from sim/models/moe.py, Mixtral from its config.json)."""
    return [n for n in preset_names() if preset_spec(n).get("kind") == "moe"]


def preset_spec(name: str) -> dict:
    """The model spec of preset ``name`` (with ``kind``); a KeyError for an unknown name."""
    if name in GPT_PRESETS:
        return {"kind": "gpt", **GPT_PRESETS[name]}
    if name in HF_PRESETS:
        from distlab.sim.models.hf import spec_from_file
        file, seq_len, _ = HF_PRESETS[name]
        return {**spec_from_file(os.path.join(CONFIGS, file)), "seq_len": seq_len}
    from distlab.sim.models.moe import PRESETS as MOE_PRESETS
    return {"kind": "moe", **MOE_PRESETS[name]}
