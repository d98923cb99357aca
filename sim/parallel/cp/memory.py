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



def cp_memory(model, cp: int, shard_ranks: int, rotate_method: str = "allgather", recompute: str | None = None,
              tp: int = 1, offload: bool | None = None) -> dict:
    """Bytes per rank by part (see the module docstring); ``shard_ranks``: the ranks one copy of the model is
    split over (dp_shard x cp x tp); ``recompute``/``offload`` None = the model's own. sim/parallel/memory.py
    ``memory_per_gpu``, the one model."""
    from distlab.sim.mesh import Mesh
    from distlab.sim.parallel.cp.local import CPOptions
    from distlab.sim.parallel.memory import as_parallelisms, memory_per_gpu
    dims = {"dp_shard": shard_ranks // (cp * tp), "cp": cp, "tp": tp}
    mesh = Mesh({k: v for k, v in dims.items() if v > 1 or k == "cp"})
    par = as_parallelisms(mesh, CPOptions(rotate_method=rotate_method))
    return dict(memory_per_gpu(model, mesh, par, recompute=recompute, offload=offload)["breakdown_bytes"])
