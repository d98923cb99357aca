"""NVLS-tree: NVLS inside every node and a double binary tree across nodes (NCCL >= 2.18, "NVLSTree").

With N nodes of g GPUs: every GPU pushes S into its node's switch, which reduces it and hands GPU j the node's
slice j (S/g); GPU j runs a double binary tree over the nodes on its rail (local rank j of every node: two trees,
each carrying half the slice, reduce and broadcast overlapped as in tree.py); then it pushes its slice back and
the switch multicasts S to every GPU of the node. One chunk runs through 2 + 2D + 2 stages (D = floor(log2 N)),
pipelined in k = num_chunks(S) chunks (common.pipeline). With g >= 2 the NICs bound it: each rail's NIC
carries at most 4 tree chunks of S/(2gk) per step (2 when N = 2, NCCL's "2 node case", tuning.cc:320), the
NVLink ports (1 + 1/g)·S/k:
    t ≈ B + (2D+4)·α + (k+2D+3)/k · max((1+1/g)·S·β_nvlink, L·S/(2g)·β_nic) / e,  L = 2 (N = 2) or 4
B = 25 us once per call (NVLS latency, tuning.cc:161, :428); each tree step across nodes pays NCCL's NVLSTree
NET hop latency over the ring's (20.9 - 2.7 us, tuning.cc:173); e = nvlsEfficiency (tuning.cc:139-144).
"""
from __future__ import annotations

from distlab.sim.collectives.common import num_chunks, pipeline
from distlab.sim.collectives.nvls import check_switch
from distlab.sim.collectives.tree import depths, heap_parents
from distlab.sim.errors import ConfigError
from distlab.sim.kernel.network import SWITCH

NAME, NCCL_NAME = "nvls_tree", "NVLSTree"
PROTOCOLS = ("Simple",)
NCCL_AUTO = True           # `auto` may pick it on NCCL clusters
OPS = ("all_reduce",)


def check(ctx, group) -> None:
    check_switch(ctx, NAME)
    by_node = ctx.nodes_of(group)
    if len(by_node) < 2:
        raise ConfigError("nvls_tree runs across nodes; inside one node use nvls", "algorithm")
    if len({len(m) for m in by_node.values()}) > 1:
        raise ConfigError("nvls_tree needs the same number of group members on every node", "algorithm")


def steps(ctx, op, group, nbytes, root):
    by_node = list(ctx.nodes_of(group).values())
    g = len(by_node[0])
    rails = [[m[j] for m in by_node] for j in range(g)]
    trees = [t for rail in rails for t in (heap_parents(rail), heap_parents(rail[::-1]))]
    depth_of = [depths(t, t.keys() | set(t.values())) for t in trees]
    D = max(max(d.values()) for d in depth_of)
    ranks = [r for m in by_node for r in m]
    half_slice = nbytes / (2 * g)
    tree_stages = [[] for _ in range(2 * D)]
    for tree, dep in zip(trees, depth_of):
        for c, p in tree.items():
            tree_stages[D - dep[c]].append((c, p, half_slice))
            tree_stages[D + dep[c] - 1].append((p, c, half_slice))
    stages = ([[(r, SWITCH, nbytes) for r in ranks], [(SWITCH, r, nbytes / g) for r in ranks]] + tree_stages
              + [[(r, SWITCH, nbytes / g) for r in ranks], [(SWITCH, r, nbytes) for r in ranks]])
    yield from pipeline(ctx, ("nvls_tree", tuple(ranks)), stages, num_chunks(nbytes), nbytes)
