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
``ddp_tp_plan`` is sim/parallel/parallelize.py with TP then DDP (sim/parallel/ddp/step.py).
"""
from __future__ import annotations

from distlab.sim.parallel.ddp.plan import DDPOptions
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Plan
from distlab.sim.parallel.tp.plan import TPOptions


def ddp_tp_plan(model, mesh, ddp_opts: DDPOptions | None = None, tp_opts: TPOptions | None = None,
                name: str | None = None, where: str = "tp") -> Plan:
    """The plan of one step on ``mesh`` with dimensions dp (DDP) and tp (see the module docstring):
    sim/parallel/parallelize.py with TP then DDP (sim/parallel/ddp/step.py)."""
    from distlab.sim.parallel.parallelize import Parallelisms, parallelize
    ddp_opts, tp_opts = (ddp_opts or DDPOptions()).validate(where), tp_opts or TPOptions()
    for dim in ("dp", "tp"):
        if dim not in mesh:
            raise ConfigError(f"DDP x TP needs mesh dimensions dp and tp; this mesh has {', '.join(mesh.names)}",
                              f"{where}: mesh")
    plan = parallelize(model, mesh, Parallelisms(tp=tp_opts, ddp=ddp_opts), where=where)
    if name:
        plan.name = name
    return plan
