"""The images of a group under Γ (sim/kernel/subgroups.py), and which of them need no expansion of their own.

    >>> from distlab.sim.kernel.equivariance import Shifts
    >>> s = Shifts(nodes=4, gpus=2, node_step=1, local_step=1)
    >>> sorted(images_of(s, s.elements(), (0, 1)))           # a whole node: one image per node
    [(0, 1), (2, 3), (4, 5), (6, 7)]

Images: {γ(g) : γ in Γ}, each with the first element of ``Shifts.elements()`` that makes it, in the order a dict
built over the elements from the last to the first lists them (what subgroups.py always used). Made from the
stabilizer of g (the elements mapping g onto itself): an image per coset, not one per element, so a group of a
thousand ranks on a Γ of 10^4 elements costs its images, not 10^7 renamed ranks.

Order-preserving renamings (``moves_in_order``): an element d of Γ that maps the members of a group, sorted,
onto the members of another, sorted (whole nodes moved without wrapping around, local ranks rotated without
wrapping inside a node where the group has several), maps that group's collective expansion onto the other's.
The collectives read a group as a set ordered by (node, local rank) (sim/collectives: ``Context.nodes_of``,
``sorted(group)``; the per-peer sizes of an all_to_all are refused by find_classes) and the fabric by its links,
and d is an automorphism of the fabric (Shifts; Topology.keeps): the expansion on d(g) is d applied to the one on
g, step by step, flow by flow, link by link. subgroups.py expands one group per such family (a *base*) and
renames it for the others, its links too (``link_renamer``: the fabric's links are made per GPU, NIC, node and
leaf, so a renaming of ranks renames them); tests/test_symmetry_scale.py compares with the plain renamings.
"""
from __future__ import annotations

import numpy as np


