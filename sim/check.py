"""Static checks of a plan, before it is simulated or run: the mistakes that hang real jobs.

NCCL and Gloo match collectives by order: the k-th collective a rank issues on a communicator (a process group:
its ranks and its name, sim/kernel/communicators.py) meets the k-th of every other member; two groups over the
same ranks keep separate sequences. If one rank calls something else, or nothing, the others wait until the timeout (or
mix up data). This check walks every group's sequence and names the first divergence, in the words
``distlab diagnose`` also uses for real runs.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

from distlab.sim.errors import ConfigError
from distlab.sim.plan import Collective, Communicator, Plan, Record, Recv, Send, Wait, describe


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


@dataclass
class Problem:
    """One problem of a plan or a run, as ``check --json`` and ``diagnose --json`` print it: the rank at
    fault, the index of its op (in its plan's op list, or the collective's sequence number in a flight record;
    None when the rank never calls it), a kind (KINDS) and the one-line message."""
    rank: int | None
    op_index: int | None
    kind: str
    message: str

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return self.message


KINDS = ("mismatched_collective", "missing_collective", "wait_without_record", "mismatched_send_recv",
         "unmatched_send", "unmatched_recv")


def ranks_text(ranks) -> str:
    """'rank 3' or 'ranks 0-2, 4'."""
    return f"rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)}"


def verb(ranks, word: str) -> str:
    """'calls' after one rank, 'call' after several."""
    return word if len(ranks) > 1 else word + "s"


def _label(key) -> str:
    """A sequence's key: a Communicator (ranks and name) or a plain group of ranks."""
    return key.label() if isinstance(key, Communicator) else group_name(key)


def collective_problem_list(sequences: dict[tuple, dict[int, list]], offsets: dict | None = None) -> list[Problem]:
    """``sequences[group][rank]`` = that rank's collectives on the group (a Communicator, or a tuple of ranks),
    in issue order, as (signature,
    description) or (signature, description, op index) tuples: of plan ops, or of records read back from a
    flight recorder. ``offsets[group]``: the number of each list's first entry (a flight recorder keeps only
    the last N), default 0; without an op index, a problem's op_index is that number."""
    problems = []
    for group, per_rank in sequences.items():
        first = (offsets or {}).get(group, 0)
        members = sorted(group.ranks if isinstance(group, Communicator) else group)
        longest = max(len(per_rank.get(r, [])) for r in members)
        for k in range(longest):
            calls = {r: per_rank[r][k] for r in members if k < len(per_rank.get(r, []))}
            missing = [r for r in members if r not in calls]
            sigs = Counter(c[0] for c in calls.values())
            if len(sigs) > 1:
                common = sigs.most_common(1)[0][0]
                odd = sorted(r for r, c in calls.items() if c[0] != common)
                same = sorted(r for r, c in calls.items() if c[0] == common)
                call = calls[odd[0]]
                problems.append(Problem(odd[0], call[2] if len(call) > 2 else k + first, "mismatched_collective",
                                        f"group {_label(group)}, collective #{k + first}: {ranks_text(odd)} "
                                        f"{verb(odd, 'call')} {call[1]}; {ranks_text(same)} "
                                        f"{verb(same, 'call')} {calls[same[0]][1]}"))
                break
            if missing:
                waiting = sorted(calls)
                what = next(iter(calls.values()))[1].split("(")[0]
                problems.append(Problem(missing[0], None, "missing_collective",
                                        f"would hang: {ranks_text(waiting)} {verb(waiting, 'wait')} in {what} "
                                        f"#{k + first} on group {_label(group)}; {ranks_text(missing)} "
                                        f"never {verb(missing, 'call')} it"))
                break
    return problems


def collective_problems(sequences: dict[tuple, dict[int, list]], offsets: dict | None = None) -> list[str]:
    """The messages of ``collective_problem_list``."""
    return [p.message for p in collective_problem_list(sequences, offsets)]


def plan_problems(plan: Plan) -> list[Problem]:
    """Every problem found, as Problem objects (empty when the plan is consistent)."""
    sequences: dict[tuple, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    sends: dict[tuple, list] = defaultdict(list)
    recvs: dict[tuple, list] = defaultdict(list)
    problems = []
    for r, ops in enumerate(plan.ranks):
        recorded = {op.event for op in ops if isinstance(op, Record)}
        for i, op in enumerate(ops):
            if isinstance(op, Collective):
                sequences[plan.communicator_of(op)][r].append((signature(op), describe(op), i))
            elif isinstance(op, Send):
                sends[r, op.peer].append((i, op))
            elif isinstance(op, Recv):
                recvs[op.peer, r].append((i, op))
            elif isinstance(op, Wait) and op.event not in recorded:
                problems.append(Problem(r, i, "wait_without_record",
                                        f"would hang: rank {r} stream {op.stream!r} waits for event {op.event!r} "
                                        f"(op #{i}), which rank {r} never records"))
    problems += collective_problem_list(sequences)
    for pair in sorted(set(sends) | set(recvs)):
        s, rv = sends.get(pair, []), recvs.get(pair, [])
        for k, ((_, a), (j, b)) in enumerate(zip(s, rv)):
            if a.bytes != b.bytes:
                problems.append(Problem(pair[1], j, "mismatched_send_recv",
                                        f"send/recv #{k} from rank {pair[0]} to rank {pair[1]}: rank {pair[0]} "
                                        f"calls {describe(a)}; rank {pair[1]} calls {describe(b)}"))
                break
        if len(s) > len(rv):
            problems.append(Problem(pair[0], s[len(rv)][0], "unmatched_send",
                                    f"would hang: rank {pair[0]} sends {len(s)} messages to rank {pair[1]}, which "
                                    f"receives only {len(rv)}"))
        elif len(rv) > len(s):
            problems.append(Problem(pair[1], rv[len(s)][0], "unmatched_recv",
                                    f"would hang: rank {pair[1]} waits for {len(rv)} messages from rank {pair[0]}, "
                                    f"which sends only {len(s)}"))
    return problems


def check_plan(plan: Plan) -> list[str]:
    """Every problem found, one line each (empty when the plan is consistent)."""
    return [p.message for p in plan_problems(plan)]


def assert_consistent(plan: Plan, where: str = "plan") -> Plan:
    """Raise PlanMismatch with the first problem (and how many more)."""
    problems = check_plan(plan)
    if problems:
        more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" if len(problems) > 1 else ""
        raise PlanMismatch(problems[0] + more, where)
    return plan
