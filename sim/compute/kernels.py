"""Compute time of one op from its kernels: GEMMs by shape and dtype, FlashAttention, memory-bound work, launches.

    >>> from distlab.sim.cluster import GPUS
    >>> from distlab.sim.compute.kernels import gemm_time
    >>> round(gemm_time(8192, 8192, 8192, 2, GPUS["h100"]) * 1e3, 2)          # ms, on the H100 preset
    1.4

GEMM (M, N, K) of ``dtype`` operands (e bytes), on a GPU with a kernel model (sim/compute/gpus.py):
    t = launch + max(2·M·N·K / (peak(dtype) · eff), (M·K + K·N + M·N) · e / (hbm · hbm_fraction))
    eff = gemm_fraction(dtype) · waves(M, N) / waves(best_shape) · sustained
``gemm_fraction`` is the measured best GEMM over the datasheet peak (MAMF); ``waves`` is tile and wave
quantization (NVIDIA, "Matrix Multiplication Background User's Guide", sec. 2.3): the output is cut into 128 x 256
tiles, one per SM at a time, so a GEMM of T tiles on S SMs runs in ceil(T/S) waves and uses
(M·N / 32768) / (ceil(T/S)·S) of the SMs' time; dividing by the best shape's value makes the model reproduce the
measured MAMF exactly at its shape. ``sustained`` is the generation's fitted constant (sim/compute/fitted.py).
float8_e4m3fn GEMMs run as an FP8 recipe runs them (sim/compute/fp8.py; default torchao's Float8Linear with
dynamic tensorwise scaling): each bf16 operand costs the recipe's cast bytes per element over HBM and its
quantization kernels, then the GEMM runs at the FP8 peak times the measured FP8 fraction (and the recipe's rate).
With a measured curve instead (``gpu.gemm_efficiency``, written by ``distlab calibrate --compute``): eff = the
curve at the GEMM's FLOPs, interpolated in log10(FLOPs), clamped; with neither, eff = ``gpu.mfu`` (a flat roofline).

FlashAttention (Dao 2023, arXiv 2307.08691, sec. 4.1, its benchmarks' FLOP count): forward 4·b·heads·s²·d,
halved when causal; backward 2.5 x forward, recompute+backward 3.5 x. Its rate is the kernel's measured forward
throughput at that sequence length (causal penalty included) and the backward's ratio to it (gpus.py), times
sustained; without a kernel model, ``gpu.attention_efficiency`` or the GEMM curve at the call's FLOPs.
``attention_kernel`` flash2: FlashAttention-2 as PyTorch's SDPA runs it (torchtitan on Hopper), the GPU's
``sdpa_flash`` measurement where it has one (gpus.py FA2_H100), else its flash kernel's.
Unfused attention (Megatron-LM before FlashAttention): per (batch, head) two batched GEMMs forward, Q·Kᵀ (s, s, d)
and P·V (s, d, s), over the whole score matrix, four in the backward, plus the memory-bound passes over the
b·heads·s² scores that Korthikanti et al. 2022 (arXiv 2205.05198, sec. 4.1) list: scale-mask-softmax (2e bytes an
element) and dropout (2e + 1) forward, their backwards (2e + 1, 3e).

Memory-bound work (norms, activations, embedding lookup, optimizer step): t = launch + bytes / (hbm · fraction).
An op with only ``flops`` and ``bytes`` (a hand-written plan, a model without a transformer's structure; every
builder gives a transformer's layers their kernels, sim/parallel/layers.py): its FLOPs at the GPU's best GEMM rate
for the op's ``dtype`` (float32: the FP32 peak; an upper bound: no shapes, no attention kernel) or its bytes, the
larger; plus a launch. An attention call with ``block_elementwise`` false (ring attention's steps after the first)
carries no elementwise passes (its block's are on the first step). Every builder sets the dtype its matmuls run
in (sim/dtypes.py compute_dtype).
``launch`` = the spec's launch_s plus the model's measured launch_s, per kernel. The block's elementwise kernels
(sim/compute/fitted.py ``elementwise_passes``, fitted) ride on its attention op: passes x b·s·heads·d x bytes.
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace
from distlab.sim.compute.fitted import constants
from distlab.sim.compute.gpus import GEMM_TILE, KERNEL_MODELS
from distlab.sim.dtypes import DTYPE_BYTES
from distlab.sim.errors import ConfigError

FLASH_BACKWARD_FACTOR = 2.5      # FlashAttention-2 (2307.08691): backward FLOPs = 2.5 x forward
PASS_FACTOR = {"forward": 1.0, "backward": FLASH_BACKWARD_FACTOR, "recompute+backward": 1.0 + FLASH_BACKWARD_FACTOR}
FLOAT8 = "float8_e4m3fn"
# torch.compile's effect on a torch-native step: torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Llama 3.1
# 8B, FSDP, selective recompute: 5,762 -> 6,667 tokens/s per GPU on 8 H100 (Table 1), 5,605 -> 6,514 on 128 (Table
# 3). Inductor's default mode leaves matmuls and SDPA to their extern kernels (cuBLAS, FlashAttention) and fuses
# the elementwise kernels between them; the model prices a block's elementwise kernels as fused already
# (sim/compute/fitted.py elementwise_passes, fitted on Megatron-Core with Transformer Engine's fused kernels), so a
# compiled step is priced as it stands and an eager torch-native one (unfused) is this much slower
# (sim/reproduce/plans.py).
TORCH_COMPILE_SPEEDUP = 1.16


def kernel_model(gpu):
    """The GPU's measured kernel model (sim/compute/gpus.py), or None: a custom GPU, a CPU, or a preset whose peak
    or bandwidth was changed (the measurements describe the GPU they were taken on)."""
    name = getattr(gpu, "compute", None)
    model = KERNEL_MODELS.get(name) if name else None
    if model is None or gpu.tflops != model.peak_tflops or gpu.hbm_GBps != model.hbm_GBps:
        return None
    return model


def sustained(gpu) -> float:
    """The fitted sustained fraction for ``gpu`` (its own override first, else its generation's)."""
    if getattr(gpu, "sustained", None) is not None:
        return gpu.sustained
    model = kernel_model(gpu)
    return constants(model.generation).sustained if model else 1.0


def elementwise_passes(gpu) -> float:
    """HBM passes over a block's activations for its elementwise kernels (sim/compute/fitted.py): the spec's own,
    else its generation's fitted value unless the spec carries its own constants (``sustained`` set: then 0); 0
    without a kernel model."""
    if getattr(gpu, "elementwise_passes", None) is not None:
        return gpu.elementwise_passes
    model = kernel_model(gpu)
    if model is None or getattr(gpu, "sustained", None) is not None:
        return 0.0
    return constants(model.generation).elementwise_passes


def elementwise_time(batch: int, heads: int, seq: int, head_dim: int, gpu, dtype_bytes: float = 2,
                     attention_pass: str = "forward") -> float:
    """Seconds of the elementwise kernels of the block whose attention call this is (no launches: the fitted
    passes stand for them): passes x b·s·heads·d x bytes over HBM, x2 backward, x3 recompute+backward."""
    passes = elementwise_passes(gpu)
    if not passes:
        return 0.0
    factor = {"forward": 1.0, "backward": 2.0, "recompute+backward": 3.0}[attention_pass]
    return passes * factor * batch * seq * heads * head_dim * dtype_bytes / hbm_Bps(gpu)


def launch_s(gpu) -> float:
    """Seconds each kernel costs beyond its work: the spec's launch_s plus the kernel model's measured launch."""
    model = kernel_model(gpu)
    return gpu.launch_s if model is None else gpu.launch_s + model.launch_s


def peak_tflops(gpu, dtype: str) -> float:
    """Datasheet dense peak for GEMMs of ``dtype``: fp8_tflops for float8, fp32_tflops (CUDA cores: torch does not
    use TF32 for matmul by default) for float32, else tflops (bf16/fp16 tensor cores)."""
    if dtype == FLOAT8:
        if not getattr(gpu, "fp8_tflops", None):
            raise ConfigError(f"GPU {gpu.name!r} has no FP8 tensor cores (fp8_tflops unset); allowed there: "
                              "bfloat16, float16, float32", "dtype")
        return gpu.fp8_tflops
    if dtype == "float32" and getattr(gpu, "fp32_tflops", None):
        return gpu.fp32_tflops
    return gpu.tflops


def hbm_Bps(gpu) -> float:
    """Bytes per second a streaming kernel reaches: the datasheet bandwidth times the measured fraction."""
    model = kernel_model(gpu)
    return gpu.hbm_GBps * 1e9 * (model.hbm_fraction if model else 1.0)


CHUNK_STREAMS = 3         # Transformer Engine spreads a TP overlap's chunk GEMMs over this many compute streams
#                           (NVTE_COMM_OVERLAP_MAX_STREAMS, transformer_engine/common/comm_gemm_overlap)
SPLIT_K_MIN_DEPTH = 1024   # assumed: a split-K slice is at least this deep, so the measured 1024³ H100 GEMM
#                            (zzc0721 issue #79) stays unsplit, as the wave model that reproduces it says


@functools.lru_cache(maxsize=8192)
def tiling(M: int, N: int, sms: int, K: int | None = None, balance: float = 0.0,
           chunks: int = 1) -> tuple[float, int]:
    """(fraction of the SMs' time an M x N output keeps busy, K splits) over the two tile orientations and, given
    K, split-K (module docstring): a GEMM of fewer tiles than SMs cuts its K loop into s slices, each at least
    SPLIT_K_MIN_DEPTH deep, making tiles x s work units of 1/s a tile each, so few tiles and a deep K still fill
    the SMs. The split chosen minimizes the time: the waves' plus the fp32 partials' extra HBM traffic,
    (s - 1)·M·N·8 bytes, at ``balance`` FLOPs per HBM byte (priced in ``_gemm_work``). A GEMM that is one of
    ``chunks`` equal ones issued round-robin over CHUNK_STREAMS streams (a TP overlap's chunks) may instead share
    the waves with them: their chunks x tiles form one pool, at most min(SMs, CHUNK_STREAMS x tiles) in flight.
    Cached: a pure function of numbers, asked hundreds of thousands of times for a few dozen shapes by an MoE step
    (DeepSeek-V3's experts: 405,819 calls, 38 shapes)."""
    best, best_cost = (0.0, 1), float("inf")
    for tm, tn in (GEMM_TILE, GEMM_TILE[::-1]):
        tiles = math.ceil(M / tm) * math.ceil(N / tn)
        depth = (K or 0) // SPLIT_K_MIN_DEPTH if tiles < sms else 1     # split-K only under one wave of tiles
        for s in range(1, max(1, depth) + 1):
            eff = (M * N / (tm * tn)) / (math.ceil(tiles * s / sms) * sms / s)
            cost = 1.0 / eff + (s - 1) * 8 * balance / (2.0 * K) if s > 1 else 1.0 / eff
            if cost < best_cost:
                best, best_cost = (eff, s), cost
        if chunks > 1:                       # the chunks' tiles pooled over the streams (no split)
            in_flight = min(sms, CHUNK_STREAMS * tiles)
            eff = (chunks * M * N / (tm * tn)) / (math.ceil(chunks * tiles / in_flight) * sms)
            if 1.0 / eff < best_cost:
                best, best_cost = (eff, 1), 1.0 / eff
    return min(best[0], 1.0), best[1]


def wave_efficiency(M: int, N: int, sms: int, K: int | None = None, balance: float = 0.0) -> float:
    """Fraction of the SMs' time an M x N output keeps busy (module docstring), the better tile orientation and,
    given K, the better split of the K loop."""
    return tiling(M, N, sms, K, balance)[0]


def _balance(gpu, model, dtype: str) -> float:
    """FLOPs per HBM byte of the GPU's best GEMM (for the split-K choice)."""
    fraction = model.gemm_fraction.get(dtype, model.gemm_fraction["bfloat16"])
    return peak_tflops(gpu, dtype) * 1e12 * fraction / hbm_Bps(gpu)


def gemm_efficiency(flops: float, gpu, M: int | None = None, N: int | None = None, dtype: str = "bfloat16",
                    K: int | None = None, chunks: int = 1) -> float:
    """Fraction of ``peak_tflops(gpu, dtype)`` a GEMM reaches (module docstring): a measured curve at ``flops``;
    else the kernel model at its (M, N) output (a large GEMM's rate when not given); else ``gpu.mfu``."""
    curve = gpu.gemm_efficiency
    if curve:
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
    model = kernel_model(gpu)
    if model is None:
        return gpu.mfu
    fraction = model.gemm_fraction.get(dtype, model.gemm_fraction["bfloat16"])
    bm, bn, bk = model.best_shape
    b = _balance(gpu, model, dtype)
    shape = 1.0 if M is None or N is None else (tiling(M, N, model.sms, K, b, chunks)[0]
                                                / wave_efficiency(bm, bn, model.sms, bk, b))
    return fraction * min(shape, 1.0) * sustained(gpu)


def gemm_time(M: int, N: int, K: int, dtype_bytes: float, gpu, dtype: str | None = None,
              fp8_recipe: str | None = None) -> float:
    """Seconds of one (M x K) @ (K x N) GEMM (module docstring). ``dtype`` defaults to bfloat16 (2 bytes) or
    float32 (4); float8_e4m3fn adds the FP8 recipe's casts of both bf16 operands (sim/compute/fp8.py)."""
    work, kernels = _gemm_work(M, N, K, dtype_bytes, gpu, dtype, fp8_recipe=fp8_recipe)
    return work + kernels * launch_s(gpu)


def _gemm_work(M: int, N: int, K: int, dtype_bytes: float, gpu, dtype: str | None = None,
               chunks: int = 1, fp8_recipe: str | None = None) -> tuple[float, int]:
    """(seconds without launches, kernels) of one GEMM (beside ``chunks`` - 1 equal ones on other streams)."""
    from distlab.sim.compute.fp8 import recipe
    dtype = dtype or ("float32" if dtype_bytes == 4 else "bfloat16")
    flops = 2.0 * M * N * K
    rate = recipe(fp8_recipe).gemm_rate if dtype == FLOAT8 else 1.0
    math_s = flops / (peak_tflops(gpu, dtype) * 1e12 * rate * gemm_efficiency(flops, gpu, M, N, dtype, K, chunks))
    operand = 1 if dtype == FLOAT8 else dtype_bytes
    memory_s = (M * K + K * N + M * N) * operand / hbm_Bps(gpu)
    model = kernel_model(gpu)
    if model is not None and not gpu.gemm_efficiency:          # split-K: fp32 partials written and read back
        splits = tiling(M, N, model.sms, K, _balance(gpu, model, dtype), chunks)[1]
        memory_s += (splits - 1) * M * N * 4 * 2 / hbm_Bps(gpu) if splits > 1 else 0.0
    if dtype == FLOAT8:
        r = recipe(fp8_recipe)
        extra = (M * K + K * N) * r.cast_bytes + M * N * r.output_bytes
        return max(math_s, memory_s) + extra / hbm_Bps(gpu), 1 + r.cast_kernels
    return max(math_s, memory_s), 1


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True,
                    attention_pass: str = "forward") -> float:
    """FlashAttention FLOPs: 4·b·heads·s²·d forward, halved when causal; x2.5 for the backward, x3.5 for the
    backward with the forward recomputed before it (activation recomputation)."""
    flops = 4.0 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)
    return flops * PASS_FACTOR[attention_pass]


