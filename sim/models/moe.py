"""Mixture-of-experts transformers: ``{kind: moe, ...}`` model specs and the DeepSeek-V3 preset.

    from distlab.sim.models.moe import from_spec
    m = from_spec({"preset": "deepseek-v3"})
    round(m.num_params / 1e9)                   # 671

A block is attention (``mla``: DeepSeek's multi-head latent attention; ``gqa``: Llama's; ``none``: an MoE
layer alone, what runtime/parallel/ep runs) followed by an FFN: the first ``first_dense`` blocks have a dense SwiGLU FFN
of ``dense_ffn``, the others an MoE: a router (``experts`` x hidden), ``experts`` routed SwiGLU experts of width
``expert_ffn`` stored stacked as torchtitan's GroupedExperts does (w1, w3: (E, f, h); w2: (E, h, f)), of which
each token uses ``top_k``, plus ``shared_experts`` always-on experts (one SwiGLU of width shared x f).
``capacity_factor``: none = dropless (every routed token is computed, torchtitan's default); a number c caps
each expert at ceil(c x tokens x top_k / experts) tokens per source rank (GShard, Lepikhin et al. 2020,
arXiv 2006.16668); over-capacity tokens are dropped.

FLOPs per block, forward, activated parameters only (2 per multiply-add, as 2104.04473):
2·T·(attention matrices + router + top_k·3·h·f + shared·3·h·f) + attention core, T = b·s tokens.
MLA (DeepSeek-V2, arXiv 2405.04434 sec. 2.1; V3, 2412.19437 sec. 2.1.1): q_a (d'_c x h), q_b
(n_h(d_h + d_R) x d'_c), kv_a (d_c + d_R x h), kv_b (n_h·2·d_h x d_c), o (h x n_h·d_h), norms on the two
latents; core 2·b·s²·n_h·(2·d_h + d_R) (QK^T over d_h + d_R, AV over d_h). GQA: as sim/models.gpt.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from distlab.sim.dtypes import DTYPE_BYTES
from distlab.sim.errors import ConfigError
from distlab.sim.models.activations import RECOMPUTE, attach
from distlab.sim.models.core import Layer, Model, Param


@dataclass(frozen=True)
class MoEConfig:
    layers: int
    hidden: int
    experts: int                       # routed experts per MoE block
    top_k: int
    expert_ffn: int
    heads: int = 8
    seq_len: int = 1024
    vocab: int = 32000
    micro_batch: int = 1
    dtype: str = "bfloat16"
    shared_experts: int = 0
    capacity_factor: float | None = None   # None: dropless
    first_dense: int = 0               # leading blocks with a dense FFN
    dense_ffn: int | None = None       # their width (default 4 x hidden)
    attention: str = "gqa"             # mla | gqa | none
    kv_heads: int | None = None        # gqa
    head_dim: int | None = None        # mla: d_h (default hidden / heads)
    q_lora: int = 1536                 # mla: d'_c, query compression
    kv_lora: int = 512                 # mla: d_c, key-value compression
    rope_dim: int = 64                 # mla: d_R, decoupled RoPE dimension
    embed: bool = True                 # embedding and head (false: the blocks alone)
    recompute: str = "none"            # how training keeps activations (sim/models/activations.py)
    offload: bool | int = False

    def check(self, where: str = "model") -> "MoEConfig":
        for f in ("layers", "hidden", "experts", "top_k", "expert_ffn", "heads", "seq_len", "vocab", "micro_batch"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{v!r} must be a whole number > 0", f"{where}.{f}")
        if self.top_k > self.experts:
            raise ConfigError(f"top_k {self.top_k} is more than the {self.experts} experts; allowed: 1..{self.experts}",
                              f"{where}.top_k")
        if self.attention not in ("mla", "gqa", "none"):
            raise ConfigError(f"unknown attention {self.attention!r}; allowed: mla, gqa, none", f"{where}.attention")
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"unknown dtype {self.dtype!r}; allowed: {', '.join(DTYPE_BYTES)}", f"{where}.dtype")
        if not 0 <= self.first_dense <= self.layers:
            raise ConfigError(f"first_dense {self.first_dense} must be in 0..{self.layers}", f"{where}.first_dense")
        if self.capacity_factor is not None and (isinstance(self.capacity_factor, bool) or not isinstance(
                self.capacity_factor, (int, float)) or self.capacity_factor <= 0):
            raise ConfigError(f"{self.capacity_factor!r} must be a number > 0 or none (dropless)",
                              f"{where}.capacity_factor")
        if self.recompute not in RECOMPUTE:
            raise ConfigError(f"unknown recompute {self.recompute!r}; allowed: {', '.join(RECOMPUTE)}",
                              f"{where}.recompute")
        from distlab.sim.models.activations import check_offload
        check_offload(self.offload, self.layers, f"{where}.offload")
        if self.hidden % self.heads:
            raise ConfigError(f"hidden {self.hidden} is not a multiple of heads {self.heads}", f"{where}.heads")
        return self

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def moe_layers(self) -> range:
        return range(self.first_dense, self.layers)


# DeepSeek-V3 (DeepSeek-AI, arXiv 2412.19437, sec. 4.2 "Hyper-parameters"): 61 layers, hidden 7168, 128 heads of
# d_h 128, d_c 512, d'_c 1536, d_R 64; all FFNs but the first three are MoE: 1 shared + 256 routed experts of
# intermediate width 2048, 8 active per token, each token sent to at most 4 nodes; 4K pre-training sequences.
# Dense FFN width 18432 and vocabulary 129280: the released config (HF deepseek-ai/DeepSeek-V3 config.json:
# intermediate_size, vocab_size). Total 671B parameters, 37B activated (the paper's abstract; the multi-token
# prediction module is left out here).
PRESETS = {
    "deepseek-v3": dict(layers=61, hidden=7168, heads=128, head_dim=128, q_lora=1536, kv_lora=512, rope_dim=64,
                        attention="mla", experts=256, top_k=8, expert_ffn=2048, shared_experts=1, first_dense=3,
                        dense_ffn=18432, vocab=129280, seq_len=4096, dtype="bfloat16"),
}


def _attention(c: MoEConfig, p: str, P) -> list[Param]:
    h, nh = c.hidden, c.heads
    if c.attention == "none":
        return []
    if c.attention == "gqa":
        d = h // nh
        kv = (c.kv_heads or nh) * d
        return [P(p + "attn.q.weight", h, h), P(p + "attn.k.weight", kv, h), P(p + "attn.v.weight", kv, h),
                P(p + "attn.o.weight", h, h)]
    d = c.head_dim or h // nh
    return [P(p + "attn.q_a.weight", c.q_lora, h), P(p + "attn.q_a_norm.weight", c.q_lora),
            P(p + "attn.q_b.weight", nh * (d + c.rope_dim), c.q_lora),
            P(p + "attn.kv_a.weight", c.kv_lora + c.rope_dim, h), P(p + "attn.kv_a_norm.weight", c.kv_lora),
            P(p + "attn.kv_b.weight", nh * 2 * d, c.kv_lora), P(p + "attn.o.weight", h, nh * d)]


def attention_core_flops(c: MoEConfig) -> float:
    """QK^T and AV of one block, forward: 4·b·s²·h (gqa), 2·b·s²·n_h·(2·d_h + d_R) (mla), 0 (none)."""
    b, s = c.micro_batch, c.seq_len
    if c.attention == "none":
        return 0.0
    if c.attention == "gqa":
        return 4.0 * b * s * s * c.hidden
    d = c.head_dim or c.hidden // c.heads
    return 2.0 * b * s * s * c.heads * (2 * d + c.rope_dim)


def block_parts(c: MoEConfig, i: int) -> dict:
    """Forward FLOPs of block i's parts: attention (matrices + core), router, dense FFN or routed + shared."""
    T, h, f = c.tokens, c.hidden, c.expert_ffn
    attn_params = sum(q.numel for q in _attention(c, "", lambda n, *s: Param(n, s)) if len(q.shape) == 2)
    out = {"attention": 2.0 * T * attn_params + attention_core_flops(c)}
    if i < c.first_dense:
        out["dense_ffn"] = 2.0 * T * 3 * h * (c.dense_ffn or 4 * h)
    else:
        out.update(router=2.0 * T * h * c.experts, routed=2.0 * T * c.top_k * 3 * h * f,
                   shared=2.0 * T * c.shared_experts * 3 * h * f)
    return out


