"""The kernels of a mixture-of-experts model's layers, for every builder that runs one (expert parallelism,
sim/parallel/ep/plan.py; FSDP2, DDP and the pipeline through sim/parallel/layers.py ``kernel_layers``).

    ops = block_kernels(config_of(model), 4, "F", received=8192, local_experts=32)   # one MoE block forward

Per block (T = b·s tokens of the rank, e the dtype's bytes, torchtitan's MoE: torchtitan/models/moe/moe.py):
- norm1, norm2: memory-bound, read and write the residual stream (2·T·h·e bytes each);
- attention: one GEMM (T, out, in) per weight matrix of sim/models/moe.py ``_attention`` (GQA: q, k, v, o; MLA:
  q_a, q_b, kv_a, kv_b, o) and one FlashAttention call (b, heads, s, d) with d chosen so that its FLOPs are the
  model's core FLOPs (GQA: the head dim; MLA: (2·d_h + d_R) / 2, QKᵀ over d_h + d_R and AV over d_h);
- router: the GEMM (T, E, h) (softmax and top-k on its T x E scores: memory-bound, 2·T·E·4 bytes);
- permutation: the routed copies gathered into expert order before the experts and scattered back after
  (torchtitan's ``_permute`` / ``_unpermute``): T·k·h·e read and written each way;
- routed experts: the grouped GEMM (torch._grouped_mm) as one GEMM per local expert over its share of the
  copies the rank computes (m = ceil(R / local experts) rows): (m, f, h) for w1 and w3, (m, h, f) for w2, one
  launch per projection; each GEMM pays its own weights' HBM reads and its own wave quantization;
- shared experts and dense FFN blocks: SwiGLU GEMMs (T, F, h) x 2 and (T, h, F).
Backward: each GEMM's input-gradient (M, K, N) and weight-gradient (K, N, M) GEMMs, the attention call's backward
(2.5 x); activation recompute (the model's ``recompute``) adds the forward GEMMs and attention (full) or the
attention call (selective). Split backward (zero-bubble I and W actions): I the input gradients and attention, W
the weight gradients. Embedding: memory-bound; head: norm, the (T, V, h) GEMM, the loss over T x V logits.
"""
from __future__ import annotations

import math

from distlab.sim.dtypes import DTYPE_BYTES
from distlab.sim.models.moe import Param, _attention, attention_core_flops
from distlab.sim.plan import Compute
from distlab.sim.parallel.tp.plan import backward_gemms

PHASES = {"F": "fwd", "B": "bwd", "I": "bwd-input", "W": "bwd-weight"}


def _flops(gemms) -> float:
    return sum(2.0 * M * N * K for M, N, K in gemms)


def _attention_call(c) -> tuple | None:
    """(b, heads, s, d) of the block's FlashAttention call (module docstring), or None without attention."""
    core = attention_core_flops(c)
    if not core:
        return None
    d = max(1, round(core / (4.0 * c.micro_batch * c.heads * c.seq_len ** 2)))
    return (c.micro_batch, c.heads, c.seq_len, d)


def _ffn(T: int, width: int, h: int) -> tuple:
    return ((T, width, h), (T, width, h), (T, h, width))


class Kernels:
    """Builds Computes of one kind (F, B, I, W) under a recompute policy."""

    def __init__(self, c, kind: str, recompute: str = "none"):
        self.c, self.kind, self.recompute = c, kind, recompute
        self.e = DTYPE_BYTES[c.dtype]

    def gemm_op(self, name: str, gemms: tuple, attention=None, launches=None, redo: bool = False) -> Compute:
        """The op of forward GEMMs ``gemms`` (and an attention call) in this kind; ``redo``: recomputed before
        the backward (full recompute)."""
        kind, c = self.kind, self.c
        core = attention_core_flops(c) if attention else 0.0
        pass_ = "forward"
        if kind == "F":
            out, flops = gemms, _flops(gemms) + core
        else:
            back = backward_gemms(gemms)
            if kind == "I":
                out, flops = back[0::2], _flops(back[0::2]) + 2.5 * core
            elif kind == "W":
                out, flops, attention = back[1::2], _flops(back[1::2]), None
            else:
                out, flops = back, 2.0 * _flops(gemms) + 2.5 * core
            if redo and kind in ("B", "I"):
                out, flops = gemms + out, flops + _flops(gemms) + core
            if attention is not None:
                again = redo or self.recompute == "selective"
                pass_ = "recompute+backward" if again else "backward"
                flops += core if again and not redo else 0.0
        n = None if launches is None else launches * (1 if kind in ("F", "I", "W") else 2)
        return Compute(f"{PHASES[kind]} {name}", flops=flops, gemms=out, attention=attention, attention_pass=pass_,
                       dtype=c.dtype, launches=n)

    def memory_op(self, name: str, nbytes: float) -> Compute:
        """A memory-bound op: once forward, twice in a full backward (read the gradient, write the input's), once
        in I; none in W."""
        factor = {"F": 1.0, "B": 2.0, "I": 2.0, "W": 0.0}[self.kind]
        return Compute(f"{PHASES[self.kind]} {name}", bytes=factor * nbytes, dtype=self.c.dtype)


