"""DDP x TP on one 2-D mesh (dp, tp): ``parallelize_module`` on the tp sub-mesh, then
``DistributedDataParallel(module, device_mesh=mesh["dp"])``, as torch 2.13 composes them.

DDP on a sub-mesh calls ``_pre_dp_module_transform`` (torch/distributed/tensor/parallel/ddp.py): every DTensor
parameter becomes a plain Parameter holding its TP-local shard, so DDP's Reducer buckets and all-reduces the
TP-local gradients over dp; a forward pre-hook rebuilds each DTensor with ``DTensor.from_local`` and a post-hook
makes the parameters local again (the optimizer then reads plain tensors and issues nothing). Consequences, as
seen with torch 2.13 on gloo (tests/test_tp_runtime.py):

- the TP collectives of forward and backward are those of the 1-D plan (sim/parallel/tp/plan.py);
- every ``from_local`` node was created in the forward pre-hook, before any other autograd node, so autograd's
  ready queue (highest sequence number first) runs them only when backward has nothing else left: every
  gradient becomes ready at the end of backward, in reverse parameter order, and DDP cannot overlap its
  all-reduces with backward compute;
- under sequence parallelism the norms' gradients are Partial(sum): ``from_local``'s backward redistributes them
  to Replicate, one all_reduce over tp per norm parameter (reverse parameter order), before DDP sees them;
- DDP's buckets: sim/parallel/ddp/buckets.py on the TP-local parameters with that ready order; each bucket one
  all_reduce over dp (launch rule: all its gradients ready and the bucket before launched).
"""
from __future__ import annotations

from distlab.sim.parallel.ddp.buckets import ddp_buckets
from distlab.sim.parallel.ddp.plan import COMPRESS, DDPOptions
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Collective, Plan, Record, Wait
from distlab.sim.parallel.tp.compose import tp_local_model
from distlab.sim.parallel.tp.plan import ADAM_BYTES, ADAM_FLOPS, Segments, TPOptions, _Program
from distlab.sim.parallel.tp.rules import check_divides, local_numel, partial_grad_params


def ddp_tp_plan(model, mesh, ddp_opts: DDPOptions | None = None, tp_opts: TPOptions | None = None,
                name: str | None = None, where: str = "tp") -> Plan:
    """The plan of one step on ``mesh`` with dimensions dp (DDP) and tp (see the module docstring)."""
    ddp_opts, tp_opts = (ddp_opts or DDPOptions()).validate(where), tp_opts or TPOptions()
    for dim in ("dp", "tp"):
        if dim not in mesh:
            raise ConfigError(f"DDP x TP needs mesh dimensions dp and tp; this mesh has {', '.join(mesh.names)}",
                              f"{where}: mesh")
    if ddp_opts.grad_accum != 1:
        raise ConfigError("DDP x TP is built for grad_accum 1", f"{where}: grad_accum")
    tp = mesh.size("tp")
    check_divides(model, tp, "mesh.tp", tp_opts.sequence_parallel)
    local = tp_local_model(model, tp, tp_opts)
    order = list(range(len(local.params)))[::-1]           # from_local nodes: reverse creation order
    buckets = ddp_buckets(local, ddp_opts.bucket_cap_mb, ddp_opts.iteration, order)
    partial = [q.name for q in partial_grad_params(model, tp_opts.sequence_parallel)][::-1]
    n_local = local_numel(model, tp)
    ranks = []
    for r in range(mesh.world_size):
        p = _Program(mesh.group_of(r, "tp"), model.config["dtype"])
        seg = Segments(model, tp_opts, p)
        for layer in model.layers:
            seg.forward(layer.name)
        for layer in reversed(model.layers):
            seg.backward(layer.name)
        seg.partial_grads(partial, 1, "backward")
        dp_group = mesh.group_of(r, "dp")
        if len(dp_group) > 1 and buckets:
            p.ops += [Record("grads ready", "compute"), Wait("grads ready", "dp")]
            for k, b in enumerate(buckets):
                numel = sum(local.params[i].numel for i in b.params)
                nbytes, dtype = (2 * numel, COMPRESS[ddp_opts.compress]) if ddp_opts.compress else (b.bytes, b.dtype)
                p.ops.append(Collective("all_reduce", nbytes, dtype, dp_group, algorithm=ddp_opts.algorithm,
                                        name=f"dp all_reduce bucket {k} backward", stream="dp"))
            p.ops += [Record("reduced", "dp"), Wait("reduced", "compute")]
        p.compute("optimizer", flops=ADAM_FLOPS * n_local, nbytes=ADAM_BYTES * n_local)
        ranks.append(p.ops)
    meta = {"builder": "ddp_tp", "model": model.name, "tp": tp, "dp": mesh.size("dp"),
            "sequence_parallel": tp_opts.sequence_parallel, "local_params": n_local,
            "buckets": [{"index": k, "bytes": b.bytes, "params": len(b.params)} for k, b in enumerate(buckets)]}
    mode = "tp-sp" if tp_opts.sequence_parallel else "tp"
    return Plan(ranks, name=name or f"ddp{mesh.size('dp')}-{mode}{tp}-{model.name}", meta=meta).validate()
