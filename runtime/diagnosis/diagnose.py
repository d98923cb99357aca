"""Read the ranks' flight records after a hang, a failure or an interruption and say what happened.

The records of each communicator (group and stream) are lined up by sequence number and compared with the
static check's own function (sim.check.collective_problems), so a real run is diagnosed in the same words as a
plan: ``group [0..3], collective #5: rank 3 calls broadcast(4 MiB, root 0); ranks 0-2 call all_reduce(4 MiB)``
or ``would hang: ranks 0-2 wait in all_reduce #5 on group [0..3]; rank 3 never calls it``. Ranks that died
without a final dump (SIGKILL, out of memory) or left no record at all are named too, with each rank's last
completed collective and what it was waiting in.

An interrupted run (Ctrl-C or SIGTERM to the launcher, written in run.json; or, without run.json, every rank
dumped on a signal) stops ranks mid-collective: one rank may wait in collective #k that its peers had not
reached yet. That is a collective *in flight*, not a hang, when the wait is short: at most
``max(IN_FLIGHT_S, 10 x the rank's longest completed collective)``. A longer wait is reported as a hang (the
user pressed Ctrl-C because the run hung). A mismatch (different collectives at the same sequence number) is
always a problem.

``diagnose(flight)`` returns the verdict (one line: the dead rank and its last completed op first, then a
mismatch, a hang, an interruption), the problems as objects {rank, op_index, kind, message} (op_index: the
plan's op index of the record, None where unknown; kind: `distlab check`'s names, mismatched_collective or
missing_collective, or died / no_record; KINDS) and one row per rank.
"""
from __future__ import annotations

import re
from collections import defaultdict

IN_FLIGHT_S = 1.0
# the kinds of a problem: `distlab check`'s (sim/check.py KINDS: mismatched_collective, missing_collective, ...),
# plus what only a real run shows: a rank that died, or left no record
KINDS = ("died", "no_record", "mismatched_collective", "missing_collective")


def _op(rec):
    from distlab.sim.plan import Collective
    return Collective(rec["op"], rec["bytes"], rec["dtype"], tuple(rec["group"]), root=rec["root"])


def where(rec) -> str:
    """'all_reduce(4 MiB) #5 on group [0..3]' (with the stream when the record has one)."""
    from distlab.sim.check import group_name
    from distlab.sim.plan import describe
    stream = f", stream {rec['stream']!r}" if rec.get("stream") not in ("", "comm", None) else ""
    return f"{describe(_op(rec))} #{rec['seq']} on group {group_name(rec['group'])}{stream}"


def _index(rec) -> int | None:
    return rec["index"] if rec and isinstance(rec.get("index"), int) and rec["index"] >= 0 else None


class Problem(dict):
    """{rank, op_index, kind, message}: JSON as an object, printed as its message (``print(p)``)."""

    def __str__(self) -> str:
        return self["message"]


def problem(rank, op_index, kind: str, message: str) -> Problem:
    return Problem(rank=rank, op_index=op_index, kind=kind, message=message)


def _waited(rank_record: dict, rec: dict) -> float | None:
    """Seconds ``rec`` (pending) had waited when the rank dumped; None without a final dump."""
    since = rec.get("t_started") or rec.get("t_issued")
    at = rank_record.get("dumped_at")
    return at - since if at and since else None


def _in_flight_limit(rank_record: dict) -> float:
    spans = [x["t_completed"] - (x["t_started"] or x["t_issued"]) for x in rank_record["records"]
             if x["state"] == "completed" and x.get("t_completed")]
    return max([IN_FLIGHT_S] + [10 * s for s in spans])


def _interrupted(flight: dict) -> str | None:
    """The signal that interrupted the run ('SIGINT', 'SIGTERM'), from run.json or from every rank's dump."""
    run = flight.get("run")
    if run is not None:
        return run.get("interrupted")
    reasons = [d.get("reason") or "" for d in flight["ranks"].values()]
    if reasons and all(x.startswith("signal ") for x in reasons):
        return reasons[0].removeprefix("signal ")
    return None


def _communicator_problems(ranks: dict, interrupted: str | None) -> tuple[list[dict], list[str]]:
    """(problems, in-flight notes) of every communicator, lined up by sequence number."""
    from distlab.sim.check import collective_problems, signature
    from distlab.sim.plan import describe
    comms: dict = defaultdict(lambda: defaultdict(list))
    for r, d in ranks.items():
        for rec in d["records"]:
            comms[(tuple(rec["group"]), rec["stream"])][r].append(rec)
    streams = defaultdict(set)
    for group, stream in comms:
        streams[group].add(stream)
    problems, in_flight = [], []
    for (group, stream), per_rank in sorted(comms.items()):
        base = max(min(x["seq"] for x in recs) for recs in per_rank.values())
        mine = {r: [x for x in sorted(recs, key=lambda x: x["seq"]) if x["seq"] >= base]
                for r, recs in per_rank.items() if r in group}
        for r in group:                                  # a member with a record but no call here: an empty list
            if r in ranks:
                mine.setdefault(r, [])
        seqs = {r: [(signature(_op(x)), describe(_op(x))) for x in recs] for r, recs in mine.items()}
        for line in collective_problems({group: seqs}, {group: base}):
            k = int(re.search(r"#(\d+)", line).group(1)) - base
            at = {r: recs[k] for r, recs in mine.items() if k < len(recs)}
            if len(streams[group]) > 1:
                line = f"{line} (stream {stream!r})"
            if line.startswith("would hang"):
                waiters = [(r, x) for r, x in at.items() if x["state"] != "completed"]
                if interrupted and all((w := _waited(ranks[r], x)) is not None and w <= _in_flight_limit(ranks[r])
                                       for r, x in waiters):
                    in_flight += [f"rank {r} in {where(x)}" for r, x in waiters]
                    continue
                problems.append(problem(min(r for r in group if r not in at), None, "missing_collective", line))
            else:
                counts = defaultdict(int)
                for x in at.values():
                    counts[signature(_op(x))] += 1
                common = max(counts, key=counts.get)
                culprit = min(r for r, x in at.items() if signature(_op(x)) != common)
                problems.append(problem(culprit, _index(at[culprit]), "mismatched_collective", line))
    return problems, in_flight


