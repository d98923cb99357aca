"""Element types a plan, a collective or a model may use, and their sizes in bytes (torch's dtypes)."""

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
               "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
               "float8_e4m3fn": 1, "float8_e5m2": 1}
