"""What autograd really saves for backward, layer by layer: the measurement sim/models/activations.py is held to.

    from distlab.runtime.modules.bridge import build_module
    from distlab.runtime.modules.saved import saved_by_layer
    saved_by_layer(build_module(model), model)          # {'embed': ..., 'h.0': ..., 'head': ...} in bytes

One forward and the loss (cross-entropy of the fp32 logits, as torchtitan computes it) run under
``torch.autograd.graph.saved_tensors_hooks``; every saved tensor's storage counts once (a view keeps its whole
base; a DTensor counts its local shard), parameters do not; bytes are charged to the layer running when they are
saved (``embed`` before the first block, each block ``h.i``, ``head`` after the last, the loss included). A
backward then runs once, so the graph is consumed. ``tp_task`` does the same on each rank of a tensor-parallel
launch (runtime/parallel/tp/run.py's plan, torchtitan's), for tests/test_activations_torch.py.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


def _local(t):
    """The plain tensor under a DTensor (its local shard) or a functional collective's result
    (AsyncCollectiveTensor: its ``elem``)."""
    while True:
        if hasattr(t, "_local_tensor"):
            t = t._local_tensor
        elif hasattr(t, "elem") and hasattr(t, "wait"):
            t = t.elem
        else:
            return t


def saved_by_layer(module, model, loss_parallel: bool = False, seed: int = 0) -> dict:
    """Bytes saved for backward by each layer of ``module`` (a model with blocks ``module.h``) on one batch."""
    c = model.config
    g = torch.Generator().manual_seed(seed)
    idx, tgt = (torch.randint(0, c["vocab"], (c["micro_batch"], c["seq_len"]), generator=g) for _ in range(2))
    params = {_local(p).untyped_storage().data_ptr() for p in module.parameters()}
    current, saved, seen = ["embed"], {}, set()
    blocks = list(module.h.values()) if hasattr(module.h, "values") else list(module.h)
    hooks = [b.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, f"h.{i}"))
             for i, b in enumerate(blocks)]
    hooks.append(blocks[-1].register_forward_hook(lambda *a: current.__setitem__(0, "head")))

    def pack(t):
        storage = _local(t).untyped_storage()
        key = storage.data_ptr()
        if key not in params and key not in seen:
            seen.add(key)
            saved[current[0]] = saved.get(current[0], 0) + storage.nbytes()
        return t
    module.train()
    ctx = contextlib.nullcontext()
    if loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel as lp
        ctx = lp()
    try:
        with ctx:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = F.cross_entropy(module(idx).flatten(0, 1).float(), tgt.flatten())
            loss.backward()
    finally:
        for h in hooks:
            h.remove()
    return saved


def tp_task(ctx, payload) -> list:
    """On each rank: runtime/parallel/tp/model.py's Llama under runtime/parallel/tp/run.py's TP plan over all ranks, one entry per
    variant ``{sequence_parallel, loss_parallel}``: the bytes each layer saved on this rank."""
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.runtime.parallel.tp.model import build_llama
    from distlab.runtime.parallel.tp.run import parallelize
    from distlab.sim.models import model_from_spec
    model = model_from_spec(payload["model"])
    mesh = init_device_mesh("cpu", (ctx.world_size,), mesh_dim_names=("tp",))
    out = []
    for v in payload["variants"]:
        torch.manual_seed(0)
        module = parallelize(build_llama(model), mesh, v["sequence_parallel"], v["loss_parallel"])
        out.append(saved_by_layer(module, model, v["loss_parallel"]))
    return out