def attention_time(batch: int, heads: int, seq: int, head_dim: int, gpu, causal: bool = True,
                   attention_pass: str = "forward") -> float:
    """Seconds of one FlashAttention call (module docstring), bf16."""
    work, kernels = _attention_work(batch, heads, seq, head_dim, gpu, causal, attention_pass)
    return work + kernels * launch_s(gpu)


def _attention_work(batch, heads, seq, head_dim, gpu, causal, attention_pass,
                    kernel: str = "flash") -> tuple[float, int]:
    model = kernel_model(gpu)
    forward = attention_flops(batch, heads, seq, head_dim, causal)
    if model is not None and not gpu.gemm_efficiency and gpu.attention_efficiency is None:
        attention = model.sdpa_flash if kernel == "flash2" and model.sdpa_flash else model.attention
        rate = gpu.tflops * 1e12 * attention.forward_fraction(seq, causal) * sustained(gpu)
        backward = forward * FLASH_BACKWARD_FACTOR / (rate * attention.backward_ratio)
        return {"forward": (forward / rate, 1), "backward": (backward, 1),
                "recompute+backward": (forward / rate + backward, 2)}[attention_pass]
    flops = forward * PASS_FACTOR[attention_pass]
    eff = gpu.attention_efficiency if gpu.attention_efficiency is not None else gemm_efficiency(flops, gpu)
    return flops / (gpu.tflops * 1e12 * eff), 1


