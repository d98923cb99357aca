"""Execute one rank's ops of a plan for real and time each one.

Before timing: every process group the plan uses is created on all ranks in one sorted order (one group per
(ranks, group_name), as ``dist.new_group`` makes them: the plan's communicators, sim/kernel/communicators.py),
one group for point-to-point (pairs match in order, as in the plan), and every buffer and matmul operand is
allocated (one set per stream, op and size, reused).
On CPU each plan stream is a thread that issues its ops in order (async_op=True) and waits on each Gloo work
handle before the next, so streams overlap like CUDA streams and a stream's ops never overlap each other. A
group used by several streams gets its collectives in plan order (a thread waits for its turn: Gloo matches
collectives by the order they are issued, its tags); the group's worker threads then run them, at most two at
a time (ProcessGroupGloo, Options::threads).
Record/Wait are counters: a Wait at position i of the rank's list waits for the Records of its event placed
before i (cudaEventRecord / cudaStreamWaitEvent semantics); a Wait with no Record before it is a no-op. On GPUs
(runtime/execute/cuda_exec.py) the streams are CUDA streams and times come from CUDA events.
Times are time.perf_counter() (CLOCK_MONOTONIC, one clock for all processes of a host), aligned across hosts
by runtime/execute/clock.py, and start at 0 = the first rank's exit from the barrier that starts each run.
"""
from __future__ import annotations

import functools
import statistics
import threading
import time
from collections import defaultdict

from distlab.runtime.execute.collectives import check_backend_dtype, issue, make_buffers, split_sizes
from distlab.runtime.execute.issue_order import IssueOrder
from distlab.sim.collectives.algorithms import NCCL_NAMES
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Collective, Compute, Plan, Record, Recv, Send, Wait
from distlab.sim.trace import OpRecord, Trace

NCCL_ALGOS = NCCL_NAMES        # our algorithm -> NCCL_ALGO's name (sim.collectives.algorithms declares both)


def group_keys(plan: Plan) -> list:
    """Every process group (Communicator: ranks, name) some rank's collective uses, in a deterministic order."""
    keys = {plan.communicator_of(op) for ops in plan.ranks for op in ops if isinstance(op, Collective)}
    return sorted(keys)


