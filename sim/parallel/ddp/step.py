"""DDP as step 5 of sim/parallel/parallelize.py: ``DistributedDataParallel(module, device_mesh=mesh["dp"])`` around
whatever TP made of the layers.

    ranks = ddp_ranks(model, mesh, DDPOptions(), layers_of, tp_local_model(model, 2), partial=[...])

Without TP it is DDP's own program (sim/parallel/ddp/plan.py: buckets all-reduced as backward makes them ready).
With TP, torch 2.13 composes them as sim/parallel/tp/ddp.py describes (``_pre_dp_module_transform``: every
gradient is ready only at the end of backward, in reverse parameter order; the sequence-parallel norms'
Partial(sum) gradients are all-reduced over tp first, one all_reduce each; then one all_reduce over dp per
bucket of the TP-local gradients; the optimizer reads plain tensors and issues nothing).
"""
from __future__ import annotations

from distlab.sim.parallel.ddp.buckets import ddp_buckets
from distlab.sim.parallel.ddp.plan import COMPRESS
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Collective, Record, Wait


def ddp_ranks(model, mesh, opts, layers_of, local, partial: list[str], n_local: int, where: str = "ddp") -> tuple:
    """(per-rank ops, buckets) of DDP x TP on ``mesh`` (dims dp, tp): ``layers_of(rank)`` gives each rank's layer
    program (sim/parallel/layers.py), ``local`` the TP-local model DDP buckets, ``partial`` the Partial(sum)
    gradients' names in the order their all-reduces run, ``n_local`` the TP-local elements AdamW updates."""
    from distlab.sim.parallel.tp.plan import ADAM_BYTES, ADAM_FLOPS
    if opts.grad_accum != 1:
        raise ConfigError("DDP x TP is built for grad_accum 1", f"{where}: grad_accum")
    order = list(range(len(local.params)))[::-1]           # from_local nodes: reverse creation order
    buckets = ddp_buckets(local, opts.bucket_cap_mb, opts.iteration, order)
    ranks = []
    for r in range(mesh.world_size):
        layers = layers_of(r)
        for layer in model.layers:
            layers.forward(None, layer.name)
        for layer in reversed(model.layers):
            layers.backward(None, layer.name)
        layers.partial_grads(partial, 1, "backward")
        dp_group = mesh.group_of(r, "dp")
        if len(dp_group) > 1 and buckets:
            layers.ops.extend([Record("grads ready", "compute"), Wait("grads ready", "dp")])
            for k, b in enumerate(buckets):
                numel = sum(local.params[i].numel for i in b.params)
                nbytes, dtype = (2 * numel, COMPRESS[opts.compress]) if opts.compress else (b.bytes, b.dtype)
                layers.ops.append(Collective("all_reduce", nbytes, dtype, dp_group, algorithm=opts.algorithm,
                                             name=f"dp all_reduce bucket {k} backward", stream="dp"))
            layers.ops.extend([Record("reduced", "dp"), Wait("reduced", "compute")])
        layers.p.compute("optimizer", flops=ADAM_FLOPS * n_local, nbytes=ADAM_BYTES * n_local)
        ranks.append(layers.ops)
    return ranks, buckets
