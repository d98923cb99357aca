"""`distlab diagnose DIR`: read the ranks' flight records after a hang or failure and name the rank at fault.

The records of each communicator (group and stream) are lined up by sequence number and compared with the
static check's own function (sim.check.collective_problems), so a real run is diagnosed in the same words as a
plan: ``group [0..3], collective #5: rank 3 calls broadcast(4 MiB, root 0); ranks 0-2 call all_reduce(4 MiB)``
or ``would hang: ranks 0-2 wait in all_reduce #5 on group [0..3]; rank 3 never calls it``. Ranks that died
without a final dump (SIGKILL, out of memory) or left no record at all are named too, with each rank's last
completed collective and what it was waiting in.
"""
from __future__ import annotations

import re
from collections import defaultdict

NAME = "diagnose"
HELP = ("Read the flight records a failed or hung run left (distlab run --dump-dir, or the folder it names) and "
        "name the rank that fell behind, diverged or died. Exit 1 if it finds a problem.")


def add_arguments(p) -> None:
    p.add_argument("dir", help="folder with flight.RANK.json / flight.RANK.ring files")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def _op(rec):
    from distlab.sim.plan import Collective
    return Collective(rec["op"], rec["bytes"], rec["dtype"], tuple(rec["group"]), root=rec["root"])


def where(rec) -> str:
    """'all_reduce(4 MiB) #5 on group [0..3]' (with the stream when the record has one)."""
    from distlab.sim.check import group_name
    from distlab.sim.plan import describe
    stream = f", stream {rec['stream']!r}" if rec.get("stream") not in ("", "comm", None) else ""
    return f"{describe(_op(rec))} #{rec['seq']} on group {group_name(rec['group'])}{stream}"


def diagnose(flight: dict) -> dict:
    """``flight`` = runtime.flight.load_dir(DIR). Returns {"problems": [lines], "ranks": [per rank], ...}."""
    from distlab.sim.check import collective_problems, signature
    from distlab.sim.plan import describe
    ranks, world = flight["ranks"], flight["world_size"]
    run = flight.get("run") or {}
    codes = {int(k): v for k, v in run.get("exit_codes", {}).items()}
    said = {f["rank"]: f["message"] for f in run.get("failures", [])}
    comms: dict = defaultdict(lambda: defaultdict(list))
    for r, d in ranks.items():
        for rec in d["records"]:
            comms[(tuple(rec["group"]), rec["stream"])][r].append(rec)
    streams = defaultdict(set)
    for group, stream in comms:
        streams[group].add(stream)
    problems = []
    for (group, stream), per_rank in sorted(comms.items()):
        base = max(min(x["seq"] for x in recs) for recs in per_rank.values())
        seqs = {r: [(signature(_op(x)), describe(_op(x))) for x in sorted(recs, key=lambda x: x["seq"])
                    if x["seq"] >= base] for r, recs in per_rank.items() if r in group}
        for r in group:                                  # a member with a record but no call here: an empty list
            if r in ranks:
                seqs.setdefault(r, [])
        lines = collective_problems({group: seqs}, {group: base})
        problems += [f"{ln} (stream {stream!r})" if len(streams[group]) > 1 else ln for ln in lines]
    rows = []
    for r in range(world):
        d = ranks.get(r)
        if d is None:
            problems.append(f"rank {r} left no flight record (it died or never started)")
            rows.append({"rank": r, "record": "none", "exit_code": codes.get(r), "died": True,
                         "message": said.get(r), "last_completed": None, "pending": []})
            continue
        recs = d["records"]
        done = [x for x in recs if x["state"] == "completed"]
        pending = [x for x in recs if x["state"] in ("issued", "started")]
        died = d["source"] == "live" and (codes.get(r) is None or codes[r] != 0)
        if died:
            last = f"; its last record: {where(recs[-1])} ({recs[-1]['state']})" if recs else ""
            if r in codes:
                how = said.get(r) or f"exit code {codes[r]}"
                problems.append(f"rank {r} died without a final dump ({how}){last}")
            else:                                        # no run.json (torchrun, or a run still going)
                problems.append(f"rank {r} left no final dump (killed, or still running){last}")
        rows.append({"rank": r, "record": d["source"], "exit_code": codes.get(r), "died": died,
                     "reason": d.get("reason"), "message": said.get(r),
                     "last_completed": done[-1] if done else None, "pending": pending,
                     "dumped_at": d.get("dumped_at")})
    return {"directory": flight.get("directory"), "world_size": world, "problems": problems, "ranks": rows}


def rank_line(row: dict) -> str:
    last = row["last_completed"]
    text = f"rank {row['rank']}: " + (f"last completed {where(last)}" if last else "completed no collective")
    for x in row["pending"][:2]:
        since = x["t_started"] or x["t_issued"]
        waited = f" for {row['dumped_at'] - since:.1f} s" if row.get("dumped_at") and since else ""
        text += f"; waits in {where(x)} ({x['state']}{waited})"
    if row["record"] == "none":
        return f"rank {row['rank']}: no flight record"
    if row.get("reason"):
        reason = re.sub(r"\[[^\]]*\.(cc|cpp|h|hpp):\d+\] ", "", row["reason"])     # gloo's source location
        text += f"; dumped on: {reason if len(reason) <= 90 else reason[:87] + '...'}"
    elif row["died"]:
        text += "; no final dump (died)"
    return text


def run(args) -> int:
    from distlab.runtime.flight import load_dir
    from distlab.sim.cli import print_json
    d = diagnose(load_dir(args.dir))
    if args.json:
        print_json(d)
    else:
        dumps = sum(r["record"] == "dump" for r in d["ranks"])
        live = sum(r["record"] == "live" for r in d["ranks"])
        print(f"{args.dir}: {d['world_size']} ranks, {dumps} final dumps, {live} live records only")
        for line in d["problems"] or ["no mismatch: every rank's recorded collectives agree"]:
            print(line)
        for row in d["ranks"]:
            print("  " + rank_line(row))
    stuck = any(r["pending"] for r in d["ranks"])
    return 1 if d["problems"] or stuck else 0
