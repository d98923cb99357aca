"""Options shared by the runtime commands (ranks, backend, threads, timeout) and their checks."""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.plan import COLLECTIVES


def add_launch_arguments(p, nproc_help: str = "number of local ranks", nproc_default=None) -> None:
    p.add_argument("--nproc", default=nproc_default, help=nproc_help)
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"),
                   help="auto: nccl when every rank has its own GPU, else gloo")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per CPU rank (default 1)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a rank waits for a peer before the run fails (default 60)")
    p.add_argument("-v", "--verbose", action="store_true", help="more detail: every row of long tables, and "
                   "each rank's pid")


def launch_kwargs(args) -> dict:
    """Launch options from the flags (and a one-line warning, naming the command, when ranks outnumber cores)."""
    return {"backend": args.backend, "threads": args.threads, "timeout": args.timeout, "verbose": args.verbose,
            "warn_cores": f"distlab {getattr(args, 'command', None) or 'run'}"}


def parse_nprocs(text, where: str = "--nproc") -> list[int]:
    """``'2,4'`` -> [2, 4]; each a whole number >= 1."""
    out = []
    for part in str(text).split(","):
        try:
            n = int(part)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"{part!r} is not a whole number of ranks >= 1", where)
        out.append(n)
    return out


def scenario_nproc(args, default: int) -> int:
    """`distlab validate --scenario`'s world size: the first of --nproc, or ``default`` when it is left out (None);
    at least 2."""
    text = getattr(args, "nproc", None)
    return max(parse_nprocs(text)[0] if text is not None else default, 2)


def parse_nproc(text, where: str = "--nproc") -> int:
    """One world size."""
    if "," in str(text):
        raise ConfigError(f"{text!r}: give one number of ranks here", where)
    return parse_nprocs(text, where)[0]


def parse_ops(text: str, where: str = "--ops", allow_barrier: bool = True) -> list[str]:
    allowed = [c for c in COLLECTIVES if allow_barrier or c != "barrier"]
    if text == "all":
        return allowed
    ops = [o.strip() for o in text.split(",") if o.strip()]
    for o in ops:
        if o not in allowed:
            raise ConfigError(f"unknown collective {o!r}; allowed: {', '.join(allowed)}, or all", where)
    if not ops:
        raise ConfigError("no collective given", where)
    return ops


def positive_int(value, where: str) -> int:
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"{value!r} must be a whole number >= 1", where)
    return value


def check_launch(args, nproc: int) -> None:
    """Ranks, threads and the timeout bounded by what this host has, before anything is printed or started
    (runtime/ranks/launch.py check_options; --backend nccl is checked where the command checks it). ``nproc``: the
    ranks on this host (under torchrun: runtime.ranks.torchrun_rank.local_ranks)."""
    from distlab.runtime.ranks.launch import check_options
    check_options(nproc, "gloo" if args.backend == "nccl" else args.backend, args.threads, args.timeout)


def check_sweep_memory(ops: list[str], sizes: list[int], dtype: str, nproc: int, local: int,
                       flag: str = "--sizes") -> None:
    """Refuse a sweep over ``nproc`` ranks whose buffers on this host's ``local`` ranks do not fit in its free
    memory (MemAvailable), naming what it needs and what is free: runtime/measure/sweep.py allocates one input and one
    output buffer per rank, each as large as the largest case needs (runtime.execute.collectives.element_counts)."""
    from distlab.runtime.execute.collectives import element_counts
    from distlab.runtime.ranks.preflight import check_fits
    from distlab.sim.plan import DTYPE_BYTES, format_bytes
    counts = [element_counts(op, s, dtype, nproc) for op in ops if op != "barrier" for s in sizes]
    if not counts:
        return
    e = DTYPE_BYTES[dtype]
    in_place = all(op in ("all_reduce", "broadcast", "reduce", "barrier") for op in ops)
    need = max(i for i, _ in counts) * e + (0 if in_place else max(o for _, o in counts) * e)
    check_fits({"collective buffers": need}, local, f"a sweep up to {format_bytes(max(sizes))} ({dtype})", flag,
               "give smaller --sizes or fewer --nproc")
