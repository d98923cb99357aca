"""Rank task for tests/test_mesh.py: build torch's ``init_device_mesh`` for each shape in the payload and
return, per shape, the ranks of this rank's process group in every dimension (and in each flattened pair),
with the mesh's dimension names, so that sim/mesh.py's layout can be compared with torch's."""
from __future__ import annotations


def mesh_groups_task(ctx, payload: dict) -> list[dict]:
    """payload: {"shapes": [[[name, size], ...], ...], "flatten": [[name, name, ...] or None per shape]}."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    out = []
    for dims, flat in zip(payload["shapes"], payload["flatten"]):
        names = tuple(n for n, _ in dims)
        mesh = init_device_mesh("cpu", tuple(s for _, s in dims), mesh_dim_names=names)
        groups = {n: dist.get_process_group_ranks(mesh.get_group(n)) for n in names}
        if flat:
            groups["+".join(flat)] = dist.get_process_group_ranks(mesh[tuple(flat)]._flatten().get_group())
        out.append({"names": list(mesh.mesh_dim_names), "groups": groups})
    return out
