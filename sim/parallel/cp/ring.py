"""Ring attention as torch 2.13's ``context_parallel`` runs it
(torch/distributed/tensor/experimental/_context_parallel/_attention.py, ``_templated_ring_attention`` and
``_templated_ring_attention_backward``), for one attention call of one rank in a cp group of n ranks.

Sharding: the sequence S is cut into 2n chunks of c = S/(2n) tokens; rank j holds chunks j and 2n-1-j
(``_HeadTailLoadBalancer``: head and tail, so every rank has the same causal work), s = S/n tokens in all.
Without load balancing rank j holds tokens [j·s, (j+1)·s). torch balances when S % 2n == 0, else silently not.

Per step i (0..n-1) rank j attends its queries to the K/V of rank (j-i) mod n (``_is_causal_behavior``):
  i = 0          causal on its own s x s block          -> 2·b·s²·h FLOPs (half of 4·b·s²·h: causal kernels skip
                                                           the masked half)
  load balanced  i <= j: all queries, first K/V chunk; i > j: second query chunk, all K/V
                                                        -> 4·b·s·(s/2)·h = 2·b·s²·h (every step the same)
  no balancing   source j-i >= 0 (i <= j): full block   -> 4·b·s²·h;  i > j: skipped (rank n-1 is the straggler)
Backward per step: 2.5 x the forward FLOPs (FlashAttention-2, Dao 2023, arXiv 2307.08691 sec. 4: backward
does 5 matmuls to forward's 2).
Kernels (given the local heads): each step is one FlashAttention call priced by sim/compute/kernels.py: causal
(b, heads, s, d) causal; full (b, heads, s, d) not causal; half, s queries on s/2 keys (or s/2 on s), as
(2b, heads, s/2, d) not causal (the same FLOPs, 4·b·s·(s/2)·h, at the rate of a call of s/2 keys). The
block's elementwise kernels (sim/compute/fitted.py) ride on step 0's call only (``block_elementwise``).

Rotation (the K/V buffer is cat(k, v): B = 2·b·s·h·e bytes; torchtitan repeats GQA K/V heads before SDPA, so h
is the full hidden size):
  allgather (torch's default): forward one all_gather of n·B at step 0 (``_AllGatherRotater``), every later
    step slices it; backward the same once more.
  alltoall: forward n-1 ``permute_tensor`` calls (an all_to_all_single sending B to rank j+1, receiving B from
    j-1), one per step except the last; backward n-1 for K/V.
  Backward always sends dK/dV around with alltoall (``dkv_rotater``), n calls of G = 2·b·s·h·4 bytes (fp32
    accumulators, ``convert_to_f32``), each after that step's compute: after n hops dK/dV are home.
Each rotation is issued before the step's compute (a functional collective: the comm stream waits for the
compute issued so far; the compute of the next step waits for the result), so it overlaps the compute.

Cost on an uncontended fabric (c: one step's compute, the same at every step with load balancing; a = α + B/bw
a permute, A the all_gather of n·B, g = α + G/bw the dK/dV permute; one comm stream per group, as NCCL's):
  forward  alltoall   T = (n-1)·max(c, a) + c              allgather   T = max(c, A) + (n-1)·c
  backward alltoall   T = max(c, a) + (n-2)·max(c, a+g) + max(c, g) + g
           allgather  T = max(c, A) + (n-1)·max(c, g) + g
(derived from the event order above; tests/test_cp_sim.py checks the simulator against it). Without overlap
(``overlap: false``) every rotation is waited for at once: the times add.
"""
from __future__ import annotations

from distlab.sim.plan import Collective, Compute, Recv, Record, Send, Wait

BWD_FACTOR = 2.5          # FlashAttention-2: backward FLOPs = 2.5 x forward
ACCUM_BYTES = 4           # dK/dV travel as float32 (_cp_options.convert_to_f32)
METHODS = ("allgather", "alltoall")


def step_kind(j: int, n: int, i: int, load_balance: bool) -> str:
    """What rank j (index in its cp group) computes at ring step i: causal, full, half (load balanced) or skip
    (torch's ``_is_causal_behavior`` plus the chunk choice of ``_templated_ring_attention``)."""
    if i == 0:
        return "causal"
    if load_balance:
        return "half"
    return "full" if (j - i) % n < j else "skip"


def step_flops(kind: str, b: int, s: int, h: int) -> float:
    """Forward FLOPs of one ring step on s local tokens (see the module docstring)."""
    return {"causal": 2.0 * b * s * s * h, "half": 2.0 * b * s * s * h, "full": 4.0 * b * s * s * h,
            "skip": 0.0}[kind]


