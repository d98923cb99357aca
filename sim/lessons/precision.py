"""Lesson 15 (mixed precision and FP8): number formats, the error a bf16 matmul makes, the bytes per parameter of
each training recipe, what the simulator says FP8 saves, and the exercises. No torch here: the real measurements
are runtime/lessons/precision.py.

    >>> round(100 * predicted_matmul_error("bfloat16"), 2)        # % rms, inputs and output rounded to bf16
    0.29
    >>> recipe_bytes()[1][1:]                                     # mixed precision AdamW: 2 + 2 + 4 + 8
    (2, 2, 4, 8, 16)

Rounding (IEEE 754 round to nearest): a value is off by at most half a unit in the last place; for data whose
mantissas spread log-uniformly (Benford; Knuth, TAOCP vol. 2, sec. 4.2.4) the rms relative error of one rounding
is ulp/sqrt(12) · sqrt(E[1/m²]) = 2^-p_m / sqrt(12) · sqrt(3 / (8 ln 2)) with p_m stored mantissa bits. A matmul
under autocast rounds both inputs and its output (fp32 accumulation in between): three independent roundings,
sqrt(3) times one, whatever k (random signs: the errors of the k products add like the products themselves).

FP8 recipes (what they scale by, and where they come from):
  tensorwise  one scale per tensor from its current amax (torchao Float8LinearConfig recipe "tensorwise",
              torchao/float8/config.py): an amax pass and a cast, 5 bytes an operand element
  rowwise     one scale per row of each operand (torchao recipe "rowwise"): finer, survives outliers, a slower
              GEMM (scaled_mm with row scales)
  delayed     the scale from an amax history of earlier steps (TransformerEngine DelayedScaling,
              transformer_engine/common/recipe/__init__.py); no amax pass before the cast
  mxfp8       a power-of-two (E8M0) scale per block of 32 elements (OCP Microscaling Formats v1.0, sec. 5);
              Blackwell's tensor cores apply the block scales in the GEMM (TransformerEngine MXFP8BlockScaling)
``fp8_recipes`` reads what the simulator prices for each: ``RECIPE_NAMES`` maps the lesson's names to
sim/compute/fp8.py's recipes (torchao's tensorwise and rowwise Float8Linear, Transformer Engine's delayed and
MXFP8 scaling), each step simulated with the scenario key ``fp8_recipe``; a recipe the GPU cannot run (MXFP8 on an
H100) says so, with the simulator's reason.
"""
from __future__ import annotations

import math
from functools import lru_cache

from distlab.sim.lessons.checker import Exercise
from distlab.sim.lessons.helpers import Table

# (exponent bits, stored mantissa bits, largest finite value, smallest subnormal)
FORMATS = {"float32": (8, 23, 3.4028234663852886e38, 2.0**-149), "bfloat16": (8, 7, 3.3895313892515355e38, 2.0**-133),
           "float16": (5, 10, 65504.0, 2.0**-24), "float8_e4m3fn": (4, 3, 448.0, 2.0**-9),
           "float8_e5m2": (5, 2, 57344.0, 2.0**-16)}
RECIPES = ("tensorwise", "rowwise", "delayed", "mxfp8")
RECIPE_NAMES = {"tensorwise": "torchao-tensorwise", "rowwise": "torchao-rowwise", "delayed": "te-delayed",
                "mxfp8": "mxfp8"}                    # sim/compute/fp8.py RECIPES, each priced by the simulator
CLUSTERS = ("dgx-h100", "dgx-b200")
STEP_MODEL = {"preset": "llama3-8b", "layers": 4, "seq_len": 4096}       # 4 blocks: simulates in a second
TOLERANCE = 0.25                                     # the measured matmul error against the prediction


def rounding_error(fmt: str) -> float:
    """The rms relative error of rounding one value to ``fmt`` (module docstring)."""
    mantissa = FORMATS[fmt][1]
    return 2.0**-mantissa / math.sqrt(12) * math.sqrt(3 / (8 * math.log(2)))


def predicted_matmul_error(fmt: str = "bfloat16") -> float:
    """The rms relative error of a matmul whose inputs and output are rounded to ``fmt``: sqrt(3) roundings."""
    return math.sqrt(3) * rounding_error(fmt)


def format_rows() -> list[list]:
    return [[f, e, m, f"{mx:.4g}", f"{tiny:.3g}", f"{100 * rounding_error(f):.2g}%"]
            for f, (e, m, mx, tiny) in FORMATS.items()]


def format_table() -> Table:
    return Table(["format", "exponent bits", "mantissa bits", "largest", "smallest subnormal", "rms rounding"],
                 format_rows(), "IEEE 754 and OCP FP8 formats (torch.finfo gives the same limits)")


