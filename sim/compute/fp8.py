"""FP8 training recipes as the frameworks run them: what a float8 linear costs beyond its GEMMs.

    >>> from distlab.sim.compute.fp8 import RECIPES
    >>> RECIPES["te-delayed"].cast_bytes, RECIPES["torchao-tensorwise"].cast_bytes
    (2.0, 5.0)

A float8 linear runs three GEMMs (forward Y = X·W, data gradient dX = dY·Wᵀ, weight gradient dW = Xᵀ·dY) at the
FP8 tensor cores' rate (sim/compute/kernels.py: the measured FP8 MAMF x wave quantization x sustained), and
quantizes three bf16 tensors (X, W, dY), each used by two of the GEMMs in two orientations. A recipe is priced per
operand of each GEMM: ``cast_bytes`` of HBM traffic per bf16 operand element, ``cast_kernels`` launches per GEMM,
``gemm_rate`` its scaled GEMM's rate relative to the tensorwise one, and whether FSDP all-gathers the weights in
float8 (``fp8_all_gather``: 1 byte a parameter instead of 2).

- ``torchao-tensorwise`` (torchao Float8Linear, dynamic tensorwise scaling, torchtitan's ``--model.converters
  float8``): ``hp_tensor_to_float8_dynamic`` (torchao/float8/float8_scaling_utils.py) reads the tensor for its
  amax (2 bytes), then reads it again and writes one byte: 5 bytes an operand element, two kernels, for every
  GEMM operand (the backward re-casts from the bf16 tensors it saved); torchtitan enables
  ``enable_fsdp_float8_all_gather`` with it (torchtitan docs/float8.md).
- ``torchao-rowwise`` (``--float8.recipe_name rowwise``): the same two passes per operand with one scale per row;
  the weights are all-gathered in bf16 (torchao/float8/README.md "rowwise with bfloat16 all-gather"). The forward
  GEMM is PyTorch's rowwise CUTLASS kernel with fast accumulation, "most shapes within 90-100% of tensor-wise
  efficiency" on H100 (pytorch/pytorch issue #147971): 0.95 of its rate; the two backward GEMMs need fp32
  accumulation, for which that kernel is too slow, so torchao runs cuBLAS's and rescales the output by hand
  (pytorch/ao PR #1325): an fp32 output read and a bf16 one written, 6 bytes per output element for 2 of the 3
  GEMMs, 4 on average.
- ``te-delayed`` (Transformer Engine DelayedScaling, Megatron-LM ``--fp8-recipe delayed``): the scale comes from
  the amax history, so one fused cast-transpose kernel reads the bf16 tensor once and writes its FP8 copy in both
  orientations (2 + 1 + 1 bytes) and serves both GEMMs that use it: 2 bytes per operand element, one kernel;
  LayerNormLinear and LayerNormMLP fuse the input's cast into the norm; weights are cast once per step and
  cached across micro-batches (``is_first_microbatch``); Megatron's ``--fp8-param-gather`` all-gathers them in FP8.
- ``te-current`` (TE Float8CurrentScaling, NeMo's "FP8-CS", Megatron ``--fp8-recipe tensorwise``): an amax pass
  (2 bytes) before the cast-transpose (4): 6 bytes per tensor, 3 per operand element, two kernels.
- ``te-blockwise`` (TE Float8BlockScaling, DeepSeek-V3's 1x128 activations and 128x128 weights, Megatron
  ``--fp8-recipe blockwise``, Hopper): block amaxes are local, so one kernel quantizes both orientations (2 + 1 + 1
  bytes, scales 4/128 per orientation): 2.03 per operand element; the block-scaled GEMM at the tensorwise rate
  (DeepGEMM, deepseek-ai/DeepGEMM README: up to 1550 TFLOP/s on H800 with these scales, above the 1402.6 the
  tensorwise MAMF measures on H100: sim/compute/gpus.py).
- ``mxfp8`` (TE MXFP8BlockScaling, Megatron ``--fp8-recipe mxfp8``; Blackwell only: its tensor cores apply the
  E8M0 scale of every 32 elements in the MMA, tcgen05 block-scaled ``kind::mxf8f6f4``, PTX ISA 8.7 sec. 9.7.16):
  one kernel writes rowwise and columnwise copies with a 1-byte scale per 32: (2 + 2 x (1 + 1/32)) / 2 = 2.03 bytes
  per operand element; the GEMM at the FP8 rate (NVIDIA Blackwell datasheets give MXFP8 and FP8 one dense peak).
"""
from __future__ import annotations

from dataclasses import dataclass

from distlab.sim.errors import ConfigError


@dataclass(frozen=True)
class Fp8Recipe:
    name: str
    framework: str
    cast_bytes: float           # HBM bytes per bf16 operand element of each GEMM (module docstring)
    cast_kernels: int           # quantization kernels launched per GEMM
    gemm_rate: float = 1.0      # the scaled GEMM's rate relative to the tensorwise FP8 GEMM's
    output_bytes: float = 0.0   # extra HBM bytes per output element (a rescale pass after the GEMM)
    fp8_all_gather: bool = False  # FSDP all-gathers the linears' weights in float8
    blackwell_only: bool = False


RECIPES = {r.name: r for r in (
    Fp8Recipe("torchao-tensorwise", "torchao Float8Linear", 5.0, 2, fp8_all_gather=True),
    Fp8Recipe("torchao-rowwise", "torchao Float8Linear", 5.0, 2, gemm_rate=0.95, output_bytes=2 / 3 * 6),
    Fp8Recipe("te-delayed", "Transformer Engine", 2.0, 1, fp8_all_gather=True),
    Fp8Recipe("te-current", "Transformer Engine", 3.0, 2, fp8_all_gather=True),
    Fp8Recipe("te-blockwise", "Transformer Engine", 2.0 + 2 * 4 / 128 / 2, 1),
    Fp8Recipe("mxfp8", "Transformer Engine", (2 + 2 * (1 + 1 / 32)) / 2, 1, blackwell_only=True),
)}
DEFAULT_RECIPE = "torchao-tensorwise"


def recipe(name: str | None) -> Fp8Recipe:
    """The recipe named ``name`` (None: torchao's tensorwise Float8Linear, the model's float8 default)."""
    return RECIPES[name or DEFAULT_RECIPE]


def check_recipe(name, gpu, where: str) -> Fp8Recipe:
    """The recipe ``name`` for ``gpu``, or ConfigError naming ``where``: an unknown recipe, FP8 on a GPU without
    FP8 tensor cores, MXFP8 before Blackwell."""
    if name not in RECIPES:
        raise ConfigError(f"unknown fp8_recipe {name!r}; allowed: {', '.join(RECIPES)}", where)
    if not getattr(gpu, "fp8_tflops", None):
        raise ConfigError(f"fp8_recipe {name} needs FP8 tensor cores and {gpu.name} has none; allowed on "
                          f"{gpu.name}: no fp8_recipe (bfloat16 or float16)", where)
    r = RECIPES[name]
    if r.blackwell_only and gpu.arch != "blackwell":
        raise ConfigError(f"fp8_recipe {name} needs Blackwell's block-scaled tensor cores and {gpu.name} is "
                          f"{gpu.arch}; allowed there: "
                          + ", ".join(n for n, x in RECIPES.items() if not x.blackwell_only), where)
    return r
