"""The terms of each model family's activations: what one layer keeps for backward at a tp/sp/cp layout, before
recomputation and offloading (sim/models/activations.py applies those and states the rule and its sources).

    from distlab.sim.models import preset
    from distlab.sim.models.families import dense
    stash = dense(preset("llama3-8b", layers=2), 1, False, 1, False, "none")
    sorted(stash[1].terms)[:3]          # ['SiLU output', "SiLU(gate)·up (down's input)", 'attention logsumexp (fp32)']

A family is a function (model, tp, sequence_parallel, cp, loss_parallel, recompute) -> one ``Stash`` per layer
in forward order; FAMILIES maps a model's ``config["kind"]`` to it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from distlab.sim.dtypes import DTYPE_BYTES
from distlab.sim.errors import ConfigError
from distlab.sim.models.arch import structure

RECOMPUTE = ("none", "selective", "full")
INDEX = 8          # int64: token ids, targets, routing indices
FP32 = 4           # norm statistics, logsumexp, router scores, the loss's log-probabilities
BLOCK = re.compile(r"^(.*\.)?\d+$")          # h.0, layers.3: a transformer block (checkpointed, offloaded)


@dataclass(frozen=True)
class Stash:
    """What one layer keeps at this layout without recomputation: named terms in bytes."""
    name: str
    terms: dict
    block: bool = False
    input_bytes: float = 0.0                    # the block's input: all full recomputation keeps
    flops: float = 0.0                          # its forward FLOPs on this rank (rerun by full recomputation)
    selective: tuple = ()                       # terms selective recomputation drops
    selective_flops: float = 0.0                # and the FLOPs it reruns for them
    transient: dict = field(default_factory=dict)   # held while its backward runs regardless (the logits)


def _norm(prefix: str, T: float, h: int, e: int, ns: int, stats: int) -> dict:
    return {f"{prefix} input": T * h * e / ns, f"{prefix} statistics (fp32)": T * stats * FP32 / ns,
            f"{prefix} output (the next linears' input)": T * h * e}


def _sdpa(T: float, heads: int, q: int, kv: int, e: int, t: int) -> dict:
    return {"q": T * q * e / t, "k, v": 2 * T * kv * e / t, "attention output (o's input)": T * q * e / t,
            "attention logsumexp (fp32)": T * heads / t * FP32}


def _unfused(b: int, s: int, heads: int, q: int, kv: int, e: int, t: int, dropout: float) -> dict:
    T, square = b * s, b * heads / t * s * s
    out = {"q": T * q * e / t, "k, v": 2 * T * kv * e / t, "softmax output (b·a·s²)": square * e}
    if dropout:
        out["attention dropout mask (b·a·s², 1 byte)"] = square
        out["attention dropout output (b·a·s²)"] = square * e
    out["attention output (o's input)"] = T * q * e / t
    return out


def _swiglu(R: float, f: int, e: int, t: int, what: str = "") -> dict:
    return {f"{what}gate and up outputs": 2 * R * f * e / t, f"{what}SiLU output": R * f * e / t,
            f"{what}SiLU(gate)·up (down's input)": R * f * e / t}


def _head(T: float, h: int, V: int, e: int, t: int, ns: int, stats: int, lp: bool) -> tuple[dict, dict]:
    v = V / t if lp else V
    terms = {**_norm("final norm", T, h, e, ns, stats), "log-softmax of the fp32 logits": T * v * FP32,
             "targets (int64)": T * INDEX}
    return terms, {"logits and their fp32 copy (or their gradients)": T * v * (e + (FP32 if e != FP32 else 0))}


def dense(model, t: int, sp: bool, cp: int, lp: bool, recompute: str) -> list[Stash]:
    """GPT-2 and Llama style blocks (module docstring), each structural choice with its own terms."""
    c, st = model.config, structure(model)
    b, S, h, V, e = c["micro_batch"], c["seq_len"], c["hidden"], c["vocab"], DTYPE_BYTES[c["dtype"]]
    heads, f = c["heads"], c["ffn_hidden"]
    d = c.get("head_dim") or h // heads
    q, kv = heads * d, c["kv_heads"] * d
    if S % cp:
        raise ConfigError(f"seq_len {S} does not split into cp = {cp} shards", "model.seq_len")
    if st["attention"] == "unfused" and cp > 1:
        raise ConfigError("context parallelism runs ring attention (SDPA); unfused attention has no such "
                          "kernel; allowed: attention sdpa with cp > 1", "model.attention")
    s = S // cp
    T, ns, p = b * s, (t if sp else 1), st["dropout"]
    stats = 2 if st["norm"] == "layernorm" else 1
    core = 4.0 * b * S * min(S, c.get("window") or S) * q / (t * cp)
    embed = {"token ids (int64)": T * INDEX}
    if st["positions"] == "learned":
        embed["position ids (int64)"] = s * INDEX
    if p:
        embed["embedding dropout mask (1 byte)"] = T * h / ns
    out = [Stash("embed", embed)]
    attn = _unfused(b, s, heads, q, kv, e, t, p) if st["attention"] == "unfused" else _sdpa(T, heads, q, kv, e, t)
    mlp = (_swiglu(T, f, e, t) if st["mlp"] == "swiglu" else
           {"fc output (GELU's input)": T * f * e / t, "GELU output (proj's input)": T * f * e / t}
           if st["mlp"] == "gelu" else {"ReLU output (proj's input)": T * f * e / t})
    terms = {**_norm("norm1", T, h, e, ns, stats), **attn}
    if p:
        terms["attention residual dropout mask (1 byte)"] = T * h / ns
    terms.update({**_norm("norm2", T, h, e, ns, stats), **mlp})
    if p:
        terms["MLP residual dropout mask (1 byte)"] = T * h / ns
    square = tuple(k for k in attn if "b·a·s²" in k)
    for layer in model.layers[1:-1]:
        out.append(Stash(layer.name, terms, True, T * h * e / ns, layer.fwd_flops / (t * cp), square,
                         core if square else 0.0))
    head, transient = _head(T, h, V, e, t, ns, stats, lp)
    out.append(Stash("head", head, transient=transient))
    return out


def moe(model, t: int, sp: bool, cp: int, lp: bool, recompute: str) -> list[Stash]:
    """Mixture-of-experts blocks (sim/models/moe.py) as torchtitan's MoE runs them (torchtitan/models/common/
    moe.py): RMSNorms; GQA attention as ``dense``, or MLA (DeepSeek-V2/V3): the q and kv latents, their norms,
    q and k with the RoPE part, kv_b's output (v is a view of it, so all of it stays), output, logsumexp; then the
    FFN: dense SwiGLU in the first blocks, else the router (its fp32 input under autocast, fp32 scores, top-k
    ids), the R = T x top_k routed copies of the tokens (the grouped GEMMs' input), the experts' SwiGLU on them,
    their outputs and the top-k scores (scaled together), and the shared experts' SwiGLU on every token."""
    c = model.config
    b, S, h, V, e = c["micro_batch"], c["seq_len"], c["hidden"], c["vocab"], DTYPE_BYTES[c["dtype"]]
    if S % cp:
        raise ConfigError(f"seq_len {S} does not split into cp = {cp} shards", "model.seq_len")
    s = S // cp
    T, ns, heads = b * s, (t if sp else 1), c["heads"]
    out = [Stash("embed", {"token ids (int64)": T * INDEX})] if c.get("embed", True) else []
    if c["attention"] == "gqa":
        d = h // heads
        attn = _sdpa(T, heads, heads * d, (c.get("kv_heads") or heads) * d, e, t)
    elif c["attention"] == "mla":
        d, dr, ql, kl = c.get("head_dim") or h // heads, c["rope_dim"], c["q_lora"], c["kv_lora"]
        n = heads / t
        attn = {"q latent (q_a's output)": T * ql * e, "q latent statistics (fp32)": T * FP32,
                "q latent normed (q_b's input)": T * ql * e, "kv latent and k RoPE part (kv_a's output)":
                T * (kl + dr) * e, "kv latent statistics (fp32)": T * FP32, "kv latent normed (kv_b's input)":
                T * kl * e, "q (nope + rope)": T * n * (d + dr) * e, "k (nope + rope)": T * n * (d + dr) * e,
                "kv_b output (v is a view of it)": T * n * 2 * d * e, "attention output (o's input)": T * n * d * e,
                "attention logsumexp (fp32)": T * n * FP32}
    else:
        attn = {}
    R = T * c["top_k"]
    if c.get("capacity_factor"):
        R = min(R, c["experts"] * math.ceil(c["capacity_factor"] * R / c["experts"]))
    routed = {"router input (fp32, autocast)": T * h * FP32, "router scores (fp32)": T * c["experts"] * FP32,
              "top-k expert ids (int64)": T * c["top_k"] * INDEX, "routed tokens (grouped GEMMs' input)": R * h * e,
              **_swiglu(R, c["expert_ffn"], e, 1, "experts' "), "experts' outputs (scaled by the scores)": R * h * e,
              "top-k scores (fp32)": T * c["top_k"] * FP32}
    if c.get("shared_experts"):
        routed.update(_swiglu(T, c["shared_experts"] * c["expert_ffn"], e, t, "shared experts' "))
    for i in range(c["layers"]):
        ffn = _swiglu(T, c.get("dense_ffn") or 4 * h, e, t) if i < c["first_dense"] else routed
        terms = {**_norm("norm1", T, h, e, ns, 1), **attn, **_norm("norm2", T, h, e, ns, 1), **ffn}
        layer = model.layers[i + (1 if c.get("embed", True) else 0)]
        out.append(Stash(layer.name, terms, True, T * h * e / ns, layer.fwd_flops / (t * cp)))
    if c.get("embed", True):
        head, transient = _head(T, h, V, e, t, ns, 1, lp)
        out.append(Stash("head", head, transient=transient))
    return out


def measured(model, t: int, sp: bool, cp: int, lp: bool, recompute: str) -> list[Stash]:
    """A model extracted from an nn.Module (runtime/modules/bridge.py ``from_factory``): each layer's saved bytes and
    input bytes as one traced step on the meta device measured them; blocks are its layers named like
    ``layers.3``. No TP, CP or selective recomputation (they need the module's structure)."""
    c = model.config
    if t > 1 or cp > 1:
        raise ConfigError(f"model {model.name!r} comes from an nn.Module: tensor and context parallelism need a "
                          "plan for its modules; allowed: ddp, fsdp, pipeline (tp 1, cp 1)", "model")
    if recompute == "selective":
        raise ConfigError(f"model {model.name!r} comes from an nn.Module: selective recomputation needs its "
                          "attention's structure; allowed: none, full", "recompute")
    return [Stash(L.name, {"saved tensors (measured)": saved}, bool(BLOCK.match(L.name)), inp, L.fwd_flops)
            for L, saved, inp in zip(model.layers, c["saved_bytes"], c["input_bytes"])]


def plain(model, t: int, sp: bool, cp: int, lp: bool, recompute: str) -> list[Stash]:
    """An MLP (sim/models/dense.py ``mlp``): each layer keeps its ReLU output (batch x out); nothing to
    recompute or shard."""
    if t > 1 or cp > 1 or recompute != "none":
        raise ConfigError(f"model {model.name!r} is an MLP: no tensor or context parallelism and no "
                          "recomputation; allowed: tp 1, cp 1, recompute none", "model")
    return [Stash(L.name, {"output": L.activation_bytes}, True) for L in model.layers]


FAMILIES = {"gpt": dense, "moe": moe, "extracted": measured, "mlp": plain}