def images_of(shifts, elements: list, group: tuple) -> dict:
    """{sorted image tuple: the first element making it} (module docstring)."""
    arr = np.array(group, dtype=np.int64)
    index = {e: k for k, e in enumerate(elements)}
    grid = np.array(elements, dtype=np.int64).reshape(-1, 3)
    lands = np.isin(_apply_many(shifts, grid, arr[:1])[:, 0], arr)         # where the first member goes
    candidates, want, stabilizer = grid[lands], np.sort(arr), []
    step = max(1, (1 << 22) // len(arr))                  # at most ~4M renamed ranks at a time
    for k in range(0, len(candidates), step):
        chunk = candidates[k:k + step]
        same = (np.sort(_apply_many(shifts, chunk, arr), axis=1) == want).all(axis=1)
        stabilizer += [tuple(e) for e in chunk[same].tolist()]
    covered = np.zeros(len(elements), dtype=bool)
    found = []                                   # (largest index of the coset, image, its first element)
    for k, e in enumerate(elements):
        if covered[k]:
            continue
        last = k
        for s in stabilizer:
            j = index.get(shifts.compose(e, s))
            if j is None:                        # Γ not closed under compose here: the plain way
                return {tuple(np.sort(shifts.apply_array(x, arr)).tolist()): x for x in reversed(elements)}
            covered[j] = True
            last = max(last, j)
        found.append((last, tuple(np.sort(shifts.apply_array(e, arr)).tolist()), e))
    found.sort(key=lambda t: -t[0])
    return {img: e for _, img, e in found}


def _apply_many(shifts, grid: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Shifts.apply_array for many elements at once (rows of ``grid``): one row of renamed ranks per element."""
    n, l = np.divmod(ranks[None, :], shifts.gpus)
    b, o = np.divmod(n, shifts.width)
    i, j, t = grid[:, :1], grid[:, 1:2], grid[:, 2:3]
    return ((b + j) % shifts.blocks * shifts.width + (o + i) % shifts.width) * shifts.gpus + (l + t) % shifts.gpus


def moves_in_order(shifts, d, sorted_from: np.ndarray, sorted_to: np.ndarray) -> bool:
    """Does element ``d`` map the sorted members ``sorted_from`` onto ``sorted_to`` member by member?"""
    return bool(np.array_equal(shifts.apply_array(d, sorted_from), sorted_to))


def renamed_rows(shifts, d, rows: np.ndarray) -> np.ndarray:
    """Sorted flows (src, dst, bytes rows) renamed by ``d`` and sorted again."""
    out = np.stack([shifts.apply_array(d, rows[0].astype(np.int64)).astype(float),
                    shifts.apply_array(d, rows[1].astype(np.int64)).astype(float), rows[2]])
    return out[:, np.lexsort(out[::-1])] if out.shape[1] else out


def link_renamer(topo, links: list):
    """A function of a renaming of ranks that maps the fabric onto itself (ranks array -> ranks array: a
    Shifts element applied) that returns the set of ``links`` renamed: a GPU's links go with the GPU, NIC k
    of node n with GPU k of node n (its rail), a node's uplinks with its GPU 0, a leaf's with its first node
    (and rail). One array op per renaming (sim/kernel/subgroups.py renames a base's links per image)."""
    g = topo.cluster.gpus_per_node
    parts = [_link_parts(topo, link) for link in links]
    proxies = np.array([_proxy(kind, a, k, g, topo.nodes_per_leaf) for kind, a, k in parts], dtype=np.int64)
    seconds = np.array([k if kind == "mesh" else 0 for kind, a, k in parts], dtype=np.int64)
    tables = {"up": topo._up, "down": topo._down, "nic_up": topo._nic_up, "nic_down": topo._nic_down,
              "node_up": topo._node_up, "node_down": topo._node_down, "leaf_up": topo._leaf_up,
              "leaf_down": topo._leaf_down, "mesh": topo._mesh}
    nics = topo.cluster.inter_node.nics_per_node if topo.cluster.inter_node is not None else 1

    def renamed(rename) -> set:
        ranks, second = rename(proxies).tolist(), rename(seconds).tolist()
        out = set()
        for (kind, _, k), r, r2 in zip(parts, ranks, second):
            if kind in ("up", "down"):
                key = r
            elif kind == "mesh":
                key = (r, r2)
            elif kind in ("nic_up", "nic_down"):
                key = (r // g, r % g % nics)
            elif kind in ("node_up", "node_down"):
                key = r // g
            else:
                key = (topo.leaf_of(r // g), None if k is None else r % g % nics)
            out.add(tables[kind][key])
        return out
    return renamed


def _link_parts(topo, link: int) -> tuple:
    """(kind, index, second index) of a link, from the dictionaries that made it (found once per link)."""
    if not hasattr(topo, "_parts"):
        topo._parts: dict = {}
        topo._tables = [(kind, table, list(table)) for kind, table in (
            ("up", topo._up), ("down", topo._down), ("mesh", topo._mesh), ("nic_up", topo._nic_up),
            ("nic_down", topo._nic_down), ("node_up", topo._node_up), ("node_down", topo._node_down),
            ("leaf_up", topo._leaf_up), ("leaf_down", topo._leaf_down)) if table]
    hit = topo._parts.get(link)
    if hit is None:
        for kind, table, keys in topo._tables:
            key = _key_of(table, keys, link)
            if key is not None:
                hit = topo._parts[link] = (kind,) + (key if isinstance(key, tuple) else (key, None))
                break
    return hit


def _proxy(kind: str, a: int, k, g: int, nodes_per_leaf: int) -> int:
    """The rank whose renaming tells where a link goes (link_renamer)."""
    if kind in ("up", "down", "mesh"):
        return a
    if kind in ("nic_up", "nic_down"):
        return a * g + k
    if kind in ("node_up", "node_down"):
        return a * g
    return a * nodes_per_leaf * g + (k or 0)


def _key_of(table: dict, keys: list, link: int):
    """The key of ``table`` (one kind of link; ids grow in its insertion order, ``keys`` that order) whose value
    is ``link``, or None: a binary search."""
    lo, hi = 0, len(keys) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        v = table[keys[mid]]
        if v == link:
            return keys[mid]
        lo, hi = (mid + 1, hi) if v < link else (lo, mid - 1)
    return None
