"""Double binary tree all-reduce (NCCL >= 2.4; Sanders, Speck & Träff 2009; NVIDIA blog "Massively scale your
deep learning training with NCCL 2.4").

Two binary trees over the group, each carrying half the data: tree A is a heap over the ranks in order, tree B
the same heap over the ranks reversed, so a rank is interior in at most one tree. Each tree reduces up, then
broadcasts down, in k = num_chunks(S/2) pipelined chunks of c = S/(2k) bytes. D = floor(log2 n) is the depth.
Reduce and broadcast take D+k-1 steps each; in a full step the busiest link carries two chunks (two children
into one parent, or one rank sending up both trees), so on an uncontended fabric:
    t = 2(D+k-1)·α + (2·(2(D+k-1)) - e)·c·β
where e counts the steps whose busiest link carries one chunk: e = 2(D+k-1) when n = 2 (every step), e = 2 when
n = 2^D >= 4 (the first reduce step and the last broadcast step feed the single deepest rank), else e = 0.
For large S this tends to 2·S·β: the same bus bandwidth as the ring, with log-depth latency.
Simplification: NCCL overlaps the reduce and broadcast phases and builds the tree over nodes with chains inside
each node; here the tree spans the group's ranks directly.
"""
from __future__ import annotations

from sim.collectives import num_chunks

OPS = ("all_reduce", "barrier")


def check(ctx, group) -> None:
    return None


def depth(n: int) -> int:
    return n.bit_length() - 1


def _edges(order, d):
    """(child, parent) edges of the heap over ``order`` whose child sits at depth ``d``."""
    n = len(order)
    return [(order[j], order[(j - 1) // 2]) for j in range(2 ** d - 1, min(n, 2 ** (d + 1) - 1))]


def steps(ctx, op, group, nbytes, root):
    n = len(group)
    if n == 1:
        return
    order = [r for members in ctx.nodes_of(group).values() for r in members]
    trees = (order, order[::-1])
    D = depth(n)
    k = num_chunks(nbytes / 2)
    chunk = 0.0 if op == "barrier" else nbytes / (2 * k)
    for t in range(D + k - 1):                   # reduce: depth d sends chunk j at step j + (D - d)
        ds = tuple(d for d in range(1, D + 1) if 0 <= t - (D - d) <= k - 1)
        key = ("tree-up", tuple(order), ds)
        yield ctx.pairs(key, lambda ds=ds: [e for tr in trees for d in ds for e in _edges(tr, d)]), chunk, None
    for t in range(D + k - 1):                   # broadcast: depth d sends chunk j to depth d+1 at step j + d
        ds = tuple(d for d in range(0, D) if 0 <= t - d <= k - 1)
        key = ("tree-down", tuple(order), ds)
        yield ctx.pairs(key, lambda ds=ds: [(p, c) for tr in trees for d in ds for c, p in _edges(tr, d + 1)]), \
            chunk, None