def batched_gemm_time(count: int, M: int, N: int, K: int, dtype_bytes: float, gpu) -> float:
    """Seconds of ``count`` equal GEMMs run as one batched kernel: the tiles of all of them share the SMs."""
    return _batched_work(count, M, N, K, dtype_bytes, gpu) + launch_s(gpu)


def _batched_work(count: int, M: int, N: int, K: int, dtype_bytes: float, gpu) -> float:
    flops = 2.0 * count * M * N * K
    dtype = "float32" if dtype_bytes == 4 else "bfloat16"
    eff = gemm_efficiency(flops, gpu, count * M, N, dtype)
    math_s = flops / (peak_tflops(gpu, dtype) * 1e12 * eff)
    return max(math_s, count * (M * K + K * N + M * N) * dtype_bytes / hbm_Bps(gpu))


def unfused_attention_time(batch: int, heads: int, seq: int, head_dim: int, gpu, dtype_bytes: float = 2,
                           attention_pass: str = "forward") -> float:
    """Seconds of unfused attention (module docstring): batched GEMMs plus softmax/dropout memory passes."""
    work, kernels = _unfused_work(batch, heads, seq, head_dim, gpu, dtype_bytes, attention_pass)
    return work + kernels * launch_s(gpu)


def _unfused_work(batch, heads, seq, head_dim, gpu, dtype_bytes, attention_pass) -> tuple[float, int]:
    n, s, d, e = batch * heads, seq, head_dim, dtype_bytes
    B = hbm_Bps(gpu)
    gemm = _batched_work(n, s, s, d, e, gpu) + _batched_work(n, s, d, s, e, gpu)
    forward = gemm + n * s * s * 2 * e / B + n * s * s * (2 * e + 1) / B
    backward = 2 * gemm + n * s * s * (2 * e + 1) / B + n * s * s * 3 * e / B
    return {"forward": (forward, 4), "backward": (backward, 6),
            "recompute+backward": (forward + backward, 10)}[attention_pass]