class Executor:
    """Prepared once per plan; ``run()`` executes it and returns [(index, start, end)] on this rank."""

    def __init__(self, plan: Plan, ctx):
        import os

        import torch.distributed as dist
        self.plan, self.ctx, self.rank = plan, ctx, ctx.rank
        self.cuda = ctx.device.type == "cuda"
        ops = plan.ranks[self.rank]
        for i, op in enumerate(ops):
            if isinstance(op, (Collective, Send, Recv)):
                check_backend_dtype(op.dtype, ctx.backend, f"plan: ranks[{self.rank}][{i}]")
        algos = {op.algorithm for o in plan.ranks for op in o if isinstance(op, Collective)} - {"auto"}
        if ctx.backend == "nccl" and algos and "NCCL_ALGO" not in os.environ:
            os.environ["NCCL_ALGO"] = ",".join(sorted(NCCL_ALGOS[a] for a in algos if a in NCCL_ALGOS)) or "Ring"
        from datetime import timedelta
        timeout = timedelta(seconds=ctx.timeout)      # new_group does not inherit it (default 30 min on Gloo)
        self.groups = {key: dist.new_group(list(key[0]), timeout=timeout) for key in group_keys(plan)}
        has_p2p = any(isinstance(op, (Send, Recv)) for o in plan.ranks for op in o)
        self.p2p = dist.new_group(list(range(plan.world_size)), timeout=timeout) if has_p2p else None
        self.matmuls: dict[str, object] = {}
        self.steps = self._prepare(ops)
        self.partial: dict[str, list] = {}

    # -- preparation ---------------------------------------------------------------------------------------
    def _prepare(self, ops) -> dict[str, list]:
        from distlab.runtime.execute.compute import Matmuls
        buffers: dict[tuple, tuple] = {}
        records_before: dict[str, int] = defaultdict(int)
        steps: dict[str, list] = defaultdict(list)
        streams_of = defaultdict(set)                  # communicator -> the streams issuing on it here
        for op in ops:
            if isinstance(op, Collective):
                streams_of[self.plan.communicator_of(op)].add(op.stream)
        self.turns = IssueOrder(self.ctx.timeout)
        issued = defaultdict(int)
        for i, op in enumerate(ops):
            fn, event, need = None, None, 0
            if isinstance(op, Collective):
                comm = self.plan.communicator_of(op)
                group = comm.ranks
                split = split_sizes(op, group.index(self.rank)) if op.splits is not None else None
                key = (op.stream, op.op, op.bytes, op.dtype, len(group), split)
                if key not in buffers:
                    buffers[key] = make_buffers(op.op, op.bytes, op.dtype, len(group), self.ctx.device, split)
                inp, out = buffers[key]
                fn = functools.partial(issue, op.op, inp, out, self.groups[comm], op.root, True, split)
                if len(streams_of[comm]) > 1 and not self.cuda:     # issued in plan order (the GPU path is)
                    fn = functools.partial(self.turns.issue, fn, comm, issued[comm])
                issued[comm] += 1
                flight = getattr(self.ctx, "flight", None)
                if flight is not None:         # runtime/diagnosis/flight.py: records it, and waits on CPU streams
                    fn = flight.wrap(fn, flight.key(group, op.stream), op.op, op.bytes, op.dtype, op.root, i,
                                     block=not self.cuda)
                elif not self.cuda:            # a CPU stream waits on the work handle before its next op
                    fn = functools.partial(_wait, fn)
            elif isinstance(op, (Send, Recv)):
                key = (op.stream, "p2p", op.bytes, op.dtype)
                if key not in buffers:
                    buffers[key] = make_buffers("all_reduce", op.bytes, op.dtype, 1, self.ctx.device)
                fn = functools.partial(_p2p, isinstance(op, Send), buffers[key][0], op.peer, self.p2p)
            elif isinstance(op, Compute):
                if op.stream not in self.matmuls:
                    self.matmuls[op.stream] = Matmuls(self.ctx.device)
                mm = self.matmuls[op.stream]
                fn = mm.work_for(op.seconds, op.flops, op.bytes)
            elif isinstance(op, Record):
                event = op.event
                records_before[op.event] += 1
            elif isinstance(op, Wait):
                event, need = op.event, records_before[op.event]
            steps[op.stream].append((i, op.kind, fn, event, need, _what(op)))
        return dict(steps)

    # -- execution -----------------------------------------------------------------------------------------
    def run(self) -> list[tuple[int, float, float]]:
        if self.cuda:
            from distlab.runtime.execute.cuda_exec import run_cuda
            out = run_cuda(self)
            if getattr(self.ctx, "flight", None) is not None:
                self.ctx.flight.synchronized()
            return out
        self.partial = {s: [] for s in self.steps}
        self.turns.reset()
        events = _Events(self.ctx.timeout)
        dog = getattr(self.ctx, "watchdog", None)      # runtime/ranks/watchdog.py: no op runs past --timeout
        if len(self.steps) <= 1:                       # one stream: no thread at all
            for stream, steps in self.steps.items():
                _run_stream(steps, self.partial[stream], events, stream, dog)
        else:
            _run_threads(self.steps, self.partial, events, dog)
        return sorted(r for recs in self.partial.values() for r in recs)


def _wait(start) -> None:
    start().wait()


def _p2p(send: bool, buf, peer: int, group) -> None:
    import torch.distributed as dist
    work = dist.isend(buf, dst=peer, group=group) if send else dist.irecv(buf, src=peer, group=group)
    work.wait()


class _Events:
    """Counters of Records per event name; Wait blocks until a count is reached (or the run aborts)."""

    def __init__(self, timeout: float):
        self.cond = threading.Condition()
        self.count: dict[str, int] = defaultdict(int)
        self.aborted = False
        self.timeout = timeout

    def record(self, event: str) -> None:
        with self.cond:
            self.count[event] += 1
            self.cond.notify_all()

    def wait(self, event: str, need: int) -> None:
        if need <= 0:
            return
        with self.cond:
            ok = self.cond.wait_for(lambda: self.count[event] >= need or self.aborted, self.timeout)
        if self.aborted:
            raise RuntimeError("aborted: another stream failed")
        if not ok:
            raise TimeoutError(f"waited more than {self.timeout:g} s for event {event!r}")

    def abort(self) -> None:
        with self.cond:
            self.aborted = True
            self.cond.notify_all()


