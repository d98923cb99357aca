"""Compute time of one op from its kernels: GEMMs by shape, FlashAttention, memory-bound work, launch overhead.

GEMM (M, N, K) with operands of e bytes (the shared interface of sim/cluster.py GPUSpec):
    t = launch_s + max(2·M·N·K / (tflops · 1e12 · eff(2·M·N·K)), (M·K + K·N + M·N) · e / (hbm_GBps · 1e9))
``eff`` is the GPU's ``gemm_efficiency`` curve: points (FLOPs of one GEMM, fraction of ``tflops`` reached),
interpolated linearly in log10(FLOPs) and clamped at both ends; with no curve, eff = ``gpu.mfu`` (the flat
roofline distlab had before). Small and skinny GEMMs reach a smaller fraction of peak than large ones: a GEMM is
cut into output tiles (cuBLAS: 128x128 or 256x128 on A100/H100) run in waves over the SMs, so a GEMM of few
tiles leaves SMs idle (wave quantization) and pays the fixed prologue/epilogue of each tile (NVIDIA, "Matrix
Multiplication Background User's Guide", sections 2.3 and 3). ``saturating_curve`` gives such a curve from two
constants: eff(F) = peak_fraction · F / (F + half_flops) (F = FLOPs of the GEMM; half_flops = the size at which
half of peak_fraction is reached). `distlab reproduce` gives each GPU generation such a curve with both
constants *fitted* on at most two published rows (sim/reproduce/runs.yaml ``generations`` names them), not
measured; ``distlab calibrate --compute`` writes a measured curve into a cluster file instead. The GPU presets
carry no curve (the flat ``mfu`` roofline) until a published benchmark or a calibration gives one.

FlashAttention (Dao 2023, "FlashAttention-2", arXiv 2307.08691, sec. 4.1, the FLOP count of its benchmarks):
forward FLOPs = 4 · batch · heads · seq² · head_dim, halved with causal masking (the masked half of the score
matrix is skipped), backward = 2.5 x forward (5 matmuls instead of 2), 3.5 x with the forward recomputed; time = launch_s + FLOPs / (tflops ·
1e12 · attention_efficiency), where attention_efficiency defaults to eff() of the attention's FLOPs.

Unfused attention (Megatron-LM before FlashAttention): per (batch, head) two batched GEMMs forward, Q·Kᵀ (s, s, d)
and P·V (s, d, s), over the whole score matrix (masking happens in the softmax), four in the backward, each timed
as one GEMM of all (batch x heads) problems; plus the memory-bound passes over the b·heads·s² score matrix that
Korthikanti et al. 2022 (arXiv 2205.05198, sec. 4.1) list: scale-mask-softmax (read scores, write
probabilities: 2e bytes an element) and dropout (read, write, a 1-byte mask: 2e + 1) forward, their backwards
(dropout: read gradient and mask, write: 2e + 1; softmax: read gradient and probabilities, write: 3e).

Memory-bound work (norms, activations, embedding lookup, optimizer step): t = launch_s + bytes / (hbm_GBps·1e9).
An op without kernel fields keeps the roofline max(flops / (tflops·mfu), bytes / HBM) + launch_s.
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace

from distlab.sim.dtypes import DTYPE_BYTES

FLASH_BACKWARD_FACTOR = 2.5      # FlashAttention-2 (2307.08691): backward FLOPs = 2.5 x forward
PASS_FACTOR = {"forward": 1.0, "backward": FLASH_BACKWARD_FACTOR, "recompute+backward": 1.0 + FLASH_BACKWARD_FACTOR}


def saturating_curve(peak_fraction: float, half_flops: float,
                     points: tuple[float, ...] = (1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13)) -> tuple:
    """The curve eff(F) = peak_fraction · F / (F + half_flops) sampled at ``points`` (GEMM FLOPs), as the
    (flops, fraction) pairs a GPUSpec carries."""
    return tuple((float(f), peak_fraction * f / (f + half_flops)) for f in points)


def gemm_efficiency(flops: float, gpu) -> float:
    """Fraction of ``gpu.tflops`` a GEMM of ``flops`` FLOPs reaches: the curve, linear in log10(FLOPs),
    clamped at both ends; ``gpu.mfu`` without a curve."""
    curve = gpu.gemm_efficiency
    if not curve:
        return gpu.mfu
    if flops <= curve[0][0]:
        return curve[0][1]
    if flops >= curve[-1][0]:
        return curve[-1][1]
    x = math.log10(flops)
    for (f0, e0), (f1, e1) in zip(curve, curve[1:]):
        if flops <= f1:
            x0, x1 = math.log10(f0), math.log10(f1)
            return e0 + (e1 - e0) * (x - x0) / (x1 - x0)
    return curve[-1][1]


def gemm_time(M: int, N: int, K: int, dtype_bytes: float, gpu) -> float:
    """Seconds of one (M x K) @ (K x N) GEMM (module docstring)."""
    flops = 2.0 * M * N * K
    math_s = flops / (gpu.tflops * 1e12 * gemm_efficiency(flops, gpu))
    memory_s = (M * K + K * N + M * N) * dtype_bytes / (gpu.hbm_GBps * 1e9)
    return gpu.launch_s + max(math_s, memory_s)


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True,
                    attention_pass: str = "forward") -> float:
    """FlashAttention FLOPs: 4·b·heads·s²·d forward, halved when causal; x2.5 for the backward, x3.5 for the
    backward with the forward recomputed before it (activation recomputation)."""
    flops = 4.0 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)
    return flops * PASS_FACTOR[attention_pass]


def attention_time(batch: int, heads: int, seq: int, head_dim: int, gpu, causal: bool = True,
                   attention_pass: str = "forward") -> float:
    """Seconds of one FlashAttention call (module docstring)."""
    flops = attention_flops(batch, heads, seq, head_dim, causal, attention_pass)
    eff = gpu.attention_efficiency if gpu.attention_efficiency is not None else gemm_efficiency(flops, gpu)
    return gpu.launch_s + flops / (gpu.tflops * 1e12 * eff)


def batched_gemm_time(count: int, M: int, N: int, K: int, dtype_bytes: float, gpu) -> float:
    """Seconds of ``count`` equal GEMMs run as one batched kernel: the curve at the kernel's total FLOPs."""
    flops = 2.0 * count * M * N * K
    math_s = flops / (gpu.tflops * 1e12 * gemm_efficiency(flops, gpu))
    memory_s = count * (M * K + K * N + M * N) * dtype_bytes / (gpu.hbm_GBps * 1e9)
    return gpu.launch_s + max(math_s, memory_s)


