"""Groups of a step's flows for sim/kernel/netloop.py: flows of one step that have the same size and have had the same
rate at every network event so far have the same bytes left, so the loop keeps one number per group (a ring step
is one group) and splits a group when its flows' rates differ (max-min rates of symmetric flows are equal: groups
rarely split). A step of many groups (an uneven all-to-all) keeps its numbers in numpy arrays instead of lists.
"""
from __future__ import annotations

import math

import numpy as np

INF = math.inf
WIDE = 64             # more groups in a step than this: numpy arrays instead of lists


class Groups:
    """A partition of one step's flows (``pairs``) into ``n`` groups of equal size and equal rates so far: ``gid``
    maps a flow to its group (the sizes are the batch's: steps of other sizes on the same pairs share the groups,
    and so the cached rates). Wide (more than WIDE groups: uneven all-to-alls): a batch's bytes left, rates and
    thresholds are numpy arrays, not lists."""

    __slots__ = ("pairs", "gid", "n", "all_done", "wide", "_alive", "__weakref__")

    def __init__(self, pairs, gid: np.ndarray, n: int):
        self.pairs, self.gid, self.n = pairs, gid, n
        self.wide = n > WIDE
        self.all_done = (1 << n) - 1
        self._alive: dict = {}

    def alive(self, done: int) -> np.ndarray:
        """The flows not yet ended when the groups in bit mask ``done`` have ended."""
        mask = self._alive.get(done)
        if mask is None:
            mask = ~bits(done, self.n)[self.gid]
            if not self.wide:
                self._alive[done] = mask
        return mask

    def split(self, rates: np.ndarray, done: int):
        """(groups, parent group of each, done mask, rate of each group) once every group's flows got ``rates``:
        the same groups if each group's flows have one rate, else groups split by rate."""
        order = np.lexsort((rates, self.gid))
        g, r = self.gid[order], rates[order]
        first = np.ones(len(g), dtype=bool)
        first[1:] = (g[1:] != g[:-1]) | (r[1:] != r[:-1])
        group_rates = r[first]
        if len(group_rates) == self.n:
            return self, None, done, group_rates if self.wide else group_rates.tolist()
        parent = g[first]
        gid = np.empty(len(g), dtype=np.int64)
        gid[order] = np.cumsum(first) - 1
        child = Groups(self.pairs, gid, len(parent))
        done = sum(1 << i for i in np.flatnonzero(bits(done, self.n)[parent]).tolist())
        if child.wide:
            return child, parent, done, group_rates
        return child, parent.tolist(), done, group_rates.tolist()


def initial(groups: Groups, size: list) -> tuple:
    """(groups, thresholds, bytes left, ended groups: those with nothing to move) of a step at its start."""
    threshold, left = [1e-9 * max(x, 1.0) for x in size], [max(x, 0.0) for x in size]
    if groups.wide:
        threshold, left = np.array(threshold), np.array(left)
    return groups, threshold, left, sum(1 << g for g, x in enumerate(size) if x <= 0)


def bits(mask: int, n: int) -> np.ndarray:
    """Bit mask -> n booleans."""
    return np.unpackbits(np.frombuffer(mask.to_bytes(n // 8 + 1, "little"), dtype=np.uint8),
                         bitorder="little")[:n].astype(bool)


def wide_time(left: np.ndarray, rates: np.ndarray) -> float:
    """The least time for a wide batch's group to end at its rate (inf if none moves)."""
    moving = rates > 0
    return float(np.min(left[moving] / rates[moving])) if moving.any() else INF


def wide_move(b, elapsed: float, tol: float) -> int:
    """A wide batch's groups move rate x elapsed (as the list path); returns its ended groups' bit mask."""
    rates = b.rates
    moving = rates > 0
    left = b.left = b.left - rates * elapsed
    just = moving & ((left <= b.threshold) | (left <= rates * tol))
    if not just.any():
        return b.done
    left[just] = 0.0
    return b.done | sum(1 << g for g in np.flatnonzero(just).tolist())
