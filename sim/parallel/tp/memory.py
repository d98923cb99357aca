"""Per-rank memory under tensor parallelism: parameters, gradients and AdamW state as the shards are
(sim/parallel/tp/rules.py local shapes), and activations per Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models" (arXiv 2205.05198), Table 2: bytes of activations one transformer layer keeps for
backward, 16-bit activations (s sequence, b micro-batch, h hidden, a heads, t tensor-parallel size):

  no parallelism                          s·b·h·(34 + 5·a·s/h)
  selective recompute                     s·b·h·34
  tensor parallel (baseline)              s·b·h·(10 + 24/t + 5·a·s/(h·t))
  tensor + sequence parallel              s·b·h·(34/t + 5·a·s/(h·t))
  tensor parallel + selective recompute   s·b·h·(10 + 24/t)
  tensor + sequence parallel + selective  s·b·h·34/t
  full activation recompute               s·b·h·2

(The 5·a·s/h term is attention's softmax input and output and dropout mask, the part selective recompute drops;
10 of the 34 are the layer norms' and dropouts' inputs that plain TP keeps replicated.) Scaled by e/2 for
e-byte activations. Totals: layers x the per-layer value.
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.fsdp.memory import precision
from distlab.sim.parallel.tp.rules import local_numel

RECOMPUTE = ("none", "selective", "full")


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none", elem_bytes: int = 2) -> float:
    """One layer's activation bytes (Table 2 above); t = 1 without tensor parallelism."""
    if recompute not in RECOMPUTE:
        raise ConfigError(f"unknown recompute {recompute!r}; allowed: {', '.join(RECOMPUTE)}", "recompute")
    sbh, attn = s * b * h, 5 * a * s / h
    if recompute == "full":
        per = 2.0
    elif t == 1:
        per = 34.0 + (attn if recompute == "none" else 0.0)
    elif sequence_parallel:
        per = 34.0 / t + (attn / t if recompute == "none" else 0.0)
    else:
        per = 10.0 + 24.0 / t + (attn / t if recompute == "none" else 0.0)
    return sbh * per * elem_bytes / 2


def tp_memory(model, tp: int, sequence_parallel: bool = True, recompute: str = "none", dp_shard: int = 1) -> dict:
    """Bytes per rank: params, grads, optimizer (AdamW: fp32 master + m + v for 16-bit params, m + v for fp32;
    sim/parallel/fsdp/memory.py ``precision``) on the local shards (with FSDP2 over ``dp_shard`` ranks: each TP-local
    shard's dim 0 padded to a multiple of dp_shard, then split), and activations of all layers (Table 2;
    FSDP2's transient unsharded units are not counted)."""
    from distlab.sim.parallel.fsdp.units import padded_numel
    from distlab.sim.plan import DTYPE_BYTES
    from distlab.sim.parallel.tp.rules import local_shape
    c = model.config
    n = local_numel(model, tp) if dp_shard == 1 else \
        sum(padded_numel(local_shape(q, tp), dp_shard) for q in model.params) // dp_shard
    p, g, k = precision(c["dtype"])
    act = c["layers"] * activation_bytes_per_layer(c["seq_len"], c["micro_batch"], c["hidden"], c["heads"], tp,
                                                   sequence_parallel, recompute, DTYPE_BYTES[c["dtype"]])
    return {"params": n * p, "grads": n * g, "optimizer": n * k, "activations": act}
