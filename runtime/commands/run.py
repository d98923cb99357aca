"""`distlab run PLAN.json --nproc N`: execute a plan on real local ranks and write the measured trace."""
from __future__ import annotations

import os
import sys

from distlab.runtime.commands.common import (add_launch_arguments, check_launch, launch_kwargs, parse_nproc,
                                             positive_int)

NAME = "run"
HELP = "Execute a plan on real local ranks (torch.distributed) and write the measured trace."


def add_arguments(p) -> None:
    p.add_argument("plan", help="a plan JSON file (format distlab-plan/1)")
    add_launch_arguments(p, "number of local ranks (default: the plan's world size)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of the whole plan first (default 1)")
    p.add_argument("--repeat", type=int, default=1, help="timed runs; the trace keeps the median one (default 1)")
    p.add_argument("--out", help="trace file: *.trace native, *.json Chrome/Perfetto (default: the plan's path "
                   "with .measured.trace for .json: plan.json -> plan.measured.trace)")
    p.add_argument("--perfetto", metavar="FILE.json", help="Perfetto (Chrome JSON) trace, written beside --out "
                   "(default: --out with .perfetto.json for its extension: m.trace -> m.perfetto.json; 'none': no "
                   "Perfetto trace); open it in ui.perfetto.dev")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--dump-dir", help="every rank's flight record goes here, kept after the run (default: --out "
                   "with .flight for its extension, m.trace -> m.flight/, kept only if the run fails); read it "
                   "with distlab diagnose")
    p.add_argument("--no-check", action="store_true", help="start the ranks even if the static check (distlab "
                   "check) finds mismatched collectives: to see a real hang")
    p.add_argument("--nnodes", type=int, help="run across nodes under torchrun (same command on every node; "
                   "--nproc is then per node; see runtime/ranks/multinode.py)")
    p.add_argument("--node-rank", type=int, help="this node's rank, 0..nnodes-1 (with --nnodes)")
    p.add_argument("--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous (with --nnodes)")
    from distlab.sim.cli import add_output_arguments
    add_output_arguments(p, verbose=False)


def run(args) -> int:
    from distlab.sim.check import PlanMismatch, assert_consistent
    from distlab.sim.errors import ConfigError
    from distlab.sim.plan import Plan

    if args.nnodes is not None:                    # torchrun on this node (issue 20)
        from distlab.runtime.ranks.multinode import run_plan_on_node
        return run_plan_on_node(args)
    from distlab.runtime.ranks.torchrun_rank import join_group, under_torchrun
    if under_torchrun():                           # this process is one of torchrun's ranks
        from distlab.runtime.ranks.multinode import worker_args
        from distlab.runtime.ranks.worker import run_torchrun
        return run_torchrun(worker_args(args), join_group(args.backend, args.threads, args.timeout))
    plan = Plan.load(args.plan)
    from distlab.sim.scenario.header import shown
    shown(plan, args.plan)                         # its scenario header, checked before anything starts
    nproc = parse_nproc(args.nproc) if args.nproc is not None else plan.world_size
    if nproc != plan.world_size:
        raise ConfigError(f"the plan has {plan.world_size} ranks; run it with --nproc {plan.world_size}", "--nproc")
    if args.warmup < 0:
        raise ConfigError(f"{args.warmup} must be a whole number >= 0", "--warmup")
    positive_int(args.repeat, "--repeat")
    check_launch(args, nproc)                      # ranks, threads, timeout: before anything starts
    check_dtypes(plan, args.backend)
    from distlab.runtime.ranks.preflight import check_plan
    check_plan(plan, nproc)
    if not args.no_check:
        try:
            assert_consistent(plan, args.plan)
        except PlanMismatch as e:
            raise PlanMismatch(f"{e} (--no-check starts the ranks anyway)") from None
    out = args.out or os.path.splitext(args.plan)[0] + ".measured.trace"
    from distlab.sim.io import check_output
    check_output(out, "--out", "trace")     # before the ranks start
    perfetto = perfetto_path(out, args.perfetto)
    if perfetto:
        check_output(perfetto, "--perfetto", "trace")
    dump_dir = args.dump_dir or flight_path(out)
    check_output(dump_dir, "--dump-dir", "dir")     # the default <out>.flight too: never a planted link
    # check_output holds each output's lock until the command ends: a second run on the same --out refuses
    return _run(args, plan, nproc, out, perfetto, dump_dir)


