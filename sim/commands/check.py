"""`distlab check PLAN.json`: find the mistakes that hang real jobs, before running anything."""
from __future__ import annotations

NAME = "check"
HELP = ("Check a plan statically: collectives that differ between ranks or that a rank never calls, "
        "unmatched send/recv, waits on events never recorded. Exit 1 if it finds any.")


def add_arguments(p) -> None:
    p.add_argument("plan", help="a plan JSON file (distlab-plan/1)")
    p.add_argument("--json", action="store_true", help="print the problems as JSON objects (rank, op_index, kind, "
                                                       "message)")
    from distlab.sim.cli import add_output_arguments
    add_output_arguments(p)


def run(args) -> int:
    from distlab.sim.check import plan_problems
    from distlab.sim.cli import LONG_TABLE, STYLE, note, print_json, say
    from distlab.sim.plan import Plan

    plan = Plan.load(args.plan)
    problems = plan_problems(plan)
    ops = sum(len(r) for r in plan.ranks)
    if args.json:
        print_json({"plan": args.plan, "world_size": plan.world_size, "ops": ops, "ok": not problems,
                    "problems": [p.to_dict() for p in problems]})
    elif problems:
        shown = problems if STYLE.verbose else problems[:LONG_TABLE]
        for p in shown:
            say(p.message, indent="  ")
        if len(shown) < len(problems):
            note(f"{len(problems) - len(shown)} more problems; --verbose prints them all")
    else:
        say(f"{args.plan}: {plan.world_size} ranks, {ops} ops: no mismatched collectives, no unmatched "
            "send/recv, no waits on missing events", indent="  ")
    return 1 if problems else 0
