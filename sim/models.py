"""Model descriptions: an ordered list of parameters grouped into layers, with FLOPs and activation bytes.

A ``Model`` is what a parallelism strategy needs to know about a network: its parameters in registration
order (``nn.Module.parameters()`` order: DDP buckets and FSDP units are built from it), and per layer the
forward FLOPs, backward FLOPs (default 2x forward: one matmul for the input gradient, one for the weight
gradient; Megatron-LM, Narayanan et al. 2021, arXiv 2104.04473, sec. 5.1) and activation bytes.

Transformer FLOPs per layer (2104.04473 eq. 3 with a general MLP): forward = 2·b·s·P_matrix + 4·b·s²·h, where
P_matrix is the layer's matrix parameters (QKV, output, MLP), and the 4·b·s²·h term is QK^T and attention x V.
The LM head adds 2·b·s·h·V. Summed, training ≈ 6·N·tokens + attention (Kaplan et al. 2020, 2001.08361).
Activation bytes per layer (Korthikanti et al. 2022, arXiv 2205.05198, eq. 1, 16-bit, no recomputation):
s·b·h·(34 + 5·a·s/h).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from distlab.sim.errors import ConfigError
from distlab.sim.plan import DTYPE_BYTES


@dataclass(frozen=True)
class Param:
    """One parameter tensor, e.g. ``Param("h.0.attn.qkv.weight", (2304, 768))`` (torch layout: out, in)."""
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass
class Layer:
    """A unit of compute owning some parameters; its gradients are ready when its backward ends."""
    name: str
    params: list[Param] = field(default_factory=list)
    fwd_flops: float = 0.0
    bwd_flops: float | None = None        # None = 2 x fwd_flops
    activation_bytes: float = 0.0         # saved for backward (and read/written once per pass)
    ready: tuple[int, ...] | None = None  # params (local indices) in gradient-ready order; None = reversed

    def __post_init__(self):
        if self.bwd_flops is None:
            self.bwd_flops = 2.0 * self.fwd_flops

    @property
    def param_bytes(self) -> int:
        return sum(p.bytes for p in self.params)


@dataclass
class Model:
    """Layers in forward order; ``params`` in registration order (layer by layer)."""
    name: str
    layers: list[Layer]
    config: dict = field(default_factory=dict)    # the builder's arguments, for reports and the runtime
    ready: list[int] | None = None                # measured gradient-ready order (global indices), if known

    @property
    def params(self) -> list[Param]:
        return [p for layer in self.layers for p in layer.params]

    @property
    def num_params(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def param_bytes(self) -> int:
        return sum(p.bytes for p in self.params)

    @property
    def fwd_flops(self) -> float:
        return sum(layer.fwd_flops for layer in self.layers)

    @property
    def bwd_flops(self) -> float:
        return sum(layer.bwd_flops for layer in self.layers)

    def param_layer(self) -> list[int]:
        """For each parameter (registration order), the index of its layer."""
        return [i for i, layer in enumerate(self.layers) for _ in layer.params]

    def ready_order(self) -> list[int]:
        """Parameter indices in the order their gradients become ready: layers last to first, and in a
        layer ``Layer.ready`` (autograd's order) or reversed registration order."""
        if self.ready is not None:
            return list(self.ready)
        order, start = [], len(self.params)
        for layer in reversed(self.layers):
            start -= len(layer.params)
            local = layer.ready if layer.ready is not None else range(len(layer.params) - 1, -1, -1)
            order += [start + i for i in local]
        return order

    def summary(self) -> str:
        """One line; a GPT counts its transformer blocks as blocks (GPT-2 small: 12, plus embedding and head)."""
        if (self.config or {}).get("kind") == "gpt":
            blocks = self.config["layers"]
            shape = f"{blocks} blocks + embedding, head"
        else:
            shape = f"{len(self.layers)} layers"
        return (f"{self.name}: {self.num_params / 1e6:.1f}M params, {self.param_bytes / 2**20:.1f} MiB, "
                f"{shape}, {self.fwd_flops / 1e9:.3g} GFLOP forward")


# Gradient-ready order inside a block, seen with torch 2.13 autograd (register_post_accumulate_grad_hook):
# backward runs the block in reverse; a Linear's bias is ready before its weight, a norm's weight before
# its bias; q, k, v (and gate, up) come back in reverse order of use.
GPT2_READY = (11, 10, 9, 8, 6, 7, 5, 4, 3, 2, 0, 1)   # proj.b proj.w fc.b fc.w n2.w n2.b o.b o.w qkv.b qkv.w n1.w n1.b
LLAMA_READY = (6, 5, 4, 8, 3, 2, 1, 0, 7)             # down up gate norm2 o v k q norm1


# --- builders ----------------------------------------------------------------------------------------------
# What each arch means when a choice is left out (None): GPT-2 (Radford et al. 2019) and LLaMA (Touvron et al.
# 2023, arXiv 2302.13971; Llama 2 2307.09288; Llama 3 2407.21783).
ARCH_DEFAULTS = {
    "gpt2": dict(qkv="fused", mlp="gelu", norm="layernorm", norm_bias=True, bias=True, tied=True, positions="learned"),
    "llama": dict(qkv="separate", mlp="swiglu", norm="rmsnorm", norm_bias=False, bias=False, tied=False,
                  positions="rope"),
}
CHOICES = {"qkv": ("fused", "separate"), "mlp": ("gelu", "relu", "swiglu"), "norm": ("layernorm", "rmsnorm"),
           "positions": ("learned", "rope")}


def gpt(layers: int, hidden: int, heads: int, seq_len: int, vocab: int, micro_batch: int = 1,
        dtype: str = "bfloat16", ffn_hidden: int | None = None, kv_heads: int | None = None,
        arch: str = "gpt2", max_positions: int | None = None, name: str = "gpt", qkv: str | None = None,
        mlp: str | None = None, norm: str | None = None, norm_bias: bool | None = None, bias: bool | None = None,
        tied: bool | None = None, positions: str | None = None) -> Model:
    """A decoder-only transformer. ``arch`` sets the defaults of every structural choice (ARCH_DEFAULTS):
    ``gpt2``: learned positions, LayerNorm with bias, biased linears, fused QKV, GELU MLP (4h), tied embeddings;
    ``llama``: RoPE, RMSNorm, no biases, separate q/k/v with ``kv_heads`` (grouped-query attention), SwiGLU MLP
    (gate, up, down of ``ffn_hidden``), untied head. Each choice can be overridden: ``qkv`` (fused|separate),
    ``mlp`` (gelu|relu: 2 matrices fc, proj; swiglu: 3), ``norm`` (layernorm|rmsnorm), ``norm_bias``, ``bias``
    (linear biases), ``tied`` (head shares the embedding), ``positions`` (learned|rope). Parameters are
    registered in the arch's module order (gpt2: norm1, attn, norm2, mlp; llama: attn, mlp, norm1, norm2)."""
    if arch not in ARCH_DEFAULTS:
        raise ConfigError(f"unknown arch {arch!r}; allowed: {', '.join(ARCH_DEFAULTS)}", "model.arch")
    for key, v in (("layers", layers), ("hidden", hidden), ("heads", heads), ("seq_len", seq_len),
                   ("vocab", vocab), ("micro_batch", micro_batch)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"{v!r} must be a whole number > 0", f"model.{key}")
    for key, v in (("ffn_hidden", ffn_hidden), ("kv_heads", kv_heads)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            raise ConfigError(f"{v!r} must be a whole number > 0", f"model.{key}")
    if layers > MAX_LAYERS:
        raise ConfigError(f"{layers} layers is more than the simulator takes (at most {MAX_LAYERS})", "model.layers")
    if hidden % heads:
        raise ConfigError(f"hidden {hidden} is not a multiple of heads {heads}", "model.heads")
    if kv_heads is not None and heads % kv_heads:
        raise ConfigError(f"heads {heads} is not a multiple of kv_heads {kv_heads}; allowed: divisors of {heads}",
                          "model.kv_heads")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPE_BYTES)}", "model.dtype")
    given = dict(qkv=qkv, mlp=mlp, norm=norm, norm_bias=norm_bias, bias=bias, tied=tied, positions=positions)
    for key, v in given.items():
        if v is None:
            continue
        if key in CHOICES and v not in CHOICES[key]:
            raise ConfigError(f"unknown {key} {v!r}; allowed: {', '.join(CHOICES[key])}", f"model.{key}")
        if key not in CHOICES and not isinstance(v, bool):
            raise ConfigError(f"{v!r} must be true or false", f"model.{key}")
    c = {k: (ARCH_DEFAULTS[arch][k] if v is None else v) for k, v in given.items()}
    ffn = ffn_hidden or 4 * hidden
    kv = (kv_heads or heads) * (hidden // heads)
    b, s, h, V = micro_batch, seq_len, hidden, vocab
    tokens = b * s
    act_elem = DTYPE_BYTES[dtype]

    def P(n, *shape):
        return Param(n, tuple(shape), dtype)

    def linear(n, out_f, in_f):
        return [P(n + ".weight", out_f, in_f)] + ([P(n + ".bias", out_f)] if c["bias"] else [])

    def norm_params(n):
        return [P(n + ".weight", h)] + ([P(n + ".bias", h)] if c["norm_bias"] else [])

    out: list[Layer] = []
    emb = [P("embed.tok.weight", V, h)] + ([P("embed.pos.weight", max_positions or s, h)]
                                            if c["positions"] == "learned" else [])
    out.append(Layer("embed", emb, fwd_flops=0.0, activation_bytes=tokens * h * act_elem))
    default = c == ARCH_DEFAULTS[arch]
    for i in range(layers):
        p = f"h.{i}."
        if c["qkv"] == "fused":
            attn = linear(p + "attn.qkv", h + 2 * kv, h)
        else:
            attn = linear(p + "attn.q", h, h) + linear(p + "attn.k", kv, h) + linear(p + "attn.v", kv, h)
        attn += linear(p + "attn.o", h, h)
        if c["mlp"] == "swiglu":
            mlp_ps = linear(p + "mlp.gate", ffn, h) + linear(p + "mlp.up", ffn, h) + linear(p + "mlp.down", h, ffn)
        else:
            mlp_ps = linear(p + "mlp.fc", ffn, h) + linear(p + "mlp.proj", h, ffn)
        if arch == "llama":
            ps = attn + mlp_ps + norm_params(p + "norm1") + norm_params(p + "norm2")
        else:
            ps = norm_params(p + "norm1") + attn + norm_params(p + "norm2") + mlp_ps
        matrix = sum(q.numel for q in ps if len(q.shape) == 2)
        flops = 2.0 * tokens * matrix + 4.0 * b * s * s * h
        act = s * b * h * (34 + 5 * heads * s / h) * act_elem / 2     # 2205.05198 counts 16-bit bytes
        ready = (LLAMA_READY if arch == "llama" else GPT2_READY) if default else None
        out.append(Layer(f"h.{i}", ps, fwd_flops=flops, activation_bytes=act, ready=ready))
    head = norm_params("norm_f") + ([] if c["tied"] else [P("lm_head.weight", V, h)])
    out.append(Layer("head", head, fwd_flops=2.0 * tokens * h * V, activation_bytes=tokens * V * act_elem,
                     ready=(0, 1) if default and arch == "gpt2" else None))
    config = dict(arch=arch, layers=layers, hidden=hidden, heads=heads, seq_len=seq_len, vocab=vocab,
                  micro_batch=micro_batch, dtype=dtype, ffn_hidden=ffn, kv_heads=kv_heads or heads)
    if max_positions is not None:
        config["max_positions"] = max_positions
    config.update({k: v for k, v in c.items() if v != ARCH_DEFAULTS[arch][k]})   # only what differs
    return Model(name, out, {"kind": "gpt", **config})


def structure(model: Model) -> dict:
    """The structural choices of a gpt Model (arch defaults filled in): qkv, mlp, norm, norm_bias, bias, tied,
    positions."""
    cfg = model.config
    return {k: cfg.get(k, v) for k, v in ARCH_DEFAULTS[cfg["arch"]].items()}


MAX_LAYERS = 4096            # a bound on model size, so a typo cannot exhaust memory


def mlp(*widths: int, batch: int = 32, dtype: str = "float32", bias: bool = True, name: str = "mlp") -> Model:
    """``len(widths) - 1`` Linear layers (``layers.{i}``, torch's Linear: weight (out, in), bias (out)).
    Forward FLOPs 2·batch·in·out; activations batch·out elements."""
    if len(widths) < 2 or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
        raise ConfigError(f"widths {list(widths)[:8]} must be at least two whole numbers > 0", "model.widths")
    if len(widths) > MAX_LAYERS + 1:
        raise ConfigError(f"{len(widths) - 1} layers is more than the simulator takes (at most {MAX_LAYERS})",
                          "model.widths")
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPE_BYTES)}", "model.dtype")
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        ps = [Param(f"layers.{i}.weight", (b, a), dtype)] + ([Param(f"layers.{i}.bias", (b,), dtype)] if bias else [])
        layers.append(Layer(f"layers.{i}", ps, fwd_flops=2.0 * batch * a * b,  # layer 0: no input gradient
                            bwd_flops=(2.0 if i else 1.0) * 2.0 * batch * a * b,
                            activation_bytes=batch * b * DTYPE_BYTES[dtype]))
    return Model(name, layers, {"kind": "mlp", "widths": list(widths), "batch": batch, "dtype": dtype, "bias": bias})


