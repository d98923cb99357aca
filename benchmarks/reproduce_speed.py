"""How long `distlab reproduce` takes (issue 39 item 7): each shipped row of sim/reproduce/runs.yaml in a process of
its own pinned to one core (wall time, CPU seconds, peak resident memory), the whole set (the rows' sum: what one
`distlab reproduce` of every row costs on one core, plus its start-up), and one step on 131,072 GPUs (Llama 3
405B as pp 16 x FSDP2 dp_shard 1024 x tp 8 on 16,384 DGX H100 nodes, the Llama 3 paper's 16K-GPU layout of Table 4
with 8x the data-parallel groups).

    python benchmarks/reproduce_speed.py [--only NAME ...] [--json] [--markdown]

Targets: each row <= 60 s and <= 2 GiB; all rows <= 600 s; the 131,072-GPU step <= 60 s and <= 4 GiB. CPU seconds
are what the wall time is on an idle core: on a shared machine compare them with the targets.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from one_core import finish, pin_to_one_core, run_child, usage  # noqa: E402

ROW_S, ROW_MIB, ALL_S, BIG_S, BIG_MIB = 60.0, 2048.0, 600.0, 60.0, 4096.0
BIG = "llama3-405b-131072"


def big_run():
    """The 131,072-GPU step as a run: the shipped llama3-405b-16384 row with 8x its data-parallel groups."""
    from dataclasses import replace
    from distlab.sim.reproduce.runs import load_runs
    run = next(r for r in load_runs()[0] if r.name == "llama3-405b-16384")
    dp = run.layout["dp"] * 8
    return replace(run, name=BIG, gpus=run.gpus * 8, global_batch=run.global_batch * 8,
                   layout={**run.layout, "dp": dp})


def one(name: str) -> dict:
    """Simulate one row (or the 131,072-GPU step) in this process, pinned to one core."""
    pin_to_one_core()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from distlab.sim.reproduce.predict import predict
    from distlab.sim.reproduce.runs import load_runs
    t0 = time.perf_counter()
    run = big_run() if name == BIG else next(r for r in load_runs()[0] if r.name == name)
    x = predict(run)
    return {"name": name, "gpus": run.gpus, "wall_s": round(time.perf_counter() - t0, 2), **usage(),
            "expressible": x["expressible"], "step_s": x.get("step_time_s"), "error": x.get("error")}


def main() -> int:
    if "--one" in sys.argv:
        print(json.dumps(one(sys.argv[sys.argv.index("--one") + 1])))
        return 0
    from distlab.sim.reproduce.runs import load_runs
    only = [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--only"]
    names = [r.name for r in load_runs()[0] if not only or r.name in only]
    rows, quiet = [], "--json" in sys.argv
    for name in names + ([BIG] if not only or BIG in only else []):
        row = run_child(__file__, "--one", name)
        big = name == BIG
        limit_s, limit_mib = (BIG_S, BIG_MIB) if big else (ROW_S, ROW_MIB)
        row["ok"] = row["cpu_s"] <= limit_s and row["peak_MiB"] <= limit_mib
        rows.append(row)
        if not quiet:
            what = "not expressible" if not row["expressible"] else f"step {row['step_s']:.3f} s"
            print(f"{name:38} {row['gpus']:>7,} GPUs  {row['wall_s']:7.1f} s wall  {row['cpu_s']:7.1f} s CPU  "
                  f"{row['peak_MiB']:7.0f} MiB  {what}  load {row['load_1min']}"
                  f"{'' if row['ok'] else '  OVER TARGET'}", flush=True)
    shipped = [r for r in rows if r["name"] != BIG]
    total = {"rows": len(shipped), "wall_s": round(sum(r["wall_s"] for r in shipped), 1),
             "cpu_s": round(sum(r["cpu_s"] for r in shipped), 1),
             "peak_MiB": max((r["peak_MiB"] for r in shipped), default=0.0)}
    total["ok"] = total["cpu_s"] <= ALL_S
    if not quiet:
        what = "rows measured (--only)" if only else "whole shipped set"
        print(f"\n{what}: {total['rows']} rows, {total['wall_s']:.0f} s wall, {total['cpu_s']:.0f} s "
              f"CPU on one core (target {ALL_S:.0f} s), largest peak {total['peak_MiB']:.0f} MiB")
        print(f"targets: each row <= {ROW_S:.0f} s CPU and {ROW_MIB:.0f} MiB; the 131,072-GPU step <= {BIG_S:.0f} s "
              f"and {BIG_MIB:.0f} MiB; missed by: "
              + (", ".join(r["name"] for r in rows if not r["ok"]) or "none"))
    return finish(rows + [total])


if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    from accuracy_doc import run_main
    sys.exit(run_main("reproduce_speed", main))
