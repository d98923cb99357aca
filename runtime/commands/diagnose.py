"""`distlab diagnose DIR`: read the ranks' flight records after a hang, failure or interruption and say what
happened (the library: runtime/diagnosis/diagnose.py)."""
from __future__ import annotations

from distlab.runtime.diagnosis.diagnose import diagnose, exit_code, rank_line, where  # noqa: F401  (lesson 08 imports rank_line)

NAME = "diagnose"
HELP = ("Read the flight records a failed, hung or interrupted run left (distlab run --dump-dir, or the folder it "
        "names) and say what happened: the rank that died, diverged or fell behind, or that the run was only "
        "interrupted. Exit 1 if it finds a problem.")


def add_arguments(p) -> None:
    p.add_argument("dir", help="folder with flight.RANK.json / flight.RANK.ring files, or torch's flight recorder "
                   "dumps (nccl_trace_rank_N: TORCH_FR_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT; sim/ingest)")
    p.add_argument("--allow-pickle", action="store_true", help="read torch flight recorder dumps written as pickle "
                   "(a restricted unpickler: builtin values only; JSON dumps need no flag)")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    from distlab.sim.cli import add_output_arguments
    add_output_arguments(p)


def run(args) -> int:
    from distlab.runtime.diagnosis.flight_read import load_dir
    from distlab.sim.cli import print_json
    from distlab.sim.ingest import flight_recorder as torch_fr
    d = diagnose(torch_fr.load_dir(args.dir, args.allow_pickle) if torch_fr.is_dump_dir(args.dir)
                 else load_dir(args.dir))
    if args.json:
        print_json(d)
        return exit_code(d)
    dumps = sum(r["record"] == "dump" for r in d["ranks"])
    live = sum(r["record"] == "live" for r in d["ranks"])
    from distlab.sim.cli import LONG_TABLE, STYLE, note, say
    say(d["verdict"], indent="  ")
    say(f"{args.dir}: {d['world_size']} ranks, {dumps} final dumps, {live} live records only", indent="  ")
    for p in d["problems"][1:LONG_TABLE] if not STYLE.verbose else d["problems"][1:]:
        say(p["message"], indent="  ")
    rows = d["ranks"]                  # the ranks with something to say first, then the others
    rows = sorted(rows, key=lambda r: not (r["died"] or r["pending"])) if not STYLE.verbose else rows
    for row in rows if STYLE.verbose else rows[:LONG_TABLE]:
        say(rank_line(row), indent="      ", first="  ")
    hidden = len(d["problems"][1:]) - len(d["problems"][1:LONG_TABLE]) + max(0, len(rows) - LONG_TABLE)
    if hidden and not STYLE.verbose:
        note(f"{hidden} more lines (problems or ranks); --verbose prints them all")
    return exit_code(d)
