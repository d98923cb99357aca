"""NVLS: all-reduce inside the NVSwitch (NVLink SHARP, NVSwitch gen 3, Hopper; NCCL >= 2.17).

Each GPU pushes its data into the switch, which reduces it and multicasts the result back (multimem loads and
stores). Per GPU the egress and ingress each carry (n+1)/n·S (its whole buffer for the reduction plus its own
slice of the result); the two directions overlap, pipelined in k = num_chunks(S) chunks:
    t = (k+1)·(α_nvls + (n+1)/(n·k) · S·β),   α_nvls = 25 µs (NCCL tuning.cc's NVLS latency)
One node only; the switch must support it (cluster intra_node.nvls).
"""
from __future__ import annotations

from distlab.sim.collectives import num_chunks
from distlab.sim.errors import ConfigError
from distlab.sim.network import SWITCH

OPS = ("all_reduce",)
NVLS_LATENCY_S = 25e-6     # NCCL src/graph/tuning.cc: NVLS latency 25 us (vs 0.6 us per NVLink hop)


def check(ctx, group) -> None:
    c = ctx.cluster
    if c.intra_node.kind != "nvswitch" or not c.intra_node.nvls:
        raise ConfigError(f"nvls needs an NVSwitch with in-switch reduction; cluster {c.name!r} has none", "algorithm")
    if len(ctx.nodes_of(group)) > 1:
        raise ConfigError("nvls runs inside one node; use hierarchical or ring across nodes", "algorithm")


def steps(ctx, op, group, nbytes, root):
    n = len(group)
    if n == 1:
        return
    g = tuple(sorted(group))
    k = num_chunks(nbytes)
    chunk = (n + 1) / n * nbytes / k
    up = ctx.pairs(("nvls-up", g), lambda: [(r, SWITCH) for r in g])
    both = ctx.pairs(("nvls-both", g), lambda: [(r, SWITCH) for r in g] + [(SWITCH, r) for r in g])
    down = ctx.pairs(("nvls-down", g), lambda: [(SWITCH, r) for r in g])
    alpha = NVLS_LATENCY_S
    for t in range(k + 1):
        yield (up if t == 0 else down if t == k else both), chunk, alpha
