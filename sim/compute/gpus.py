"""What each GPU preset's kernels reach, measured: the data of the compute model (sim/compute/kernels.py).

    >>> from distlab.sim.compute.gpus import KERNEL_MODELS
    >>> KERNEL_MODELS["h100"].gemm_fraction["bfloat16"]      # MAMF / datasheet peak, measured
    0.803

Per GPU (GPUSpec.compute names its entry; sim/cluster/presets.py GPUS): the fraction of the datasheet peak the best GEMM
reaches per input dtype, the SM count (for wave quantization), the attention kernel users run on it with its
measured throughput, the HBM fraction a streaming kernel reaches, and the GPU's generation (which names the two
fitted constants, sim/compute/fitted.py). Every number is a measurement or a datasheet figure; the source is on
its line. Peaks themselves are datasheet numbers on GPUSpec (tflops = dense bf16, fp8_tflops, fp32_tflops).

GEMMs: "Maximum Achievable Matmul FLOPS" (MAMF), the best of a brute-force sweep of large shapes, torch.matmul,
mean of 100 iterations after 50 warm-up (S. Bekman, ml-engineering, compute/accelerator/README.md, "Maximum
Achievable Matmul FLOPS comparison table", commit 744d01e). float32 (torch's default: no TF32 for matmul, so the
CUDA cores' FP32 rate): the best square GEMM of zzc0721/torch-performance-test-data database.md (commit 9d82827)
over the datasheet FP32 peak.

Attention: FlashAttention's forward throughput by sequence length (head_dim 128, non-causal, bf16) as published
for the kernel each generation runs, the causal penalty s / (s + s0) read off the same sources' causal and
non-causal pairs (the diagonal blocks and the uneven work per query block cost about s0 keys' worth), and the
backward's throughput relative to the forward's (both counted as sim/compute/kernels.py counts FLOPs: forward
4·b·h·s²·d, halved when causal; backward 2.5x). Throughputs are absolute TFLOP/s measured on the named GPU and
turned into fractions of the preset's own bf16 peak where the preset is that GPU's silicon.
"""
from __future__ import annotations

from dataclasses import dataclass, field

GEMM_TILE = (128, 256)   # output tile of one SM: cuBLAS's large bf16 kernels (sm80 "256x128", sm90 "128x256x64",
#                          sm100 2-SM "256x256"), NVIDIA "Matrix Multiplication Background User's Guide" sec. 2.3


