"""Read torch.profiler traces (Kineto's Chrome-trace JSON, one ``.json`` or ``.json.gz`` per rank) and measure them.

    prof = load_profile("traces/")          # Profile: {rank: RankTrace}, GPU kernels or CPU ops per rank
    breakdown(prof.ranks[0])                # {"kernel_time_us", "idle_time_us", "compute_time_us", ...}

A rank's file: ``distributedInfo`` {rank, world_size, nccl_version, pg_config} names the rank (else a number in
the file name: rank-3, rank_3, rank3), ``deviceProperties`` the GPU, ``traceEvents`` the events (Chrome trace
format: "X" events with ts and dur in microseconds). GPU work is the events of categories ``kernel``,
``gpu_memcpy`` and ``gpu_memset`` (those with a stream). A kernel is, by name:
- communication: ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` (NCCL 2.19 on) or
  ``ncclKernel_AllReduce_RING_LL_Sum_float(...)`` (before): op, algorithm and protocol in the name; torch adds
  ``Collective name``, ``In msg nelems``, ``dtype``, ``Group size`` and ``Process Group Ranks`` to its args
  (torch 2.1 on), which give the message size;
- memory: ``Memcpy ...``, ``Memset ...``, ``dma...``;
- GEMM (gemm, xmma, cutlass, cublas, matmul in the name), attention (flash, fmha, attention, sdpa), else other
  compute.
A CPU trace (gloo ranks: no GPU events) keeps its top-level ``cpu_op`` events per thread (an op inside another
is part of it): communication is a c10d / gloo op (``c10d::allreduce_``, ``gloo:all_reduce``,
``record_param_comms``), compute aten's matmuls and the rest. Gloo runs a collective on its own threads while
the caller blocks in ``work.wait()``, which is no op: a CPU collective's time runs from its op's start to the next
top-level op's start on that thread (the issue plus the wait). Its size: the first tensor of ``Input Dims``
(recorded with ``record_shapes=True``) x 4 bytes (the dtype of a TensorList is not recorded: float32 assumed),
its group the default process group's ranks (``distributedInfo.pg_config``).

The temporal breakdown and the communication/computation overlap follow HolisticTraceAnalysis's definitions
(hta/analyzers/breakdown_analysis.py get_temporal_breakdown, communication_analysis.py get_comm_comp_overlap):
per rank over its GPU events, kernel time = end of the last - start of the first; idle = kernel time - the union
of all of them; compute = the union of the compute kernels (HTA: neither NCCL, nor a memcpy/memset, nor a Sync);
non-compute = kernel time - compute - idle; overlap = |union(comm) ∩ union(compute)| / |union(comm)|. Like HTA
(hta/common/trace.py _filter_irrelevant_gpu_kernels), when the trace holds two or more ``ProfilerStep#N`` steps
the GPU events kept are those launched (their CPU event of the same ``correlation``) before the last step began:
the last step the profiler records is often cut short. A trace of nanosecond resolution (fractional ts) is
rounded inward to whole microseconds, start up and end down, as HTA does (trace_parser.py round_down_time_stamps,
for pytorch/pytorch#122425: Kineto's nanosecond stamps made back-to-back events overlap); an event shorter than
that keeps no time.
Files are read bounded (sim/io.py); a file that is not a trace is a ConfigError naming it.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import re
from dataclasses import dataclass, field

from distlab.sim.errors import ConfigError
from distlab.sim.kernel.spans import overlap, union, union_length

MAX_TRACE_BYTES = 256 << 20           # uncompressed, per rank
MAX_RANKS = 4096
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_NCCL = re.compile(r"^nccl.*Kernel")
_NCCL_NEW = re.compile(r"^ncclDevKernel_([A-Za-z]+)_(?:[A-Za-z]+_)?(?:[a-z0-9]+_)?([A-Z]+)_([A-Z0-9]+)")
_NCCL_OLD = re.compile(r"^ncclKernel_([A-Za-z]+)_([A-Z]+)_([A-Z0-9]+)")
_HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_CPU_COMM = re.compile(r"^(c10d::|gloo:|record_param_comms|nccl:)")
_CPU_GEMM = re.compile(r"^aten::(mm|addmm|bmm|matmul|linear|baddbmm)$")
# NCCL kernel op names -> distlab's collectives
NCCL_OPS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
            "Broadcast": "broadcast", "Reduce": "reduce", "SendRecv": "send_recv", "AllToAll": "all_to_all",
            "allreduce": "all_reduce", "allgather": "all_gather", "_allgather_base": "all_gather",
            "allgather_into_tensor_coalesced": "all_gather", "reduce_scatter": "reduce_scatter",
            "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
            "broadcast": "broadcast", "reduce": "reduce", "all_to_all": "all_to_all", "alltoall_base": "all_to_all",
            "send": "send_recv", "recv": "send_recv"}
DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Byte": 1, "Char": 1,
               "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Bool": 1}
DTYPE_NAMES = {"Float": "float32", "Half": "float16", "BFloat16": "bfloat16", "Double": "float64", "Int": "int32",
               "Long": "int64", "Byte": "uint8", "Char": "int8", "Bool": "uint8", "Float8_e4m3fn": "float8_e4m3fn",
               "Float8_e5m2": "float8_e5m2"}


@dataclass
class Event:
    name: str
    start_us: float
    dur_us: float
    stream: int               # GPU stream; the thread id of a CPU op
    kind: str                 # communication, memory, gemm, attention, compute (HTA: compute = not comm/mem/sync)
    hta_compute: bool
    op: str | None = None     # a collective's distlab name
    algorithm: str | None = None
    protocol: str | None = None
    nbytes: int | None = None
    dtype: str | None = None
    group: tuple | None = None
    launch_us: float | None = None   # its CPU launch (the event of the same correlation), when traced

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass
class RankTrace:
    path: str
    rank: int
    world_size: int | None
    device: str | None
    gpu: bool                        # GPU events found (else a CPU trace: its cpu_ops)
    events: list[Event]
    nccl_version: str | None = None
    process_groups: list = field(default_factory=list)
    steps: list = field(default_factory=list)      # (start, end) us of each ProfilerStep#N kept, in order


@dataclass
class Profile:
    directory: str
    ranks: dict[int, RankTrace]

    @property
    def world_size(self) -> int | None:
        sizes = [t.world_size for t in self.ranks.values() if t.world_size]
        return max(sizes) if sizes else None


def _read(path: str):
    from distlab.sim.io import read_bytes
    data = read_bytes(path, "profiler trace", MAX_TRACE_BYTES)
    if path.endswith(".gz"):
        try:
            with gzip.GzipFile(fileobj=__import__("io").BytesIO(data)) as f:
                data = f.read(MAX_TRACE_BYTES + 1)
        except (OSError, EOFError):
            raise ConfigError("not a whole gzip file (cut while copying?)", path) from None
        if len(data) > MAX_TRACE_BYTES:
            raise ConfigError(f"larger than {MAX_TRACE_BYTES >> 20} MiB once decompressed", path)
    try:
        d = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"not a torch.profiler trace: not valid JSON ({str(e)[:60]}; cut?)", path) from None
    if not isinstance(d, dict) or not isinstance(d.get("traceEvents"), list):
        raise ConfigError("not a torch.profiler trace: no 'traceEvents' list (Chrome trace JSON)", path)
    return d


def _collective(name: str, args: dict) -> dict:
    m = _NCCL_NEW.match(name) or _NCCL_OLD.match(name)
    out = {}
    if m:
        out = {"op": NCCL_OPS.get(m.group(1), m.group(1)), "algorithm": m.group(2), "protocol": m.group(3)}
    elif name.startswith(("ncclDevKernel_SendRecv", "ncclKernel_SendRecv")):
        out = {"op": "send_recv"}
    coll = args.get("Collective name")
    if isinstance(coll, str) and coll in NCCL_OPS:
        out["op"] = NCCL_OPS[coll]
    n, dt = args.get("In msg nelems"), args.get("dtype")
    if isinstance(n, int) and isinstance(dt, str) and dt in DTYPE_BYTES:
        out["nbytes"], out["dtype"] = n * DTYPE_BYTES[dt], DTYPE_NAMES.get(dt, dt.lower())
        if out.get("op") == "all_gather":       # torch records the input shard: the collective's size is n x that
            out["nbytes"] *= int(args.get("Group size") or 1)
    ranks = args.get("Process Group Ranks")
    if isinstance(ranks, str) and re.fullmatch(r"\[[\d, ]*\]", ranks):
        out["group"] = tuple(int(x) for x in re.findall(r"\d+", ranks))
    return out


def gpu_kind(name: str) -> str:
    """communication, memory (copies and sets), or a compute kernel's kind as compute_match.py's ``kernel_kind``
    names it (gemm, attention; the rest "compute"): one classifier for both readers."""
    from distlab.sim.ingest.compute_match import kernel_kind
    if _NCCL.match(name):
        return "communication"
    if _MEMORY.match(name):
        return "memory"
    kind = kernel_kind(name)
    return kind if kind in ("gemm", "attention") else "compute"


def read_rank(path: str, fallback_rank: int) -> RankTrace:
    d = _read(path)
    info = d.get("distributedInfo") if isinstance(d.get("distributedInfo"), dict) else {}
    rank = info.get("rank")
    if not isinstance(rank, int):
        m = re.search(r"rank[-_]?(\d+)", os.path.basename(path))
        rank = int(m.group(1)) if m else fallback_rank
    props = d.get("deviceProperties")
    device = props[0].get("name") if isinstance(props, list) and props and isinstance(props[0], dict) else None
    gpu, cpu = [], []
    launched, steps = {}, {}
    for e in d["traceEvents"]:
        if isinstance(e, dict) and e.get("cat") not in GPU_CATEGORIES and isinstance(e.get("ts"), (int, float)):
            corr = e.get("args", {}).get("correlation") if isinstance(e.get("args"), dict) else None
            if isinstance(corr, int):
                launched[corr] = float(e["ts"])
            if isinstance(e.get("name"), str) and e["name"].startswith("ProfilerStep") and \
                    isinstance(e.get("dur"), (int, float)):
                steps[e["name"]] = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
    last_step = max(s for s, _ in steps.values()) if len(steps) >= 2 else None
    for e in d["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur, name = e.get("ts"), e.get("dur"), e.get("name")
        if not (isinstance(ts, (int, float)) and isinstance(dur, (int, float)) and isinstance(name, str)):
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        cat = e.get("cat")
        if cat in GPU_CATEGORIES:
            if last_step is not None and not launched.get(args.get("correlation"), float("inf")) < last_step:
                continue                         # launched in the last (cut) step, or by nothing traced
            kind = gpu_kind(name)
            stream = args.get("stream", e.get("tid", 0))
            gpu.append(Event(name, float(ts), float(dur), stream if isinstance(stream, int) else 0, kind,
                             not _HTA_NOT_COMPUTE.match(name),
                             **(_collective(name, args) if kind == "communication" else {}),
                             launch_us=launched.get(args.get("correlation"))))
        elif cat == "cpu_op":
            kind = "communication" if _CPU_COMM.match(name) else "gemm" if _CPU_GEMM.match(name) else "compute"
            tid = e.get("tid", 0)
            cpu.append(Event(name, float(ts), float(dur), tid if isinstance(tid, int) else 0, kind,
                             kind != "communication", **(_cpu_collective(name, args) if kind == "communication"
                                                         else {})))
    world = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    pgs = info.get("pg_config") if isinstance(info.get("pg_config"), list) else []
    nccl = info.get("nccl_version") if isinstance(info.get("nccl_version"), str) else None
    events = gpu or _cpu_top_level(cpu, info.get("pg_config"))
    if any(e.start_us != int(e.start_us) for e in events):          # ns resolution: HTA's rounding
        for e in events:
            start, end = math.ceil(e.start_us), math.floor(e.start_us + e.dur_us)
            e.start_us, e.dur_us = float(start), float(max(0, end - start))
    kept = sorted(v for v in steps.values() if last_step is None or v[0] < last_step)
    return RankTrace(path, rank, world, device, bool(gpu), events, nccl, pgs, kept)


def _cpu_top_level(events: list[Event], pgs) -> list[Event]:
    """The ops of a CPU trace not inside another op of their thread, collectives stretched over their wait."""
    default = next((tuple(p["ranks"]) for p in pgs or [] if isinstance(p, dict) and p.get("pg_desc") == "default_pg"
                    and isinstance(p.get("ranks"), list)), None)
    out: list[Event] = []
    by_thread: dict[int, list[Event]] = {}
    for e in sorted(events, key=lambda e: (e.stream, e.start_us, -e.dur_us)):
        mine = by_thread.setdefault(e.stream, [])
        if mine and e.start_us < mine[-1].end_us:            # inside the op before it
            parent = mine[-1]
            if parent.kind == "communication" and parent.nbytes is None and e.nbytes is not None:
                parent.op, parent.nbytes, parent.dtype, parent.group = e.op or parent.op, e.nbytes, e.dtype, e.group
            continue
        mine.append(e)
    for mine in by_thread.values():
        for a, b in zip(mine, mine[1:] + [None]):
            if a.kind == "communication":
                if a.group is None:
                    a.group = default
                if b is not None:
                    a.dur_us = b.start_us - a.start_us
        out += mine
    return sorted(out, key=lambda e: e.start_us)


def _cpu_collective(name: str, args: dict) -> dict:
    out = _collective(name, args)
    dims = args.get("Input Dims")
    if "nbytes" not in out and isinstance(dims, list) and dims and isinstance(dims[0], list) and dims[0] and \
            isinstance(dims[0][0], list) and all(isinstance(x, int) for x in dims[0][0]):
        out["nbytes"], out["dtype"] = 4 * math.prod(dims[0][0]), "float32"
    if "op" not in out:
        base = re.sub(r"^(c10d::|gloo:|nccl:)", "", name).rstrip("_")
        if base in NCCL_OPS:
            out["op"] = NCCL_OPS[base]
    return out


def load_profile(path: str) -> Profile:
    """Every rank's trace in a folder (*.json, *.json.gz; other files ignored), or one trace file."""
    if os.path.isfile(path):
        files = [path]
    elif os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith((".json", ".json.gz"))
                       and os.path.isfile(os.path.join(path, f)))
    else:
        raise ConfigError("no such file or folder (a torch.profiler trace, or a folder of one per rank)", path)
    if not files:
        raise ConfigError("no *.json or *.json.gz trace here (torch.profiler's tensorboard_trace_handler writes "
                          "one per rank)", path)
    if len(files) > MAX_RANKS:
        raise ConfigError(f"{len(files)} traces; at most {MAX_RANKS} ranks are read", path)
    ranks: dict[int, RankTrace] = {}
    for i, f in enumerate(files):
        t = read_rank(f, i)
        if t.rank in ranks:
            raise ConfigError(f"two traces of rank {t.rank} ({os.path.basename(ranks[t.rank].path)} and "
                              f"{os.path.basename(f)}): keep one step's files per folder", path)
        if not t.events:
            raise ConfigError("no GPU kernels and no CPU ops in this trace (profiled with activities?)", f)
        ranks[t.rank] = t
    return Profile(path, dict(sorted(ranks.items())))


