"""Which renamings of the ranks map a composed plan onto itself, so that sim/kernel/relabel.py builds one
program per class and sim/kernel/subgroups.py simulates one rank per class (the 16,384-GPU path).

    composed_shifts(Mesh({"pp": 16, "dp_shard": 128, "tp": 8}), dgx_h100_2048_nodes, par)
    -> Shifts(nodes=2048, gpus=8, node_step=1, local_step=1, block=128, block_step=16): 16 representatives

A rank's program (sim/parallel/parallelize.py) depends on its pipeline stage (pp), its cp index (the ring's
causal work differs per rank, sim/parallel/cp/ring.py) and nothing else: every rank of a tp, dp_shard,
dp_replicate or dp group runs the same ops on its own groups. So a renaming g of the ranks (sim/kernel/
equivariance.Shifts: rotations of the nodes inside blocks of nodes, shifts of whole blocks, rotations of the
local rank in every node) maps the plan onto itself when, for every rank r,
  1. g(r) has r's pp and cp coordinates (its program is r's, renamed), and
  2. for every mesh dimension d (and the flattened dp_shard x cp group FSDP2 uses with cp), the ranks that share
     r's coordinates but d's go to the ranks that share g(r)'s (groups onto groups, peers onto peers).
Both are checked here for each generator on every rank (numpy, O(world)); the largest such group is chosen (the
fewest representatives). Local rotations also need every node's rails to map onto rails (NICs per node divide
the GPUs, as sim/kernel/equivariance.find_shifts requires). The layouts relabelled before (FSDP2 x TP x CP,
sim/kernel/relabel.py fsdp_shifts; PP x TP x DP, pp_tp_shifts) keep their own functions.
"""
from __future__ import annotations

import numpy as np

from distlab.sim.kernel.equivariance import Shifts

PROGRAM_DIMS = ("pp", "cp")           # a rank's program depends on these coordinates


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _coords(mesh) -> dict:
    ranks = np.arange(mesh.world_size)
    stride = 1
    out = {}
    for name, size in reversed(list(zip(mesh.names, mesh.shape))):
        out[name] = (ranks // stride) % size
        stride *= size
    return out


def _maps(mesh, coords: dict, image: np.ndarray) -> bool:
    """Conditions 1 and 2 of the module docstring for the renaming r -> image[r]."""
    for d in PROGRAM_DIMS:
        if d in coords and not np.array_equal(coords[d][image], coords[d]):
            return False
    dims = [(d,) for d in mesh.names] + ([("dp_shard", "cp")] if "dp_shard" in mesh and "cp" in mesh else [])
    for group in dims:
        others = [d for d in mesh.names if d not in group]
        if not others:
            continue
        key = np.zeros(mesh.world_size, dtype=np.int64)
        for d in others:
            key = key * mesh.size(d) + coords[d]
        target = key[image]                 # the group key of g(r); it must depend on r's group key alone
        first = np.full(int(key.max()) + 1, -1, dtype=np.int64)
        first[key[::-1]] = target[::-1]     # one target per source key (the first rank's)
        if not np.array_equal(first[key], target):
            return False
    return True


def composed_shifts(mesh, cluster, par) -> Shifts | None:
    """The Shifts relabel may use for ``par`` on ``mesh`` (module docstring), or None (every rank built)."""
    from distlab.sim.kernel.relabel import fsdp_shifts, pp_tp_shifts
    if par.pipeline is None and par.fsdp is not None:
        return fsdp_shifts(mesh, cluster, par.fsdp.reshard_after_forward)
    if par.pipeline is not None and par.fsdp is None:
        return pp_tp_shifts(mesh, cluster) if par.tp is not None and par.cp is None else None
    if par.pipeline is None or mesh.world_size != cluster.world_size or mesh.world_size < 2:
        return None
    if not isinstance(par.fsdp.reshard_after_forward, bool):
        return None
    return best_shifts(mesh, cluster)


def best_shifts(mesh, cluster) -> Shifts | None:
    """The largest Γ of the form Shifts under which ``mesh``'s plan is invariant (module docstring)."""
    n, g = cluster.nodes, cluster.gpus_per_node
    coords = _coords(mesh)
    ranks = np.arange(mesh.world_size)

    def valid(s: Shifts, e) -> bool:
        return _maps(mesh, coords, s.apply_array(e, ranks))

    inter = cluster.inter_node
    rails_ok = inter is None or n == 1 or g % inter.nics_per_node == 0
    t = next((t for t in _divisors(g)[:-1] if rails_ok and valid(Shifts(n, g, n, t), (0, 0, t))), g)
    best = None
    for block in _divisors(n):
        blocks = n // block
        k = next((k for k in _divisors(block)[:-1] if valid(Shifts(n, g, k, g, block), (k, 0, 0))), block)
        j = next((j for j in _divisors(blocks)[:-1] if valid(Shifts(n, g, block, g, block, j), (0, j, 0))), blocks)
        s = Shifts(n, g, k, t, block, j)
        reps = j * k * t
        if best is None or reps < best[0]:
            best = (reps, s)
    return None if best is None or best[1].trivial() else best[1]