@dataclass(frozen=True)
class Attention:
    """A FlashAttention kernel as measured: forward TFLOP/s by sequence length (non-causal, head_dim 128) on
    ``measured_on`` (peak ``measured_peak`` TFLOP/s), the causal constant s0, backward/forward throughput."""
    kernel: str
    forward_tflops: tuple[tuple[int, float], ...]
    measured_on: str
    measured_peak: float
    causal_s0: float
    backward_ratio: float
    source: str

    def forward_fraction(self, seq: int, causal: bool) -> float:
        """Fraction of the measuring GPU's peak the forward reaches at ``seq`` (linear in log2 seq between the
        measured lengths, clamped at both ends), times s / (s + s0) when causal."""
        import math
        pts = self.forward_tflops
        if seq <= pts[0][0]:
            t = pts[0][1]
        elif seq >= pts[-1][0]:
            t = pts[-1][1]
        else:
            t = pts[-1][1]
            for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
                if seq <= s1:
                    t = t0 + (t1 - t0) * (math.log2(seq) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
                    break
        fraction = t / self.measured_peak
        return fraction * seq / (seq + self.causal_s0) if causal else fraction


# --- attention kernels ---------------------------------------------------------------------------------------
# FlashAttention-3 on H100 SXM (what SDPA / flash_attn_interface run on Hopper): forward, non-causal, head_dim 128,
# batch x seq = 16k, 16 heads: pytorch/benchmark PR #2391 (commit ff65cb6, "flash_v3-tflops" column).
# Causal s0 = 350: FA3 on H20 (Hopper), head_dim 128, seq 2048: 107.8 causal vs 126.2 TFLOP/s non-causal
# (Dao-AILab/flash-attention issue #1310) -> s / (s + s0) = 0.854. Backward: FA3 on H100, causal, head_dim 64,
# 4 x 16 x 16384: forward 4642.5 us, backward 12733.7 us for 2.5x the FLOPs (pytorch/pytorch PR #137036, "fwd_fav3",
# "bwd_fav3") -> 0.911 of the forward's rate.
FA3_H100 = Attention("FlashAttention-3", ((512, 430.3), (1024, 517.1), (2048, 565.5), (4096, 590.2),
                                          (8192, 614.2), (16384, 620.7)),
                     "h100", 989.0, 350.0, 0.911,
                     "pytorch/benchmark#2391 (forward), flash-attention#1310 (causal), pytorch#137036 (backward)")
# FlashAttention-2 on A100 (Dao 2023, arXiv 2307.08691, sec. 4.1): "up to 73% of the theoretical maximum FLOPs/s"
# forward, "up to 63%" backward, on A100 80GB SXM4. The sequence-length shape is FA3's above, scaled so that its
# longest measured length reaches the paper's 73%; causal s0 = 554: FA2 on H20, head_dim 128, seq 2048: 65.9
# causal vs 83.7 TFLOP/s non-causal (flash-attention issue #1310); backward 63 / 73 = 0.863.
FA2_A100 = Attention("FlashAttention-2", tuple((s, 0.73 * 312.0 * t / 620.7) for s, t in FA3_H100.forward_tflops),
                     "a100", 312.0, 554.0, 0.863,
                     "Dao 2023 (arXiv 2307.08691) sec. 4.1: 73% forward, 63% backward; shape of pytorch/benchmark#2391")
# FlashAttention-2 on H100, as PyTorch's SDPA runs it (its FLASH_ATTENTION backend is FlashAttention-2; torchtitan
# puts it first on Hopper and cuDNN first only on sm100: torchtitan/models/attention.py at e7c0cae). Head_dim 128,
# seq 8192, benchmark_attn.py on Hopper (flash-attention PR #1791, "main"): non-causal forward 369.9 TFLOP/s,
# causal forward 284.1, causal backward 287.1 (beside FA3's 659.1 / 630.0 / 531.6 on the same GPU). Shape over
# sequence length: FA3's above scaled to 369.9 at 8192; causal s0 = 8192 x (369.9 / 284.1 - 1) = 2474; backward
# 287.1 / 284.1 = 1.011 of the causal forward's rate.
FA2_H100 = Attention("FlashAttention-2 (SDPA)", tuple((s, 369.9 * t / 614.2) for s, t in FA3_H100.forward_tflops),
                     "h100", 989.0, 2474.0, 1.011, "flash-attention PR #1791 (FA2 and FA3 on one Hopper GPU)")
# FlashAttention-4 (CuTe DSL) on sm100 (Blackwell): forward, non-causal, head_dim 128: flash-attention PR #2605
# ("FA4" column: 1540, 1706, 1796, 1837, 1882 TFLOP/s at 1k..16k; its causal rows at 1k, 2k, 4k: 829, 1172, 1431
# -> s0 = 880, 930, 1040: 950). Backward: PR #2280, causal, head_dim 128, seq 8192: forward 1418.1, 2-CTA backward
# 1208.6 TFLOP/s -> 0.852. The GPU: PR #2605's tables print MFU beside TFLOP/s (e.g. 1745 TFLOP/s = 69.8% at
# head_dim 128, 16k), dividing by 2,500 TFLOP/s: GB200's dense bf16 peak, so the fractions are of GB200's peak.
FA4_B200 = Attention("FlashAttention-4", ((1024, 1540.0), (2048, 1706.0), (4096, 1796.0), (8192, 1837.0),
                                          (16384, 1882.0)),
                     "gb200", 2500.0, 950.0, 0.852, "flash-attention PR #2605 (forward, causal, its MFU column's "
                     "2,500 TFLOP/s peak), PR #2280 (backward)")


@dataclass(frozen=True)
class KernelModel:
    """The measured behaviour of one GPU's kernels (module docstring)."""
    name: str
    generation: str                               # the fitted constants' key (sim/compute/fitted.py)
    peak_tflops: float                            # the datasheet bf16 peak and HBM bandwidth of the GPU measured:
    hbm_GBps: float                               # the model applies to a spec with these (sim/cluster/presets.py GPUS)
    sms: int                                      # streaming multiprocessors (datasheet / whitepaper)
    gemm_fraction: dict = field(hash=False)       # input dtype -> best GEMM / datasheet peak (measured)
    best_shape: tuple[int, int, int] = (8192, 8192, 8192)   # (M, N, K) of the best GEMM (where MAMF names one)
    attention: Attention = FA3_H100
    sdpa_flash: Attention | None = None           # PyTorch SDPA's flash backend where it differs (attention "flash2")
    hbm_fraction: float = 0.904
    launch_s: float = 2e-6
    sources: str = ""

    def __hash__(self):                           # frozen with a dict field: hash by name (one entry per name)
        return hash(self.name)


# HBM: a streaming kernel reaches 0.904 of the datasheet bandwidth: GH200 (96 GB HBM3, 4.0 TB/s datasheet),
# coalesced read 3614.6 GB/s (OpenCL-Benchmark, mredenti/PowerCapping configuration/OpenCL_benchmark.md, commit
# f57c11c). No published measurement found for the other GPUs: the same fraction (gpu_check.sh measures it).
# Per-kernel cost launch_s = 2 us: H100 square bf16 GEMMs (zzc0721/torch-performance-test-data issue #79) take
# 12.2 us at 1024³ and 25.4 us at 2048³, the wave model below predicts 10.8 and 21.6 us: 1.3 and 3.8 us more.
KERNEL_MODELS = {
    # A100 SXM4 80GB: 108 SMs (NVIDIA A100 whitepaper). MAMF bf16 271.2 of 312 TFLOP/s at 1024x10240x5120
    # (M x N x K as mamf-finder prints it). fp32: 19.18 of 19.5 (zzc0721 database.md, "A100 SXM4 80GB").
    "a100": KernelModel("a100", "ampere", 312.0, 2039.0, 108,
                        {"bfloat16": 0.869, "float16": 0.869, "float32": 0.984}, (1024, 10240, 5120), FA2_A100,
                        sources="MAMF table (ml-engineering 744d01e); zzc0721 database.md"),
    # H100 SXM5 80GB: 132 SMs (H100 datasheet). MAMF bf16 794.5 / 989 at 2048x2048x13312; fp8 1402.6 / 1979;
    # fp32 51.88 of 66.9 (zzc0721 database.md / issue #79).
    "h100": KernelModel("h100", "hopper", 989.0, 3350.0, 132,
                        {"bfloat16": 0.803, "float16": 0.803, "float8_e4m3fn": 0.709, "float32": 0.775},
                        (2048, 2048, 13312), FA3_H100, sdpa_flash=FA2_H100,
                        sources="MAMF table (ml-engineering 744d01e); zzc0721 issue #79"),
    # H200 SXM: the H100's compute ("H200 is the same", MAMF table, bf16); fp8 1453.4 / 1979 measured on H200;
    # fp32 51.34 / 66.9 (zzc0721 database.md "NVIDIA H200").
    "h200": KernelModel("h200", "hopper", 989.0, 4800.0, 132,
                        {"bfloat16": 0.803, "float16": 0.803, "float8_e4m3fn": 0.734, "float32": 0.767},
                        (2048, 2048, 13312), FA3_H100, sdpa_flash=FA2_H100,
                        sources="MAMF table (ml-engineering 744d01e); zzc0721 database.md"),
    # H800 SXM: the H100 die with NVLink cut (DeepSeek-V3, arXiv 2412.19437 sec. 3.1); no separate measurement:
    # the H100's.
    "h800": KernelModel("h800", "hopper", 989.0, 3350.0, 132,
                        {"bfloat16": 0.803, "float16": 0.803, "float8_e4m3fn": 0.709, "float32": 0.775},
                        (2048, 2048, 13312), FA3_H100, sdpa_flash=FA2_H100,
                        sources="H100's (same die)"),
    # B200 SXM: 148 SMs (ml-engineering training/performance/README.md: "a B200 SKU also reads 148"). MAMF bf16
    # 1745.0 / 2250 at 1792x16128x3072; fp8 3432.5 / 4500; fp32 66.24 of 75 (zzc0721 database.md "B200 180GB";
    # HGX B200 datasheet FP32 600 TFLOPS for 8 GPUs).
    "b200": KernelModel("b200", "blackwell", 2250.0, 8000.0, 148,
                        {"bfloat16": 0.776, "float16": 0.776, "float8_e4m3fn": 0.763, "float32": 0.883},
                        (1792, 16128, 3072), FA4_B200,
                        sources="MAMF table (ml-engineering 744d01e); zzc0721 database.md"),
    # GB200: MAMF bf16 1822.0 / 2500 at 4096x9728x2048, fp8 3615.6 / 5000 (MAMF table, "GB200 SXM"); SMs and fp32:
    # no separate figure, B200's.
    "gb200": KernelModel("gb200", "blackwell", 2500.0, 8000.0, 148,
                         {"bfloat16": 0.729, "float16": 0.729, "float8_e4m3fn": 0.723, "float32": 0.883},
                         (4096, 9728, 2048), FA4_B200, sources="MAMF table (ml-engineering 744d01e)"),
    # L40S (Ada, sm89): 142 SMs (L40S datasheet). No MAMF row: the best square GEMM of zzc0721 database.md,
    # "NVIDIA L40S": bf16 269.15 of 362, fp32 46.88 of 91.6; fp8: no measurement, bf16's fraction. Attention:
    # FlashAttention-2 (A100's figures: no Ada measurement found).
    "l40s": KernelModel("l40s", "ada", 362.0, 864.0, 142,
                        {"bfloat16": 0.743, "float16": 0.743, "float8_e4m3fn": 0.743, "float32": 0.512},
                        (8192, 8192, 8192), FA2_A100,
                        sources="zzc0721 database.md"),
}