def block_kernels(c, i: int, kind: str, received: int | None = None, local_experts: int | None = None,
                  recompute: str = "none", tag: str = "") -> dict:
    """Block i's ops for ``kind`` (F, B, I, W) as {"front": [...], "experts": [...], "shared": [...]}: front the
    norms, attention and router (with the permutation), experts the routed experts' grouped GEMMs (and the
    unpermute), shared the shared experts; a dense block: everything in front. ``received``: routed copies this
    rank computes (default every token's top_k), ``local_experts`` (default all)."""
    k = Kernels(c, kind, recompute)
    T, h, e, name = c.tokens, c.hidden, k.e, f"{tag}h.{i}"
    redo = recompute == "full"
    attn = tuple((T, q.shape[0], q.shape[1]) for q in _attention(c, "", lambda n, *s: Param(n, s))
                 if len(q.shape) == 2)
    call = _attention_call(c)
    front = [k.memory_op(f"{name}.norm1", 2 * T * h * e)]
    if attn:
        front.append(k.gemm_op(f"{name}.attn", attn, call, redo=redo))
    front.append(k.memory_op(f"{name}.norm2", 2 * T * h * e))
    if i < c.first_dense:
        front.append(k.gemm_op(f"{name}.mlp", _ffn(T, c.dense_ffn or 4 * h, h), redo=redo))
        return {"front": front, "experts": [], "shared": []}
    R = c.tokens * c.top_k if received is None else received
    E = c.experts if local_experts is None else local_experts
    front += [k.gemm_op(f"{name}.router", ((T, c.experts, h),), redo=redo),
              k.memory_op(f"{name}.router topk", 2 * T * c.experts * 4),
              k.memory_op(f"{name}.permute", 2 * T * c.top_k * h * e)]
    m = math.ceil(R / E) if R else 0
    experts = [k.gemm_op(f"{name}.experts", _ffn(m, c.expert_ffn, h) * E, launches=3, redo=redo)] if m else []
    experts.append(k.memory_op(f"{name}.unpermute", 2 * T * c.top_k * h * e))
    shared = ([k.gemm_op(f"{name}.shared", _ffn(T, c.shared_experts * c.expert_ffn, h), redo=redo)]
              if c.shared_experts else [])
    return {"front": front, "experts": experts, "shared": shared}


def end_kernels(c, layer: str, kind: str, tag: str = "") -> list:
    """The embedding's or the head's ops (module docstring)."""
    k = Kernels(c, kind)
    T, h, e = c.tokens, c.hidden, k.e
    if layer == "embed":
        return [k.memory_op(f"{tag}embed", T * h * e)]
    ops = [k.memory_op(f"{tag}norm_f", 2 * T * h * e), k.gemm_op(f"{tag}lm_head", ((T, c.vocab, h),)),
           k.memory_op(f"{tag}loss", T * 4 * c.vocab)]
    return ops if kind == "F" else ops[::-1]


def layer_kernels(model, c, index: int, kind: str, recompute: str = "none", tag: str = "") -> list:
    """Every op of model layer ``index`` on one rank without expert parallelism, in execution order."""
    name = model.layers[index].name
    if not name.startswith("h."):
        return end_kernels(c, name, kind, tag)
    parts = block_kernels(c, int(name[2:]), kind, recompute=recompute, tag=tag)
    ops = parts["front"] + parts["experts"] + parts["shared"]
    return ops if kind == "F" else ops[::-1]


class MoELayers:
    """The layer program (sim/parallel/layers.py) of an MoE model on one rank: each layer's op replaced by its
    kernels (no collectives: expert parallelism is sim/parallel/ep/plan.py)."""

    def __init__(self, model, rank: int, recompute: str = "none"):
        from distlab.sim.parallel.ep.model import config_of
        self.model, self.c, self.recompute = model, config_of(model), recompute
        self.index = {L.name: i for i, L in enumerate(model.layers)}
        self.ops: list = []

    def forward(self, op, name: str):
        self.ops += layer_kernels(self.model, self.c, self.index[name], "F", self.recompute)

    def backward(self, op, name: str):
        self.ops += layer_kernels(self.model, self.c, self.index[name], "B", self.recompute)

    def keep(self, op):
        self.ops.append(op)

    def partial_grads(self, names, reads: int, phase: str):
        pass
