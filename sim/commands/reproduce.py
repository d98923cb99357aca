"""`distlab reproduce [RUNS.yaml]`: simulate published training runs and compare with what they reported."""
from __future__ import annotations

NAME = "reproduce"
HELP = ("Simulate published training runs (default: the shipped file, Megatron-LM's Table 1, 2104.04473) on "
        "their cluster presets and print predicted vs reported figure and the error.")


def add_arguments(p) -> None:
    p.add_argument("runs", nargs="?", default=None, help="a runs YAML file (default: the shipped "
                                                          "sim/reproduce/runs.yaml)")
    p.add_argument("--only", action="append", metavar="NAME", help="simulate only this run (repeatable)")
    p.add_argument("--max-gpus", type=int, default=None, help="skip runs of more GPUs than this (listed as "
                                                              "skipped)")
    p.add_argument("--plot", metavar="PATH", help="save predicted vs reported as a figure (.png, .svg, .pdf)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args) -> int:
    from distlab.sim.cli import print_json, print_table, progress
    from distlab.sim.errors import ConfigError
    from distlab.sim.io import check_output
    from distlab.sim.reproduce.predict import predict
    from distlab.sim.reproduce.runs import DEFAULT_PATH, load_runs

    check_output(args.plot, "--plot", "figure")
    if args.max_gpus is not None and args.max_gpus < 1:
        raise ConfigError(f"{args.max_gpus} must be a whole number >= 1", "--max-gpus")
    path = args.runs or DEFAULT_PATH
    runs, generations = load_runs(path)
    names = [r.name for r in runs]
    for n in args.only or []:
        if n not in names:
            raise ConfigError(f"no run named {n!r}; allowed: {', '.join(names)}", "--only")
    chosen = [r for r in runs if not args.only or r.name in args.only]
    results, skipped = [], []
    for r in progress(chosen, len(chosen), "simulating published runs"):
        if args.max_gpus is not None and r.gpus > args.max_gpus:
            skipped.append({"name": r.name, "world_size": r.gpus,
                            "reason": f"more than --max-gpus {args.max_gpus}"})
            continue
        results.append(predict(r, generations))
    fitted = {arch: {"peak_fraction": g.peak_fraction, "half_flops": g.half_flops, "fitted_on": g.fitted_on}
              for arch, g in generations.items()}
    if args.json:
        print_json({"runs_file": path, "results": results, "skipped": skipped, "fitted": fitted,
                    "summary": summary(results)}, NAME)
    else:
        rows = [[x["name"], x["world_size"], x["figure"], f"{x['reported']:.4g}", f"{x['predicted']:.4g}",
                 f"{100 * x['error']:+.1f}%", f"{x['step_time_s']:.4g}", "yes" if x["fitted"] else "",
                 f"{x['wall_s']:.1f}"] for x in results]
        print_table(f"distlab reproduce {path}", ["run", "GPUs", "figure", "reported", "predicted", "error",
                                                  "step s", "fitted", "sim wall s"], rows)
        s = summary(results)
        if s["rows"]:
            print(f"not fitted rows: {s['rows']}, median |error| {100 * s['median_abs_error']:.1f}%, "
                  f"max |error| {100 * s['max_abs_error']:.1f}%")
        for x in skipped:
            print(f"skipped {x['name']} ({x['world_size']} GPUs): {x['reason']}")
    if args.plot:
        from distlab.sim.io import save_figure
        save_figure(draw(results), args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


def summary(results: list[dict]) -> dict:
    """Median and max |error| over the rows that were not fitted on."""
    errs = sorted(abs(x["error"]) for x in results if not x["fitted"])
    if not errs:
        return {"rows": 0, "median_abs_error": None, "max_abs_error": None}
    mid = len(errs) // 2
    median = errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2
    return {"rows": len(errs), "median_abs_error": median, "max_abs_error": errs[-1]}


def draw(results: list[dict]):
    """Predicted vs reported, one point per run (fitted rows hollow), the y = x line and a ±10% band; each point
    named where its name fits (sim/figure_text.py place_labels: no two names overlap, none leaves the axes)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from distlab.sim.figure_text import place_labels
    fig = Figure(figsize=(6.5, 5))
    ax = fig.add_subplot()
    values = [x["reported"] for x in results] + [x["predicted"] for x in results] or [1.0]
    lo, hi = 0.9 * min(values), 1.1 * max(values)
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1)
    ax.fill_between([lo, hi], [0.9 * lo, 0.9 * hi], [1.1 * lo, 1.1 * hi], color="grey", alpha=0.15)
    for x in results:
        ax.scatter([x["reported"]], [x["predicted"]], facecolors="none" if x["fitted"] else "C0",
                   edgecolors="C0", zorder=3)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    figure = results[0]["figure"] if results else "figure"
    ax.set_xlabel(f"reported {figure}")
    ax.set_ylabel(f"simulated {figure}")
    ax.set_title("distlab reproduce: simulated against reported")
    from matplotlib.patches import Patch
    ax.legend(handles=[Line2D([], [], marker="o", linestyle="none", color="C0", label="a run (named if room)"),
                       Line2D([], [], marker="o", linestyle="none", markerfacecolor="none", color="C0",
                              label="a run the curve was fitted on"),
                       Line2D([], [], color="grey", linewidth=1, label="simulated = reported"),
                       Patch(color="grey", alpha=0.15, label="±10%")], loc="upper left", fontsize=7)
    fig.tight_layout()
    place_labels(fig, ax, [(x["reported"], x["predicted"], x["name"]) for x in results])
    return fig
