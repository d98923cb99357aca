"""Symmetric ranks, simulated once: find the ranks whose timelines are provably equal, so the engine runs one
representative per class and copies its timing to the others (exactly: the copied records are the ones the full
simulation makes, see tests/test_symmetry.py).

The case handled: every rank runs the same program (the same ops in the same order, as every data-parallel
replica of a DDP step does), every collective spans the whole world, there is no point-to-point traffic, no
straggler (per-rank slowdown) and no CPU-core sharing between the ranks of a node. Then, by induction over the
ops: every rank reaches its k-th op at the same time (its compute takes the same time on every rank, Record and
Wait are local, and a collective starts when all members have arrived and ends for all members together), so
every rank's records equal rank 0's. This holds on any fabric (also with degraded links): a whole-world
collective's duration is one number shared by all its members.

Left out here: collectives over sub-groups (TP x DP meshes: their ranks are symmetric only up to a renaming
that maps the topology onto itself) and pipelines (send/recv): sim/kernel/subgroups.py takes those (classes of ranks,
one representative each); stragglers, shared CPU cores and recorded transfers: every rank is simulated.

Collective durations: when, in addition, every collective is issued on one stream, at most one collective is in
flight at a time (the k+1-th cannot start before the k-th has ended for everyone), so the network carries
nothing else while it runs and its duration depends only on (op, bytes, algorithm, root): the engine runs each
distinct one on the network once and reuses the duration for its repeats (``repeat_collectives``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from distlab.sim.check import assert_consistent
from distlab.sim.collectives.context import Context
from distlab.sim.errors import ConfigError
from distlab.sim.kernel.equivariance import RANK_STREAM, check_classes
from distlab.sim.kernel.network import Topology
from distlab.sim.kernel.subgroups import find_classes, subgroups_apply
from distlab.sim.plan import Collective, Plan, Recv, Send


@dataclass(frozen=True)
class Symmetry:
    """``representative`` is simulated; the trace reads its records as those of every rank of ``members`` (trace.RankCopies)."""
    representative: int
    members: range
    repeat_collectives: bool    # every collective on one stream: durations may be reused (module docstring)


def find_symmetry(plan: Plan, cluster, slowdown: dict | None, record_transfers: bool) -> Symmetry | None:
    """The symmetry of ``plan`` on ``cluster`` (module docstring), or None when the case does not apply."""
    n = plan.world_size
    if n < 2 or record_transfers or cluster.cpu_cores or any(f != 1.0 for f in (slowdown or {}).values()):
        return None
    first = plan.ranks[0]
    streams, rooted = set(), False
    for op in first:
        if isinstance(op, (Send, Recv)):
            return None
        if isinstance(op, Collective):
            if op.group is not None and len(op.group) != n:
                return None
            streams.add(op.stream)
            rooted = rooted or op.op in ("broadcast", "reduce")
    if _renamings_of_first(plan, rooted):
        return Symmetry(0, range(n), len(streams) <= 1)
    if any(ops is not first and ops != first for ops in plan.ranks[1:]):   # list ==: identical ops skip __eq__
        return None
    return Symmetry(0, range(n), len(streams) <= 1)


def _renamings_of_first(plan: Plan, rooted: bool) -> bool:
    """A plan built from rank 0's program alone (sim/kernel/relabel.py: every rank a renaming of it) whose program has
    no peers, no roots and no per-peer streams, and only whole-world collectives: a renaming maps the world onto
    itself, so every rank's program equals rank 0's (no need to make and compare them)."""
    reps = getattr(plan.ranks, "representatives", None)
    if reps is None or reps() != [0] or rooted:
        return False
    return not any(RANK_STREAM.fullmatch(op.stream) for op in plan.ranks[0])


def representative_plan(plan: Plan) -> Plan:
    """Rank 0's program alone, its collectives on "the whole world": sim.check of it finds what a check of
    the whole plan finds (every rank runs this program, so their collective sequences agree)."""
    ops = [replace(op, group=None) if isinstance(op, Collective) and op.group is not None else op
           for op in plan.ranks[0]]
    return Plan([ops], name=plan.name, meta=plan.meta)


def reductions(plan: Plan, cluster, topo=None, *, slowdown=None, record_transfers: bool = False,
               link_factors=None, protocol: str = "auto", symmetric: bool = True, check: bool = True,
               busy: frozenset = frozenset(), ctx=None):
    """(Symmetry or None, Classes or None) of ``plan`` on ``topo`` (default: the cluster's own fabric), the plan
    checked first (sim.check; ``check``). ``busy``: the links this plan shares with another plan on the same
    network (sim/jobs/): no collective reuses a duration there (the network is not otherwise idle); which
    renamings keep the shared links is ``topo.keeps``' to say. ``ctx``: the Context to expand collectives in."""
    sym = find_symmetry(plan, cluster, slowdown, record_transfers) if symmetric else None
    classes = None
    if symmetric and sym is None and subgroups_apply(plan, cluster, slowdown, record_transfers, link_factors):
        try:
            classes = find_classes(plan, ctx or Context(topo or Topology(cluster), protocol), busy)
        except ConfigError:              # a plan the simulation refuses: the full path says why, in its order
            classes = None
    if sym is not None and busy:
        sym = replace(sym, repeat_collectives=False)
    if check and classes:
        check_classes(plan, classes)
    elif check:
        assert_consistent(representative_plan(plan) if sym else plan)
    return sym, classes