def recipe_bytes() -> list[tuple]:
    """(recipe, param, grad, master, optimizer, total) bytes per parameter with AdamW (m and v in fp32):
    fp32 and mixed precision from the library (sim/parallel/fsdp/memory.py ``precision``: ZeRO, Rajbhandari et
    al. 2020, arXiv 1910.02054, sec. 3.1: 2 + 2 + 12), then fp32 gradient accumulation (Megatron-LM's
    ``main_grad`` buffer, megatron/core/distributed/param_and_grad_buffer.py) replacing or beside the bf16 one."""
    from distlab.sim.parallel.fsdp.memory import precision
    p32, g32, k32 = precision("float32")
    p16, g16, k16 = precision("bfloat16")
    master, adam = 4, k16 - 4
    rows = [("fp32 weights, fp32 AdamW", p32, g32, 0, k32),
            ("bf16 weights and grads, fp32 master (ZeRO's count)", p16, g16, master, adam),
            ("bf16 weights, fp32 grad accumulation (main_grad)", p16, 4, master, adam),
            ("bf16 and fp32 grads both kept", p16, g16 + 4, master, adam)]
    return [(r, p, g, m, k, p + g + m + k) for r, p, g, m, k in rows]


def recipe_table(params: float = 8.03e9) -> Table:
    rows = [[r, p, g, m, k, t, f"{t * params / 2**30:.0f}"] for r, p, g, m, k, t in recipe_bytes()]
    return Table(["recipe", "param", "grad", "fp32 master", "AdamW m, v", "bytes/param", "GiB, 8B params"], rows,
                 "model state per parameter (FP8 training keeps these: it casts GEMM operands, not the state)")


@lru_cache(maxsize=16)
def fp8_step(cluster: str, recipe: str | None = None) -> dict:
    """The simulated FSDP2 step of ``STEP_MODEL`` on one ``cluster`` node, bf16 (``recipe`` None) or with GEMMs
    (and all-gathers) in float8 under the lesson's ``recipe`` (``RECIPE_NAMES``), fp32 reduction: its summary
    (sim/lessons/training.py simulate). A recipe the GPU cannot run raises ConfigError with the reason."""
    from distlab.sim import scenario as sc
    from distlab.sim.lessons.training import scenario, simulate
    s = scenario(dict(STEP_MODEL), "fsdp", cluster=cluster, nodes=1, micro_batch=2, zero=3,
                 param_dtype="float8_e4m3fn" if recipe else "bfloat16", reduce_dtype="float32")
    if recipe:                                      # the scenario key fp8_recipe (sim/scenario/parse.py)
        s = sc.from_dict({**s.source, "fp8_recipe": RECIPE_NAMES[recipe]}, "scenario")
    return simulate(s)["summary"]


def fp8_saving(cluster: str = "dgx-h100", recipe: str = "tensorwise") -> float | None:
    """bf16 compute time over ``recipe``'s, simulated; None for a recipe the cluster's GPU cannot run."""
    from distlab.sim.errors import ConfigError
    try:
        return fp8_step(cluster)["compute_s"] / fp8_step(cluster, recipe)["compute_s"]
    except ConfigError:
        return None


def fp8_recipes(clusters=CLUSTERS) -> Table:
    """Per recipe and GPU: the simulated compute and step time against bf16, or why the GPU cannot run it."""
    from distlab.sim.errors import ConfigError
    rows = []
    for recipe in RECIPES:
        for cluster in clusters:
            try:
                bf, f8 = fp8_step(cluster), fp8_step(cluster, recipe)
            except ConfigError as e:               # MXFP8 before Blackwell: the simulator's one line
                reason = str(e).removeprefix(f"{e.where}: ").split(" and ")[0]
                rows.append([recipe, cluster, "-", "-", f"not on this GPU: {reason}"])
                continue
            rows.append([recipe, cluster, f"{bf['compute_s'] * 1e3:.1f} -> {f8['compute_s'] * 1e3:.1f}",
                         f"{bf['step_s'] * 1e3:.1f} -> {f8['step_s'] * 1e3:.1f}",
                         f"compute {bf['compute_s'] / f8['compute_s']:.2f}x faster"])
    return Table(["recipe", "cluster", "compute ms (bf16 -> fp8)", "step ms", "what the simulator says"], rows,
                 "4 Llama 3 8B blocks, 4096 tokens x 2, FSDP2 on one node (sim/compute/kernels.py)")


def error_verdict(measured: float, predicted: float | None = None, tolerance: float = TOLERANCE) -> Table:
    """The measured matmul error against the prediction, judged as lessons 05-07's runs are (within, or the
    words tests/test_lessons_notebooks.py fails on). Rounding is arithmetic, not timing: a busy machine does not
    change it, so no run is excused."""
    from distlab.sim.lessons.verdicts import OUTSIDE
    predicted = predicted_matmul_error() if predicted is None else predicted
    err = predicted / measured - 1
    word = "within the lesson's tolerance" if abs(err) <= tolerance else OUTSIDE
    return Table(["", "rms relative error"], [["predicted (3 roundings)", f"{100 * predicted:.3f}%"],
                                              ["measured", f"{100 * measured:.3f}%"]],
                 f"bf16 autocast matmul: error {err:+.0%}: {word} ({tolerance:.0%})")


