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
renames it for the others; tests/test_symmetry.py compares with expanding every image.
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
