"""`distlab reproduce [RUNS.yaml]`: simulate published training runs and compare with what they reported."""
from __future__ import annotations

import os
import sys
import time

NAME = "reproduce"
HELP = ("Simulate published training runs (default: the shipped file: Megatron-LM's SC21 Table 1 on A100s, "
        "Megatron-Core's H100 weak scaling, Llama 3's 405B table, torchtitan's and torchao's H100/H200 benchmarks, "
        "NeMo's H100/B200/GB200 FP8 tables) on their cluster presets and print predicted vs reported figure, the "
        "error, and the rows not expressible yet; a progress bar on a terminal, else one line per row on stderr.")


def add_arguments(p) -> None:
    p.add_argument("runs", nargs="?", default=None, help="a runs YAML file (default: the shipped "
                                                          "sim/reproduce/runs.yaml)")
    p.add_argument("--only", action="append", metavar="NAME", help="simulate only this run (repeatable)")
    p.add_argument("--max-gpus", type=int, default=None, help="skip runs of more GPUs than this (listed as "
                                                              "skipped)")
    p.add_argument("--plot", metavar="PATH", help="save predicted vs reported as a figure (.png, .svg, .pdf)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args) -> int:
    from distlab.sim.cli import print_json, progress
    from distlab.sim.errors import ConfigError
    from distlab.sim.io import check_output
    from distlab.sim.reproduce.predict import predict
    from distlab.sim.reproduce.runs import DEFAULT_PATH, load_runs

    check_output(args.plot, "--plot", "figure")
    if args.max_gpus is not None and args.max_gpus < 1:
        raise ConfigError(f"{args.max_gpus} must be a whole number >= 1", "--max-gpus")
    path = args.runs or DEFAULT_PATH
    runs, fitted = load_runs(path)
    names = [r.name for r in runs]
    for n in args.only or []:
        if n not in names:
            raise ConfigError(f"no run named {n!r}; allowed: {', '.join(names)}", "--only")
    chosen = [r for r in runs if not args.only or r.name in args.only]
    results, skipped = [], []
    start = time.perf_counter()
    bar = progress(chosen, len(chosen), "simulating published runs", delay_s=0.0,
                   enabled=sys.stderr.isatty())          # elsewhere: the line per row below
    for i, r in enumerate(bar, 1):
        if args.max_gpus is not None and r.gpus > args.max_gpus:
            skipped.append({"name": r.name, "world_size": r.gpus,
                            "reason": f"more than --max-gpus {args.max_gpus}"})
            continue
        t0 = time.perf_counter()
        results.append(predict(r))
        if not sys.stderr.isatty():            # a terminal shows the bar instead (sim/cli.py progress)
            print(f"reproduce: {i}/{len(chosen)} {r.name} ({r.gpus:,} GPUs): {time.perf_counter() - t0:.1f} s, "
                  f"{time.perf_counter() - start:.0f} s in all", file=sys.stderr, flush=True)
    simulated = [x for x in results if x["expressible"]]
    missing = [x for x in results if not x["expressible"]]
    constants = {g: {"sustained": f.sustained, "elementwise_passes": f.elementwise_passes,
                     "fitted_on": list(f.fitted_on)} for g, f in fitted.items()}
    if args.json:
        print_json({"runs_file": path, "results": simulated, "not_expressible": missing, "skipped": skipped,
                    "fitted": constants, "summary": summary(simulated),
                    "by_generation": by_key(simulated, "generation"),
                    "by_generation_precision": by_key(simulated, "generation_precision"),
                    "by_source": by_key(simulated, "table")},
                   NAME)
    else:
        print_text(path, simulated, missing, skipped)
    if args.plot:
        from distlab.sim.io import save_figure
        save_figure(draw(simulated), args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


FIGURE_LABELS = {"tflops_per_gpu": "TFLOP/s/GPU", "mfu": "MFU", "tokens_per_s": "tok/s",
                 "tokens_per_s_per_gpu": "tok/s/GPU", "iteration_s": "step s"}


def print_text(path: str, simulated: list[dict], missing: list[dict], skipped: list[dict]) -> None:
    """The table (fitted rows marked), the accuracy per GPU generation and per source, then the rows not
    expressible yet grouped by reason and the skipped ones, within 100 columns."""
    import re
    import textwrap
    from distlab.sim.cli import print_table

    def num(v):
        return f"{v:,.0f}" if v >= 1000 else f"{v:.4g}"
    rows = [[x["name"], x["world_size"], FIGURE_LABELS[x["figure"]], num(x["reported"]), num(x["predicted"]),
             f"{100 * x['error']:+.1f}%", f"{100 * x['mfu']:.1f}%", f"{x['step_time_s']:.3g}",
             "yes" if x["fitted"] else ""] for x in simulated]
    print_table(f"distlab reproduce {os.path.basename(path)}", ["run", "GPUs", "figure", "reported", "predicted",
                                                               "error", "MFU", "step s", "fitted"], rows)
    print("rows not fitted on: median |error|, largest |error|, bias (median error)")
    for key in ("generation_precision", "table"):
        for s in by_key(simulated, key):
            if s["rows"]:
                name = re.sub(r"\S+/", "", re.sub(r" \([^)]*\)", "", s[key]))     # no parentheses, no folders
                print(f"  {100 * s['median_abs_error']:.1f}% {100 * s['max_abs_error']:.1f}% "
                      f"{100 * s['bias']:+.1f}% ({s['rows']} rows) {name}")
    for what, group in (("not expressible yet", missing), ("skipped", skipped)):
        for reason in dict.fromkeys(x["reason"] for x in group):
            names = ", ".join(x["name"] for x in group if x["reason"] == reason)
            print(textwrap.fill(f"{what}: {names}", 100, subsequent_indent="  ", break_on_hyphens=False))
            print(textwrap.fill(f"because {reason}", 100, initial_indent="  ", subsequent_indent="  ",
                                break_on_hyphens=False))


def summary(results: list[dict]) -> dict:
    """Median and largest |error| and the bias (median signed error) over the rows that were not fitted on."""
    return by_key([{**x, "all": "all"} for x in results], "all")[0] if results else \
        {"rows": 0, "median_abs_error": None, "max_abs_error": None, "bias": None}


def by_key(results: list[dict], key: str) -> list[dict]:
    """summary() per value of ``key`` (generation, generation_precision, table) among the simulated rows (a row
    without a precision counts under its generation)."""
    import statistics
    out = []
    label = (lambda x: x.get(key) or x["generation"]) if key == "generation_precision" else (lambda x: x[key])
    for value in dict.fromkeys(label(x) for x in results):
        errs = [x["error"] for x in results if label(x) == value and not x["fitted"]]
        row = {key: value, "rows": len(errs), "median_abs_error": None, "max_abs_error": None, "bias": None}
        if errs:
            row.update(median_abs_error=statistics.median(abs(e) for e in errs),
                       max_abs_error=max(abs(e) for e in errs), bias=statistics.median(errs))
        out.append(row)
    return out


def draw(results: list[dict]):
    """Predicted over reported, one point per run (fitted rows hollow), the y = 1 line and a ±10% band; each
    point named where its name fits (sim/figure_text.py place_labels: no two names overlap, none leaves the axes)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from distlab.sim.figure_text import place_labels
    fig = Figure(figsize=(6.5, 5))
    ax = fig.add_subplot()
    ratios = [x["predicted"] / x["reported"] for x in results] or [1.0]
    lo, hi = min(0.85, 0.95 * min(ratios)), max(1.15, 1.05 * max(ratios))
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.axhspan(0.9, 1.1, color="grey", alpha=0.15)
    for i, (x, ratio) in enumerate(zip(results, ratios)):
        ax.scatter([i], [ratio], facecolors="none" if x["fitted"] else "C0", edgecolors="C0", zorder=3)
    ax.set_xlim(-0.5, max(len(results) - 0.5, 0.5))
    ax.set_ylim(lo, hi)
    ax.set_xlabel("run")
    ax.set_ylabel("simulated / reported")
    ax.set_title("distlab reproduce: simulated over reported")
    from matplotlib.patches import Patch
    ax.legend(handles=[Line2D([], [], marker="o", linestyle="none", color="C0", label="a run (named if room)"),
                       Line2D([], [], marker="o", linestyle="none", markerfacecolor="none", color="C0",
                              label="a run the curve was fitted on"),
                       Line2D([], [], color="grey", linewidth=1, label="simulated = reported"),
                       Patch(color="grey", alpha=0.15, label="±10%")], loc="upper left", fontsize=7)
    fig.tight_layout()
    place_labels(fig, ax, [(i, r, x["name"]) for i, (x, r) in enumerate(zip(results, ratios))])
    return fig