def _what(op) -> str:
    """An op in a few words, for the watchdog's message."""
    from distlab.sim.plan import describe
    if isinstance(op, Compute):
        return f"compute {op.name!r}" if op.name else "compute"
    if isinstance(op, (Record, Wait)):
        return f"{op.kind} {op.event!r}"
    return describe(op)


def _run_stream(steps, out: list, events: _Events, stream: str = "", dog=None) -> None:
    clock = time.perf_counter
    for index, kind, fn, event, need, what in steps:
        if dog is not None:
            dog.enter(stream, index, what)
        t0 = clock()
        if fn is not None:
            fn()
        elif kind == "record":
            events.record(event)
        else:
            events.wait(event, need)
        out.append((index, t0, clock()))
    if dog is not None:
        dog.leave(stream)


def _run_threads(streams: dict, partial: dict, events: _Events, dog=None) -> None:
    """One daemon thread per stream; the first error aborts the others and is raised here.

    Each thread first sets torch's intra-op threads to the rank's (``torch.set_num_threads`` in the main thread,
    runtime/ranks/worker.py): OpenMP keeps that count per thread (the nthreads-var ICV, OpenMP 4.5 sec. 2.3.2), so a
    new thread's matmuls would otherwise start a team of one OpenMP thread per core. On 2 cores that made the
    compute stream of `distlab validate`'s overlap plan 4-35x slower than the same matmuls timed in the main
    thread (48 x 256^3 matmuls: 54-62 ms in the main thread, 221-2045 ms in a new thread, 78-97 ms after
    set_num_threads there; measured on this 2-core machine under load), which is where its 2-14x errors came
    from (docs/calibration.md)."""
    import torch
    intra_op = torch.get_num_threads()
    errors: list[tuple[str, BaseException]] = []
    done = threading.Semaphore(0)

    def body(stream):
        try:
            torch.set_num_threads(intra_op)
            _run_stream(streams[stream], partial[stream], events, stream, dog)
        except BaseException as e:        # noqa: BLE001 - handed to the main thread
            errors.append((stream, e))
            events.abort()
        finally:
            done.release()

    threads = [threading.Thread(target=body, args=(s,), daemon=True, name=f"stream-{s}") for s in streams]
    for t in threads:
        t.start()
    for _ in threads:
        done.acquire()
        if errors:     # threads blocked in a collective stay behind; the worker exits without joining them
            stream, e = errors[0]
            raise RuntimeError(f"stream {stream!r}: {type(e).__name__}: {e}") from e


# -- the task the launcher (or torchrun) runs on every rank -------------------------------------------------
def plan_task(ctx, payload: dict, between=None) -> dict:
    """Run the plan ``warmup`` times untimed then ``repeat`` times timed. Each run: {"zero": this rank's exit
    from the starting barrier, "ops": [[index, start, end], ...]}, in seconds on rank 0's clock. ``between``:
    called on every rank before each run (a calibration round interleaved with the runs, runtime/measure/sweep.py)."""
    from distlab.runtime.execute.clock import Alignment, measure, start_barrier
    plan = Plan.from_dict(payload["plan"])
    if plan.world_size != ctx.world_size:
        raise ConfigError(f"the plan has {plan.world_size} ranks but {ctx.world_size} were started", "--nproc")
    ex = Executor(plan, ctx)
    before = measure(ctx)
    offset = before.offset_s
    runs: list = []
    warmup, repeat = int(payload.get("warmup", 1)), int(payload.get("repeat", 1))
    now = {"k": -1, "zero": 0.0}

    def keep_partial():            # the worker calls this if the run fails or is terminated
        done = sorted(r for recs in ex.partial.values() for r in recs)
        cut = [{"zero": now["zero"], "ops": [[i, a - offset, b - offset] for i, a, b in done]}]
        ctx.save_partial({"rank": ctx.rank, "runs": runs + (cut if now["k"] >= warmup and done else []),
                          "complete": False})
    ctx.on_failure = keep_partial
    if hasattr(ctx, "mark_running"):
        ctx.mark_running()
    for k in range(warmup + repeat):
        if between is not None:
            between()
        now["zero"] = start_barrier(ctx, offset)
        now["k"] = k
        raw = ex.run()
        if k >= warmup:
            runs.append({"zero": now["zero"], "ops": [[i, a - offset, b - offset] for i, a, b in raw]})
            ctx.save_partial({"rank": ctx.rank, "runs": runs, "complete": False})
        ex.partial = {}
    ctx.on_failure = None
    align = Alignment(before, measure(ctx))        # again after the run: the drift, interpolated over it
    runs = [_realign(r, offset, align) for r in runs]
    rates = {s: mm.flops_per_s for s, mm in ex.matmuls.items() if mm.seconds_per_iter}
    return {"rank": ctx.rank, "runs": runs, "complete": True, "backend": ctx.backend,
            "device": str(ctx.device), "clock_offset": offset, "clock": align.report(), "matmul_flops_per_s": rates}


