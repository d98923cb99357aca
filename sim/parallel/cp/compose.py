"""CP x TP (x FSDP2, x HSDP replicas), torchtitan's N-D layout (torchtitan/distributed/parallel_dims.py: mesh
(dp_replicate, dp_shard, cp, tp), tp innermost; parallelize_llama: TP first, then FSDP2 over dp_shard_cp, HSDP
with dp_replicate). Each rank holds s = S/cp tokens and a/tp heads: the TP segments of sim/parallel/tp/plan.py run on the
cp-local sequence (its collectives carry b·s·h·e), and inside the attention part the ring (sim/parallel/cp/ring.py)
rotates K/V of the local heads, 2·b·s·(h/tp)·e bytes, over the cp group. The program is FSDP2's on the model
with TP-local shapes and cp-local tokens (as sim/parallel/tp/compose.py splices TP into FSDP2). Without TP the
same segments run on a group of one rank (sim/parallel/layers.py). Kernels: the q/k/v GEMMs before the ring, the
o GEMM after it, the MLP's GEMMs (TP's shapes on s local tokens, sim/parallel/tp/plan.py ``gemm_shapes``),
backward each GEMM's input- and weight-gradient GEMMs; the ring's steps are FlashAttention calls.
"""
from __future__ import annotations

from distlab.sim.parallel.cp.ring import Ring
from distlab.sim.parallel.tp.plan import Segments, TPOptions, _Program, backward_gemms


def _flops(gemms: tuple) -> float:
    return sum(2.0 * M * N * K for M, N, K in gemms)


class CPSegments(Segments):
    """TP segments whose attention core is the ring: the attention linears' FLOPs around it, the core's
    4·b·s²·h/tp left to the ring's steps."""

    def __init__(self, model, o: TPOptions, p: _Program, ring: Ring, recompute: bool = False):
        super().__init__(model, o, p)
        self.ring, self.recompute = ring, recompute
        self.linear_attn = self.k["attn_flops"] - self.k["core_flops"]
        self.qkv, self.out = self.k["attn_gemms"][:-1], self.k["attn_gemms"][-1:]

    def forward(self, name: str, phase: str = "fwd"):
        """A block's forward; ``phase`` "recompute" when full activation checkpointing reruns it in backward
        (its TP collectives and ring again)."""
        if not name.startswith("h."):
            return super().forward(name)
        p, k, X = self.p, self.k, self.k["X"]
        for part, norm in (("attn", "norm1"), ("mlp", "norm2")):
            p.compute(f"{phase} {name}.{norm}", nbytes=self.norm)
            if self.sp:
                p.coll("all_gather", X, f"{name}.{part} input {phase}")
            if part == "attn":
                p.compute(f"{phase} {name}.attn", _flops(self.qkv), k["attn_bytes"], self.qkv)
                self.ring.forward(f"{name}.attn", phase)
                p.compute(f"{phase} {name}.attn (after attention)", _flops(self.out), gemms=self.out)
            else:
                p.compute(f"{phase} {name}.mlp", k["mlp_flops"], k["mlp_bytes"], k["mlp_gemms"])
            p.coll("reduce_scatter" if self.sp else "all_reduce", X, f"{name}.{part} output {phase}")

    def backward(self, name: str):
        if not name.startswith("h."):
            return super().backward(name)
        if self.recompute:
            self.forward(name, "recompute")
        p, k, X = self.p, self.k, self.k["X"]
        for part, norm in (("mlp", "norm2"), ("attn", "norm1")):
            if self.sp:
                p.coll("all_gather", X, f"{name}.{part} output bwd")
            if part == "attn":
                p.compute(f"bwd {name}.attn (after attention)", 2 * _flops(self.out), gemms=backward_gemms(self.out))
                self.ring.backward(f"{name}.attn")
                p.compute(f"bwd {name}.attn", 2 * _flops(self.qkv), k["attn_bytes"], backward_gemms(self.qkv))
            else:
                p.compute(f"bwd {name}.mlp", 2 * k["mlp_flops"], k["mlp_bytes"], backward_gemms(k["mlp_gemms"]))
            for _ in range(1 if self.sp else k[f"col_{part}"]):
                p.coll("reduce_scatter" if self.sp else "all_reduce", X, f"{name}.{part} input bwd")
            p.compute(f"bwd {name}.{norm}", nbytes=self.norm)