def moe_model(c: MoEConfig, name: str = "moe") -> Model:
    c = c.check()
    T, h, V, E, f = c.tokens, c.hidden, c.vocab, c.experts, c.expert_ffn

    def P(n, *shape):
        return Param(n, tuple(shape), c.dtype)

    out = [Layer("embed", [P("embed.tok.weight", V, h)])] if c.embed else []
    for i in range(c.layers):
        p = f"h.{i}."
        ps = [P(p + "norm1.weight", h)] + _attention(c, p, P) + [P(p + "norm2.weight", h)]
        if i < c.first_dense:
            F = c.dense_ffn or 4 * h
            ps += [P(p + "mlp.w1.weight", F, h), P(p + "mlp.w3.weight", F, h), P(p + "mlp.w2.weight", h, F)]
        else:
            ps += [P(p + "moe.router.weight", E, h), P(p + "moe.experts.w1", E, f, h), P(p + "moe.experts.w3", E, f, h),
                   P(p + "moe.experts.w2", E, h, f)]
            if c.shared_experts:
                S = c.shared_experts * f
                ps += [P(p + "moe.shared.w1.weight", S, h), P(p + "moe.shared.w3.weight", S, h),
                       P(p + "moe.shared.w2.weight", h, S)]
        out.append(Layer(f"h.{i}", ps, fwd_flops=sum(block_parts(c, i).values())))
    if c.embed:
        out.append(Layer("head", [P("norm_f.weight", h), P("lm_head.weight", V, h)], fwd_flops=2.0 * T * h * V))
    config = {k: v for k, v in asdict(c).items() if k not in ("recompute", "offload")}
    config.update({k: v for k, v in (("recompute", c.recompute), ("offload", c.offload)) if v not in ("none", False)})
    return attach(Model(name, out, {"kind": "moe", **config}))


