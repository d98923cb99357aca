"""Which nodes each job gets: explicit node lists first, then the policies, job by job in file order.

    place([4, "packed", "spread"], nodes=16, nodes_per_leaf=4)   # nodes [0..3]; a list given as is
    -> [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 12, 13)]              (the second job packed, the third spread)

- ``packed``: contiguous free nodes under as few leaf switches as possible (Slurm's topology/tree plugin aims the
  same way: the fewest switches, then the lowest nodes); where no contiguous run is free, the leaves with the
  most free nodes first. Without leaf switches: the lowest free nodes.
- ``spread``: one node per leaf in turn (leaf 0, leaf 1, ..., then the next node of leaf 0): every leaf carries a
  share of the job, so its traffic crosses the spine as much as it can.
- ``random``: free nodes drawn with ``random.Random(seed)``, sorted (one generator for the whole file, so a
  seed fixes every job's draw).
- a list of node numbers: those nodes, in that order (the job's rank r runs on node list[r // gpus_per_node]);
  the policies give their nodes in ascending order, as a launcher numbers ranks by host.
A job never shares a node with another job. Bad input (a node twice, outside the cluster, more nodes than are
free, an unknown policy) is a ConfigError naming the job.
"""
from __future__ import annotations

import random

from distlab.sim.errors import ConfigError

POLICIES = ("packed", "spread", "random")


def place(requests: list, nodes: int, nodes_per_leaf: int = 0, seed: int = 0, names: list[str] | None = None,
          where: str = "jobs") -> list[tuple[int, ...]]:
    """The nodes of each job. ``requests[i]``: (node count, policy or node list) or, for a list, the list alone."""
    names = names or [f"job {i}" for i in range(len(requests))]
    leaf = nodes_per_leaf or nodes
    taken: dict[int, str] = {}
    out: list = [None] * len(requests)
    for i, (count, how) in enumerate(requests):
        if isinstance(how, str):
            continue
        for n in how:
            if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < nodes:
                raise ConfigError(f"job {names[i]!r} asks for node {n!r}; the cluster has nodes 0..{nodes - 1}",
                                  f"{where}[{i}].placement")
            if n in taken:
                raise ConfigError(f"jobs {taken[n]!r} and {names[i]!r} both ask for node {n}; a node runs one job",
                                  f"{where}[{i}].placement")
            taken[n] = names[i]
        out[i] = tuple(how)
    need = sum(count for count, how in requests if isinstance(how, str))
    if need > nodes - len(taken):
        raise ConfigError(f"the jobs need {need + len(taken)} nodes but the cluster has {nodes}; allowed: at most "
                          f"{nodes} nodes in all", where)
    rng = random.Random(seed)
    for i, (count, how) in enumerate(requests):
        if not isinstance(how, str):
            continue
        free = [n for n in range(nodes) if n not in taken]
        if how == "packed":
            chosen = _packed(free, count, leaf)
        elif how == "spread":
            chosen = _spread(free, count, leaf)
        elif how == "random":
            chosen = sorted(rng.sample(free, count))
        else:
            raise ConfigError(f"unknown placement {how!r}; allowed: {', '.join(POLICIES)}, or a list of node numbers",
                              f"{where}[{i}].placement")
        for n in chosen:
            taken[n] = names[i]
        out[i] = tuple(chosen)
    return out


def _packed(free: list[int], count: int, leaf: int) -> list[int]:
    """A run of ``count`` consecutive free nodes touching the fewest leaves (then the lowest), else the fullest
    leaves' free nodes."""
    runs, start = [], 0
    for k in range(1, len(free) + 1):
        if k == len(free) or free[k] != free[k - 1] + 1:
            runs.append(free[start:k])
            start = k
    best = None
    for run in runs:
        for s in range(len(run) - count + 1):
            span = run[s + count - 1] // leaf - run[s] // leaf + 1
            if best is None or span < best[0]:
                best = (span, run[s:s + count])
    if best is not None:
        return best[1]
    by_leaf: dict = {}
    for n in free:
        by_leaf.setdefault(n // leaf, []).append(n)
    order = sorted(by_leaf, key=lambda x: (-len(by_leaf[x]), x))
    return sorted([n for x in order for n in by_leaf[x]][:count])


def _spread(free: list[int], count: int, leaf: int) -> list[int]:
    """Round-robin over the leaves: the first free node of each leaf, then the second, ..."""
    by_leaf: dict = {}
    for n in free:
        by_leaf.setdefault(n // leaf, []).append(n)
    chosen, depth = [], 0
    while len(chosen) < count:
        for x in sorted(by_leaf):
            if depth < len(by_leaf[x]) and len(chosen) < count:
                chosen.append(by_leaf[x][depth])
        depth += 1
    return sorted(chosen)
