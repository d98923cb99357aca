"""The ops of a plan: what one rank does, one op at a time, on a named stream (sim/plan.py holds them in order).

    Compute("fwd h.0", flops=2e12)                    # a kernel on the "compute" stream
    Collective("all_reduce", 64 * 2**20, group=(0, 1, 2, 3), stream="comm")
    Record("grads", "compute"), Wait("grads", "comm")  # cudaEventRecord / cudaStreamWaitEvent

Byte counts follow nccl-tests (doc/PERFORMANCE.md): ``bytes`` of an all_gather is the gathered output, of a
reduce_scatter the full input, of an all_to_all what one rank sends in all; of the others the buffer itself.
An all_to_all with per-peer sizes (``splits``, torch's ``all_to_all_single`` input/output split sizes) names the
whole matrix on every member; its ``bytes`` is then the largest row sum (what the busiest sender sends).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Union

from distlab.sim.collectives.algorithms import NAMES
from distlab.sim.dtypes import DTYPE_BYTES  # noqa: F401  (for the ops' dtype checks and re-export)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "barrier")
ALGORITHMS = ("auto", *NAMES)              # sim.collectives.algorithms declares them


@dataclass(frozen=True)
class Compute:
    """Local work: ``seconds`` if given; else, where the op names its kernels (``gemms``: (M, N, K) of each
    matmul; ``attention``: (batch, heads, seq, head_dim) of an attention call, ``causal``, its pass
    ``attention_pass`` forward, backward or recompute+backward, ``attention_kernel`` flash, flash2 or unfused; ``dtype`` of
    the operands), the per-kernel model of sim/compute.py; else a roofline of ``flops`` and HBM ``bytes`` on the
    GPU spec. ``flops``/``bytes`` stay the op's totals. Each kernel pays the GPU spec's ``launch_s``; an op that
    counts ``launches`` (not None: the ops the host dispatches one by one for it, e.g. DTensor's, sim/parallel/tp/plan.py)
    pays launches x launch_s instead. ``chunks`` (default 1): the op's GEMMs are one of ``chunks`` equal GEMMs
    issued round-robin over several streams (Transformer Engine's userbuffers spread the chunk GEMMs of a TP overlap
    over up to 3 compute streams), so their tiles share the SMs' waves (sim/compute/kernels.py ``tiling``)."""
    name: str = "compute"
    seconds: float | None = None
    flops: float = 0.0
    bytes: float = 0.0
    stream: str = "compute"
    launches: int | None = None
    gemms: tuple[tuple[int, int, int], ...] = ()
    attention: tuple[int, int, int, int] | None = None
    causal: bool = True
    attention_pass: str = "forward"
    attention_kernel: str = "flash"
    dtype: str = "bfloat16"
    chunks: int = 1
    block_elementwise: bool = True      # the attention call carries its block's elementwise kernels (false: a
    #                                     ring attention step after the first, sim/parallel/cp/ring.py)
    kind: ClassVar[str] = "compute"


COMPUTE_MODEL_FIELDS = {"launches": None, "gemms": (), "attention": None, "causal": True, "attention_pass": "forward",
                        "attention_kernel": "flash", "dtype": "bfloat16", "chunks": 1,
                        "block_elementwise": True}   # left out of JSON at these defaults
ATTENTION_KERNELS = ("flash", "flash2", "unfused")     # sim/compute/kernels.py (flash2: PyTorch SDPA's FA2)
ATTENTION_PASSES = ("forward", "backward", "recompute+backward")   # sim/compute.py


@dataclass(frozen=True)
class Collective:
    """A collective over ``group`` (global ranks; None = the whole world). ``root`` is a global rank.
    ``splits`` (all_to_all only, optional): ``splits[i][j]`` bytes from the group's i-th rank to its j-th (group
    order; the diagonal stays local), the same matrix on every member; ``bytes`` = max_i sum_j splits[i][j].
    ``group_name``: the process group's name. A process group is its ranks and its name (``dist.new_group`` over
    the same ranks makes a second one): the communicator whose collectives run one at a time in issue order
    (sim/kernel/communicators.py). "" (plans without names) = the one group of these ranks."""
    op: str
    bytes: int
    dtype: str = "float32"
    group: tuple[int, ...] | None = None
    algorithm: str = "auto"
    root: int = 0
    name: str = ""
    stream: str = "comm"
    splits: tuple[tuple[int, ...], ...] | None = None
    group_name: str = ""
    kind: ClassVar[str] = "collective"


class Communicator(NamedTuple):
    """A process group as NCCL and Gloo see it: its ranks (the group tuple) and its name."""
    ranks: tuple[int, ...]
    name: str = ""

    def label(self) -> str:
        """'[0..7]' or '[0..7] "rs"'."""
        g = sorted(self.ranks)
        text = f"[{g[0]}..{g[-1]}]" if len(g) > 2 and g == list(range(g[0], g[-1] + 1)) else \
            "[" + ",".join(map(str, g)) + "]"
        return f'{text} "{self.name}"' if self.name else text


@dataclass(frozen=True)
class Send:
    """Point-to-point send of ``bytes`` to ``peer``; completes when the matching Recv has the data."""
    peer: int
    bytes: int
    dtype: str = "float32"
    name: str = ""
    stream: str = "comm"
    kind: ClassVar[str] = "send"


@dataclass(frozen=True)
class Recv:
    """Point-to-point receive of ``bytes`` from ``peer``; sends and receives between a pair match in order."""
    peer: int
    bytes: int
    dtype: str = "float32"
    name: str = ""
    stream: str = "comm"
    kind: ClassVar[str] = "recv"


@dataclass(frozen=True)
class Record:
    """Mark ``event`` once everything queued before it on ``stream`` has finished."""
    event: str
    stream: str = "compute"
    kind: ClassVar[str] = "record"


@dataclass(frozen=True)
class Wait:
    """Hold ``stream`` until ``event`` (recorded on another stream of the same rank) has happened."""
    event: str
    stream: str = "comm"
    kind: ClassVar[str] = "wait"


Op = Union[Compute, Collective, Send, Recv, Record, Wait]
OP_TYPES = {cls.kind: cls for cls in (Compute, Collective, Send, Recv, Record, Wait)}


def describe(op: Op) -> str:
    """A short human description, e.g. ``all_reduce(4.0 MiB)`` or ``send(1.0 KiB -> 3)``."""
    if isinstance(op, Collective):
        root = f", root {op.root}" if op.op in ("broadcast", "reduce") else ""
        return f"{op.op}({format_bytes(op.bytes)}{root})"
    if isinstance(op, Send):
        return f"send({format_bytes(op.bytes)} -> {op.peer})"
    if isinstance(op, Recv):
        return f"recv({format_bytes(op.bytes)} <- {op.peer})"
    if isinstance(op, Compute):
        return f"compute {op.name!r}"
    return f"{op.kind}({op.event!r})"


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{int(n)} B"
