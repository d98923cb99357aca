"""Lesson 13's roofline: arithmetic intensity, where a GEMM turns from memory-bound to compute-bound, and what
fusion saves; the table and the exercise, computed by sim/compute's kernel model (no torch).

    >>> round(intensity(4096, 8192, 8192))                   # FLOPs per HBM byte of a bf16 GEMM
    2048

The roofline (Williams, Waterman and Patterson, "Roofline: an insightful visual performance model for multicore
architectures", CACM 52(4), 2009): a kernel of arithmetic intensity I (FLOPs per byte it moves through memory)
runs at most min(peak, I x memory bandwidth). Below the ridge I = peak / bandwidth it is memory-bound. An
(M x K) @ (K x N) GEMM of e-byte operands moves (M·K + K·N + M·N)·e bytes for 2·M·N·K FLOPs; with a weight
much larger than the tokens (M << K, N) and e = 2 that is about M FLOPs per byte: a GEMM of few tokens (a
decode step, a small micro-batch) reads the whole weight for little math. sim/compute/kernels.py prices a GEMM
as launch + max(FLOPs / (peak x eff), bytes / (HBM x 0.904)): its own roofline, with the measured best GEMM,
the tiles' waves and the HBM fraction in place of the datasheet's. H100 SXM: 989 TFLOP/s dense bf16, 3.35 TB/s
(NVIDIA H100 datasheet), a ridge of 295 FLOPs per byte.
"""
from __future__ import annotations

from distlab.sim.lessons.checker import Exercise
from distlab.sim.lessons.helpers import Table

GPU = "h100"
WEIGHT = 8192                    # an 8192 x 8192 weight: Llama 3 70B's attention output projection (h = 8192)
ASKED_TOKENS = 64


def _gpu():
    from distlab.sim.cluster import GPUS
    return GPUS[GPU]


def intensity(M: int, N: int, K: int, dtype_bytes: float = 2) -> float:
    """FLOPs per HBM byte of one (M x K) @ (K x N) GEMM: 2·M·N·K / ((M·K + K·N + M·N) · e)."""
    return 2.0 * M * N * K / ((M * K + K * N + M * N) * dtype_bytes)


def ridge() -> float:
    """The datasheet ridge: peak FLOP/s over HBM bytes/s (H100: 989e12 / 3.35e12 = 295)."""
    g = _gpu()
    return g.tflops * 1e12 / (g.hbm_GBps * 1e9)


def gemm_us(M: int, N: int = WEIGHT, K: int = WEIGHT) -> float:
    """sim/compute/kernels.py gemm_time of a bf16 GEMM on the H100 preset, in µs."""
    from distlab.sim.compute import gemm_time
    return gemm_time(M, N, K, 2, _gpu()) * 1e6


def peak_us(M: int, N: int = WEIGHT, K: int = WEIGHT) -> float:
    """The same GEMM's FLOPs at the datasheet peak, in µs (what a compute-only estimate says)."""
    return 2.0 * M * N * K / (_gpu().tflops * 1e12) * 1e6


def roofline_table(tokens=(16, 64, 256, 1024, 4096)) -> Table:
    """GEMMs of ``tokens`` x an 8192 x 8192 bf16 weight on H100: intensity, time, achieved rate, bound."""
    rows = []
    for m in tokens:
        t = gemm_us(m)
        rows.append([m, f"{intensity(m, WEIGHT, WEIGHT):,.0f}", f"{t:,.1f}", f"{peak_us(m):,.1f}",
                     f"{2.0 * m * WEIGHT * WEIGHT / t / 1e6:,.0f}",
                     "memory" if intensity(m, WEIGHT, WEIGHT) < ridge() else "compute"])
    return Table(["tokens M", "FLOPs / byte", "time (µs)", "at peak (µs)", "TFLOP/s", "below the ridge?"], rows,
                 f"(M x {WEIGHT}) @ ({WEIGHT} x {WEIGHT}) bf16 on H100, sim/compute's kernel model (ridge "
                 f"{ridge():.0f} FLOPs/byte)")


EXERCISES = (
    Exercise("13-roofline", f"Predict before the table: a bf16 GEMM of {ASKED_TOKENS} tokens by an {WEIGHT} x "
             f"{WEIGHT} weight, ({ASKED_TOKENS} x {WEIGHT}) @ ({WEIGHT} x {WEIGHT}), on an H100 (989 TFLOP/s dense "
             "bf16, 3.35 TB/s HBM). How long does it take in sim/compute's kernel model, in µs? Within 15%.", "us",
             lambda: gemm_us(ASKED_TOKENS), tolerance=0.15,
             traps=lambda: {peak_us(ASKED_TOKENS): "that is its FLOPs at peak; the GEMM must also read its weight"},
             hint="compute both sides of the roofline: 2·M·N·K FLOPs at the peak, and (M·K + K·N + M·N) x 2 bytes "
                  "at the HBM a kernel reaches (0.904 of the datasheet); the larger wins, plus a few µs of launch",
             why="the 8192 x 8192 weight is 128 MiB: reading it at 3.03 TB/s takes about 45 µs, while its 8.6 "
                 "GFLOP take 9 µs at peak. At 64 tokens the GEMM is memory-bound (64 FLOPs per byte, far below "
                 "the ridge of 295): up to about 256 tokens more tokens cost almost nothing, which is why decoding "
                 "batches requests and why a tiny micro-batch wastes the GPU."),
)
