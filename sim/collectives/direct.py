"""Direct all-to-all: every rank sends to every other rank at once (NCCL's all-to-all is grouped send/recv:
ncclGroupStart, one ncclSend and one ncclRecv per peer, ncclGroupEnd; nccl-tests src/alltoall.cu).

Even sizes (S/n to each peer): on a non-blocking switch each rank's egress carries n-1 flows of S/n:
    t = α + (n-1)/n · S·β
Across N nodes of g GPUs with one NIC per GPU of bandwidth B, (n-g)/n of S leaves the node through the NIC, so
t ≈ α + (n-g)/n · S / B and nccl-tests' busbw = algbw·(n-1)/n = S/t·(n-1)/n (doc/PERFORMANCE.md, alltoall).

Per-peer sizes (``splits[i][j]`` bytes from member i to member j, torch's ``all_to_all_single`` split sizes):
one step of flows (i, j) of size splits[i][j] (i != j; the diagonal is a local copy), sharing links max-min
fairly (sim/kernel/network.py). The slowest peer pair decides: on a non-blocking switch
    t = α + max over members of max(Σ_j≠i splits[i][j] / B_out(i), Σ_j≠i splits[j][i] / B_in(i)),
the busiest sender's egress or the busiest receiver's ingress (exact when the flows on that link are equal).
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


def split_steps(ctx, group, splits):
    """The one step of an all-to-all with per-peer sizes (``splits`` in ``group`` order); empty flows left out."""
    group = tuple(group)
    flows = [(group[i], group[j], row[j]) for i, row in enumerate(splits) for j in range(len(group))
             if i != j and row[j] > 0]
    if not flows:
        return
    pairs = ctx.pairs(("a2a-split", group, tuple((a, b) for a, b, _ in flows)), lambda: [(a, b) for a, b, _ in flows])
    yield pairs, ctx.sizes(("a2a-split", group, splits), lambda: [s for _, _, s in flows]), None
