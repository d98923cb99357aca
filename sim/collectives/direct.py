"""Direct all-to-all: every rank sends S/n to every other rank at once (NCCL's all-to-all is grouped
send/recv). On a non-blocking switch each rank's egress carries n-1 flows of S/n:
    t = α + (n-1)/n · S·β
"""
from __future__ import annotations

NAME, NCCL_NAME = "direct", None
PROTOCOLS = ("Simple",)
NCCL_AUTO = True           # `auto` may pick it on NCCL clusters
OPS = ("all_to_all",)


def check(ctx, group) -> None:
    return None


def steps(ctx, op, group, nbytes, root):
    n = len(group)
    if n == 1:
        return
    g = tuple(sorted(group))
    yield ctx.pairs(("a2a", g), lambda: [(a, b) for a in g for b in g if a != b]), nbytes / n, None