def _realign(run: dict, offset: float, align) -> dict:
    """Times shifted by the offset measured before -> by the offset interpolated at each time (clock drift)."""
    def fix(t):
        return align(t + offset)
    return {"zero": fix(run["zero"]), "ops": [[i, fix(a), fix(b)] for i, a, b in run["ops"]]}


def merge_results(plan: Plan, results: list, run: int | None = None, meta: dict | None = None) -> Trace:
    """Per-rank results of plan_task -> one Trace (source=measured). ``run`` None = the median makespan.

    A collective's ``launch`` is the latest start among its group's members for the same call (the k-th
    collective of that process group on each member): when all had arrived. A send's and its receive's
    ``launch`` is the later of their two starts (both posted), as in sim/kernel/engine.py.
    """
    per_rank = {r["rank"]: r for r in results if r}
    n_runs = min((len(r["runs"]) for r in per_rank.values()), default=0)
    if run is None and n_runs:
        spans = []
        for k in range(n_runs):
            recs = [x for r in per_rank.values() for x in r["runs"][k]["ops"]]
            spans.append((max(x[2] for x in recs) - min(x[1] for x in recs)) if recs else 0.0)
        run = spans.index(statistics.median_low(spans))
    picked = {rank: r["runs"][min(run, len(r["runs"]) - 1)] for rank, r in per_rank.items()
              if r["runs"] and run is not None}
    zero = min((p["zero"] for p in picked.values()), default=0.0)
    ops = []
    seq: dict[tuple, list] = defaultdict(list)
    for rank in sorted(picked):
        for index, start, end in picked[rank]["ops"]:
            op = plan.ranks[rank][index]
            rec = OpRecord(rank, op.stream, index, op.kind, _name(op), start - zero, end - zero)
            if isinstance(op, Collective):
                rec.bytes, rec.op, rec.algorithm = op.bytes, op.op, op.algorithm
                rec.group = plan.group_of(op)
                seq[(plan.communicator_of(op), rank)].append(rec)
            elif isinstance(op, (Send, Recv)):
                rec.bytes, rec.peer = op.bytes, op.peer
                pair = (rank, op.peer) if isinstance(op, Send) else (op.peer, rank)
                seq[("p2p", pair, isinstance(op, Send))].append(rec)
            elif isinstance(op, Compute):
                rec.bytes = int(op.bytes)
            ops.append(rec)
    for key, recs in seq.items():
        if key[0] == "p2p":                         # the k-th send a -> b meets the k-th recv at b from a
            other = seq.get(("p2p", key[1], not key[2]), [])
            for k, rec in enumerate(recs):
                rec.launch = max(rec.start, other[k].start) if k < len(other) else None
            continue
        comm, rank = key
        for k, rec in enumerate(recs):
            peers = [seq.get((comm, m), []) for m in comm.ranks]
            starts = [p[k].start for p in peers if k < len(p)]
            rec.launch = max(starts) if len(starts) == len(comm.ranks) else None
    ops.sort(key=lambda o: (o.rank, o.index))
    info = {"source": "measured", "plan": plan.name, "world_size": plan.world_size, "run": run,
            "complete": all(r.get("complete", False) for r in per_rank.values()) and len(per_rank) == plan.world_size}
    any_r = next(iter(per_rank.values()), {})
    for key in ("backend", "device"):
        if key in any_r:
            info[key] = any_r[key]
    clocks = {rank: r["clock"] for rank, r in per_rank.items() if r.get("clock")}
    if clocks:
        from distlab.runtime.execute.clock import summarize
        info["clock"] = summarize(clocks)
    info.update(meta or {})
    return Trace(ops, [], info)


def _name(op) -> str:
    if isinstance(op, (Record, Wait)):
        return op.event
    if isinstance(op, Compute):
        return op.name
    return op.name or (op.op if isinstance(op, Collective) else op.kind)      # as sim/kernel/engine.py names them