def memory_time(nbytes: float, gpu) -> float:
    """Seconds of a memory-bound kernel moving ``nbytes`` through HBM."""
    return launch_s(gpu) + nbytes / hbm_Bps(gpu)


def gemm_dtype(dtype: str) -> str:
    """The GEMM rate an op of ``dtype`` runs at: float8, float32 and float16 their own, anything else bf16's."""
    return dtype if dtype in (FLOAT8, "float32", "float16") else "bfloat16"


def flops_only_seconds(flops: float, nbytes: float, gpu, dtype: str = "bfloat16") -> float:
    """An op that gives only FLOPs and bytes: the larger of its FLOPs at the best GEMM rate of its ``dtype``
    (float32: the FP32 peak, torch's default without TF32; ``gpu.mfu`` of that peak without a kernel model: the
    flat roofline) and its HBM bytes."""
    dtype = gemm_dtype(dtype)
    if kernel_model(gpu):                  # the kernel model's rate, not a fitted curve's (copied only when it has one)
        eff = gemm_efficiency(flops, replace(gpu, gemm_efficiency=None) if gpu.gemm_efficiency else gpu, dtype=dtype)
    else:
        eff = gpu.mfu
    return max(flops / (peak_tflops(gpu, dtype) * 1e12 * eff), nbytes / hbm_Bps(gpu))