def _run(args, plan, nproc: int, out: str, perfetto: str | None, dump_dir: str) -> int:
    import contextlib

    from distlab.runtime.execute.executor import merge_results
    from distlab.runtime.diagnosis.flight import clear
    from distlab.runtime.ranks.launch import Launch, RunFailed
    from distlab.runtime.execute.run_summary import summary
    from distlab.sim.cli import print_json, print_table
    payload = {"plan": plan.to_dict(), "warmup": args.warmup, "repeat": args.repeat}
    launch = Launch("distlab.runtime.execute.executor:plan_task", payload, nproc, dump_dir=dump_dir, check=False,
                    **launch_kwargs(args)).start()
    try:
        results = launch.wait_progress(args.repeat, f"{plan.name} on {nproc} ranks",
                                       lambda L: len((L.partial(0) or {}).get("runs", [])))
    except KeyboardInterrupt:
        keep_partial(plan, launch.kept, out, {"complete": False, "error": "interrupted"})
        if os.path.isdir(dump_dir):
            sys.stderr.write(f"distlab run: every rank's flight record is in {dump_dir}/: "
                             f"distlab diagnose {dump_dir}\n")
        raise
    except RunFailed as e:
        if e.refused:                       # a stranger tried to join: nothing of the run is worth keeping
            sys.stderr.write(f"distlab run: error: {e}\n")
            return 1
        keep_partial(plan, e.partial, out, {"complete": False, "failed_rank": e.rank, "error": str(e)})
        if args.verbose and e.logs.get(e.rank):
            sys.stderr.write(f"--- rank {e.rank}'s output ---\n{e.logs[e.rank]}\n---\n")
        sys.stderr.write(f"distlab run: error: {e}\n")
        sys.stderr.write(f"distlab run: every rank's flight record is in {dump_dir}/: distlab diagnose {dump_dir}\n")
        return 1
    if not args.dump_dir:                   # the default folder is kept only when the run fails
        clear(dump_dir)
        with contextlib.suppress(OSError):
            os.rmdir(dump_dir)
    head = {"scenario": plan.scenario} if plan.scenario is not None else {}     # compare shows it
    trace = merge_results(plan, results, meta={"threads": args.threads, "warmup": args.warmup,
                                               "repeat": args.repeat, **head})
    trace.save(out)
    if perfetto:
        trace.save(perfetto)
    rows = summary(trace)
    if args.json:
        print_json({"trace": out, "perfetto": perfetto, "world_size": nproc, "makespan_s": trace.makespan,
                    "backend": trace.meta.get("backend"), "streams": rows, **head})
        return 0
    from distlab.sim.scenario.header import shown
    header = shown(plan, args.plan)
    if header:
        print(f"scenario: {header['label']}")
    from distlab.sim.cli import LONG_TABLE
    print_table(f"{plan.name}: {nproc} ranks, {trace.meta.get('backend')}, makespan "
                f"{trace.makespan * 1e3:.3f} ms", ["rank", "stream", "ops", "busy (ms)", "first start (ms)",
                                                   "last end (ms)"],
                [[r["rank"], r["stream"], r["ops"], f"{r['busy_s'] * 1e3:.3f}", f"{r['start_s'] * 1e3:.3f}",
                  f"{r['end_s'] * 1e3:.3f}"] for r in rows], justify_left=2, max_rows=LONG_TABLE)
    print(f"wrote {out}" + (f" and {perfetto} (open in ui.perfetto.dev)" if perfetto else ""))
    return 0


def flight_path(out: str) -> str:
    """The default flight-record folder: --out with ``.flight`` for its extension (m.trace -> m.flight)."""
    return os.path.splitext(out)[0] + ".flight"


def perfetto_path(out: str, flag: str | None) -> str | None:
    """The Perfetto trace's path: --perfetto, else OUT.perfetto.json; None for 'none' or when --out is
    already a Chrome/Perfetto *.json."""
    from distlab.sim.errors import ConfigError
    if flag == "none":
        return None
    if flag is not None:
        if not flag.endswith(".json") or flag.endswith(".distlab.json"):
            raise ConfigError(f"{flag!r}: a Perfetto trace is a *.json file (not *.distlab.json)", "--perfetto")
        return flag
    if out.endswith(".json") and not out.endswith(".distlab.json"):
        return None
    return os.path.splitext(out.removesuffix(".distlab.json"))[0] + ".perfetto.json"


def keep_partial(plan, partial: dict, out: str, meta: dict) -> None:
    """Write what the ranks measured before a failure or Ctrl-C (meta complete: false)."""
    from distlab.runtime.execute.executor import merge_results
    kept = [p for p in (partial or {}).values() if p]
    if kept and any(p["runs"] for p in kept):
        trace = merge_results(plan, kept, run=max(len(p["runs"]) for p in kept) - 1, meta=meta)
        trace.save(out)
        sys.stderr.write(f"distlab run: kept {len(trace.ops)} measured ops in {out}\n")


def check_dtypes(plan, backend: str) -> None:
    """Refuse before starting ranks what Gloo cannot reduce (torch is imported only to resolve 'auto')."""
    from distlab.runtime.execute.collectives import GLOO_DTYPES, check_backend_dtype
    from distlab.sim.plan import Collective, Recv, Send
    bad = [(r, i, op) for r, ops in enumerate(plan.ranks) for i, op in enumerate(ops)
           if isinstance(op, (Collective, Send, Recv)) and op.dtype not in GLOO_DTYPES]
    if not bad or backend == "nccl":
        return
    if backend == "auto":
        import torch
        if torch.cuda.is_available() and torch.cuda.device_count() >= plan.world_size:
            return
    r, i, op = bad[0]
    check_backend_dtype(op.dtype, "gloo", f"{plan.name}: ranks[{r}][{i}]")
