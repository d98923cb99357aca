"""Activation memory: the bytes autograd keeps from a layer's forward until its backward, one function per
model family, the same for every parallelism and for `distlab memory`.

    from distlab.sim.models import preset
    from distlab.sim.models.activations import activations
    a = activations(preset("llama3-8b", micro_batch=1, seq_len=4096))
    a.peak_bytes / 2**30                        # 30.6 GiB: no s x s scores (SDPA), no dropout
    activations(preset("llama3-8b", micro_batch=1, seq_len=4096), recompute="full").peak_bytes / 2**30   # 6.9

The rule: a saved tensor counts once however many ops save it (q, k and v all save the same normed input; a
view keeps its whole base alive), in its own dtype; parameters do not count. What each op saves is torch 2.13's
autograd formula (tools/autograd/derivatives.yaml), as ``torch.autograd.graph.saved_tensors_hooks`` shows it
(tests/test_activations_torch.py checks a small Llama and a small GPT within 5%):

  Linear                   its input                     GELU, SiLU        their input
  LayerNorm                input, mean, rstd (fp32)      ReLU              its output (= the next input)
  RMSNorm                  input, rstd (fp32)            x * y             x and y
  SDPA (flash, efficient,  q, k, v, output, logsumexp    dropout           its mask (1 byte)
    cuDNN; CPU flash)      (fp32): never s x s           add, views, RoPE with constant cos/sin: nothing
  unfused attention        q, k (QKᵀ); softmax output (b·a·s²); with dropout its mask and output; v
  embedding                the token ids (int64)         cross-entropy     log-softmax of the fp32 logits
                                                                           (torchtitan: pred.float()), targets

(RMSNorm: CUDA's ``_fused_rms_norm`` saves input and rstd; on CPU torch 2.13 decomposes it and also keeps
x·rstd, one more b·s·h per norm: the test counts that difference explicitly.) Korthikanti et al. 2022 (arXiv
2205.05198, sec. 4.1) count the same way for GPT with dropout and unfused attention: 34·s·b·h + 5·a·s²·b bytes at
16 bits, which ``dense`` reproduces (``dropout`` > 0, ``attention: unfused``, without the small fp32 terms).

Layouts (torch's DTensor tensor parallelism with torchtitan's plan): with tp (+ sequence parallelism) the heads,
the FFN width and their tensors divide by tp; the norms' inputs divide by tp only with sequence parallelism;
the norms' outputs do not: ``PrepareModuleInput`` all-gathers them and the column-parallel linears save the
gathered tensor (Megatron-LM's SP saves the shard and gathers again in backward: Korthikanti's 34/t). With
loss parallelism the log-softmax keeps V/tp columns. Context parallelism divides every per-token term by cp
(ring attention saves the local q, k, v, output and logsumexp).

Options (``recompute``, ``offload``; the model's own unless given), applied to the transformer blocks as
torchtitan's activation checkpointing wraps them (embedding and head keep theirs):
  full        a block keeps only its input (sharded with sequence parallelism: issue 28.5); its backward reruns
              its forward (``recompute_flops``) and holds that forward's tensors meanwhile (``transient_bytes``)
  selective   Korthikanti et al.'s: the attention core (QKᵀ, softmax, dropout) is recomputed, its s x s tensors
              are not kept; with SDPA there are none (FlashAttention recomputes the scores in its backward), so
              selective = none (torchtitan's op-level selective AC is not modelled)
  offload     a block's saved tensors live in host memory (``torch.autograd.graph.save_on_cpu``) and come back
              for its backward (``host_bytes``; the copies' time over PCIe is not simulated)
Peak over one micro-batch: backward visits the layers last to first, so the peak is the largest of (saved
bytes of layers 0..i + the transient bytes of layer i).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

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


@dataclass(frozen=True)
class LayerActivations:
    name: str
    saved: float                                # on the GPU from its forward until its backward
    transient: float = 0.0                      # on top of that while its backward runs
    host: float = 0.0                           # offloaded to host memory
    recompute_flops: float = 0.0
    terms: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Activations:
    """One micro-batch's activations on one rank, layer by layer, in forward order."""
    layers: tuple
    recompute: str = "none"
    offload: bool = False
    tp: int = 1
    sequence_parallel: bool = False
    cp: int = 1
    loss_parallel: bool = False

    @property
    def saved_bytes(self) -> float:
        return sum(x.saved for x in self.layers)

    @property
    def host_bytes(self) -> float:
        return sum(x.host for x in self.layers)

    @property
    def peak_bytes(self) -> float:
        """The most bytes alive at once: max over layers i of saved(0..i) + transient(i)."""
        prefix, best = 0.0, 0.0
        for x in self.layers:
            prefix += x.saved
            best = max(best, prefix + x.transient)
        return best

    def per_block(self) -> float:
        """Saved bytes of the first transformer block (0 without blocks)."""
        return next((x.saved for x in self.layers if BLOCK.match(x.name)), 0.0)

    def as_json(self) -> dict:
        first = next((x for x in self.layers if BLOCK.match(x.name)), None)
        return {"recompute": self.recompute, "offload": self.offload, "tp": self.tp,
                "sequence_parallel": self.sequence_parallel, "cp": self.cp, "loss_parallel": self.loss_parallel,
                "peak_bytes": self.peak_bytes, "saved_bytes": self.saved_bytes, "host_bytes": self.host_bytes,
                "block_terms": [{"term": k, "bytes": v} for k, v in (first.terms if first else {}).items()]}


