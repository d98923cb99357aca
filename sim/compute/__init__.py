"""The compute model: how long one op's kernels take on a GPU, one model for every command.

    >>> from distlab.sim.cluster import GPUS
    >>> from distlab.sim.compute import gemm_time, mfu_summary
    >>> gemm_time(8192, 8192, 8192, 2, GPUS["h100"]) > 2 * 8192**3 / 989e12      # below datasheet peak
    True

The engine (sim/kernel/engine.py) times every Compute op with ``op_seconds``; `distlab simulate`, `plan`,
`reproduce` and the lessons all go through it. Parts:
- kernels.py: GEMMs by shape and dtype (measured best GEMM x tile/wave quantization), FlashAttention at its
  measured throughput, unfused attention, memory-bound work over HBM, launches; float8 GEMMs as torchao runs them.
- gpus.py: what each GPU preset's kernels reach, every number measured and cited (MAMF tables, FlashAttention
  benchmarks, HBM streams), plus SM counts.
- fitted.py: the only fitted numbers, at most two per GPU generation, and the published rows they were fitted on.
- flops.py: model FLOPs per token and their conventions (6N + attention, Megatron's eq. 3), MFU, HFU, TFLOP/s and
  tokens/s per GPU: the step summary's throughput fields.
docs/compute.md explains the model and lists its sources.
"""
from distlab.sim.compute.flops import (BEST_PUBLISHED_MFU, LEFT_OUT, mfu_summary, model_flops_per_token,  # noqa: F401
                                       plausibility, published_mfu)
from distlab.sim.compute.kernels import (FLASH_BACKWARD_FACTOR, PASS_FACTOR, attention_flops,  # noqa: F401
                                         attention_time, batched_gemm_time, gemm_efficiency, gemm_time,
                                         kernel_model, memory_time, op_seconds, peak_tflops,
                                         unfused_attention_time, wave_efficiency)
