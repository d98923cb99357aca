"""Model FLOPs per token and the throughput of a step: MFU, HFU, TFLOP/s and tokens/s per GPU.

    >>> from distlab.sim.models import preset
    >>> from distlab.sim.compute.flops import model_flops_per_token
    >>> round(model_flops_per_token(preset("llama3-8b")) / 1e9, 1)     # GFLOP per token: 6N + 12·l·h·s
    57.9

Convention (PaLM, Chowdhery et al. 2022, arXiv 2204.02311, app. B): model FLOPs per token = 6·N + 12·l·h·s, N the
parameters of the matrices a token goes through (attention and MLP projections, the LM head; not the embedding
lookup), l layers, h hidden size, s sequence length: forward 2·N + 4·l·h·s (Q·Kᵀ and P·V over the whole s x s
score matrix, as PaLM and Megatron count it, though a causal kernel skips half), backward twice the forward. It is
3 x the forward FLOPs the model description holds (sim/models.py), so any model kind counts the same way.
Hardware FLOPs add what recomputation runs again: full recompute the blocks' forward, selective recompute the
attention scores and values (4·l·h·s per token; Korthikanti et al. 2022, arXiv 2205.05198, sec. 5). Megatron's
eq. 3 (Narayanan et al. 2021, arXiv 2104.04473) is the hardware count of full recompute for a GPT-2 shaped model:
96·B·s·l·h²·(1 + s/6h + V/16lh) per step.

MFU = model FLOPs per step / (GPUs x bf16 dense peak x step time), whatever dtype the step computes in (the
published figures' convention: a float32 step shows how far below the tensor cores it runs); HFU the same with
hardware FLOPs; beside them the MFU against the peak of the dtype the matmuls run in (float32: the CUDA cores'
FP32 peak, torch's default ``allow_tf32 = False``); TFLOP/s per GPU = model FLOPs / (GPUs x step); tokens/s per
GPU = sequences x s / step / GPUs.
"""
from __future__ import annotations

# Best published MFU per GPU generation (bf16 dense peak, a whole training step), for the plausibility check.
BEST_PUBLISHED_MFU = {
    # FlashAttention-2 (Dao 2023, arXiv 2307.08691, abstract and sec. 4.3): GPT-style training "up to 225
    # TFLOPs/s per A100 GPU (72% model FLOPs utilization)".
    "ampere": (0.72, "FlashAttention-2 end-to-end GPT training, 225 TFLOP/s per A100 (arXiv 2307.08691)"),
    # Megatron-LM README (core r0.8.0, images/model_table.png): 16B on 192 H100, 489.1 TFLOP/s per GPU, 49% MFU.
    "hopper": (0.49, "Megatron-Core r0.8.0 weak scaling, 16B on 192 H100: 49% MFU (Megatron-LM README)"),
}
PLAUSIBLE_MARGIN = 1.15      # the check flags a simulated MFU above the best published one by more than 15%
# What the compute model leaves out (docs/compute.md), for the lessons and reports to name beside a figure.
LEFT_OUT = (
    "elementwise kernels one by one (they are the fitted elementwise_passes and sustained fraction)",
    "clocks and power under a long job's load; thermal differences between GPUs",
    "cuBLAS's choice of tile shapes, split-K and stream-K (one 128 x 256 tile is modelled)",
    "attention at head_dim other than 128, sliding windows, document masks",
    "CUDA graphs, host stalls, data loading, checkpoints, stragglers and failures",
)


def tokens_of(model) -> int:
    """Tokens in one micro-batch of ``model``: micro_batch x seq_len (an MLP: its batch)."""
    c = model.config or {}
    if "seq_len" in c:
        return c.get("micro_batch", 1) * c["seq_len"]
    return c.get("micro_batch", c.get("batch", 1))


def model_flops_per_token(model) -> float:
    """6N + 12·l·h·s for a transformer: 3 x the model's forward FLOPs per token (module docstring)."""
    return 3.0 * model.fwd_flops / tokens_of(model)


