"""Per-rank memory under tensor parallelism: parameters, gradients and AdamW state as the shards are
(sim/parallel/tp/rules.py local shapes), FSDP2's gathered units when the mesh also shards over dp_shard, and the
activations of the model's family (sim/models/activations.py: what torch's autograd keeps at this tp, sequence
and loss parallelism, recompute and offload; the same function DDP, FSDP, CP, pipelines and `distlab memory`
use).

    from distlab.sim.models import preset
    from distlab.sim.parallel.tp.memory import tp_memory
    parts = tp_memory(preset("llama3.1-70b", micro_batch=16), 8, True, "full", dp_shard=32, loss_parallel=True)
    sum(parts.values()) / 2**30        # ~47 GiB: torchtitan's Table 4 layout (tests/test_activations.py)

``activation_bytes_per_layer`` keeps Korthikanti et al. 2022 (arXiv 2205.05198), Table 2, as the paper gives it
for Megatron-LM's GPT (16-bit, dropout, unfused attention; s sequence, b micro-batch, h hidden, a heads, t
tensor-parallel size), a reference the lessons quote:

  no parallelism                          s·b·h·(34 + 5·a·s/h)
  selective recompute                     s·b·h·34
  tensor parallel (baseline)              s·b·h·(10 + 24/t + 5·a·s/(h·t))
  tensor + sequence parallel              s·b·h·(34/t + 5·a·s/(h·t))
  tensor parallel + selective recompute   s·b·h·(10 + 24/t)
  tensor + sequence parallel + selective  s·b·h·34/t
  full activation recompute               s·b·h·2

The simulator's own numbers come from the model family instead: for such a GPT (``dropout``, ``attention:
unfused``) the same rows plus the norms' fp32 statistics, except tensor + sequence parallel, where torch's
``PrepareModuleInput`` keeps the gathered norm outputs whole (4 of the 34 do not divide by t).
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.fsdp.memory import precision
from distlab.sim.parallel.tp.rules import local_numel

RECOMPUTE = ("none", "selective", "full")


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none", elem_bytes: int = 2) -> float:
    """One layer's activation bytes by Korthikanti et al.'s Table 2 (above); t = 1 without tensor parallelism."""
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


def tp_memory(model, tp: int, sequence_parallel: bool = True, recompute: str | None = None, dp_shard: int = 1,
              loss_parallel: bool = False, offload: bool | None = None) -> dict:
    """Bytes per rank: params, grads, optimizer (AdamW: fp32 master + m + v for 16-bit params, m + v for fp32;
    sim/parallel/fsdp/memory.py ``precision``) on the local shards (with FSDP2 over ``dp_shard`` ranks: each
    TP-local shard's dim 0 padded to a multiple of dp_shard, then split), FSDP2's gathered units in flight
    (the root and two blocks: the one computing and the one prefetched), and the activations' peak (module
    docstring; ``recompute``/``offload`` None = the model's own)."""
    from distlab.sim.dtypes import DTYPE_BYTES
    from distlab.sim.models.activations import activations
    from distlab.sim.parallel.fsdp.units import padded_numel, units_of
    from distlab.sim.parallel.tp.rules import local_shape
    c = model.config
    if dp_shard > 1:                      # each parameter's TP-local shard padded for FSDP2, by name
        padded = {q.name: padded_numel(local_shape(q, tp), dp_shard) for q in model.params}
    n = local_numel(model, tp) if dp_shard == 1 else sum(padded[q.name] for q in model.params) // dp_shard
    p, g, k = precision(c["dtype"])
    out = {"params": n * p, "grads": n * g, "optimizer": n * k}
    if dp_shard > 1:
        units = units_of(model)
        sizes = sorted((sum(padded[q.name] for q in u.params) for u in units[1:]), reverse=True)
        root = sum(padded[q.name] for q in units[0].params)
        out["unsharded params"] = (root + sum(sizes[:2])) * DTYPE_BYTES[c["dtype"]]
    acts = activations(model, recompute, offload, tp, sequence_parallel, 1, loss_parallel)
    out["activations"] = acts.peak_bytes
    return out