def unfused_attention_time(batch: int, heads: int, seq: int, head_dim: int, gpu, dtype_bytes: float = 2,
                           attention_pass: str = "forward") -> float:
    """Seconds of unfused attention (module docstring): batched GEMMs plus softmax/dropout memory passes."""
    n, s, d, e = batch * heads, seq, head_dim, dtype_bytes
    gemm = batched_gemm_time(n, s, s, d, e, gpu) + batched_gemm_time(n, s, d, s, e, gpu)
    forward = gemm + memory_time(n * s * s * 2 * e, gpu) + memory_time(n * s * s * (2 * e + 1), gpu)
    backward = 2 * gemm + memory_time(n * s * s * (2 * e + 1), gpu) + memory_time(n * s * s * 3 * e, gpu)
    return {"forward": forward, "backward": backward, "recompute+backward": forward + backward}[attention_pass]


def memory_time(nbytes: float, gpu) -> float:
    """Seconds of a memory-bound kernel moving ``nbytes`` through HBM."""
    return gpu.launch_s + nbytes / (gpu.hbm_GBps * 1e9)


def op_seconds(op, gpu) -> float:
    """Seconds of a Compute op on ``gpu`` (module docstring): ``seconds`` if given; the kernels it names; else
    the roofline of its flops and bytes. Overhead: launch_s per kernel, or, when the op counts ``launches`` (not None:
    ops the host dispatches one by one, e.g. DTensor's: sim/parallel/tp/plan.py), launches x launch_s instead (one rule,
    never both)."""
    if op.seconds is not None:
        return op.seconds
    if op.gemms or op.attention is not None:
        t = _kernel_seconds(op, gpu)
        if op.launches is not None and gpu.launch_s:
            kernels = round((t - _kernel_seconds(op, replace(gpu, launch_s=0.0))) / gpu.launch_s)
            t += (op.launches - kernels) * gpu.launch_s
        return t
    t = max(op.flops / (gpu.tflops * 1e12 * gpu.mfu), op.bytes / (gpu.hbm_GBps * 1e9))
    if op.launches is not None:
        return t + op.launches * gpu.launch_s
    return t + gpu.launch_s if (op.flops or op.bytes) else t


@functools.lru_cache(maxsize=4096)
def _kernel_seconds(op, gpu) -> float:
    """The sum of the op's kernels (cached: a step repeats the same layer ops thousands of times)."""
    e = DTYPE_BYTES[op.dtype]
    t = sum(gemm_time(M, N, K, e, gpu) for M, N, K in op.gemms)
    if op.attention is not None and op.attention_kernel == "unfused":
        t += unfused_attention_time(*op.attention, gpu, e, op.attention_pass)
    elif op.attention is not None:
        t += attention_time(*op.attention, gpu, op.causal, op.attention_pass)
    return t
