"""Lesson 13 (from FLOPs to a real step): FLOP counts, the GEMM efficiency curve, attention kernels, interference
and a reproduced published row; tables, figures and the exercises, computed by the simulator (sim/compute/,
sim/reproduce/, sim/parallel/tp/plan.py), never typed in. No torch here: the real GEMM sweep is runtime/lessons/compute.py.

Model FLOPs of one step (Narayanan et al. 2021, arXiv 2104.04473, sec. 5.1, eq. 3): a transformer layer's
forward is 24·B·s·h²·(1 + s/(6h)) FLOPs (its GEMMs 24·B·s·h², the attention scores and their use on the values
4·B·s²·h), the logits 2·B·s·h·V; backward is twice forward. Without recomputation a step is
72·B·s·l·h²·(1 + s/(6h)) + 6·B·s·h·V; full recomputation runs each layer's forward again, giving eq. 3:
96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)). MFU counts the first (what the model needs, PaLM: Chowdhery et al. 2022,
arXiv 2204.02311, app. B); hardware FLOPs utilisation (HFU) counts what the GPU ran, recomputation included
(Korthikanti et al. 2022, arXiv 2205.05198, sec. 6.3), as eq. 3 does.
"""
from __future__ import annotations

from functools import lru_cache

from distlab.sim.compute import attention_time, gemm_efficiency, gemm_time, unfused_attention_time
from distlab.sim.lessons.checker import Exercise
from distlab.sim.lessons.helpers import Figure, Table

ROW = "megatron-1.7b"          # the smallest row of Megatron-LM's Table 1: 32 A100s, the lesson reproduces it
TP_ROW = "megatron-7.5b"       # h = 4096, the row whose layer the lesson slices with tensor parallelism
A100_PEAK_TFLOPS = 312.0       # dense fp16/bf16 tensor-core peak (NVIDIA A100 datasheet)
LEE_INTERFERENCE = 1.189       # Lee et al. 2025 (arXiv 2507.03114): compute 18.9% slower beside communication


@lru_cache(maxsize=1)
def _shipped_runs():
    """The shipped runs file, loaded once (it builds every run's model: a second or more per load)."""
    from distlab.sim.reproduce.runs import load_runs
    return load_runs()


def row(name: str = ROW):
    """The run ``name`` of the shipped runs file (sim/reproduce/runs.yaml) and its fitted generations."""
    runs, generations = _shipped_runs()
    return next(r for r in runs if r.name == name), generations


@lru_cache(maxsize=8)
def fitted_gpu(name: str = ROW):
    """The run's GPU with its generation's fitted GEMM efficiency curve (what `distlab reproduce` simulates)."""
    from distlab.sim.reproduce.predict import cluster_for
    run, generations = row(name)
    return cluster_for(run, generations).gpu


def step_flops(run, recompute: bool = True) -> float:
    """FLOPs of one step counted as Megatron does (module docstring): eq. 3 with ``recompute``, else the model's."""
    B, s, l, h, V = run.global_batch, run.model["seq_len"], run.model["layers"], run.model["hidden"], run.model["vocab"]
    layer_passes = 4 if recompute else 3                # forward, backward (2x), and the recomputed forward
    return layer_passes * 24.0 * B * s * l * h * h * (1 + s / (6 * h)) + 6.0 * B * s * h * V