def recompute_flops_per_token(model, recompute: str) -> float:
    """FLOPs per token that recomputation runs again: full = the blocks' forward, selective = attention's
    4·l·h·s, none = 0."""
    c, tokens = model.config or {}, tokens_of(model)
    blocks = [layer for layer in model.layers if layer.name.startswith("h.")]
    if recompute == "full":
        return sum(layer.fwd_flops for layer in blocks) / tokens
    if recompute == "selective" and "seq_len" in c:
        return 4.0 * c["layers"] * c["hidden"] * c["seq_len"]
    return 0.0


def mfu_summary(model, sequences: int, step_s: float, world_size: int, gpu, recompute: str = "none",
                dtype: str = "bfloat16") -> dict:
    """The throughput fields of a step summary: FLOPs per token (model and hardware), MFU, HFU, TFLOP/s and
    tokens/s per GPU, for ``sequences`` sequences of the model per step on ``world_size`` GPUs. MFU and HFU are
    taken against the bf16 dense peak (``mfu_peak_tflops``: the convention of the published figures, whatever
    the step computes in); ``dtype`` is what its matmuls run in, and ``mfu_of_compute_peak`` the MFU against that
    dtype's own dense peak (``compute_peak_tflops``: float32's is the CUDA cores' FP32 peak, TF32 being off)."""
    from distlab.sim.compute.kernels import gemm_dtype, peak_tflops
    seq = (model.config or {}).get("seq_len", 1)
    tokens = sequences * seq
    per_token = model_flops_per_token(model)
    hardware = per_token + recompute_flops_per_token(model, recompute)
    peak = gpu.tflops * 1e12 * world_size * step_s if step_s > 0 else float("inf")
    compute_peak = peak_tflops(gpu, gemm_dtype(dtype))
    return {"model_flops_per_token": per_token, "hardware_flops_per_token": hardware,
            "flops_convention": "6N + 12·l·h·s (PaLM app. B; recompute in hardware FLOPs only)",
            "global_batch": sequences, "seq_len": seq, "tokens_per_step": tokens,
            "mfu": per_token * tokens / peak, "hfu": hardware * tokens / peak,
            "mfu_peak_tflops": gpu.tflops, "mfu_peak": "bf16 dense", "compute_dtype": dtype,
            "compute_peak_tflops": compute_peak,
            "mfu_of_compute_peak": per_token * tokens / peak * gpu.tflops / compute_peak,
            "tflops_per_gpu": per_token * tokens / (world_size * step_s) / 1e12 if step_s > 0 else 0.0,
            "tokens_per_s_per_gpu": tokens / step_s / world_size if step_s > 0 else 0.0}


def published_mfu(gpu) -> tuple[float, str] | None:
    """(best published whole-step MFU, its source) for ``gpu``'s generation, or None (no kernel model or nothing
    published for the generation yet)."""
    from distlab.sim.compute.kernels import kernel_model
    model = kernel_model(gpu)
    return BEST_PUBLISHED_MFU.get(model.generation) if model else None


def plausibility(mfu: float, gpu) -> str | None:
    """A line saying why when ``mfu`` is above the best published MFU of ``gpu``'s generation by more than 15%,
    or that no published figure bounds it; None when it is within the bound."""
    from distlab.sim.compute.kernels import kernel_model
    model = kernel_model(gpu)
    if model is None:
        return None
    best = BEST_PUBLISHED_MFU.get(model.generation)
    if best is None:
        return (f"no published MFU for {model.generation} GPUs to hold this figure to (sim/compute/flops.py "
                "BEST_PUBLISHED_MFU)")
    if mfu <= best[0] * PLAUSIBLE_MARGIN:
        return None
    return (f"MFU {100 * mfu:.0f}% is above the best published {100 * best[0]:.0f}% for {model.generation} "
            f"({best[1]}) by more than 15%: published runs also lose time to what the simulation leaves out "
            "(stragglers, data loading, checkpoints, docs/compute.md)")
