"""Per-rank memory with context parallelism (torchtitan's layout: FSDP2 over dp_shard x cp, sim/parallel/cp/plan.py).

  params, grads, AdamW state   FSDP2 shards of the whole model over dp_shard·cp ranks (sim/parallel/fsdp/memory.py)
  activations                  layers x s·b·h·34·e/2 with s = S/cp local tokens: Korthikanti et al. 2022
                               (arXiv 2205.05198) Table 2 without the 5·a·s/h term, which counts the s x s
                               softmax that flash/memory-efficient SDPA never stores (it keeps the output and the
                               logsumexp); plus the logits b·s·V·e of the head; full recompute keeps each
                               block's input (s·b·h·e, Table 2's 2·s·b·h at 16 bits) and one block's
                               activations at a time; with tp (+ SP) the block terms divide by tp (Table 2's
                               34/t)
  ring buffers (transient)     one layer's: allgather the gathered K/V, cp·B, plus the local B; alltoall the
                               current and the incoming K/V, 2·B; backward adds the fp32 dK/dV accumulator
                               and the one in flight, 2·G (B = 2·b·s·h·e, G = 2·b·s·h·4; sim/parallel/cp/ring.py)
Without CP a rank keeps the activations of all S tokens: CP divides them by cp, which is why it exists.
"""
from __future__ import annotations

from distlab.sim.parallel.cp.ring import ACCUM_BYTES
from distlab.sim.parallel.fsdp.memory import static_bytes
from distlab.sim.plan import DTYPE_BYTES


def cp_memory(model, cp: int, shard_ranks: int, rotate_method: str = "allgather", recompute: str = "none",
              tp: int = 1) -> dict:
    """Bytes per rank (see the module docstring); ``shard_ranks``: the ranks one copy of the model is split
    over (dp_shard x cp x tp); with tp (+ SP) the activations and the ring's local heads divide by tp."""
    c = model.config
    b, s, h, V, e = c["micro_batch"], c["seq_len"] // cp, c["hidden"] // tp, c["vocab"], DTYPE_BYTES[c["dtype"]]
    static = static_bytes(model, shard_ranks, 3, shard_ranks)
    B, G = 2 * b * s * h * e, 2 * b * s * h * ACCUM_BYTES
    layer = s * b * h * 34 * e / 2
    act = (c["layers"] * s * b * h * e + layer if recompute == "full" else c["layers"] * layer) + b * s * V * e
    ring = ((cp + 1) * B if rotate_method == "allgather" else 2 * B) + 2 * G
    return {"params": static["params"], "grads": static["grads"], "optimizer": static["optimizer"],
            "activations": act, "ring buffers": ring}