def breakdown(t: RankTrace) -> dict:
    """HTA's temporal breakdown and comm/comp overlap of one rank (module docstring), in microseconds."""
    spans = [(e.start_us, e.end_us) for e in t.events if e.dur_us > 0]
    merged = union(spans)
    kernel_time = merged[-1][1] - merged[0][0] if merged else 0.0
    idle = kernel_time - union_length(spans)
    comp = union([(e.start_us, e.end_us) for e in t.events if e.hta_compute and e.dur_us > 0])
    comm = union([(e.start_us, e.end_us) for e in t.events if e.kind == "communication" and e.dur_us > 0])
    compute = sum(e - s for s, e in comp)
    comm_time = sum(e - s for s, e in comm)
    both = overlap(comm, comp)
    return {"rank": t.rank, "kernel_time_us": kernel_time, "idle_time_us": idle, "compute_time_us": compute,
            "non_compute_time_us": kernel_time - compute - idle, "communication_time_us": comm_time,
            "exposed_communication_us": comm_time - both,
            "comm_comp_overlap": both / comm_time if comm_time else None}


def per_kind(t: RankTrace) -> dict[str, float]:
    """Busy time (union, us) of each kind of event on one rank."""
    kinds: dict[str, list] = {}
    for e in t.events:
        kinds.setdefault(e.kind, []).append((e.start_us, e.end_us))
    return {k: union_length(v) for k, v in sorted(kinds.items())}