def activations(model, recompute: str | None = None, offload: bool | None = None, tp: int = 1,
                sequence_parallel: bool = False, cp: int = 1, loss_parallel: bool = False) -> Activations:
    """The activations of one micro-batch of ``model`` on one rank of this layout (module docstring).
    ``recompute``/``offload``: None = the model's own (``model.config``), else this."""
    cfg = model.config or {}
    kind = cfg.get("kind")
    rc = cfg.get("recompute", "none") if recompute is None else recompute
    off = bool(cfg.get("offload", False)) if offload is None else offload
    if rc not in RECOMPUTE:
        raise ConfigError(f"unknown recompute {rc!r}; allowed: {', '.join(RECOMPUTE)}", "recompute")
    if kind not in FAMILIES:
        raise ConfigError(f"no activation model for a {kind!r} model; allowed kinds: {', '.join(FAMILIES)}", "model")
    for key, v in (("tp", tp), ("cp", cp)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{v!r} must be a whole number >= 1", key)
    sp = sequence_parallel and tp > 1
    stashes = FAMILIES[kind](model, tp, sp, cp, loss_parallel and tp > 1, rc)
    out = []
    for st in stashes:
        plain = sum(st.terms.values())
        saved, transient, flops, terms = plain, sum(st.transient.values()), 0.0, dict(st.terms)
        if st.block and rc == "full":
            saved, transient, flops = st.input_bytes, transient + plain, st.flops
            terms = {"block input (kept by activation checkpointing)": st.input_bytes}
        elif st.block and rc == "selective" and st.selective:
            drop = sum(st.terms[k] for k in st.selective)
            saved, transient, flops = plain - drop, transient + drop, st.selective_flops
            terms = {k: v for k, v in st.terms.items() if k not in st.selective}
        host = 0.0
        if off and st.block:
            host, transient, saved = saved, transient + saved, 0.0
        out.append(LayerActivations(st.name, saved, transient, host, flops, terms))
    return Activations(tuple(out), rc, off, tp, sp, cp, loss_parallel and tp > 1)


def attach(model, **layout):
    """``model`` with every layer's ``activation_bytes``, ``transient_bytes`` and ``recompute_flops`` set from
    its family's function (its own recompute/offload, or ``layout``'s keyword arguments); returns the model."""
    acts = activations(model, **layout)
    for layer, a in zip(model.layers, acts.layers):
        layer.activation_bytes, layer.transient_bytes, layer.recompute_flops = a.saved, a.transient, a.recompute_flops
    return model


def local_layers(model, layers: list, **layout) -> list:
    """``layers`` (one rank's copies of ``model.layers``, e.g. TP-local) with the activation bytes of this
    layout: what sim/parallel/tp/compose.py and sim/parallel/cp/plan.py build their plans from. Their
    ``recompute_flops`` stay 0: those builders time the recomputed forward in their own segments."""
    acts = activations(model, **layout)
    return [replace(L, activation_bytes=a.saved, transient_bytes=a.transient, recompute_flops=0.0)
            for L, a in zip(layers, acts.layers)]


# --- families ------------------------------------------------------------------------------------------------
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
        out.update({"attention dropout mask (b·a·s², 1 byte)": square, "attention dropout output (b·a·s²)": square * e})
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
    """A model extracted from an nn.Module (runtime/models.py ``from_factory``): each layer's saved bytes and
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


def effective_recompute(model, option: str, where: str = "recompute") -> str:
    """A parallelism section's own ``recompute`` option together with the model's: whichever is set (not
    "none"); both set to different values is a ConfigError."""
    own = (model.config or {}).get("recompute", "none")
    if option != "none" and own != "none" and option != own:
        raise ConfigError(f"{option!r} differs from the model's recompute {own!r}; set it in one place", where)
    return option if option != "none" else own


def require_structure(model, what: str, kinds: tuple = ("gpt",)) -> None:
    """ConfigError unless ``model`` is of one of ``kinds`` (TP and CP rewrite a transformer's modules by name)."""
    kind = (model.config or {}).get("kind")
    if kind not in kinds:
        source = "comes from an nn.Module" if kind == "extracted" else f"is a {kind} model"
        raise ConfigError(f"{what} needs a transformer described by its structure (a preset, a config.json or "
                          f"{{kind: {kinds[0]}}}); {model.name!r} {source}; allowed for it: ddp, fsdp, pipeline",
                          "model")
