"""Ring algorithms (NCCL's default for large messages; Thakur, Rabenseifner & Gropp 2005; nccl-tests PERFORMANCE.md).

all_reduce: reduce-scatter then all-gather around a ring, 2(n-1) steps of S/n bytes:
    t = 2(n-1)·α + 2(n-1)/n · S·β
all_gather, reduce_scatter: n-1 steps of S/n bytes:   t = (n-1)·α + (n-1)/n · S·β
broadcast, reduce: a chain from (to) the root, pipelined in k = num_chunks(S) chunks (k = 1 when n = 2):
    t = (n-2+k)·(α + S/k·β)
barrier: a ring all-reduce of zero bytes: t = 2(n-1)·α
On several nodes the ring is split into C channels (C = NICs per node), each carrying S/C, each crossing nodes
on its own rail, as NCCL's rings do; inside a node channel c starts at local rank c. A step's α is then the mean
hop latency along a chunk's path (path_latency), not the slowest link's.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from distlab.sim.collectives.common import num_chunks

NAME, NCCL_NAME = "ring", "Ring"
PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_AUTO = True           # `auto` may pick it on NCCL clusters
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "barrier")


def check(ctx, group) -> None:
    return None


def ring_orders(ctx, group) -> list[list[int]]:
    """One rank order per channel: nodes in order, each node's members rotated by the channel index."""
    by_node = ctx.nodes_of(group)
    if len(by_node) == 1:
        return [list(next(iter(by_node.values())))]
    inter = ctx.cluster.inter_node
    channels = max(1, min(inter.nics_per_node, min(len(m) for m in by_node.values())))
    orders = []
    for c in range(channels):
        order = []
        for members in by_node.values():
            k = c % len(members)
            order.extend(members[k:] + members[:k])
        orders.append(order)
    return orders


def steps(ctx, op, group, nbytes, root):
    n = len(group)
    if n == 1:
        return
    if op in ("broadcast", "reduce"):
        yield from _chain(ctx, op, group, nbytes, root)
        return
    orders = ring_orders(ctx, group)
    key = ("ring", tuple(tuple(o) for o in orders))
    pairs = ctx.pairs(key, lambda: [(o[i], o[(i + 1) % n]) for o in orders for i in range(n)])
    if pairs.hw == 2:
        pairs = ctx.cached(("ring-path",) + key, lambda: path_latency(ctx, pairs, len(ctx.nodes_of(group)), n))
    per_flow = 0.0 if op == "barrier" else nbytes / (n * len(orders))
    n_steps = n - 1 if op in ("all_gather", "reduce_scatter") else 2 * (n - 1)
    for _ in range(n_steps):
        yield pairs, per_flow, None


def path_latency(ctx, pairs, nodes: int, n: int):
    """A ring across N nodes: its steps are not globally synchronous; a chunk's path crosses nodes on N-1 of
    every n-1 hops, so the ring pays the hop latencies along that path (NCCL: (nsteps - nInterSteps) x intra +
    nInterSteps x inter, tuning.cc:411-412). Each step's latency is that path's mean hop:
        α_step = (1 - s)·α_intra + s·α_inter,   s = (N-1)/(n-1)
    Returns ``pairs`` with that latency (protocols weigh their per-hop extra by s too)."""
    per_flow = np.bincount(pairs.entry_flow, weights=ctx.topo.latency[pairs.entry_link], minlength=len(pairs))
    g = ctx.cluster.gpus_per_node
    crosses = pairs.src // g != pairs.dst // g
    lat_intra = float(per_flow[~crosses].max()) if (~crosses).any() else 0.0
    share = (nodes - 1) / (n - 1)
    intra_hw = 1 if ctx.cluster.intra_node.kind == "pcie" else 0
    latency = (1 - share) * lat_intra + share * float(per_flow[crosses].max())
    return replace(pairs, latency=latency, hw=intra_hw, net_share=share)


def _chain(ctx, op, group, nbytes, root):
    """Pipelined chain: link i (order[i] -> order[i+1]) carries chunk t-i at step t."""
    n = len(group)
    order = ring_orders(ctx, group)[0]
    at = order.index(root)
    order = order[at:] + order[:at]              # root first
    links = [(order[i], order[i + 1]) for i in range(n - 1)]
    if op == "reduce":                           # toward the root: the chain reversed
        links = [(b, a) for a, b in reversed(links)]
    k = 1 if n == 2 else num_chunks(nbytes)
    chunk = nbytes / k
    for t in range(n - 2 + k):
        lo, hi = max(0, t - k + 1), min(n - 2, t)
        active = tuple(links[lo:hi + 1])
        yield ctx.pairs(("chain", active), lambda a=active: list(a)), chunk, None