def diagnose(flight: dict) -> dict:
    """``flight`` = runtime.diagnosis.flight_read.load_dir(DIR) -> {"verdict": line, "status", "problems": [{rank, op_index,
    kind, message}], "ranks": [per rank], "interrupted", "in_flight", "directory", "world_size"}."""
    ranks, world = flight["ranks"], flight["world_size"]
    run = flight.get("run") or {}
    codes = {int(k): v for k, v in run.get("exit_codes", {}).items()}
    said = {f["rank"]: f["message"] for f in run.get("failures", [])}
    interrupted = _interrupted(flight) if not said else None
    problems, in_flight = _communicator_problems(ranks, interrupted)
    dead, rows = [], []
    for r in range(world):
        d = ranks.get(r)
        if d is None:
            dead.append(problem(r, None, "no_record", f"rank {r} left no flight record (it died or never started)"))
            rows.append({"rank": r, "record": "none", "exit_code": codes.get(r), "died": True,
                         "message": said.get(r), "last_completed": None, "pending": []})
            continue
        recs = d["records"]
        done = [x for x in recs if x["state"] == "completed"]
        pending = [x for x in recs if x["state"] in ("issued", "started")]
        died = d["source"] == "live" and (codes.get(r) is None or codes[r] != 0)
        if died:
            how = said.get(r, "").removeprefix(f"rank {r} died: ").removeprefix(f"rank {r} ") or (
                f"exit code {codes[r]}" if r in codes else None)
            after = f"after its last completed op, {where(done[-1])}" if done else "before completing any collective"
            if done and _index(done[-1]) is not None:
                after += f" (plan op {_index(done[-1])})"
            last = f"; its last record: {where(recs[-1])} ({recs[-1]['state']})" if recs else ""
            if how:
                msg = f"rank {r} died without a final dump ({how}) {after}{last}"
            else:                                        # no run.json (torchrun, or a run still going)
                msg = f"rank {r} left no final dump (killed, or still running) {after}{last}"
            dead.append(problem(r, _index(done[-1]) if done else None, "died", msg))
        rows.append({"rank": r, "record": d["source"], "exit_code": codes.get(r), "died": died,
                     "reason": d.get("reason"), "message": said.get(r),
                     "last_completed": done[-1] if done else None, "pending": pending,
                     "dumped_at": d.get("dumped_at")})
    problems = dead + problems
    if problems:
        status, verdict = problems[0]["kind"], problems[0]["message"]
    elif interrupted:
        status = "interrupted"
        flying = f"; in flight when stopped: {'; '.join(in_flight[:3])}" if in_flight else ""
        verdict = (f"interrupted by {interrupted}: the run was stopped, it did not hang (no rank failed, every "
                   f"rank's collectives agree){flying}")
    elif rows and all(r.get("reason") == "completed" for r in rows):
        status, verdict = "completed", f"completed: all {world} ranks finished their work (no failure, no mismatch)"
    else:
        status, verdict = "ok", "no mismatch: every rank's recorded collectives agree"
    return {"directory": flight.get("directory"), "world_size": world, "status": status, "verdict": verdict,
            "interrupted": interrupted, "in_flight": in_flight, "problems": problems, "ranks": rows}


def rank_line(row: dict) -> str:
    """'rank 3: last completed all_reduce(4 MiB) #4 on group [0..3]; waits in ... (started for 3.0 s)'."""
    if row["record"] == "none":
        return f"rank {row['rank']}: no flight record"
    last = row["last_completed"]
    text = f"rank {row['rank']}: " + (f"last completed {where(last)}" if last else "completed no collective")
    for x in row["pending"][:2]:
        since = x["t_started"] or x["t_issued"]
        waited = f" for {row['dumped_at'] - since:.1f} s" if row.get("dumped_at") and since else ""
        text += f"; waits in {where(x)} ({x['state']}{waited})"
    if row.get("reason"):
        reason = re.sub(r"\[[^\]]*\.(cc|cpp|h|hpp):\d+\] ", "", row["reason"])     # gloo's source location
        text += f"; dumped on: {reason if len(reason) <= 90 else reason[:87] + '...'}"
    elif row["died"]:
        text += "; no final dump (died)"
    return text


def exit_code(d: dict) -> int:
    """1 when the diagnosis found a problem (or a rank still waits outside an interruption), else 0."""
    stuck = any(r["pending"] for r in d["ranks"]) and d["status"] != "interrupted"
    return 1 if d["problems"] or stuck else 0
