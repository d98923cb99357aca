"""PAT (Parallel Aggregated Trees, NCCL >= 2.23): all_gather and reduce_scatter in log2(n) steps, for one GPU
per node (NCCL enables it only when nNodes == nRanks, tuning.cc:215-223).

Modelled as Bruck's all-gather (Bruck et al. 1997), which moves the same data in the same number of steps:
at step i (d = 2^i) rank r sends the min(d, n - d) blocks of S/n it holds to rank r - d; reduce_scatter runs the
steps in reverse order (distance halving), reducing instead of copying. Σ blocks = n - 1, so
    t = B + ceil(log2 n)·α + (n-1)/n · S·β / 0.75
B = 8 us + 2.8 us x n (baseLatency and NCCL's "linear part", tuning.cc:154, :431-433); 0.75: NCCL's PAT
bandwidth factor (tuning.cc:337). Simple protocol only.
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError

NAME, NCCL_NAME = "pat", "PAT"
PROTOCOLS = ("Simple",)
NCCL_AUTO = True           # `auto` may pick it on NCCL clusters
OPS = ("all_gather", "reduce_scatter")


def check(ctx, group) -> None:
    by_node = ctx.nodes_of(group)
    if len(by_node) != len(group):
        most = max(len(m) for m in by_node.values())
        raise ConfigError(f"pat needs one GPU per node (NCCL runs PAT only then); this group has {most} on one "
                          "node; allowed there: ring", "algorithm")


def steps(ctx, op, group, nbytes, root):
    n = len(group)
    order = sorted(group)
    plan = []
    d = 1
    while d < n:
        plan.append((d, min(d, n - d)))
        d *= 2
    if op == "reduce_scatter":
        plan.reverse()
    for d, blocks in plan:
        pairs = ctx.pairs(("pat", tuple(order), d), lambda d=d: [(order[i], order[(i - d) % n]) for i in range(n)])
        yield pairs, blocks * nbytes / n, None