def underflow_table(result: dict) -> Table:
    rows = [[f"2^{int(math.log2(r['scale']))}", f"{100 * r['zero']:.1f}%", "yes" if r["finite"] else "no: inf",
             "-" if not r["finite"] else f"{100 * r['error']:.2f}%"] for r in result["rows"]]
    return Table(["loss scale", "grads flushed to 0", "finite", "error vs fp32"], rows,
                 f"fp16 gradients of a small MLP (median |grad| {result['median_grad']:.2g} in fp32)")


EXERCISES = (
    Exercise("15-underflow", "Predict before the run: gradients whose median size is a few 1e-9, computed in "
             "fp16 without loss scaling: what share of them flush to zero, in %? Within 10 points.", "%",
             lambda result: 100 * result["rows"][0]["zero"], needs=("result",), tolerance=0.0, abs_tolerance=10.0,
             prediction=True, hint="fp16's smallest subnormal is 2^-24 ≈ 6e-8 (the format table): anything "
                                   "below half of it rounds to zero",
             why="almost all: fp16's range ends near 6e-8, and gradients late in training live below it. "
                 "bf16 has fp32's exponent (smallest subnormal 2^-133), which is why bf16 needs no loss scaling."),
    Exercise("15-bf16-error", "Predict before the run: a (128 x 1024) @ (1024 x 512) matmul of random normal values "
             "under bf16 autocast (inputs and output rounded to bf16, fp32 accumulation): its rms relative error "
             "against fp32, in %? Within 25%.", "%", lambda result: 100 * result["matmul_error"],
             needs=("result",), tolerance=0.25, prediction=True,
             hint="one rounding to 7 stored mantissa bits: rms ulp/sqrt(12) · sqrt(3/(8 ln 2)), ulp = 2^-7 of the "
                  "leading digit; the errors of independent roundings add in quadrature, and k does not matter",
             why="sqrt(3) roundings of 2^-7/sqrt(12)·0.74 each: about 0.29%, whatever k. fp16's 10 mantissa bits "
                 "would give 8x less, FP8 e4m3's 3 bits 16x more: why FP8 needs scales and fp32 master weights."),
    Exercise("15-state-bytes", "Llama 3 8B (8.03e9 parameters) with bf16 weights, fp32 gradient accumulation "
             "(Megatron's main_grad, the bf16 gradients not kept), fp32 master weights and AdamW: GiB of model "
             "state on one GPU without sharding?", "GiB", lambda: recipe_bytes()[2][5] * 8.03e9 / 2**30,
             traps=lambda: {16 * 8.03e9 / 2**30: "that is 16 bytes: bf16 grads; here the grads are fp32 (4 "
                                                  "bytes)"},
             hint="add the bytes of each: bf16 weight, fp32 gradient, fp32 master copy, AdamW's two fp32 moments",
             why="2 + 4 + 4 + 8 = 18 bytes per parameter; FP8 training keeps the same state: it only casts what "
                 "the GEMMs read."),
    Exercise("15-fp8-h100", "Predict from the datasheets, then simulate: FP8 tensorwise (torchao) against bf16, "
             "how many times faster is the simulated compute of an FSDP2 step of 4 Llama 3 8B blocks on a DGX "
             "H100? Within 15%.", "x", lambda: fp8_saving("dgx-h100"), tolerance=0.15,
             hint="the H100's dense FP8 peak is twice its bf16 peak (1979 against 989 TFLOP/s) for the GEMMs; "
                  "the casts (5 bytes per operand element over HBM), attention (still bf16) and the elementwise "
                  "kernels do not speed up",
             why="well under 2x: only the linears' GEMMs run at the FP8 rate, and each pays its casts. The same "
                 "on B200 (the table below): FP8 buys compute, not memory."),
)


def plot_underflow(result: dict):
    """Share of gradients flushed to zero and the error against fp32, per loss scale (log scales)."""
    from distlab.sim.lessons.helpers import Figure
    f = Figure(6.0, 3.4)
    rows = result["rows"]
    xs = [math.log2(r["scale"]) for r in rows]
    f.ax.plot(xs, [100 * r["zero"] for r in rows], marker="o", label="flushed to zero (%)")
    f.ax.plot([x for x, r in zip(xs, rows) if r["finite"]], [100 * r["error"] for r in rows if r["finite"]],
              marker="s", label="error against fp32 (%)")
    for x, r in zip(xs, rows):
        if not r["finite"]:
            f.ax.axvline(x, color="#b3261e", ls="--", lw=1, label="overflow (inf)")
    f.ax.set_xlabel("log2 of the loss scale")
    f.ax.set_ylabel("%")
    f.ax.legend(fontsize=7)
    f.ax.set_title("fp16 gradients against the loss scale")
    return f
