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
Across nodes the trees follow NCCL's layout: a double binary tree over the nodes with a chain inside each node,
and C = min(NICs, g) / 2 channels, each a pair of trees carrying S/C, whose node heads use distinct NICs.
Simplification: NCCL overlaps the reduce and broadcast phases; here broadcast starts after the reduce.
"""
from __future__ import annotations

from distlab.sim.collectives import num_chunks

OPS = ("all_reduce", "barrier")


def check(ctx, group) -> None:
    return None


def depth(n: int) -> int:
    return n.bit_length() - 1


def heap_parents(order) -> dict:
    """child -> parent of a binary heap laid over ``order`` (position j has children 2j+1, 2j+2)."""
    return {order[j]: order[(j - 1) // 2] for j in range(1, len(order))}


def node_trees(by_node: list[list[int]]) -> tuple[dict, dict]:
    """NCCL's layout across nodes: a binary tree over the nodes (tree B over the nodes reversed) and a chain
    inside each node hanging below the node's head. Tree A's heads are local rank 0, tree B's the last local
    rank, so the two trees cross nodes on different NICs and run their chains in opposite directions."""
    trees = []
    for nodes, reverse in ((by_node, False), (by_node[::-1], True)):
        chains = [m[::-1] if reverse else m for m in nodes]       # a chain's head is its first rank
        parent = heap_parents([c[0] for c in chains])
        for c in chains:
            parent.update({c[i]: c[i - 1] for i in range(1, len(c))})
        trees.append(parent)
    return trees[0], trees[1]


def depths(parent: dict, ranks) -> dict:
    out = {}
    for r in ranks:
        d, x = 0, r
        while x in parent:
            x, d = parent[x], d + 1
        out[r] = d
    return out


def steps(ctx, op, group, nbytes, root):
    n = len(group)
    if n == 1:
        return
    by_node = list(ctx.nodes_of(group).values())
    if len(by_node) == 1 or len({len(m) for m in by_node}) > 1:
        order = [r for members in by_node for r in members]
        trees = [heap_parents(order), heap_parents(order[::-1])]
    else:                                    # channel c rotates each node by 2c: its heads use 2 more NICs
        g = len(by_node[0])
        channels = max(1, min(ctx.cluster.inter_node.nics_per_node, g) // 2)
        trees = [t for c in range(channels) for t in node_trees([m[2 * c:] + m[:2 * c] for m in by_node])]
    depth_of = [depths(t, group) for t in trees]
    D = max(max(d.values()) for d in depth_of)
    k = num_chunks(nbytes / len(trees))
    chunk = 0.0 if op == "barrier" else nbytes / (len(trees) * k)
    key = tuple(sorted(group))
    for t in range(D + k - 1):               # reduce: a rank at depth d sends chunk j up at step j + (D - d)
        edges = tuple((c, p) for tree, dep in zip(trees, depth_of) for c, p in tree.items()
                      if 0 <= t - (D - dep[c]) <= k - 1)
        yield ctx.pairs(("tree", key, edges), lambda e=edges: list(e)), chunk, None
    for t in range(D + k - 1):               # broadcast: a rank at depth d sends chunk j down at step j + d
        edges = tuple((p, c) for tree, dep in zip(trees, depth_of) for c, p in tree.items()
                      if 0 <= t - (dep[c] - 1) <= k - 1)
        yield ctx.pairs(("tree", key, edges), lambda e=edges: list(e)), chunk, None