def config_of(model: Model, where: str = "mesh.ep") -> MoEConfig:
    """The MoEConfig of a model built here; any other model is dense: a ConfigError at ``where`` (the key that
    asked for experts; expert parallelism names the MoE presets first, sim/parallel/ep/plan.py)."""
    cfg = model.config or {}
    if cfg.get("kind") != "moe":
        raise ConfigError(f"{model.name} is dense; allowed: a mixture-of-experts model (kind: moe)", where)
    return MoEConfig(**{k: v for k, v in cfg.items() if k != "kind"})


def from_spec(spec: dict, where: str = "model") -> Model:
    """``{kind: moe, ...MoEConfig fields}`` or ``{preset: deepseek-v3, ...overrides}``."""
    spec = {k: v for k, v in spec.items() if k != "kind"}
    name = spec.pop("name", None)
    if "preset" in spec:
        preset = spec.pop("preset")
        if preset not in PRESETS:
            raise ConfigError(f"unknown model preset {preset!r}; allowed: {', '.join(PRESETS)}", f"{where}.preset")
        spec, name = {**PRESETS[preset], **spec}, name or preset
    allowed = tuple(f.name for f in fields(MoEConfig))
    for k in spec:
        if k not in allowed:
            raise ConfigError(f"unknown key {k!r}; allowed: kind, preset, name, {', '.join(allowed)}", where)
    try:
        c = MoEConfig(**spec)
    except TypeError as err:
        raise ConfigError(str(err), where) from None
    return moe_model(c.check(where), name or "moe")

