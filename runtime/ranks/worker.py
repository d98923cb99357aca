"""One rank. Started by `distlab run` (runtime/ranks/launch.py) or by torchrun, on one node or several:

    torchrun --nproc-per-node 4 -m distlab.runtime.ranks.worker PLAN.json --out measured.trace
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \
        -m distlab.runtime.ranks.worker PLAN.json --out measured.trace          # on every node

Under torchrun, rank 0 gathers every rank's records, aligned to its clock (runtime/execute/clock.py), and writes the
one merged trace on its node.

Add ``--dump-dir DIR`` to keep every rank's flight record there (runtime/diagnosis/flight.py; read it with
``distlab diagnose DIR``); the plan is checked statically first (``--no-check`` runs a mismatched one anyway).
Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment (as
torchrun sets them). Under distlab's launcher, DISTLAB_RUN_DIR holds task.json (which function to run, with
what) and receives each rank's result, partial result and error as files.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import traceback


class Context:
    """What a task function gets: who it is, its device, and a place for partial results."""

    def __init__(self, rank, world_size, local_rank, local_world_size, backend, device, timeout, run_dir):
        self.rank, self.world_size = rank, world_size
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.backend, self.device, self.timeout, self.run_dir = backend, device, timeout, run_dir
        self.on_failure = None      # a task may set a function that saves its partial results
        self.flight = None          # this rank's flight recorder (runtime/diagnosis/flight.py), when there is one
        self.watchdog = None        # ends the rank when a plan's op runs past timeout (runtime/ranks/watchdog.py)

    def shielded(self):
        """A block that SIGTERM does not interrupt (it is raised when the block ends): for saving results."""
        return _Shield()

    def mark_running(self) -> None:
        """Tell the launcher that the timed work has begun (after setup): the file ``running.R``."""
        if self.run_dir:
            open(os.path.join(self.run_dir, f"running.{self.rank}"), "w").close()

    def save_partial(self, obj) -> None:
        """Keep results measured so far (atomically), so a failure later in the run does not lose them."""
        if self.run_dir:
            _write_json(os.path.join(self.run_dir, f"partial.{self.rank}.json"), obj)


def _write_json(path: str, obj) -> None:
    from distlab.sim.io import write_atomic
    write_atomic(path, json.dumps(obj))


def env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            from distlab.sim.errors import ConfigError
            raise ConfigError(f"environment variable {name} is not set (start ranks with distlab run or torchrun)",
                              "worker")
        return default
    return int(value)


def choose_backend(requested: str, local_world_size: int) -> str:
    """nccl when every local rank has its own GPU, else gloo; an explicit choice wins."""
    if requested != "auto":
        return requested
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        return "nccl"
    return "gloo"


def init(backend: str = "auto", threads: int = 1, timeout: float = 60.0, run_dir: str | None = None) -> Context:
    """Join the run's process group through its authenticated store (runtime/ranks/rendezvous.py)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from distlab.runtime.ranks.rendezvous import run_store
    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    local_rank = env_int("LOCAL_RANK", rank)
    local_world = env_int("LOCAL_WORLD_SIZE", world)
    backend = choose_backend(backend, local_world)
    store = run_store(rank, world, timeout, on_refused=stop_on_refusal(rank, run_dir))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout),
                                device_id=device)
    else:
        torch.set_num_threads(threads)
        device = torch.device("cpu")
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
    return Context(rank, world, local_rank, local_world, backend, device, timeout, run_dir)


REFUSED_EXIT = 3                 # a rank that stopped the run because a stranger tried to join it
WATCHDOG_EXIT = 4                # a rank its watchdog ended: an op ran past --timeout


def _end_rank(rank: int, run_dir: str | None, message: str, code: int, flight=None, **extra) -> None:
    """End this rank now, from any thread: its flight record, its error (error.R.json for the launcher; one line on
    stderr, as torchrun's ranks report errors), then os._exit."""
    try:
        if flight is not None:
            flight.dump(message)
        if run_dir:
            _write_json(os.path.join(run_dir, f"error.{rank}.json"), {"time": time.time(), "error": message, **extra})
        sys.stderr.write(f"distlab.runtime.ranks.worker: error: {message}\n")
        sys.stderr.flush()
    finally:
        os._exit(code)


