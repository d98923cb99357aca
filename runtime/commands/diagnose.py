"""`distlab diagnose DIR`: read the ranks' flight records after a hang, failure or interruption and say what
happened (the library: runtime/diagnose.py)."""
from __future__ import annotations

from distlab.runtime.diagnose import diagnose, exit_code, rank_line, where  # noqa: F401  (lesson 08 imports rank_line)

NAME = "diagnose"
HELP = ("Read the flight records a failed, hung or interrupted run left (distlab run --dump-dir, or the folder it "
        "names) and say what happened: the rank that died, diverged or fell behind, or that the run was only "
        "interrupted. Exit 1 if it finds a problem.")


def add_arguments(p) -> None:
    p.add_argument("dir", help="folder with flight.RANK.json / flight.RANK.ring files")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def run(args) -> int:
    from distlab.runtime.flight_read import load_dir
    from distlab.sim.cli import print_json
    d = diagnose(load_dir(args.dir))
    if args.json:
        print_json(d)
        return exit_code(d)
    dumps = sum(r["record"] == "dump" for r in d["ranks"])
    live = sum(r["record"] == "live" for r in d["ranks"])
    print(d["verdict"])
    print(f"{args.dir}: {d['world_size']} ranks, {dumps} final dumps, {live} live records only")
    for p in d["problems"][1:]:
        print(p["message"])
    for row in d["ranks"]:
        print("  " + rank_line(row))
    return exit_code(d)
