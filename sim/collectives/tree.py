"""Double binary tree all-reduce (NCCL >= 2.4; Sanders, Speck & Träff 2009; NVIDIA blog "Massively scale your
deep learning training with NCCL 2.4").

Two trees over the group, each carrying half the data. Across nodes (NCCL's layout) a double binary tree over the
nodes with a chain inside each node; inside one node NCCL's tree is that chain (two chains, run opposite ways,
D = n - 1); with unequal members per node, tree A is a heap over the ranks in order and tree B the same heap over
the ranks reversed (D = floor(log2 n)). D is the depth.
Each tree reduces up and broadcasts down in k = num_chunks(S/2) pipelined chunks of c = S/(2k) bytes, and, as in
NCCL, the two phases overlap: the root broadcasts chunk j as soon as it has reduced it, so a chunk runs through
2D stages (D levels up, D levels down) and the collective takes 2D + k - 1 steps (common.pipeline). The hop
latency is paid while the pipeline fills (2D steps: NCCL's tree latency is per level, tuning.cc:416):
    t = 2D·α + Σ_t L_t·c·β,   L_t = chunks on the busiest link at step t
For n = 2 that is exactly 2α + S·β. Otherwise a busy rank sends up to 4 chunks a step (up and down in both
trees), so Σ L_t = 4k + O(D) and t tends to 2·S·β for large S: the ring's bus bandwidth (x n/(n-1)), with
latency 2D·α instead of the ring's 2(n-1)·α (log-depth across nodes). Across nodes there are C = min(NICs, g) / 2
channels, each a pair of trees carrying S/C, whose node heads use distinct NICs.
"""
from __future__ import annotations

from distlab.sim.collectives.common import num_chunks, pipeline

NAME, NCCL_NAME = "tree", "Tree"
PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_AUTO = True           # `auto` may pick it on NCCL clusters
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
    if len(by_node) == 1:                    # NCCL: inside a node the "tree" is a chain (two, opposite ways)
        trees = list(node_trees(by_node))
    elif len({len(m) for m in by_node}) > 1:
        order = [r for members in by_node for r in members]
        trees = [heap_parents(order), heap_parents(order[::-1])]
    else:                                    # channel c rotates each node by 2c: its heads use 2 more NICs
        g = len(by_node[0])
        channels = max(1, min(ctx.cluster.inter_node.nics_per_node, g) // 2)
        trees = [t for c in range(channels) for t in node_trees([m[2 * c:] + m[:2 * c] for m in by_node])]
    depth_of = [depths(t, group) for t in trees]
    D = max(max(d.values()) for d in depth_of)
    per_tree = 0.0 if op == "barrier" else nbytes / len(trees)
    stages = [[] for _ in range(2 * D)]       # up: child at depth d sends in stage D - d; down: stage D + d - 1
    for tree, dep in zip(trees, depth_of):
        for c, p in tree.items():
            stages[D - dep[c]].append((c, p, per_tree))
            stages[D + dep[c] - 1].append((p, c, per_tree))
    yield from pipeline(ctx, ("tree", tuple(sorted(group))), stages, num_chunks(per_tree), nbytes)
