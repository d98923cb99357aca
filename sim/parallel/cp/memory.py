"""Per-rank memory with context parallelism (torchtitan's layout: FSDP2 over dp_shard x cp, sim/parallel/cp/plan.py).

  params, grads, AdamW state   FSDP2 shards of the whole model over dp_shard·cp ranks (sim/parallel/fsdp/memory.py)
  activations                  the model family's (sim/models/activations.py) with s = S/cp local tokens: ring
                               attention keeps the local q, k, v, output and logsumexp, never an s x s
                               matrix; full recompute keeps each block's input (sharded with tp + SP) and
                               one block's forward at a time; with tp + SP as torch's DTensor plan keeps them
  ring buffers (transient)     one layer's: allgather the gathered K/V, cp·B, plus the local B; alltoall the
                               current and the incoming K/V, 2·B; backward adds the fp32 dK/dV accumulator
                               and the one in flight, 2·G (B = 2·b·s·h·e, G = 2·b·s·h·4; sim/parallel/cp/ring.py)
Without CP a rank keeps the activations of all S tokens: CP divides them by cp, which is why it exists.
"""
from __future__ import annotations

from distlab.sim.dtypes import DTYPE_BYTES
from distlab.sim.models.activations import activations
from distlab.sim.parallel.cp.ring import ACCUM_BYTES
from distlab.sim.parallel.fsdp.memory import static_bytes


def cp_memory(model, cp: int, shard_ranks: int, rotate_method: str = "allgather", recompute: str | None = None,
              tp: int = 1, offload: bool | None = None) -> dict:
    """Bytes per rank (see the module docstring); ``shard_ranks``: the ranks one copy of the model is split
    over (dp_shard x cp x tp); with tp (+ SP) the activations and the ring's local heads divide by tp;
    ``recompute``/``offload`` None = the model's own."""
    c = model.config
    b, s, h, e = c["micro_batch"], c["seq_len"] // cp, c["hidden"] // tp, DTYPE_BYTES[c["dtype"]]
    static = static_bytes(model, shard_ranks, 3, shard_ranks)
    B, G = 2 * b * s * h * e, 2 * b * s * h * ACCUM_BYTES
    act = activations(model, recompute, offload, tp, tp > 1, cp).peak_bytes
    ring = ((cp + 1) * B if rotate_method == "allgather" else 2 * B) + 2 * G
    return {"params": static["params"], "grads": static["grads"], "optimizer": static["optimizer"],
            "activations": act, "ring buffers": ring}
