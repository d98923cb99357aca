"""`distlab check PLAN.json`: find the mistakes that hang real jobs, before running anything."""
from __future__ import annotations

NAME = "check"
HELP = ("Check a plan statically: collectives that differ between ranks or that a rank never calls, "
        "unmatched send/recv, waits on events never recorded. Exit 1 if it finds any.")


def add_arguments(p) -> None:
    p.add_argument("plan", help="a plan JSON file (distlab-plan/1)")
    p.add_argument("--json", action="store_true", help="print the problems as a JSON list")


def run(args) -> int:
    from distlab.sim.check import check_plan
    from distlab.sim.cli import print_json
    from distlab.sim.plan import Plan

    plan = Plan.load(args.plan)
    problems = check_plan(plan)
    if args.json:
        print_json({"plan": args.plan, "ranks": plan.world_size, "problems": problems})
    elif problems:
        for p in problems:
            print(p)
    else:
        ops = sum(len(r) for r in plan.ranks)
        print(f"{args.plan}: {plan.world_size} ranks, {ops} ops: no mismatched collectives, no unmatched "
              "send/recv, no waits on missing events")
    return 1 if problems else 0