def stop_on_refusal(rank: int, run_dir: str | None):
    """What rank 0 does when a process without the run's secret connects to the store: end the run at once, with
    one line naming the address."""
    def stop(address: str, reason: str) -> None:
        _end_rank(rank, run_dir, f"refused a connection to the run's store from {address}: {reason}; the run was "
                  f"stopped", REFUSED_EXIT, refused=address)
    return stop


def start_watchdog(ctx) -> None:
    """Give ``ctx`` a watchdog (runtime/ranks/watchdog.py): an op running past ctx.timeout ends the rank, naming it."""
    from distlab.runtime.ranks.watchdog import Watchdog
    ctx.watchdog = Watchdog(ctx.rank, ctx.timeout, lambda message: _end_rank(
        ctx.rank, ctx.run_dir, message, WATCHDOG_EXIT, getattr(ctx, "flight", None)))


def load_target(spec: str):
    """``package.module:function`` or ``path/to/file.py:function``."""
    mod_name, _, func = spec.rpartition(":")
    if mod_name.endswith(".py"):
        s = importlib.util.spec_from_file_location("distlab_task", mod_name)
        module = importlib.util.module_from_spec(s)
        s.loader.exec_module(module)
    else:
        module = importlib.import_module(mod_name)
    return getattr(module, func)


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel SIGKILLs this rank if the launcher dies (prctl PR_SET_PDEATHSIG = 1). Elsewhere (macOS:
    no prctl) a daemon thread looks every PARENT_POLL_S whether the parent is still this rank's parent: once
    it died, the rank was re-parented (to launchd, or to a subreaper) and ends itself the same way."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
        except Exception:
            pass
    else:
        threading.Thread(target=_poll_parent, args=(parent,), daemon=True, name="distlab-parent").start()
    if os.getppid() != parent:          # the launcher died before prctl took effect
        os._exit(1)


PARENT_POLL_S = 0.5


def _poll_parent(parent: int, period: float = PARENT_POLL_S) -> None:
    while os.getppid() == parent:
        time.sleep(period)
    os._exit(1)


_SHIELD = {"depth": 0, "pending": False}


class _Shield:
    def __enter__(self):
        _SHIELD["depth"] += 1

    def __exit__(self, *exc):
        _SHIELD["depth"] -= 1
        if _SHIELD["depth"] == 0 and _SHIELD["pending"] and exc[0] is None:
            raise SystemExit("terminated (SIGTERM)")


def _on_sigterm(signum, frame):
    """The first SIGTERM raises SystemExit (unless shielded); any later one is only noted."""
    if _SHIELD["depth"] or _SHIELD["pending"]:
        _SHIELD["pending"] = True
        return
    _SHIELD["pending"] = True
    raise SystemExit("terminated (SIGTERM)")


def run_task(run_dir: str) -> int:
    with open(os.path.join(run_dir, "task.json")) as f:
        task = json.load(f)
    rank = env_int("RANK")
    if "DISTLAB_PARENT_PID" in os.environ:
        _die_with_parent(int(os.environ["DISTLAB_PARENT_PID"]))
    signal.signal(signal.SIGTERM, _on_sigterm)
    ctx = None
    flight = _recorder(os.environ.get("DISTLAB_FLIGHT_DIR") or run_dir, rank)
    try:
        ctx = init(task["backend"], task["threads"], task["timeout"], run_dir)
        ctx.flight = flight
        start_watchdog(ctx)
        open(os.path.join(run_dir, f"ready.{rank}"), "w").close()
        result = load_target(task["target"])(ctx, task["payload"])
        _write_json(os.path.join(run_dir, f"result.{rank}.json"), result)
        if flight is not None:
            flight.dump(COMPLETED)        # a final dump: `distlab diagnose` then knows this rank finished
        _finish()
        return 0
    except BaseException as e:       # noqa: BLE001 - report every failure, then exit non-zero
        _SHIELD["depth"] += 1        # a SIGTERM now waits until the partial results and the error are saved
        try:
            if ctx is not None and ctx.on_failure is not None:
                ctx.on_failure()
        except Exception:            # noqa: BLE001 - the error below matters more
            traceback.print_exc()
        message = f"{type(e).__name__}: {e}".strip().splitlines()[0][:500] if str(e) else type(e).__name__
        try:
            if flight is not None:
                flight.dump(message)
        except Exception:            # noqa: BLE001 - the error below matters more
            traceback.print_exc()
        _write_json(os.path.join(run_dir, f"error.{rank}.json"), {"time": time.time(), "error": message})
        traceback.print_exc()
        return 1