def flops_table(name: str = ROW) -> Table:
    """The terms of one step's FLOPs (PFLOP), Megatron's count against 6·N·tokens."""
    from distlab.sim.reproduce.predict import build_model
    run, _ = row(name)
    B, s, l, h, V = run.global_batch, run.model["seq_len"], run.model["layers"], run.model["hidden"], run.model["vocab"]
    n, recomputed = build_model(run).num_params, 24.0 * B * s * l * h * h * (1 + s / (6 * h))
    terms = [("layer GEMMs, forward + backward", "72·B·s·l·h²", 72.0 * B * s * l * h * h),
             ("attention scores and values", "12·B·s²·l·h", 12.0 * B * s * s * l * h),
             ("logits (the head)", "6·B·s·h·V", 6.0 * B * s * h * V),
             ("model FLOPs (MFU counts these)", "sum of the three", step_flops(run, recompute=False)),
             ("recomputed forward of every layer", "24·B·s·l·h²·(1 + s/6h)", recomputed),
             ("eq. 3 (hardware FLOPs: what ran)", "96·B·s·l·h²·(1 + s/6h + V/16lh)", step_flops(run)),
             ("6·N·tokens, N parameters", f"6 x {n / 1e9:.2f}e9 x B·s", 6.0 * n * B * s)]
    return Table(["term", "formula", "PFLOP per step"], [[t, f, f"{v / 1e15:,.1f}"] for t, f, v in terms],
                 f"{run.name}: B {B}, s {s}, l {l}, h {h}, V {V}")


def block_gemms(name: str, tp: int) -> list[tuple[str, tuple]]:
    """(name, (M, N, K)) of the forward GEMMs of one block per rank at micro-batch 1 (M = one sequence's tokens),
    as sim/parallel/tp/plan.py's builders emit them."""
    from dataclasses import replace as with_
    from distlab.sim.reproduce.predict import build_model
    from distlab.sim.parallel.tp.plan import gemm_shapes
    run, _ = row(name)
    k = gemm_shapes(build_model(with_(run, micro_batch=1)), tp)
    names = ["qkv", "attn proj"] if len(k["attn_gemms"]) == 2 else ["q", "k", "v", "attn proj"]
    names += ["mlp fc1", "mlp fc2"] if len(k["mlp_gemms"]) == 2 else ["mlp gate", "mlp up", "mlp down"]
    return list(zip(names, k["attn_gemms"] + k["mlp_gemms"]))


def tp_slice_cost(name: str = TP_ROW, gemm: str = "mlp fc1", tp: int = 8) -> float:
    """How many times longer a rank's 1/tp slice of ``gemm`` takes than 1/tp of the whole GEMM (fitted A100)."""
    gpu, whole, part = fitted_gpu(name), dict(block_gemms(name, 1))[gemm], dict(block_gemms(name, tp))[gemm]
    return tp * gemm_time(*part, 2, gpu) / gemm_time(*whole, 2, gpu)


def gemm_table(name: str = TP_ROW, tps: tuple[int, ...] = (1, 2, 4, 8)) -> Table:
    """Each forward GEMM of one block per rank at each tp: shape, share of peak in the compute model, time."""
    gpu, rows = fitted_gpu(name), []
    for tp in tps:
        for g, (M, N, K) in block_gemms(name, tp):
            t = gemm_time(M, N, K, 2, gpu)
            rows.append([tp, g, f"{M} x {N} x {K}", f"{2 * M * N * K / 1e9:.1f}",
                         f"{100 * gemm_efficiency(2.0 * M * N * K, gpu, M, N):.1f}%", f"{t * 1e6:.1f}"])
    return Table(["tp", "GEMM", "M x N x K", "GFLOP", "of peak", "time us"], rows,
                 f"{name}: one block's forward GEMMs per rank (A100 compute model, fp16)")


def fit_saturating(rows: list[dict]) -> tuple[float, float]:
    """(peak FLOP/s, half_flops) of rate(F) = peak · F / (F + half_flops) fitted to measured rows: half_flops on a
    grid of 1/8 decade, peak the median of the peaks each row implies, the pair with the least sum of |log| errors
    (medians and |log|: a few blocks slowed by other processes do not drag the fit down)."""
    import math
    import statistics
    best = None
    for i in range(2 * 8, 12 * 8 + 1):
        half = 10 ** (i / 8)
        implied = [r["flops_per_s"] * (r["flops"] + half) / r["flops"] for r in rows]
        peak = statistics.median(implied)
        err = sum(abs(math.log(p / peak)) for p in implied)
        if best is None or err < best[0] - 1e-12:
            best = (err, peak, half)
    return best[1], best[2]


