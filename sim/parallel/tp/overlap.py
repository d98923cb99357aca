"""TP communication overlap (``tp: {comm_overlap: true}``, ``--tp-comm-overlap``): Megatron-LM's
``--tp-comm-overlap`` (Transformer Engine's userbuffers), the async-TP option of the TP transform.

    seg = OverlapSegments(model, TPOptions(comm_overlap=True), program)     # in place of Segments

Priced from its published description (NVIDIA NeMo Framework user guide, "Communication Overlap",
"Tensor-parallel Communication Overlap"): with sequence parallelism, "the TP communication without direct
computation dependency are overlapped with the computation in bulk", and those with a direct dependency "are
overlapped in pipelined fashion": "the activation (gradient) tensor all-gather is replaced with multiple steps of
input P2P ring exchanges, and reduce-scatter is replaced with multiple steps of GEMM output P2P ring exchanges
followed by a reduction of the received outputs" (the decomposition of Wang et al. 2023, "Overlap Communication
with Dependent Computation via Decomposition in Large Deep Learning Models", ASPLOS; torch's async TP applies the
same one under torch.compile, torchtitan ``enable_async_tensor_parallel``). Per block part (attention, MLP), with
t = tp and X = b·s·h·e, rank j of the tp ring:

- forward, all-gather -> column-parallel GEMMs (q, k, v; gate, up): t steps; step i runs the GEMMs on the
  sequence chunk it holds (1/t of their FLOPs) while the next chunk comes round (send X/t to rank j+1, receive
  X/t from j-1, streams ``tp`` and ``tp_recv``); step i+1 waits for it;
- the part's other compute (attention's core, SwiGLU) as in sim/parallel/tp/plan.py;
- forward, row-parallel GEMM (o, down) -> reduce-scatter: t steps; step i computes the output chunk of one
  destination (1/t of the FLOPs), adds the partial sum that came in (reads two chunks, writes one: 3·X/t bytes)
  and passes it on (X/t), so after t-1 exchanges each rank holds its reduced chunk;
- backward, the same two pipelines around the row GEMM's input gradient (the incoming gradient all-gathered)
  and the column GEMMs' input gradient (reduce-scattered), each GEMM's FLOPs the backward's: the data
  gradient's share of the part's backward (half of the GEMMs' 2 x forward); the weight gradients, in bulk, run
  while the reduce-scatter's last exchange is in flight.
The step time of a pipeline is then t·max(GEMM chunk, exchange) + the last step's other part, instead of
GEMM + collective. The chunk GEMMs are issued round-robin on min(3, t) compute streams (Transformer Engine,
transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp ``split_overlap_ag`` / ``split_overlap_rs``:
``_stream_compute[i % _stream_compute.size()]``, NVTE_COMM_OVERLAP_MAX_STREAMS = 3), so up to three run at once and
the t chunks' tiles share the SMs' waves as one pool: each chunk op carries ``chunks`` = t (sim/compute/kernels.py
``tiling``).
Needs sequence parallelism (Megatron requires it); not built with CP.
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.plan import Recv, Record, Send, Wait
from distlab.sim.parallel.tp.plan import Segments



def _flops(gemms) -> float:
    return sum(2.0 * M * N * K for M, N, K in gemms)


def _weights(gemms, e: int) -> float:
    """Bytes of the weights of forward GEMMs (M, N, K): N x K each."""
    return float(sum(N * K for _, N, K in gemms) * e)


def _chunk(gemms, t: int) -> tuple:
    """The GEMMs on 1/t of the tokens (M), those sharing an operand fused into one as Megatron-LM's layers run
    them (``linear_qkv``: q, k and v; ``linear_fc1``: gate and up): the same M and K (forward) sum their N, the
    same M and N (their input gradients) their K."""
    gemms = tuple((max(1, M // t), N, K) for M, N, K in gemms)
    if len(gemms) > 1 and len({(M, K) for M, _, K in gemms}) == 1:
        return ((gemms[0][0], sum(N for _, N, _ in gemms), gemms[0][2]),)
    if len(gemms) > 1 and len({(M, N) for M, N, _ in gemms}) == 1:
        return ((gemms[0][0], gemms[0][1], sum(K for _, _, K in gemms)),)
    return gemms


class OverlapSegments(Segments):
    """Segments whose block parts run their TP collectives as pipelined P2P ring exchanges (module docstring);
    ``rank``: this rank (its place in the tp group)."""

    def __init__(self, model, o, p, rank: int):
        super().__init__(model, o, p)
        if not o.sequence_parallel:
            raise ConfigError("comm_overlap (Megatron's TP overlap) needs sequence_parallel true", "tp.comm_overlap")
        self.t, self.me, self.events = len(p.group), p.group.index(rank), 0

    def _exchange(self, name: str, nbytes: float) -> str:
        """Send a chunk to the next rank of the tp ring and receive one from the previous, after the compute
        issued so far; returns the event of its arrival."""
        p, g = self.p, self.p.group
        self.events += 1
        issued, done = f"ov{self.events} issue", f"ov{self.events} done"
        p.ops += [Record(issued, "compute"), Wait(issued, "tp"), Wait(issued, "tp_recv"),
                  Send(g[(self.me + 1) % self.t], int(nbytes), p.dtype, name=f"tp p2p {name}", stream="tp"),
                  Recv(g[(self.me - 1) % self.t], int(nbytes), p.dtype, name=f"tp p2p {name}", stream="tp_recv"),
                  Record(done, "tp_recv")]
        return done

    def _gathered(self, name: str, gemms: tuple, chunk_bytes: float):
        """All-gather -> GEMMs, pipelined: t steps of 1/t of the GEMMs, the next chunk arriving meanwhile."""
        t, arrived, flops, weights = self.t, None, _flops(gemms), _weights(gemms, self.k["e"])
        for i in range(t):
            nxt = self._exchange(f"{name} all_gather step {i}", chunk_bytes) if i < t - 1 else None
            if arrived:
                self.p.ops.append(Wait(arrived, "compute"))
            self.p.compute(f"{name} step {i}", flops / t, weights / t, _chunk(gemms, t),
                           chunks=t)
            arrived = nxt

    def _scattered(self, name: str, gemms: tuple, chunk_bytes: float, bulk=None):
        """GEMMs -> reduce-scatter, pipelined: t steps, each computing one destination's chunk, adding the
        partial sum received and passing it on; ``bulk()`` (the weight gradients) runs before the last arrives."""
        t, arrived, flops, weights = self.t, None, _flops(gemms), _weights(gemms, self.k["e"])
        for i in range(t):
            self.p.compute(f"{name} step {i}", flops / t, weights / t, _chunk(gemms, t),
                           chunks=t)
            if i == t - 1 and bulk is not None:
                bulk()
            if arrived:
                self.p.ops.append(Wait(arrived, "compute"))
                self.p.compute(f"{name} reduce step {i}", nbytes=3 * chunk_bytes)
            arrived = self._exchange(f"{name} reduce_scatter step {i}", chunk_bytes) if i < t - 1 else None

    def forward(self, name: str):
        if not name.startswith("h.") or self.t == 1:
            return super().forward(name)
        p, k, chunk = self.p, self.k, self.k["X"] / self.t
        for part, norm in (("attn", "norm1"), ("mlp", "norm2")):
            p.compute(f"fwd {name}.{norm}", nbytes=self.norm)
            col, row = k[f"{part}_gemms"][:-1], k[f"{part}_gemms"][-1:]
            self._gathered(f"fwd {name}.{part} in", col, chunk)
            p.compute(f"fwd {name}.{part}", k[f"{part}_flops"] - _flops(col) - _flops(row), 0.0, (),
                      k["core"] if part == "attn" else None, launches=self._half("fwd", part))
            self._scattered(f"fwd {name}.{part} out", row, chunk)

    def backward(self, name: str):
        if not name.startswith("h.") or self.t == 1:
            return super().backward(name)
        p, k, chunk = self.p, self.k, self.k["X"] / self.t
        for part, norm, redo in (("mlp", "norm2", self.redo_mlp), ("attn", "norm1", self.redo_attn)):
            gemms = k[f"{part}_gemms"]
            col, row = gemms[:-1], gemms[-1:]
            dgrad = lambda g: tuple((M, K, N) for M, N, K in g)          # noqa: E731  (input gradients)
            wgrad = lambda g: tuple((K, N, M) for M, N, K in g)          # noqa: E731  (weight gradients)
            self._gathered(f"bwd {name}.{part} out", dgrad(row), chunk)
            rest = 2 * k[f"{part}_flops"] + redo - _flops(row) - 2 * _flops(col)
            p.compute(f"bwd {name}.{part}", rest, 0.0, (gemms if self.o.recompute == "full" else ()) + wgrad(row),
                      k["core"] if part == "attn" else None,
                      "recompute+backward" if self.o.recompute != "none" else "backward",
                      launches=self._half("bwd", part))
            self._scattered(f"bwd {name}.{part} in", dgrad(col), chunk,
                            bulk=lambda c=col, nm=f"bwd {name}.{part} wgrad": p.compute(
                                nm, _flops(c), _weights(c, k["e"]), wgrad(c)))
            p.compute(f"bwd {name}.{norm}", nbytes=self.norm)
