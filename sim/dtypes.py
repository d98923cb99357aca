"""Element types a plan, a collective or a model may use, and their sizes in bytes (torch's dtypes)."""

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
               "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
               "float8_e4m3fn": 1, "float8_e5m2": 1}

# what a model's parameters, FSDP2's MixedPrecisionPolicy param_dtype and a training step compute in: torch's
# floating types for training (float64 and integers are not: no tensor-core GEMM, no optimizer trains them);
# float8 as torchao's Float8Linear / FSDP2 float8 all-gather use it (sim/compute/kernels.py)
TRAINING_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
REDUCE_DTYPES = ("float32", "bfloat16", "float16")      # MixedPrecisionPolicy reduce_dtype: gradients' reductions


def compute_dtype(model) -> str:
    """The dtype a model's matmuls run in without mixed precision: its parameters' (torch computes a float32
    module in float32, and ``torch.backends.cuda.matmul.allow_tf32`` is False by default, so on the FP32 peak).
    Mixed precision (FSDP2's MixedPrecisionPolicy param_dtype) replaces it where a builder knows it."""
    dtype = (model.config or {}).get("dtype")
    return dtype or (model.params[0].dtype if model.params else "float32")
