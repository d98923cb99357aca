"""sim/mesh.py: rank layout, groups, flatten, split, placement, bad input; and (slow) the same groups as real
``init_device_mesh`` on gloo ranks (world 4 and 8, 2-D and 3-D shapes, one launch per world size)."""
import itertools

import pytest

from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh

SHAPES = {4: [(("dp_replicate", 2), ("dp_shard", 2)), (("pp", 2), ("dp", 1), ("tp", 2)), (("dp", 4), ("pp", 1))],
          8: [(("pp", 2), ("dp_shard", 2), ("tp", 2)), (("dp_replicate", 2), ("dp_shard", 4)),
              (("dp", 2), ("pp", 4)), (("pp", 2), ("dp_replicate", 2), ("dp_shard", 2))]}
FLATTEN = {("dp_replicate", "dp_shard"), ("dp_shard", "tp")}


def test_layout_is_row_major_last_dim_fastest():
    m = Mesh({"pp": 2, "dp_shard": 2, "tp": 2})
    assert m.world_size == 8 and m.names == ("pp", "dp_shard", "tp")
    assert m.coords(5) == {"pp": 1, "dp_shard": 0, "tp": 1}
    assert [m.rank(m.coords(r)) for r in range(8)] == list(range(8))
    assert m.group_of(5, "tp") == (4, 5)
    assert m.groups("dp_shard") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert m.groups("pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert m.group_of(5, ("dp_shard", "tp")) == (4, 5, 6, 7)


@pytest.mark.parametrize("dims", [d for shapes in SHAPES.values() for d in shapes])
def test_groups_of_every_dim_partition_the_world(dims):
    m = Mesh(dict(dims))
    for name in m.names:
        groups = m.groups(name)
        assert sorted(itertools.chain(*groups)) == list(range(m.world_size))
        assert all(len(g) == m.size(name) for g in groups)
        for g in groups:                 # members differ only in this coordinate, ordered by it
            coords = [m.coords(r) for r in g]
            assert [c[name] for c in coords] == list(range(m.size(name)))
            assert all({k: v for k, v in c.items() if k != name} ==
                       {k: v for k, v in coords[0].items() if k != name} for c in coords)


def test_flatten_and_split_keep_the_layout():
    m = Mesh({"dp_replicate": 2, "dp_shard": 4})
    flat = m.flatten(("dp_replicate", "dp_shard"), "dp")
    assert flat.groups("dp") == [tuple(range(8))]
    split = m.split("dp_shard", ("outer", "inner"), 2)
    assert split.names == ("dp_replicate", "outer", "inner")
    assert split.groups("inner") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert split.groups(("outer", "inner")) == m.groups("dp_shard")
    with pytest.raises(ConfigError, match="must divide"):
        m.split("dp_shard", ("a", "b"), 3)
    with pytest.raises(ConfigError, match="adjacent"):
        Mesh({"a": 2, "b": 2, "c": 2}).flatten(("a", "c"), "ac")


def test_placement_says_which_dims_stay_inside_a_node():
    m = Mesh({"pp": 2, "dp": 2, "tp": 4})            # 16 ranks on 2 nodes of 8
    place = {p.dim: p for p in m.placement(8)}
    assert place["tp"].intra_node and place["dp"].intra_node and not place["pp"].intra_node
    assert place["pp"].nodes_per_group == 2
    assert m.placement_warnings(8) == []
    bad = Mesh({"tp": 4, "dp": 4})                     # tp strided across both nodes
    warnings = bad.placement_warnings(8)
    assert len(warnings) == 1 and "'tp'" in warnings[0] and "spans 2 nodes" in warnings[0]


@pytest.mark.parametrize("dims, text", [({}, "at least one dimension"), ({"dp": 0}, "whole number >= 1"),
                                        ({"dp": 2.5}, "whole number"), ({"d p": 2}, "must be a word")])
def test_bad_meshes_are_config_errors(dims, text):
    with pytest.raises(ConfigError, match=text):
        Mesh(dims)


def test_check_world_names_the_product():
    with pytest.raises(ConfigError, match=r"pp 2 x dp 3 = 6 ranks, but the world has 8"):
        Mesh({"pp": 2, "dp": 3}).check_world(8)


@pytest.fixture(scope="module")
def torch_groups():
    """One gloo launch per world size: every rank's groups in every dimension of every shape."""
    from distlab.runtime.ranks.launch import launch
    out = {}
    for world, shapes in SHAPES.items():
        flatten = [next((list(f) for f in FLATTEN if all(n in dict(s) for n in f)), None) for s in shapes]
        payload = {"shapes": [[list(d) for d in s] for s in shapes], "flatten": flatten}
        out[world] = (launch("distlab.runtime.measure.mesh_probe:mesh_groups_task", payload, world, backend="gloo",
                             timeout=120), flatten)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", sorted(SHAPES))
def test_same_groups_as_init_device_mesh(torch_groups, world):
    per_rank, flatten = torch_groups[world]
    for i, dims in enumerate(SHAPES[world]):
        m = Mesh(dict(dims))
        for rank in range(world):
            got = per_rank[rank][i]
            assert tuple(got["names"]) == m.names
            for name in m.names:
                assert tuple(got["groups"][name]) == m.group_of(rank, name), (dims, rank, name)
            if flatten[i]:
                key = "+".join(flatten[i])
                assert tuple(got["groups"][key]) == m.group_of(rank, tuple(flatten[i])), (dims, rank, key)
                assert m.flatten(tuple(flatten[i]), "f").group_of(rank, "f") == tuple(got["groups"][key])