# --- presets -----------------------------------------------------------------------------------------------
PRESETS = {
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
# Model kinds defined elsewhere register (builder(spec, where) -> Model, their preset names) here, so this module
# imports none of them: sim/parallel/ep/model.py adds kind "moe" and the preset deepseek-v3 (imported with the workloads).
KINDS: dict = {}
GPT_KEYS = ("arch", "layers", "hidden", "heads", "seq_len", "vocab", "micro_batch", "dtype", "ffn_hidden",
            "kv_heads", "max_positions") + tuple(ARCH_DEFAULTS["gpt2"])
MLP_KEYS = ("widths", "batch", "dtype", "bias")


def preset(name: str, **overrides) -> Model:
    """A preset by name (``gpt2-small``, ``gpt2-medium``, ``llama-7b``, ``llama-70b``, ``llama3-8b``,
    ``llama3-70b``, ``llama3-405b``) with overrides."""
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; allowed: {', '.join(PRESETS)}", "model")
    return gpt(**{**PRESETS[name], **overrides}, name=name)


def model_from_spec(spec, where: str = "model") -> Model:
    """A preset name, ``{preset: NAME, micro_batch: 4, ...}``, ``{kind: gpt, layers: ..., ...}`` (``kind`` may be
    left out when ``arch`` is given: ``{arch: llama, layers: 2, ...}``) or
    ``{kind: mlp, widths: [1024, 1024, 1024], batch: 32}``."""
    if isinstance(spec, Model):
        return spec
    other = _other_kind(spec)
    if other is not None:
        return other(spec if isinstance(spec, dict) else {"preset": spec}, where)
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise ConfigError(f"unknown model preset {spec!r}; allowed: {', '.join(PRESETS)}, or a mapping", where)
        return preset(spec)
    if not isinstance(spec, dict):
        raise ConfigError(f"must be a preset name ({', '.join(PRESETS)}) or a mapping", where)
    spec = dict(spec)
    if "preset" in spec:
        _check_keys(spec, ("preset", "name") + GPT_KEYS, where)
        name = spec.pop("preset")
        if not isinstance(name, str) or name not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; allowed: {', '.join(PRESETS)}", f"{where}.preset")
        return _call(gpt, {**PRESETS[name], "name": name, **spec}, where)
    kind = spec.pop("kind", "gpt" if "arch" in spec else None)
    if kind == "gpt":
        _check_keys(spec, ("name",) + GPT_KEYS, where)
        return _call(gpt, spec, where)
    if kind == "mlp":
        _check_keys(spec, ("name",) + MLP_KEYS, where)
        widths = spec.pop("widths", None)
        if not isinstance(widths, list):
            raise ConfigError("widths must be a list of layer widths, e.g. [1024, 1024, 1024]", f"{where}.widths")
        return _call(lambda **kw: mlp(*widths, **kw), spec, where)
    raise ConfigError(f"needs 'preset' ({', '.join(PRESETS)}) or 'kind' (gpt, mlp); got kind {kind!r}", where)


def _other_kind(spec):
    """The builder of a registered kind (KINDS) that ``spec`` names by kind or preset, else None."""
    name = spec.get("preset") if isinstance(spec, dict) else spec
    for kind, (builder, presets) in KINDS.items():
        if (isinstance(spec, dict) and spec.get("kind") == kind) or (isinstance(name, str) and name in presets):
            return builder
    return None


def _check_keys(d: dict, allowed: tuple, where: str) -> None:
    for k in d:
        if k not in allowed:
            raise ConfigError(f"unknown key {k!r}; allowed: {', '.join(allowed)}", where)


def _call(fn, kwargs: dict, where: str) -> Model:
    try:
        return fn(**kwargs)
    except TypeError as e:
        raise ConfigError(str(e), where) from None