def achieved(M: int, N: int, K: int, gpu) -> float:
    """Fraction of the datasheet peak one fp16 GEMM reaches in the compute model, launch and HBM included."""
    from distlab.sim.compute import peak_tflops
    return 2.0 * M * N * K / (gemm_time(M, N, K, 2, gpu) * peak_tflops(gpu, "float16") * 1e12)


def plot_gemm_efficiency(measured: list[dict], name: str = TP_ROW) -> Figure:
    """Left: square GEMMs in the A100's compute model (sim/compute/: measured best GEMM, tile and wave
    quantization, launch, Ampere's fitted sustained fraction) with one block's GEMMs at tp 1 and 8. Right: GEMMs
    measured here (fraction of the best measured rate) and a two-constant curve fitted to them."""
    import numpy as np
    gpu, f = fitted_gpu(name), Figure(11, 4.2, ncols=2)
    sizes = np.unique(np.logspace(np.log10(64), np.log10(16384), 120).astype(int))
    f.axes[0].plot([2.0 * n ** 3 for n in sizes], [achieved(n, n, n, gpu) for n in sizes], color="#3182bd",
                   label="A100 model, square GEMMs (n x n x n)")
    for tp, colour in ((1, "#31a354"), (8, "#e6550d")):
        shapes = [g for _, g in block_gemms(name, tp)]
        f.axes[0].scatter([2.0 * M * N * K for M, N, K in shapes], [achieved(M, N, K, gpu) for M, N, K in shapes],
                          color=colour, zorder=3, label=f"{name} block GEMMs, tp {tp}")
    peak, half = fit_saturating(measured)
    best = max(r["flops_per_s"] for r in measured)
    f.axes[1].scatter([r["flops"] for r in measured], [r["flops_per_s"] / best for r in measured],
                      color="#756bb1", zorder=3, label=f"measured here (1 = best, {best / 1e9:.3g} GFLOP/s)")
    here = np.logspace(3, 11, 90)
    f.axes[1].plot(here, [peak / best * x / (x + half) for x in here], color="#756bb1", alpha=0.6,
                   label=f"fit: peak {peak / 1e9:.3g} GFLOP/s, half_flops {half:.2g}")
    for ax, title in ((f.axes[0], "sim/compute/: A100 GEMMs (fp16)"),
                      (f.axes[1], f"this machine ({measured[0]['device']}, {measured[0]['dtype']})")):
        ax.set_xscale("log")
        ax.set_xlabel("FLOPs of one GEMM (2·M·N·K)")
        ax.set_ylabel("fraction of peak")
        ax.set_ylim(0, 1.05)
        ax.set_title(title, loc="left", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return f


def measured_table(measured: list[dict]) -> Table:
    """The sweep's rows: shape, FLOPs, time and rate. Measured values carry their unit (a time as "21.3 us", a
    rate as "2.13e+10"), so a measurement can never read as a later exercise's bare answer by chance."""
    return Table(["M x N x K", "MFLOP", "time", "FLOP/s"],
                 [[f"{r['M']} x {r['N']} x {r['K']}", f"{r['flops'] / 1e6:.2f}", f"{r['time_s'] * 1e6:.1f} us",
                   f"{r['flops_per_s']:.3g}"] for r in measured], "torch.mm on this machine")


def attention_ratio(name: str = ROW, attention_pass: str = "forward") -> float:
    """Unfused attention over FlashAttention, one layer and micro-batch of the row (fitted A100, fp16)."""
    return _attention_times(name, attention_pass)[0] / _attention_times(name, attention_pass)[1]


def _attention_times(name: str, attention_pass: str) -> tuple[float, float]:
    run, gpu = row(name)[0], fitted_gpu(name)
    m = run.model
    shape = (1, m["heads"], m["seq_len"], m["hidden"] // m["heads"])          # micro-batch 1
    return (unfused_attention_time(*shape, gpu, 2, attention_pass),
            attention_time(*shape, gpu, causal=True, attention_pass=attention_pass))


def attention_table(name: str = ROW) -> Table:
    """Per pass, one layer's attention: unfused (batched GEMMs + softmax/dropout passes) against FlashAttention."""
    rows = []
    for p in ("forward", "backward", "recompute+backward"):
        unfused, flash = _attention_times(name, p)
        rows.append([p, f"{unfused * 1e3:.3f}", f"{flash * 1e3:.3f}", f"{unfused / flash:.2f}x"])
    return Table(["pass", "unfused ms", "FlashAttention ms", "ratio"], rows,
                 f"{name}: one layer's attention, micro-batch 1 (A100 compute model)")


def overlapped_compute_s(compute_s: float, comm_s: float, factor: float) -> float:
    """When compute of ``compute_s`` (alone) ends if a collective of ``comm_s`` starts with it and slows it by
    ``factor`` while in flight (Cluster.interference, issue 15 item 3): comm_s + (compute_s - comm_s / factor) if
    the compute outlasts the collective, else compute_s · factor."""
    return comm_s + compute_s - comm_s / factor if compute_s * factor > comm_s else compute_s * factor


def interference_table(compute_s: float = 0.020, comm_s: float = 0.008,
                       factors: tuple[float, ...] = (1.0, 1.1, LEE_INTERFERENCE, 1.4)) -> Table:
    """When the compute ends at a few slowdown factors, and what the overlap costs it."""
    rows = [[f"{k:g}", f"{overlapped_compute_s(compute_s, comm_s, k) * 1e3:.2f}",
             f"{(overlapped_compute_s(compute_s, comm_s, k) - compute_s) * 1e3:.2f}"] for k in factors]
    return Table(["interference", "compute ends, ms", "added by the overlap, ms"], rows,
                 f"compute {compute_s * 1e3:g} ms (alone) beside a collective of {comm_s * 1e3:g} ms")


def reproduce(names: tuple[str, ...] = (ROW,)) -> list[dict]:
    """`distlab reproduce --only NAME` for each of ``names``: predicted against reported (sim/reproduce/)."""
    from distlab.sim.reproduce.predict import predict
    from distlab.sim.reproduce.runs import load_runs
    runs, generations = load_runs()
    return [predict(r, generations) for r in runs if r.name in names]


def reproduce_table(results: list[dict]) -> Table:
    return Table(["run", "GPUs", "reported TFLOP/s", "predicted", "error", "step s", "fitted on"],
                 [[x["name"], x["world_size"], f"{x['reported']:g}", f"{x['predicted']:.1f}",
                   f"{100 * x['error']:+.1f}%", f"{x['step_time_s']:.3f}", "yes" if x["fitted"] else "no"]
                  for x in results], "distlab reproduce: Megatron-LM Table 1 (arXiv 2104.04473)")


def constants_table() -> Table:
    """The compute model's fitted constants per GPU generation (sim/compute/fitted.py) and the rows they were
    fitted on: everything else in the model is measured (sim/compute/gpus.py)."""
    _, generations = row()
    return Table(["generation", "sustained (fitted)", "elementwise passes (fitted)", "fitted on"],
                 [[a, f"{g.sustained:g}", f"{g.elementwise_passes:g}", ", ".join(g.fitted_on) or "(none)"]
                  for a, g in generations.items()],
                 "the compute model's fitted constants (sim/compute/fitted.py)")


def plot_reproduced(results: list[dict]) -> Figure:
    """Reported against predicted TFLOP/s per GPU, one pair of bars per run (fitted rows hatched)."""
    f = Figure(max(4.5, 1.6 * len(results) + 2), 3.8)
    xs = range(len(results))
    f.ax.bar([x - 0.2 for x in xs], [r["reported"] for r in results], 0.4, color="#bdbdbd", label="reported")
    f.ax.bar([x + 0.2 for x in xs], [r["predicted"] for r in results], 0.4, color="#3182bd", label="predicted")
    for x, r in zip(xs, results):
        if r["fitted"]:
            f.ax.bar(x + 0.2, r["predicted"], 0.4, fill=False, hatch="//", edgecolor="white")
    f.ax.set_xticks(list(xs))
    f.ax.set_xticklabels([f"{r['name']}\n{r['world_size']} GPUs" + ("\n(fitted)" if r["fitted"] else "")
                          for r in results], fontsize=8)
    f.ax.set_ylabel("TFLOP/s per GPU (eq. 3)")
    f.ax.set_title("distlab reproduce: predicted against reported", loc="left", fontsize=10)
    f.ax.legend(fontsize=8, loc="lower right")
    f.ax.grid(alpha=0.3, axis="y")
    return f


EXERCISES = (
    Exercise("13-step-time", f"Megatron-LM's smallest row ({ROW}): 137 TFLOP/s per GPU on 32 A100s, counted with eq. 3 "
             "(B 512, s 2048, l 24, h 2304, V 51200). How long is one step?", "s",
             lambda: step_flops(row()[0]) / (137e12 * 32),
             hint="96·B·s·l·h²·(1 + s/6h + V/16lh) / (137e12 x 32)",
             why="a step's FLOPs over the rate the paper reports: the figure the simulator has to predict."),
    Exercise("13-mfu", "The same step counted as MFU: the model's FLOPs only (no recomputed forward: "
             "72·B·s·l·h²·(1 + s/6h) + 6·B·s·h·V) per second, over 32 x 312 TFLOP/s peak. In %?", "%",
             lambda: 100 * step_flops(row()[0], recompute=False) * 137 / step_flops(row()[0]) / A100_PEAK_TFLOPS,
             abs_tolerance=0.5, hint="the same time as before; the recomputed forward (a third of a layer's "
                                     "training FLOPs, a quarter of what eq. 3 counts) is not counted",
             why="eq. 3 counts recomputation (hardware FLOPs): MFU drops by about a quarter for the same run."),
    Exercise("13-tp-slice", f"In the A100's compute model: the {TP_ROW} row's first MLP GEMM (M 2048 tokens, N 16384, "
             "K 4096, fp16) at tp 8: each rank multiplies 2048 x 2048 x 4096. How many times longer does that take "
             "than 1/8 of the whole GEMM at tp 1?", "x", tp_slice_cost,
             hint="count the 128 x 256 output tiles of each GEMM and the waves they take on the A100's 108 SMs: "
                  "a last wave that is not full leaves SMs idle",
             why="a column-parallel slice has tp times fewer output tiles, and its last wave may leave many SMs "
                 "idle; a row-parallel slice (K / tp) keeps its tiles and shortens each, which the model charges "
                 "only through launch and memory time."),
    Exercise("13-flash", f"The {ROW} row's attention, one layer, micro-batch 1, forward in the A100 compute "
             "model: how many times longer does unfused attention (2021 Megatron: the whole score matrix, plus softmax and dropout "
             "passes through HBM) take than FlashAttention (the causal half skipped)?", "x", attention_ratio,
             tolerance=0.03, hint="twice the GEMM FLOPs, plus 24·2048² scores read and written several times",
             why="the score matrix never reaches HBM in FlashAttention, and the masked half is skipped."),
    Exercise("13-interference", "A backward of 20 ms (alone) starts together with a gradient all-reduce of 8 ms; "
             f"while the all-reduce runs, compute runs {LEE_INTERFERENCE}x slower. When does the backward end?",
             "ms", lambda: 1e3 * overlapped_compute_s(0.020, 0.008, LEE_INTERFERENCE),
             hint="during the 8 ms the compute progresses 8 / 1.189 ms; the rest runs at full speed",
             why="overlap hides the collective, but not for free: the compute pays 1 - 1/1.189 of it."),
)
