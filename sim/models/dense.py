"""Dense models: decoder-only transformers (``gpt``: GPT-2 and Llama style, Mistral, Qwen2) and plain MLPs.

    from distlab.sim.models.dense import gpt
    m = gpt(arch="llama", layers=2, hidden=256, heads=4, kv_heads=2, seq_len=128, vocab=1000)
    [layer.name for layer in m.layers]          # ['embed', 'h.0', 'h.1', 'head']

Transformer FLOPs per layer (Narayanan et al. 2021, arXiv 2104.04473, eq. 3 with a general MLP): forward =
2·b·s·P_matrix + 4·b·s·w·q, where P_matrix is the block's matrix parameters (QKV, output, MLP), q = heads x
head_dim, w = s (or the sliding window when shorter: each query sees w keys), and the last term is QKᵀ and
attention x V. The LM head adds 2·b·s·h·V. Summed, training ≈ 6·N·tokens + attention (Kaplan et al. 2020,
arXiv 2001.08361). Activation bytes per layer: sim/models/activations.py (the dense family's terms).
"""
from __future__ import annotations

from distlab.sim.dtypes import DTYPE_BYTES, TRAINING_DTYPES
from distlab.sim.errors import ConfigError
from distlab.sim.models.activations import RECOMPUTE, attach, check_offload
from distlab.sim.models.arch import ARCH_DEFAULTS, CHOICES, COMMON_DEFAULTS, structure
from distlab.sim.models.core import MAX_LAYERS, Layer, Model, Param

# Gradient-ready order inside a block, seen with torch 2.13 autograd (register_post_accumulate_grad_hook):
# backward runs the block in reverse; a Linear's bias is ready before its weight, a norm's weight before
# its bias; q, k, v (and gate, up) come back in reverse order of use.
GPT2_READY = (11, 10, 9, 8, 6, 7, 5, 4, 3, 2, 0, 1)   # proj.b proj.w fc.b fc.w n2.w n2.b o.b o.w qkv.b qkv.w n1.w n1.b
LLAMA_READY = (6, 5, 4, 8, 3, 2, 1, 0, 7)             # down up gate norm2 o v k q norm1
BOOL_CHOICES = ("norm_bias", "bias", "tied", "qkv_bias", "attention_bias", "mlp_bias")


