"""Token routing: how many token copies each rank sends to each expert, and so to each expert-parallel rank.

Expert load: expert e gets a share p_e ∝ (e + 1)^-skew of the routed token copies (a Zipf law; skew 0 =
balanced, what an auxiliary-loss-free balancer aims at, DeepSeek-V3 2412.19437 sec. 2.1.2). Experts are
sharded contiguously over the ep ranks, E/ep each (torchtitan's GroupedExperts, Shard(0)), so a skew loads the
first ranks most. Each source rank routes T·top_k copies: count_e = T·top_k·p_e, rounded by largest remainder
so they sum to T·top_k; with a capacity factor c an expert keeps at most ceil(c·T·top_k/E) of them (GShard
2006.16668: over-capacity tokens are dropped).

Node-limited routing (DeepSeek-V3 sec. 2.1.2: each token goes to at most M nodes): a rank's tokens use only
the experts on M nodes (its own node and the next M-1), loads renormalised over them. The dispatch all-to-all
then moves tokens[i][j] = Σ_{e on rank j} count_i,e copies of h x dtype bytes from rank i to rank j; the
combine all-to-all moves the transpose back.
"""
from __future__ import annotations

import math


def expert_shares(experts: int, skew: float = 0.0) -> list[float]:
    """p_e ∝ (e + 1)^-skew, summing to 1."""
    w = [(e + 1) ** -skew for e in range(experts)]
    total = sum(w)
    return [x / total for x in w]


def largest_remainder(total: int, shares: list[float]) -> list[int]:
    """Whole numbers summing to ``total``, as close to total x shares as rounding allows (ties: lower index)."""
    raw = [total * s for s in shares]
    out = [math.floor(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - out[i]), i))
    for i in order[:total - sum(out)]:
        out[i] += 1
    return out


def expert_counts(tokens: int, top_k: int, experts: int, skew: float = 0.0, capacity_factor: float | None = None,
                  allowed: list[int] | None = None) -> list[int]:
    """Token copies one source rank sends to each expert (only ``allowed`` experts when given)."""
    shares = expert_shares(experts, skew)
    if allowed is not None:
        keep = set(allowed)
        shares = [s if e in keep else 0.0 for e, s in enumerate(shares)]
        total = sum(shares)
        shares = [s / total for s in shares]
    counts = largest_remainder(tokens * top_k, shares)
    if capacity_factor is not None:
        cap = math.ceil(capacity_factor * tokens * top_k / experts)
        counts = [min(n, cap) for n in counts]
    return counts


def routing(tokens: int, top_k: int, experts: int, ep: int, skew: float = 0.0,
            capacity_factor: float | None = None, nodes: list[int] | None = None,
            node_limit: int | None = None) -> list[list[int]]:
    """counts[i][e]: token copies ep rank i sends to expert e. ``nodes[j]``: the node of ep rank j (for
    node-limited routing with at most ``node_limit`` nodes per token)."""
    per_rank = experts // ep
    out = []
    for i in range(ep):
        allowed = None
        if node_limit is not None and nodes is not None:
            order = sorted(set(nodes))
            k = order.index(nodes[i])
            chosen = {order[(k + d) % len(order)] for d in range(min(node_limit, len(order)))}
            allowed = [e for e in range(experts) if nodes[e // per_rank] in chosen]
        out.append(expert_counts(tokens, top_k, experts, skew, capacity_factor, allowed))
    return out


def token_matrix(counts: list[list[int]], ep: int) -> list[list[int]]:
    """tokens[i][j]: copies rank i sends to rank j (the experts of rank j are j·E/ep .. (j+1)·E/ep - 1)."""
    per_rank = len(counts[0]) // ep
    return [[sum(row[j * per_rank:(j + 1) * per_rank]) for j in range(ep)] for row in counts]
