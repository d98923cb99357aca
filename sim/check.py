"""Static checks of a plan, before it is simulated or run: the mistakes that hang real jobs.

NCCL and Gloo match collectives by order: the k-th collective a rank issues on a communicator meets the k-th
of every other member. If one rank calls something else, or nothing, the others wait until the timeout (or
mix up data). This check walks every group's sequence and names the first divergence, in the words
``distlab diagnose`` also uses for real runs.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from distlab.sim.errors import ConfigError
from distlab.sim.plan import Collective, Plan, Record, Recv, Send, Wait, describe


class PlanMismatch(ConfigError):
    """A plan whose ranks disagree: it would hang or compute garbage."""


def rank_ranges(ranks) -> str:
    """[0, 1, 2, 4, 5] -> '0-2, 4-5'."""
    ranks = sorted(ranks)
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts)


def group_name(group) -> str:
    g = sorted(group)
    if len(g) > 2 and g == list(range(g[0], g[-1] + 1)):
        return f"[{g[0]}..{g[-1]}]"
    return "[" + ",".join(map(str, g)) + "]"


def signature(op: Collective) -> tuple:
    return (op.op, op.bytes, op.dtype, op.root if op.op in ("broadcast", "reduce") else None)


def collective_problems(sequences: dict[tuple, dict[int, list]], offsets: dict | None = None) -> list[str]:
    """``sequences[group][rank]`` = that rank's collectives on the group, in issue order, as (signature,
    description) pairs: of plan ops, or of records read back from a flight recorder. ``offsets[group]``: the
    number of each list's first entry (a flight recorder keeps only the last N), default 0."""
    problems = []
    for group, per_rank in sequences.items():
        first = (offsets or {}).get(group, 0)
        members = sorted(group)
        longest = max(len(per_rank.get(r, [])) for r in members)
        for k in range(longest):
            calls = {r: per_rank[r][k] for r in members if k < len(per_rank.get(r, []))}
            missing = [r for r in members if r not in calls]
            sigs = Counter(sig for sig, _ in calls.values())
            if len(sigs) > 1:
                common = sigs.most_common(1)[0][0]
                odd = sorted(r for r, (sig, _) in calls.items() if sig != common)
                same = sorted(r for r, (sig, _) in calls.items() if sig == common)
                first_odd = odd[0]
                problems.append(f"group {group_name(group)}, collective #{k + first}: "
                                f"rank{'s' if len(odd) > 1 else ''} {rank_ranges(odd)} "
                                f"call{'' if len(odd) > 1 else 's'} {calls[first_odd][1]}; "
                                f"ranks {rank_ranges(same)} call {calls[same[0]][1]}")
                break
            if missing:
                waiting = sorted(calls)
                what = next(iter(calls.values()))[1].split("(")[0]
                problems.append(f"would hang: ranks {rank_ranges(waiting)} wait in {what} #{k + first} on group "
                                f"{group_name(group)}; rank{'s' if len(missing) > 1 else ''} {rank_ranges(missing)} "
                                f"never call{'' if len(missing) > 1 else 's'} it")
                break
    return problems


def check_plan(plan: Plan) -> list[str]:
    """Every problem found, one line each (empty when the plan is consistent)."""
    sequences: dict[tuple, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    sends: dict[tuple, list] = defaultdict(list)
    recvs: dict[tuple, list] = defaultdict(list)
    problems = []
    for r, ops in enumerate(plan.ranks):
        recorded = {op.event for op in ops if isinstance(op, Record)}
        for i, op in enumerate(ops):
            if isinstance(op, Collective):
                sequences[plan.group_of(op)][r].append((signature(op), describe(op)))
            elif isinstance(op, Send):
                sends[r, op.peer].append(op)
            elif isinstance(op, Recv):
                recvs[op.peer, r].append(op)
            elif isinstance(op, Wait) and op.event not in recorded:
                problems.append(f"would hang: rank {r} stream {op.stream!r} waits for event {op.event!r} "
                                f"(op #{i}), which rank {r} never records")
    problems += collective_problems(sequences)
    for pair in sorted(set(sends) | set(recvs)):
        s, rv = sends.get(pair, []), recvs.get(pair, [])
        for k, (a, b) in enumerate(zip(s, rv)):
            if a.bytes != b.bytes:
                problems.append(f"send/recv #{k} from rank {pair[0]} to rank {pair[1]}: rank {pair[0]} calls "
                                f"{describe(a)}; rank {pair[1]} calls {describe(b)}")
                break
        if len(s) > len(rv):
            problems.append(f"would hang: rank {pair[0]} sends {len(s)} messages to rank {pair[1]}, which receives "
                            f"only {len(rv)}")
        elif len(rv) > len(s):
            problems.append(f"would hang: rank {pair[1]} waits for {len(rv)} messages from rank {pair[0]}, which "
                            f"sends only {len(s)}")
    return problems


def assert_consistent(plan: Plan, where: str = "plan") -> Plan:
    """Raise PlanMismatch with the first problem (and how many more)."""
    problems = check_plan(plan)
    if problems:
        more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" if len(problems) > 1 else ""
        raise PlanMismatch(problems[0] + more, where)
    return plan
