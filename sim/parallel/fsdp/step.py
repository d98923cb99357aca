"""FSDP2 / HSDP / ZeRO-1-2 as step 5 of sim/parallel/parallelize.py, around whatever TP and CP made of the layers.

    ranks, base = fsdp_ranks(model, tp_local, mesh, fsdp_mesh, FSDPOptions(), layers_of, partial_units, tp=True)

FSDP2's program (sim/parallel/fsdp/plan.py) is built on the model as TP and CP leave it (TP-local shapes, cp-local
tokens: what ``fully_shard`` shards after ``parallelize_module``), and each layer's compute op in it is handed to
the rank's layer program (sim/parallel/layers.py), which puts the layer's TP segment or ring attention in its
place. What TP adds around FSDP2 (as seen with torch 2.13 on gloo, tests/test_tp_runtime.py):

- the sequence-parallel norms' Partial(sum) gradients are all-reduced over tp once, in FSDP2's post-backward,
  just before their unit's reduce-scatter (``FSDPParam._get_grad_inner_tensor`` redistributes them);
- AdamW runs on DTensors (every parameter is one under ``fully_shard``): its elementwise ops go through
  DTensor's dispatch (``launches``, sim/parallel/tp/plan.py ADAMW_DTENSOR_OPS per parameter);
- on a 2-D data-parallel mesh (dp_replicate, dp_shard) torch all-reduces every unit's gradient shard over
  dp_replicate even when it holds one rank (``foreach_reduce``: ``if all_reduce_group is not None``), so the
  plan has that 1-rank all_reduce too (no time).
"""
from __future__ import annotations

from dataclasses import replace

from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
from distlab.sim.plan import Collective, Compute


def fsdp_ranks(model, local, mesh, fsdp_mesh, opts, layers_of, partial_units: dict, tp: bool,
               where: str = "fsdp", only: list[int] | None = None) -> tuple:
    """(per-rank ops, FSDP2's base plan) on ``fsdp_mesh`` (dims dp_replicate?, dp_shard, tp?: the data-parallel
    view of ``mesh``; with cp, dp_shard is torchtitan's dp_shard_cp); ``local`` the model FSDP2 shards,
    ``layers_of(rank)`` each rank's layer program, ``partial_units`` unit -> its Partial(sum) parameters."""
    from distlab.sim.parallel.fsdp.plan import fsdp_plan
    from distlab.sim.parallel.tp.plan import ADAMW_DTENSOR_OPS
    base = fsdp_plan(local, fsdp_mesh, opts, where=where, only=only, kernels=False)
    replicate_of_one = "dp_replicate" in fsdp_mesh and fsdp_mesh.size("dp_replicate") == 1
    ranks = []
    for r, ops in zip(range(mesh.world_size) if only is None else only, base.ranks):
        layers = layers_of(r)
        for op in ops:
            kind, _, rest = getattr(op, "name", "").partition(" ")
            if isinstance(op, Compute) and kind == "fwd":
                layers.forward(op, rest)
            elif isinstance(op, Compute) and kind == "bwd":
                layers.backward(op, rest)
            elif isinstance(op, Compute) and op.name == "optimizer" and tp:       # AdamW on DTensor shards
                layers.keep(replace(op, launches=ADAMW_DTENSOR_OPS * len(model.params)))
            else:
                if isinstance(op, Compute) and op.name.startswith("copy-in grads "):
                    layers.partial_grads(partial_units.get(op.name.removeprefix("copy-in grads "), []), 1,
                                         "backward")
                layers.keep(op)
                if replicate_of_one and isinstance(op, Collective) and op.op == "reduce_scatter":
                    unit = op.name.removeprefix("reduce_scatter ")
                    layers.keep(Collective("all_reduce", op.bytes // len(op.group), op.dtype, (r,),
                                           name=f"all_reduce {unit} backward", stream=op.stream))
        ranks.append(layers.ops)
    return ranks, base


def partial_units(model, local, sequence_parallel: bool) -> dict:
    """FSDP2 unit name -> the names of its parameters whose gradients TP leaves Partial(sum)."""
    from distlab.sim.parallel.fsdp.plan import units_of
    from distlab.sim.parallel.tp.rules import partial_grad_params
    partial = {q.name for q in partial_grad_params(model, sequence_parallel)}
    return {u.name: [q.name for q in u.params if q.name in partial] for u in units_of(local)}


def data_parallel_mesh(mesh: Mesh, where: str = "mesh") -> Mesh:
    """``mesh`` as FSDP2 sees it: cp folded into dp_shard (torchtitan's dp_shard_cp, the same rank layout)."""
    if "cp" not in mesh:
        return mesh
    if "dp_shard" in mesh:
        if abs(mesh.names.index("dp_shard") - mesh.names.index("cp")) != 1:
            raise ConfigError(f"dp_shard and cp must be next to each other in the mesh (FSDP2 shards over them "
                              f"flattened, torchtitan's dp_shard_cp); this mesh has {', '.join(mesh.names)}", where)
        return mesh.flatten(("dp_shard", "cp"), "dp_shard")
    return Mesh([("dp_shard" if d == "cp" else d, s) for d, s in zip(mesh.names, mesh.shape)])