class Ring:
    """Appends one rank's ring-attention ops to ``ops``. ``group``: the cp group (global ranks, cp order);
    streams: compute, ``cp`` (sends and collectives) and ``cp_recv`` (receives of the permutes)."""

    def __init__(self, ops: list, rank: int, group: tuple, b: int, s: int, h: int, dtype: str, elem: int,
                 method: str = "allgather", load_balance: bool = True, overlap: bool = True,
                 heads: int | None = None):
        self.ops, self.group, self.n, self.j = ops, group, len(group), group.index(rank)
        self.heads = heads                # local heads: each step's compute names its attention call
        self.b, self.s, self.h, self.dtype = b, s, h, dtype
        self.kv_bytes, self.dkv_bytes = 2 * b * s * h * elem, 2 * b * s * h * ACCUM_BYTES
        self.method, self.load_balance, self.overlap = method, load_balance, overlap
        self.events, self.last = 0, None

    def _event(self, what: str) -> str:
        self.events += 1
        return f"cp{self.events} {what}"

    def rotate(self, label: str, nbytes: int, method: str, dtype: str) -> str:
        """Issue one rotation after the compute issued so far; the event its result is ready at."""
        ops, issued, done = self.ops, self._event("issue"), self._event("done")
        ops.append(Record(issued, "compute"))
        streams = ("cp",) if method == "allgather" else ("cp", "cp_recv")
        for st in streams:
            ops.append(Wait(issued, st))
            if self.last:
                ops.append(Wait(self.last, st))       # one comm stream per group: after the previous rotation
        if method == "allgather":
            ops.append(Collective("all_gather", self.n * nbytes, dtype, self.group, name=f"cp all_gather {label}",
                                  stream="cp", group_name="cp"))   # the cp mesh dim's group, not FSDP's dp_shard_cp
            ops.append(Record(done, "cp"))
        else:
            nxt, prv = self.group[(self.j + 1) % self.n], self.group[(self.j - 1) % self.n]
            ops.append(Send(nxt, nbytes, dtype, name=f"cp all_to_all {label}", stream="cp"))
            ops.append(Recv(prv, nbytes, dtype, name=f"cp all_to_all {label}", stream="cp_recv"))
            ops.append(Record(done, "cp_recv"))
        self.last = done
        if not self.overlap:
            ops.append(Wait(done, "compute"))
        return done

    def _compute(self, name: str, i: int, factor: float):
        kind = step_kind(self.j, self.n, i, self.load_balance)
        if kind == "skip":
            return
        flops = factor * step_flops(kind, self.b, self.s, self.h)
        if not self.heads:
            self.ops.append(Compute(f"{name} step {i} ({kind})", flops=flops, dtype=self.dtype))
            return
        d, b, s = self.h // self.heads, self.b, self.s
        call = (2 * b, self.heads, s // 2, d) if kind == "half" else (b, self.heads, s, d)
        self.ops.append(Compute(f"{name} step {i} ({kind})", flops=flops, dtype=self.dtype, attention=call,
                                causal=kind == "causal", attention_pass="forward" if factor == 1.0 else "backward",
                                block_elementwise=i == 0))

    def forward(self, name: str, phase: str = "fwd"):
        """``_templated_ring_attention``: rotate K/V (before each step but the last), attend, merge."""
        kv = None
        for i in range(self.n):
            if i > 0:
                self.ops.append(Wait(kv, "compute"))
            if i < self.n - 1 and (self.method == "alltoall" or i == 0):
                kv = self.rotate(f"{name} kv {phase}", self.kv_bytes, self.method, self.dtype)
            self._compute(f"{phase} {name}", i, 1.0)

    def backward(self, name: str):
        """``_templated_ring_attention_backward``: K/V rotate again; dK/dV follow them (alltoall, fp32)."""
        kv = dkv = None
        for i in range(self.n):
            if i > 0:
                self.ops.append(Wait(kv, "compute"))
            if i != self.n - 1 and (self.method == "alltoall" or i == 0):
                kv = self.rotate(f"{name} kv bwd", self.kv_bytes, self.method, self.dtype)
            self._compute(f"bwd {name}", i, BWD_FACTOR)
            if i > 0:
                self.ops.append(Wait(dkv, "compute"))
            if self.n > 1:
                dkv = self.rotate(f"{name} dkv bwd", self.dkv_bytes, "alltoall", "float32")
        if dkv:
            self.ops.append(Wait(dkv, "compute"))