COMPLETED = "completed"          # the reason of the final dump a rank writes when its task ends well


def _recorder(directory: str | None, rank: int):
    """This rank's flight recorder in ``directory`` (none when DISTLAB_FLIGHT=0 or without a directory)."""
    if not directory or os.environ.get("DISTLAB_FLIGHT") == "0":
        return None
    from distlab.runtime.diagnosis.flight import Recorder
    rec = Recorder(directory, rank, env_int("WORLD_SIZE"))
    rec.watch_signals()
    return rec


def _finish() -> None:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run_torchrun(argv: list[str], ctx: Context | None = None) -> int:
    """Run a plan under torchrun: every rank executes, rank 0 gathers the records and writes the trace. ``ctx``:
    a process group joined already (`distlab run` under torchrun, runtime/ranks/torchrun_rank.py), kept after the run;
    without one, this joins torchrun's group and leaves it at the end."""
    p = argparse.ArgumentParser(prog="python -m distlab.runtime.ranks.worker", description="Run a plan under torchrun.")
    p.add_argument("plan")
    p.add_argument("--out", default="measured.trace")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=1, help="timed runs; the trace keeps the median one")
    p.add_argument("--dump-dir", help="flight records of every rank go here (see distlab diagnose)")
    p.add_argument("--no-check", action="store_true", help="run even a plan that the static check refuses")
    p.add_argument("--json", action="store_true", help="rank 0 prints the summary as one line of JSON "
                   "(distlab.run/1, as `distlab run --json`)")
    args = p.parse_args(argv)
    from distlab.runtime.execute.clock import describe
    from distlab.runtime.execute.executor import merge_results, plan_task
    from distlab.runtime.execute.wire import gather_json
    from distlab.sim.check import assert_consistent
    from distlab.sim.errors import ConfigError
    from distlab.sim.plan import Plan
    from distlab.runtime.execute.clock import install_test_shift
    install_test_shift()                     # (also when `distlab run` calls this under torchrun)
    _die_with_parent(os.getppid())           # torchrun's agent: if it dies, so does this rank
    plan = Plan.load(args.plan)
    world = env_int("WORLD_SIZE")
    if plan.world_size != world:           # before joining the group: every rank says so at once
        raise ConfigError(f"the plan has {plan.world_size} ranks but torchrun started {world} (nnodes x "
                          f"nproc-per-node must equal it)", "WORLD_SIZE")
    if not args.no_check:
        assert_consistent(plan, args.plan)
    signal.signal(signal.SIGTERM, _on_sigterm)
    flight = _recorder(args.dump_dir or os.environ.get("DISTLAB_FLIGHT_DIR"), env_int("RANK"))
    own_group = ctx is None
    ctx = init(args.backend, args.threads, args.timeout) if own_group else ctx
    ctx.flight = flight
    if ctx.watchdog is None:
        start_watchdog(ctx)
    try:
        result = plan_task(ctx, {"plan": plan.to_dict(), "warmup": args.warmup, "repeat": args.repeat})
        gathered = gather_json(result, dst=0)
        if ctx.rank == 0:
            trace = merge_results(plan, gathered)
            trace.save(args.out)
            if args.json:
                from distlab.runtime.execute.run_summary import run_json
                print(json.dumps(run_json(trace, args.out)))
            else:
                print(f"wrote {args.out}: {ctx.world_size} ranks, makespan {trace.makespan * 1e3:.3f} ms")
                if "clock" in trace.meta:
                    print(describe(trace.meta["clock"]))
        if flight is not None:
            flight.dump(COMPLETED)
        if own_group:
            _finish()
    except BaseException as e:
        if flight is not None:
            flight.dump(f"{type(e).__name__}: {e}".strip().splitlines()[0][:500])
        raise
    return 0


def main(argv: list[str] | None = None) -> int:
    from distlab.runtime.execute.clock import install_test_shift
    install_test_shift()
    run_dir = os.environ.get("DISTLAB_RUN_DIR")
    if run_dir:
        rc = run_task(run_dir)
    else:
        from distlab.sim.errors import ConfigError
        try:
            rc = run_torchrun(sys.argv[1:] if argv is None else argv)
        except ConfigError as e:              # a bad or mismatched plan: one line, as the CLI prints it
            sys.stderr.write(f"distlab.runtime.ranks.worker: error: {e}\n")
            rc = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)      # do not wait for Gloo's or the executor's threads


if __name__ == "__main__":
    main()
