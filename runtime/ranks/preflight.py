"""Checks made in the launcher's process before any rank starts: memory, the NCCL backend, cores.

Memory per rank (bytes), a simple estimate of what the runtime allocates on each CPU rank. P = the model's
parameter bytes (in its dtype), A = its activation bytes for one micro-batch (sim.models: each layer's saved
output), N = the ranks sharing it, Adam keeps two states per parameter (exp_avg, exp_avg_sq: torch.optim.Adam):

- DDP (runtime/parallel/ddp.py rank_task): the wrapped model's params P, grads P, DDP's gradient buckets P (torch's
  Reducer copies every gradient into a flat bucket), Adam 2P, and the unwrapped reference model the same
  launch times (params P + grads P): 7P + A (the two models run forward and backward in turn).
- FSDP (runtime/parallel/fsdp.py rank_task): every rank builds the whole model before ``fully_shard`` and also times an
  unsharded reference with Adam (params, grads, 2 states: 4P); the sharded model keeps 4P/N (params, grads,
  Adam; sim.fsdp.memory.static_bytes) plus its gathered units (sim.fsdp.memory.estimate): 4P + 4P/N +
  gathered + A.
- Pipeline (runtime/parallel/pipeline.py): a rank builds only its stages: 4 P/S (params, grads, optimizer states) and
  the activations of every micro-batch in flight, at most A x M / S (S stages, M micro-batches).
- A plan (`distlab run`, runtime/execute/executor.py): one input and one output buffer per distinct (stream, op, size,
  dtype): sum of in + out bytes (runtime.execute.collectives.element_counts).

Each rank also holds the torch runtime itself: RANK_BASE_BYTES (about 220 MiB resident after
``import torch`` with torch 2.13 CPU, measured with /proc/self/status VmRSS, plus Gloo's buffers).
The host's free memory is MemAvailable in /proc/meminfo (the kernel's estimate of what can be allocated
without swapping, Linux >= 3.14). The run is refused when N ranks x the estimate exceed it.
"""
from __future__ import annotations

import os
import sys

from distlab.sim.errors import ConfigError

RANK_BASE_BYTES = 300 * 2**20
GiB = 2**30
_warned: set = set()


def mem_available(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable in bytes, or None where /proc/meminfo has none (not Linux)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and taskset restrict)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_world_sizes(threads: int = 1, candidates: tuple[int, ...] = (2, 4)) -> str:
    """The world sizes `calibrate` and `validate` measure when --nproc is left out: those of ``candidates`` whose
    ranks x ``threads`` fit this process's cores (at least the smallest: collectives need 2 ranks), so that a
    default never starts more ranks than cores (e.g. "2" on 2 cores, "2,4" on 4 or more)."""
    fit = [n for n in candidates if n * max(threads, 1) <= cpu_cores()]
    return ",".join(str(n) for n in fit or candidates[:1])


MAX_RANKS_PER_CORE = 8           # more ranks than this per core only measure waiting (and can exhaust fork limits)
TIMEOUT_S = (1.0, 7 * 86400.0)   # a rank needs ~1 s to start and join; past 7 days a timeout is a typo (inf, 1e300)


def check_host_bounds(nproc: int, threads, timeout) -> None:
    """Ranks at most MAX_RANKS_PER_CORE per core found, --threads 1 to the cores, --timeout within TIMEOUT_S
    (issue 41: --threads 1000000 made threads until killed, --nproc 1000 a fork-limit traceback, --timeout inf
    and 1e-9 started the ranks, then failed)."""
    cores = cpu_cores()
    if nproc > MAX_RANKS_PER_CORE * cores:
        raise ConfigError(f"{nproc} ranks on {cores} CPU core{'s' if cores > 1 else ''} is more than this host can "
                          f"run (at most {MAX_RANKS_PER_CORE * cores}: {MAX_RANKS_PER_CORE} per core)", "--nproc")
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= cores:
        raise ConfigError(f"{threads!r} must be a whole number from 1 to {cores} (the CPU cores found)", "--threads")
    if not (isinstance(timeout, (int, float)) and TIMEOUT_S[0] <= timeout <= TIMEOUT_S[1]):
        raise ConfigError(f"{timeout!r} must be a number of seconds from {TIMEOUT_S[0]:g} to {TIMEOUT_S[1]:g} "
                          "(7 days)", "--timeout")


def warn_cores(nproc: int, threads: int = 1, command: str = "distlab") -> bool:
    """One line on stderr (once per process) when ``nproc`` ranks x ``threads`` outnumber the cores."""
    cores = cpu_cores()
    if nproc * threads <= cores or _warned:
        return False
    _warned.add(nproc)
    from distlab.sim.output import wrapped
    sys.stderr.write(wrapped(f"{command}: warning: {nproc} ranks x {threads} thread{'s' if threads > 1 else ''} on "
                             f"{cores} CPU core{'s' if cores > 1 else ''}: ranks take turns on the cores, so measured "
                             f"times include waiting for one (use --nproc {max(cores // threads, 1)} or fewer for "
                             "clean timings)"))
    sys.stderr.flush()
    return True


