"""A named N-D device mesh, laid out exactly as torch 2.13's ``init_device_mesh``.

    mesh = Mesh({"pp": 2, "dp_shard": 2, "tp": 2})      # 8 ranks
    mesh.coords(5)            -> {"pp": 1, "dp_shard": 0, "tp": 1}
    mesh.group_of(5, "tp")    -> (4, 5)
    mesh.groups("dp_shard")   -> [(0, 2), (1, 3), (4, 6), (5, 7)]
    mesh.flatten(("dp_replicate", "dp_shard"), "dp")     # torchtitan's flattened data-parallel dimension

Layout (torch/distributed/device_mesh.py, ``init_device_mesh`` and ``DeviceMesh._init_process_groups``): the
mesh is ``torch.arange(world).view(shape)``, row-major over the dimensions in the order given, so the last
dimension varies fastest: rank = sum(coord[d] * stride[d]) with stride[d] = product of the later sizes. The
process group of dimension d holds the ranks that differ only in coordinate d; a flattened or multi-dimension
group (``mesh["dp_replicate", "dp_shard"]._flatten()``) holds the ranks that differ only in those coordinates,
ordered row-major over them. Groups are listed here by their lowest rank (torch creates them in another order;
membership, which is what a collective needs, is the same).

Placement: ranks fill nodes in order (rank r on node r // gpus_per_node, as torchrun numbers them), so the last
dimensions are the ones that stay inside a node; put ``tp`` last, as torchtitan does, to keep it on NVLink.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from distlab.sim.errors import ConfigError

MAX_DIMS = 8


@dataclass(frozen=True)
class DimPlacement:
    """Where the groups of one dimension land on a cluster with ``gpus_per_node`` GPUs per node."""
    dim: str
    size: int
    nodes_per_group: int          # nodes that one group spans (1 = inside a node)
    intra_node: bool


class Mesh:
    """A named mesh of ``world_size`` ranks. ``dims``: a mapping (or pairs) name -> size, in layout order."""

    def __init__(self, dims, where: str = "mesh"):
        items = list(dims.items()) if isinstance(dims, dict) else list(dims)
        if not items:
            raise ConfigError("a mesh needs at least one dimension, e.g. {dp: 8}", where)
        if len(items) > MAX_DIMS:
            raise ConfigError(f"{len(items)} dimensions; at most {MAX_DIMS}", where)
        seen = set()
        for name, size in items:
            if not isinstance(name, str) or not name.isidentifier():
                raise ConfigError(f"dimension name {name!r} must be a word such as dp, tp or pp", where)
            if name in seen:
                raise ConfigError(f"dimension {name!r} appears twice", where)
            seen.add(name)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ConfigError(f"size {size!r} must be a whole number >= 1", f"{where}.{name}")
        self.names: tuple[str, ...] = tuple(n for n, _ in items)
        self.shape: tuple[int, ...] = tuple(s for _, s in items)
        self.world_size = math.prod(self.shape)
        self._strides = tuple(math.prod(self.shape[i + 1:]) for i in range(len(self.shape)))

    def __repr__(self) -> str:
        return "Mesh({" + ", ".join(f"{n!r}: {s}" for n, s in zip(self.names, self.shape)) + "})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Mesh) and (self.names, self.shape) == (other.names, other.shape)

    def __hash__(self) -> int:
        return hash((self.names, self.shape))

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self.names, self.shape))

    def size(self, dim: str | tuple[str, ...]) -> int:
        return math.prod(self.shape[self._index(d)] for d in self._dims(dim))

    def __contains__(self, dim: str) -> bool:
        return dim in self.names

    def check_world(self, world_size: int, where: str = "mesh") -> "Mesh":
        """This mesh, or a ConfigError when its product is not ``world_size``."""
        if self.world_size != world_size:
            sizes = " x ".join(f"{n} {s}" for n, s in zip(self.names, self.shape))
            raise ConfigError(f"{sizes} = {self.world_size} ranks, but the world has {world_size}; allowed: "
                              f"{world_size} ranks", where)        # within 100 columns after --mesh
        return self

    def coords(self, rank: int) -> dict[str, int]:
        self._check_rank(rank)
        return {n: (rank // st) % s for n, s, st in zip(self.names, self.shape, self._strides)}

    def rank(self, coords: dict[str, int]) -> int:
        """The rank at ``coords`` (every dimension named)."""
        if set(coords) != set(self.names):
            raise ConfigError(f"coordinates must name exactly {', '.join(self.names)}", "mesh")
        return sum(coords[n] * st for n, st in zip(self.names, self._strides))

    def group_of(self, rank: int, dim: str | tuple[str, ...]) -> tuple[int, ...]:
        """The ranks that share every coordinate of ``rank`` but those of ``dim`` (one name or several),
        row-major over ``dim``'s dimensions in mesh order: the process group torch gives ``rank`` for it."""
        dims = self._dims(dim)
        base = self.coords(rank)
        idx = sorted(self._index(d) for d in dims)
        out = [sum(base[n] * st for i, (n, st) in enumerate(zip(self.names, self._strides)) if i not in idx)]
        for i in idx:              # row-major: the earlier dimension is the outer loop
            out = [r + k * self._strides[i] for r in out for k in range(self.shape[i])]
        return tuple(out)

    def groups(self, dim: str | tuple[str, ...]) -> list[tuple[int, ...]]:
        """Every group of ``dim``, by lowest rank."""
        seen, out = set(), []
        for r in range(self.world_size):
            if r not in seen:
                g = self.group_of(r, dim)
                seen.update(g)
                out.append(g)
        return out

    def flatten(self, dims: tuple[str, ...], name: str) -> "Mesh":
        """The mesh with ``dims`` (adjacent, in mesh order) replaced by one dimension ``name`` of their product:
        the same rank layout, as ``DeviceMesh._flatten`` gives it."""
        dims = self._dims(dims)
        idx = [self._index(d) for d in dims]
        if idx != list(range(idx[0], idx[0] + len(idx))):
            raise ConfigError(f"can only flatten adjacent dimensions in mesh order; {', '.join(dims)} are not "
                              f"(mesh: {', '.join(self.names)})", "mesh")
        items = list(zip(self.names, self.shape))
        merged = items[:idx[0]] + [(name, math.prod(self.shape[i] for i in idx))] + items[idx[-1] + 1:]
        return Mesh(merged)

    def split(self, dim: str, names: tuple[str, str], inner: int) -> "Mesh":
        """The mesh with ``dim`` split into (outer, inner) dimensions ``names`` of sizes (size / inner, inner):
        the same rank layout, as ``mesh.view(-1, inner)`` gives it (FSDP2's post-forward mesh for an int
        reshard_after_forward, torch/distributed/fsdp/_fully_shard/_fsdp_init.py)."""
        i = self._index(dim)
        size = self.shape[i]
        if isinstance(inner, bool) or not isinstance(inner, int) or inner < 1 or size % inner:
            raise ConfigError(f"{inner!r} must divide the size {size} of mesh dimension {dim!r}", "mesh")
        items = list(zip(self.names, self.shape))
        return Mesh(items[:i] + [(names[0], size // inner), (names[1], inner)] + items[i + 1:])

    def placement(self, gpus_per_node: int) -> list[DimPlacement]:
        """For each dimension: how many nodes one of its groups spans (the same for every group)."""
        out = []
        for n, s in zip(self.names, self.shape):
            spans = {len({r // gpus_per_node for r in g}) for g in self.groups(n)}
            worst = max(spans)
            out.append(DimPlacement(n, s, worst, worst == 1))
        return out

    def placement_warnings(self, gpus_per_node: int, intra_node: tuple[str, ...] = ("tp", "cp")) -> list[str]:
        """One line per dimension in ``intra_node`` whose groups cross nodes (they usually should not): put it
        last in the mesh (its groups then take consecutive ranks) unless it is already the innermost dimension
        of size > 1, and make it <= the GPUs of a node. ep is not among them by default: expert parallelism
        across nodes is a published layout (DeepSeek-V3: ep 64 over 8 nodes, arXiv 2412.19437 sec. 3.2)."""
        inner = [n for n, s in zip(self.names, self.shape) if s > 1][-1:]
        out = []
        for p in self.placement(gpus_per_node):
            if p.dim in intra_node and not p.intra_node and p.size > 1:
                fix = (f"make it <= {gpus_per_node}" if [p.dim] == inner
                       else f"put it last in the mesh or make it <= {gpus_per_node}")
                out.append(f"mesh dimension {p.dim!r} (size {p.size}) spans {p.nodes_per_group} nodes per group: "
                           f"its collectives cross the network; {fix}")
        return out

    def _dims(self, dim) -> tuple[str, ...]:
        dims = (dim,) if isinstance(dim, str) else tuple(dim)
        for d in dims:
            self._index(d)
        if len(set(dims)) != len(dims) or not dims:
            raise ConfigError(f"dimensions {dims!r} must be distinct and at least one", "mesh")
        return dims

    def _index(self, d: str) -> int:
        if d not in self.names:
            raise ConfigError(f"unknown mesh dimension {d!r}; this mesh has {', '.join(self.names)}", "mesh")
        return self.names.index(d)

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank!r} is outside the mesh (0..{self.world_size - 1})", "mesh")
