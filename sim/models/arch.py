"""The structural choices of a dense decoder (``sim.models.gpt``) and what each architecture means by default.

    from distlab.sim.models.arch import structure
    structure({"arch": "llama"})["mlp"]      # 'swiglu'

GPT-2 (Radford et al. 2019): learned positions, LayerNorm with bias, biased linears, fused QKV, GELU MLP (4h),
tied embeddings. LLaMA (Touvron et al. 2023, arXiv 2302.13971; Llama 2 2307.09288; Llama 3 2407.21783): RoPE,
RMSNorm, no biases, separate q/k/v with grouped-query attention, SwiGLU MLP, untied head. ``qkv_bias`` (Qwen2's
q/k/v biases), ``attention_bias`` and ``mlp_bias`` (Hugging Face's keys) default to ``bias``. ``attention``:
``sdpa`` = torch's scaled_dot_product_attention (FlashAttention, memory-efficient or cuDNN on GPUs, the flash
kernel on CPU: no s x s matrix is stored), ``unfused`` = the explicit softmax(QKᵀ)V of Megatron-LM 2021.
``dropout``: the probability of GPT-2's dropouts (embedding, attention, residual; 0 = none, as pre-training runs
now: nanoGPT, torchtitan).
"""
from __future__ import annotations

ARCH_DEFAULTS = {
    "gpt2": dict(qkv="fused", mlp="gelu", norm="layernorm", norm_bias=True, bias=True, tied=True, positions="learned"),
    "llama": dict(qkv="separate", mlp="swiglu", norm="rmsnorm", norm_bias=False, bias=False, tied=False,
                  positions="rope"),
}
CHOICES = {"qkv": ("fused", "separate"), "mlp": ("gelu", "relu", "swiglu"), "norm": ("layernorm", "rmsnorm"),
           "positions": ("learned", "rope"), "attention": ("sdpa", "unfused")}
# choices every arch shares (None: follows ``bias``, or ``attention_bias`` for qkv_bias)
COMMON_DEFAULTS = dict(qkv_bias=None, attention_bias=None, mlp_bias=None, attention="sdpa", dropout=0.0)


def structure(model) -> dict:
    """Every structural choice of a gpt Model (or its config), defaults filled in (biases resolved to true/false)."""
    config = getattr(model, "config", model)
    st = {k: config.get(k, v) for k, v in {**ARCH_DEFAULTS[config["arch"]], **COMMON_DEFAULTS}.items()}
    st["attention_bias"] = st["bias"] if st["attention_bias"] is None else st["attention_bias"]
    st["qkv_bias"] = st["attention_bias"] if st["qkv_bias"] is None else st["qkv_bias"]
    st["mlp_bias"] = st["bias"] if st["mlp_bias"] is None else st["mlp_bias"]
    return st
