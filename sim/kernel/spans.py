"""Time spans (start, end): their union and the overlap of two unions. The one home of this rule; used by the
step summary (sim/result.py), the time breakdown (sim/analysis.py), traces (sim/trace.py) and pipeline
metrics (sim/parallel/pipeline/metrics.py)."""
from __future__ import annotations


def union(spans) -> list[tuple[float, float]]:
    """Merge ``spans`` (any order) into disjoint, sorted spans; touching spans merge."""
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def union_length(spans) -> float:
    """Seconds covered by at least one span: sum over union(spans) of end - start."""
    return sum(e - s for s, e in union(spans))


def overlap(a, b) -> float:
    """Seconds covered by both ``a`` and ``b`` (each a list of disjoint spans, e.g. from :func:`union`): the sum
    of min(ends) - max(starts) over the pairs that intersect, found in one sweep over both sorted lists (the
    pairs in the order a quadratic double loop adds them)."""
    a, b = sorted(a), sorted(b)
    total, j = 0.0, 0
    for s1, e1 in a:
        while j < len(b) and b[j][1] <= s1:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e1:
            total += max(0.0, min(e1, b[k][1]) - max(s1, b[k][0]))
            k += 1
    return total
