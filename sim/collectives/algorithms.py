"""The collective algorithms, declared once. Each module names itself (NAME), the collectives it implements
(OPS), the NCCL protocols it runs with (PROTOCOLS), NCCL's name for it (NCCL_NAME, None when NCCL has no such
algorithm), whether `auto` may pick it on NCCL clusters as NCCL's tuner would (NCCL_AUTO), ``check(ctx, group)``
and ``steps(ctx, op, group, nbytes, root)``.

The order below is the order `auto` tries them in (a tie goes to the earlier one); plan.ALGORITHMS and the
runtime's NCCL_ALGO map derive from it. Adding an algorithm: write its module, add it here.
"""
from __future__ import annotations

from distlab.sim.collectives import direct, hierarchical, nvls, nvls_tree, pat, ring, tree
from distlab.sim.errors import ConfigError

MODULES = (ring, tree, hierarchical, nvls, nvls_tree, pat, direct)
NAMES = tuple(m.NAME for m in MODULES)
BY_NAME = {m.NAME: m for m in MODULES}
NCCL_NAMES = {m.NAME: m.NCCL_NAME for m in MODULES if m.NCCL_NAME}   # for NCCL_ALGO


def supported(op: str) -> dict:
    """Which algorithms implement ``op``."""
    return {m.NAME: op in m.OPS for m in MODULES}


def module(algorithm: str, op: str):
    """The module of ``algorithm``, which must implement ``op``."""
    m = BY_NAME.get(algorithm)
    if m is None:
        raise ConfigError(f"unknown algorithm {algorithm!r}; allowed: auto, {', '.join(NAMES)}", "algorithm")
    if op not in m.OPS:
        allowed = [a for a, ok in supported(op).items() if ok]
        raise ConfigError(f"algorithm {algorithm!r} does not implement {op}; allowed: auto, {', '.join(allowed)}",
                          "algorithm")
    return m


def steps(ctx, op: str, group: tuple[int, ...], nbytes: float, algorithm: str, root: int = 0):
    """The steps of one collective (before its protocol is applied). ``ctx`` is a collectives Context."""
    m = module(algorithm, op)
    m.check(ctx, group)
    return m.steps(ctx, op, group, nbytes, root)