def check_nccl(nproc: int) -> None:
    """``--backend nccl`` needs a CUDA build of torch with NCCL and one GPU per rank (NCCL refuses two ranks on
    one GPU of a communicator: 'Duplicate GPU detected'); a ConfigError otherwise, before any rank starts."""
    import torch
    import torch.distributed as dist
    if torch.version.cuda is None:
        raise ConfigError(f"NCCL needs a CUDA build of torch; this torch {torch.__version__} is a CPU build; "
                          "allowed here: gloo, or auto", "--backend")
    if not dist.is_nccl_available():
        raise ConfigError(f"this torch {torch.__version__} was built without NCCL; allowed here: gloo, or auto",
                          "--backend")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not gpus:
        raise ConfigError("NCCL needs CUDA GPUs; torch.cuda.is_available() is False on this host; allowed here: "
                          "gloo, or auto", "--backend")
    if gpus < nproc:
        raise ConfigError(f"NCCL needs one CUDA GPU per rank: {nproc} ranks, {gpus} GPU{'s' if gpus > 1 else ''} "
                          f"visible; use --nproc {gpus} or fewer, or --backend gloo", "--backend")


# --- memory ------------------------------------------------------------------------------------------------
def model_rank_bytes(model, kind: str, world: int, opts: dict | None = None) -> dict:
    """{part: bytes} one rank allocates for a real ``kind`` run of ``model`` (module docstring's formulas)."""
    opts = opts or {}
    P = model.param_bytes
    A = int(sum(layer.activation_bytes for layer in model.layers))
    if kind == "ddp":
        return {"params": P, "grads": P, "DDP buckets": P, "Adam states": 2 * P, "reference model": 2 * P,
                "activations": A}
    if kind == "fsdp":
        from distlab.sim.parallel.memory import estimate
        shard = estimate(model, world, 3, opts.get("shard_size"), reshard_after_forward=opts.get(
            "reshard_after_forward", True) is True, prefetch=int(opts.get("prefetch", 1) or 1))
        sharded = 4 * P // (opts.get("shard_size") or world)      # params, grads, Adam in P's dtype: 4P/N
        return {"whole model + reference": 4 * P, "shards (params, grads, Adam)": sharded,
                "gathered units": shard["unsharded params"], "activations": A}
    if kind == "pipeline":
        stages = max(int(opts.get("stages", world) or world), 1)
        micro = max(int(opts.get("microbatches", 1) or 1), 1)
        return {"stage params, grads, optimizer": 4 * P // stages, "activations in flight": A * micro // stages}
    return {"params": P, "activations": A}


def plan_rank_bytes(plan) -> dict:
    """{part: bytes} of the collective buffers the executor allocates, the largest rank."""
    from distlab.runtime.execute.collectives import element_counts
    from distlab.sim.plan import DTYPE_BYTES, Collective, Recv, Send
    worst = 0
    for ops in plan.ranks:
        keys = {}
        for op in ops:
            if isinstance(op, Collective):
                n = len(plan.group_of(op))
                i, o = element_counts(op.op, op.bytes, op.dtype, n)
                same = op.op in ("all_reduce", "broadcast", "reduce", "barrier")
                keys[(op.stream, op.op, op.bytes, op.dtype, n)] = (i + (0 if same else o)) * DTYPE_BYTES[op.dtype]
            elif isinstance(op, (Send, Recv)):
                keys[(op.stream, "p2p", op.bytes, op.dtype)] = op.bytes
        worst = max(worst, sum(keys.values()))
    return {"collective buffers": worst}


def check_fits(parts: dict, nproc: int, what: str, where: str, change: str, available: int | None = None) -> None:
    """ConfigError (one line: needed per rank, available on this host, what to change) when ``nproc`` ranks of
    ``parts`` + RANK_BASE_BYTES do not fit in MemAvailable."""
    available = mem_available() if available is None else available
    if available is None:
        return
    per_rank = sum(parts.values()) + RANK_BASE_BYTES
    if per_rank * nproc <= available:
        return
    top = ", ".join(f"{k} {v / GiB:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])[:3] if v)
    raise ConfigError(f"{what} needs about {per_rank / GiB:.1f} GiB per rank ({top} GiB, torch "
                      f"{RANK_BASE_BYTES / GiB:.1f} GiB) x {nproc} rank{'s' if nproc > 1 else ''} = "
                      f"{per_rank * nproc / GiB:.1f} GiB, but this host has {available / GiB:.1f} GiB available "
                      f"(MemAvailable); {change}", where)


def check_scenario(scenario, nproc: int, available: int | None = None, path: str | None = None) -> None:
    """Refuse `distlab validate --scenario` when the real ranks would not fit in this host's memory. ``scenario``:
    the typed Scenario (sim/scenario/spec.py) of the file ``path``, or the path itself (parsed here)."""
    from distlab.sim import scenario as sc
    path = path or (scenario if isinstance(scenario, str) else "scenario")
    s = sc.from_dict(scenario) if isinstance(scenario, str) else scenario
    model, _ = sc.resolve(s, path)
    opts = sc.parallelism(s.source)              # the flat options as written (the real run's world is nproc)
    kind = s.workload
    world = int(opts.get("stages", 2) or 2) if kind == "pipeline" else max(nproc, 2)
    parts = model_rank_bytes(model, kind, world, opts)
    every = "every rank builds the whole model, so fewer ranks do not help; " if kind in ("ddp", "fsdp") else ""
    check_fits(parts, world, f"{model.name} ({model.num_params / 1e9:.3g}B params, {kind} on {world} CPU ranks)",
               path, f"{every}use a smaller model in the scenario (fewer layers, a smaller hidden; e.g. "
               "scenarios/fsdp-cpu.yaml) or a host with more memory", available)


def check_plan(plan, nproc: int, available: int | None = None) -> None:
    """Refuse `distlab run` when the plan's buffers on ``nproc`` ranks would not fit in this host's memory."""
    check_fits(plan_rank_bytes(plan), nproc, f"plan {plan.name!r}", "plan",
               "use smaller collectives in the plan, or a host with more memory", available)
