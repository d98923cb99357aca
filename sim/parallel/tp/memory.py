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
    """Bytes per rank of TP (with FSDP2 over ``dp_shard`` ranks when > 1) by part: sim/parallel/memory.py
    ``memory_per_gpu``, the one model (``recompute``/``offload`` None = the model's own)."""
    from distlab.sim.mesh import Mesh
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.parallel.memory import memory_per_gpu
    from distlab.sim.parallel.parallelize import Parallelisms
    from distlab.sim.parallel.tp.plan import TPOptions
    mesh = Mesh({"dp_shard": dp_shard, "tp": tp} if dp_shard > 1 else {"tp": tp})
    par = Parallelisms(tp=TPOptions(sequence_parallel=sequence_parallel, loss_parallel=loss_parallel),
                       fsdp=FSDPOptions() if dp_shard > 1 else None)
    return dict(memory_per_gpu(model, mesh, par, recompute=recompute, offload=offload)["breakdown_bytes"])