def gpt(layers: int, hidden: int, heads: int, seq_len: int, vocab: int, micro_batch: int = 1,
        dtype: str = "bfloat16", ffn_hidden: int | None = None, kv_heads: int | None = None,
        arch: str = "gpt2", max_positions: int | None = None, name: str = "gpt", qkv: str | None = None,
        mlp: str | None = None, norm: str | None = None, norm_bias: bool | None = None, bias: bool | None = None,
        tied: bool | None = None, positions: str | None = None, head_dim: int | None = None,
        window: int | None = None, qkv_bias: bool | None = None, attention_bias: bool | None = None,
        mlp_bias: bool | None = None, attention: str | None = None, dropout: float | None = None,
        recompute: str = "none", offload: bool | int = False) -> Model:
    """A decoder-only transformer. ``arch`` sets the defaults of every structural choice (sim/models/arch.py):
    ``gpt2``: learned positions, LayerNorm with bias, biased linears, fused QKV, GELU MLP (4h), tied embeddings;
    ``llama``: RoPE, RMSNorm, no biases, separate q/k/v with ``kv_heads`` (grouped-query attention), SwiGLU MLP
    (gate, up, down of ``ffn_hidden``), untied head. Each choice can be overridden: ``qkv`` (fused|separate),
    ``mlp`` (gelu|relu: 2 matrices fc, proj; swiglu: 3), ``norm`` (layernorm|rmsnorm), ``norm_bias``, ``bias``
    (linear biases; ``qkv_bias``, ``attention_bias``, ``mlp_bias`` for parts), ``tied`` (head shares the
    embedding), ``positions`` (learned|rope), ``head_dim`` (default hidden / heads), ``window`` (sliding-window
    attention, Mistral), ``attention`` (sdpa|unfused), ``dropout``. ``recompute`` (none|selective|full) and
    ``offload`` say how training keeps the activations (sim/models/activations.py). Parameters are registered
    in the arch's module order (gpt2: norm1, attn, norm2, mlp; llama: attn, mlp, norm1, norm2)."""
    if arch not in ARCH_DEFAULTS:
        raise ConfigError(f"unknown arch {arch!r}; allowed: {', '.join(ARCH_DEFAULTS)}", "model.arch")
    for key, v in (("layers", layers), ("hidden", hidden), ("heads", heads), ("seq_len", seq_len),
                   ("vocab", vocab), ("micro_batch", micro_batch)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"{v!r} must be a whole number > 0", f"model.{key}")
    for key, v in (("ffn_hidden", ffn_hidden), ("kv_heads", kv_heads), ("head_dim", head_dim), ("window", window),
                   ("max_positions", max_positions)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            raise ConfigError(f"{v!r} must be a whole number > 0", f"model.{key}")
    if layers > MAX_LAYERS:
        raise ConfigError(f"{layers} layers is more than the simulator takes (at most {MAX_LAYERS})", "model.layers")
    if head_dim is None and hidden % heads:
        raise ConfigError(f"hidden {hidden} is not a multiple of heads {heads} (or give head_dim)", "model.heads")
    if kv_heads is not None and heads % kv_heads:
        raise ConfigError(f"heads {heads} is not a multiple of kv_heads {kv_heads}; allowed: divisors of {heads}",
                          "model.kv_heads")
    if not isinstance(dtype, str) or dtype not in TRAINING_DTYPES:
        raise ConfigError(f"{dtype!r} is not a training dtype; allowed: {', '.join(TRAINING_DTYPES)}", "model.dtype")
    if dropout is not None and (isinstance(dropout, bool) or not isinstance(dropout, (int, float))
                                or not 0 <= dropout < 1):
        raise ConfigError(f"{dropout!r} must be a probability in [0, 1)", "model.dropout")
    if recompute not in RECOMPUTE:
        raise ConfigError(f"unknown recompute {recompute!r}; allowed: {', '.join(RECOMPUTE)}", "model.recompute")
    check_offload(offload, layers, "model.offload")
    given = dict(qkv=qkv, mlp=mlp, norm=norm, norm_bias=norm_bias, bias=bias, tied=tied, positions=positions,
                 qkv_bias=qkv_bias, attention_bias=attention_bias, mlp_bias=mlp_bias, attention=attention,
                 dropout=dropout)
    for key, v in given.items():
        if v is None:
            continue
        if key in CHOICES and v not in CHOICES[key]:
            raise ConfigError(f"unknown {key} {v!r}; allowed: {', '.join(CHOICES[key])}", f"model.{key}")
        if key in BOOL_CHOICES and not isinstance(v, bool):
            raise ConfigError(f"{v!r} must be true or false", f"model.{key}")
    defaults = {**ARCH_DEFAULTS[arch], **COMMON_DEFAULTS}
    c = {k: (defaults[k] if v is None else v) for k, v in given.items()}
    st = structure({"arch": arch, **c})
    ffn = ffn_hidden or 4 * hidden
    d = head_dim or hidden // heads
    qdim, kv = heads * d, (kv_heads or heads) * d
    b, s, h, V = micro_batch, seq_len, hidden, vocab
    tokens = b * s

    def P(n, *shape):
        return Param(n, tuple(shape), dtype)

    def linear(n, out_f, in_f, with_bias):
        return [P(n + ".weight", out_f, in_f)] + ([P(n + ".bias", out_f)] if with_bias else [])

    def norm_params(n):
        return [P(n + ".weight", h)] + ([P(n + ".bias", h)] if st["norm_bias"] else [])

    out: list[Layer] = []
    emb = [P("embed.tok.weight", V, h)] + ([P("embed.pos.weight", max_positions or s, h)]
                                            if st["positions"] == "learned" else [])
    out.append(Layer("embed", emb, fwd_flops=0.0))
    default = all(c[k] == v for k, v in ARCH_DEFAULTS[arch].items()) and not (st["qkv_bias"] != st["bias"]
                                                                               or st["mlp_bias"] != st["bias"]
                                                                               or st["attention_bias"] != st["bias"])
    qb, ob, mb = st["qkv_bias"], st["attention_bias"], st["mlp_bias"]
    core = 4.0 * b * s * min(s, window or s) * qdim
    for i in range(layers):
        p = f"h.{i}."
        if st["qkv"] == "fused":
            attn = linear(p + "attn.qkv", qdim + 2 * kv, h, qb)
        else:
            attn = linear(p + "attn.q", qdim, h, qb) + linear(p + "attn.k", kv, h, qb) + linear(p + "attn.v", kv, h, qb)
        attn += linear(p + "attn.o", h, qdim, ob)
        if st["mlp"] == "swiglu":
            mlp_ps = (linear(p + "mlp.gate", ffn, h, mb) + linear(p + "mlp.up", ffn, h, mb)
                      + linear(p + "mlp.down", h, ffn, mb))
        else:
            mlp_ps = linear(p + "mlp.fc", ffn, h, mb) + linear(p + "mlp.proj", h, ffn, mb)
        if arch == "llama":
            ps = attn + mlp_ps + norm_params(p + "norm1") + norm_params(p + "norm2")
        else:
            ps = norm_params(p + "norm1") + attn + norm_params(p + "norm2") + mlp_ps
        matrix = sum(q.numel for q in ps if len(q.shape) == 2)
        ready = (LLAMA_READY if arch == "llama" else GPT2_READY) if default else None
        out.append(Layer(f"h.{i}", ps, fwd_flops=2.0 * tokens * matrix + core, ready=ready))
    head = norm_params("norm_f") + ([] if st["tied"] else [P("lm_head.weight", V, h)])
    out.append(Layer("head", head, fwd_flops=2.0 * tokens * h * V,
                     ready=(0, 1) if default and arch == "gpt2" else None))
    config = dict(arch=arch, layers=layers, hidden=hidden, heads=heads, seq_len=seq_len, vocab=vocab,
                  micro_batch=micro_batch, dtype=dtype, ffn_hidden=ffn, kv_heads=kv_heads or heads)
    for key, v in (("max_positions", max_positions), ("head_dim", head_dim), ("window", window)):
        if v is not None:
            config[key] = v
    config.update({k: v for k, v in c.items() if v != defaults[k]})   # only what differs
    if recompute != "none":
        config["recompute"] = recompute
    if offload:
        config["offload"] = offload
    return attach(Model(name, out, {"kind": "gpt", **config}))


def mlp(*widths: int, batch: int = 32, dtype: str = "float32", bias: bool = True, name: str = "mlp") -> Model:
    """``len(widths) - 1`` Linear layers (``layers.{i}``, torch's Linear: weight (out, in), bias (out)), ReLU
    between. Forward FLOPs 2·batch·in·out; activations batch·out elements (ReLU keeps its output, which the next
    Linear keeps as its input: the same tensor)."""
    if len(widths) < 2 or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
        raise ConfigError(f"widths {list(widths)[:8]} must be at least two whole numbers > 0", "model.widths")
    if len(widths) > MAX_LAYERS + 1:
        raise ConfigError(f"{len(widths) - 1} layers is more than the simulator takes (at most {MAX_LAYERS})",
                          "model.widths")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ConfigError(f"{batch!r} must be a whole number >= 1", "model.batch")
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPE_BYTES)}", "model.dtype")
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        ps = [Param(f"layers.{i}.weight", (b, a), dtype)] + ([Param(f"layers.{i}.bias", (b,), dtype)] if bias else [])
        layers.append(Layer(f"layers.{i}", ps, fwd_flops=2.0 * batch * a * b,  # layer 0: no input gradient
                            bwd_flops=(2.0 if i else 1.0) * 2.0 * batch * a * b,
                            activation_bytes=batch * b * DTYPE_BYTES[dtype]))
    return Model(name, layers, {"kind": "mlp", "widths": list(widths), "batch": batch, "dtype": dtype, "bias": bias})
