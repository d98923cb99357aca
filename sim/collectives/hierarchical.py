"""Hierarchical all-reduce (Horovod's hierarchical allreduce; NCCL's CollNet/NVLS+tree follow the same idea).

With N nodes of g members each: reduce-scatter inside every node (ring), then all-reduce of S/g per rail
across nodes (local rank j of every node forms ring j over the nodes), then all-gather inside every node:
    t = 2(g-1)·(α_intra + S/g·β_intra) + 2(N-1)·(α_inter + S/(g·N)·β_inter)
The rails run in parallel on their own NICs, so crossing nodes moves only S/g per GPU per direction-step.
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError

NAME, NCCL_NAME = "hierarchical", None
PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_AUTO = False          # not an NCCL algorithm: `auto` picks it on Gloo clusters only
OPS = ("all_reduce",)


def check(ctx, group) -> None:
    sizes = {len(m) for m in ctx.nodes_of(group).values()}
    if len(sizes) > 1:
        raise ConfigError(f"hierarchical needs the same number of group members on every node, got {sorted(sizes)}",
                          "algorithm")


def steps(ctx, op, group, nbytes, root):
    by_node = list(ctx.nodes_of(group).values())
    g, N = len(by_node[0]), len(by_node)
    if g * N == 1:
        return
    if g > 1:
        intra = ctx.pairs(("hier-intra", tuple(map(tuple, by_node))),
                          lambda: [(m[i], m[(i + 1) % g]) for m in by_node for i in range(g)])
        for _ in range(g - 1):
            yield intra, nbytes / g, None
    if N > 1:
        rails = [[m[j] for m in by_node] for j in range(g)]
        inter = ctx.pairs(("hier-inter", tuple(map(tuple, rails))),
                          lambda: [(r[i], r[(i + 1) % N]) for r in rails for i in range(N)])
        for _ in range(2 * (N - 1)):
            yield inter, nbytes / (g * N), None
    if g > 1:
        for _ in range(g - 1):
            yield intra, nbytes / g, None
