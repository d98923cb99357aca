"""Arrival skew: a collective starts when the last member of its group arrives.

Between two synchronizations each rank computes for mu seconds on average, but not exactly: on a shared CPU the
OS preempts, caches and memory bandwidth vary. The delays are many small independent ones, so their variance
grows with the time computed (a compound Poisson process: variance proportional to duration, Ross, "Stochastic
Processes" 1996, ch. 2): a rank's compute of mean mu has standard deviation sigma = sqrt(J x mu), J =
``Cluster.compute_jitter`` in seconds. (Measured here, 2 gloo ranks, FSDP2 steps: the rank-to-rank spread of 1.7,
9 and 15 ms segments is 15-25%, 4-8% and 3-7% of their length; a constant coefficient of variation would give
one figure for all three; sqrt(J mu) with J from the 90 ms forward+backward gives 15%, 6.7% and 5%.)

The n members arrive at mu + sigma Z_i with Z_i independent standard normal, so the collective starts, in
expectation, at mu + sigma e_n, e_n = E[max of n standard normals] = integral of n x phi(x) Phi(x)^(n-1) dx
(David & Nagaraja, "Order Statistics", 3rd ed. 2003, sec. 4.2 and Tippett 1925's table: e_2 = 1/sqrt(pi) =
0.5642, e_4 = 1.0294, e_8 = 1.4236). The engine charges sigma e_n once per collective, with mu the largest compute
time any member did since its previous collective: deterministic and the same for every member, so the
symmetric reductions (sim/kernel/symmetry.py, sim/kernel/subgroups.py) stay exact.
"""
from __future__ import annotations

import math
from functools import lru_cache

STEPS = 4000          # trapezoid points over [-LIMIT, LIMIT]: e_n to better than 1e-9 for n up to 10^6
LIMIT = 9.0


@lru_cache(maxsize=None)
def expected_max_normal(n: int) -> float:
    """e_n = E[max of n independent standard normals] (0 for n = 1), by the trapezoid rule on
    n x phi(x) Phi(x)^(n-1)."""
    if n <= 1:
        return 0.0
    h, total = 2 * LIMIT / STEPS, 0.0
    for i in range(STEPS + 1):
        x = -LIMIT + i * h
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        cdf = 0.5 * math.erfc(-x / math.sqrt(2))
        w = 0.5 if i in (0, STEPS) else 1.0
        total += w * x * n * pdf * cdf ** (n - 1)
    return total * h


def arrival_skew(jitter: float, computed_s: float, n: int) -> float:
    """Seconds a collective of ``n`` members starts after the mean arrival: e_n x sqrt(jitter x computed_s)."""
    if jitter <= 0 or computed_s <= 0 or n <= 1:
        return 0.0
    return expected_max_normal(n) * math.sqrt(jitter * computed_s)