def op_seconds(op, gpu, fp8_recipe: str | None = None) -> float:
    """Seconds of a Compute op on ``gpu`` (module docstring): ``seconds`` if given; the kernels it names; else
    FLOPs and bytes. Overhead: one launch per kernel, or, when the op counts ``launches`` (not None: ops the host
    dispatches one by one, e.g. DTensor's: sim/parallel/tp/plan.py), launches x launch instead (never both).
    ``fp8_recipe``: how float8 GEMMs quantize (sim/compute/fp8.py; None: torchao's tensorwise)."""
    if op.seconds is not None:
        return op.seconds
    if op.gemms or op.attention is not None:
        work, kernels = _kernel_work(op, gpu, fp8_recipe)
        return work + (kernels if op.launches is None else op.launches) * launch_s(gpu)
    t = flops_only_seconds(op.flops, op.bytes, gpu, op.dtype)
    if op.launches is not None:
        return t + op.launches * launch_s(gpu)
    return t + launch_s(gpu) if (op.flops or op.bytes) else t


@functools.lru_cache(maxsize=4096)
def _kernel_work(op, gpu, fp8_recipe: str | None = None) -> tuple[float, int]:
    """(seconds without launches, kernels) of the op's kernels (cached: a step repeats the same layer ops
    thousands of times)."""
    e = DTYPE_BYTES.get(op.dtype, 2)
    work, kernels, shapes = 0.0, 0, {}        # shapes: an MoE layer repeats a few GEMM shapes hundreds of times
    for M, N, K in op.gemms:
        if (M, N, K) not in shapes:
            shapes[M, N, K] = _gemm_work(M, N, K, e, gpu, gemm_dtype(op.dtype), op.chunks, fp8_recipe)
        w, k = shapes[M, N, K]
        work, kernels = work + w, kernels + k
    operand = 2 if op.dtype == FLOAT8 else e          # attention stays in bf16 beside float8 linears
    if op.attention is not None and op.attention_kernel == "unfused":
        w, k = _unfused_work(*op.attention, gpu, operand, op.attention_pass)
    elif op.attention is not None:
        w, k = _attention_work(*op.attention, gpu, op.causal, op.attention_pass, op.attention_kernel)
    else:
        w, k = 0.0, 0
    if op.attention is not None and op.block_elementwise:
        w += elementwise_time(*op.attention, gpu, operand, op.attention_pass)
    return work + w, kernels + k
