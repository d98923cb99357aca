"""`distlab reproduce [RUNS.yaml]`: simulate published training runs and compare with what they reported."""
from __future__ import annotations

NAME = "reproduce"
HELP = ("Simulate published training runs (default: the shipped file: Megatron-LM's SC21 Table 1 on A100s, "
        "Megatron-Core's H100 weak scaling, Llama 3's 405B table, torchtitan's H100/H200 benchmarks) on their cluster "
        "presets and print predicted vs reported figure, the error, and the rows not expressible yet.")


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
    runs, fitted = load_runs(path)
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
        results.append(predict(r))
    simulated = [x for x in results if x["expressible"]]
    missing = [x for x in results if not x["expressible"]]
    constants = {g: {"sustained": f.sustained, "kernel_gap_s": f.kernel_gap_s, "fitted_on": list(f.fitted_on)}
                 for g, f in fitted.items()}
    if args.json:
        print_json({"runs_file": path, "results": simulated, "not_expressible": missing, "skipped": skipped,
                    "fitted": constants, "summary": summary(simulated),
                    "by_generation": by_key(simulated, "generation"), "by_source": by_key(simulated, "table")},
                   NAME)
    else:
        rows = [[x["name"], x["world_size"], x["figure"], f"{x['reported']:.4g}", f"{x['predicted']:.4g}",
                 f"{100 * x['error']:+.1f}%", f"{100 * x['mfu']:.1f}%", f"{x['step_time_s']:.4g}",
                 "yes" if x["fitted"] else ""] for x in simulated]
        print_table(f"distlab reproduce {path}", ["run", "GPUs", "figure", "reported", "predicted", "error",
                                                  "MFU", "step s", "fitted"], rows)
        for key, title in (("generation", "GPU generation"), ("table", "source")):
            for s in by_key(simulated, key):
                if s["rows"]:
                    print(f"{title} {s[key]}: {s['rows']} rows not fitted on, median |error| "
                          f"{100 * s['median_abs_error']:.1f}%, largest {100 * s['max_abs_error']:.1f}%, bias "
                          f"{100 * s['bias']:+.1f}%")
        for x in missing:
            print(f"not expressible yet: {x['name']} ({x['world_size']} GPUs): {x['reason']}")
        for x in skipped:
            print(f"skipped {x['name']} ({x['world_size']} GPUs): {x['reason']}")
    if args.plot:
        from distlab.sim.io import save_figure
        save_figure(draw(simulated), args.plot)
    return 0


def summary(results: list[dict]) -> dict:
    """Median and largest |error| and the bias (median signed error) over the rows that were not fitted on."""
    return by_key([{**x, "all": "all"} for x in results], "all")[0] if results else \
        {"rows": 0, "median_abs_error": None, "max_abs_error": None, "bias": None}


def by_key(results: list[dict], key: str) -> list[dict]:
    """summary() per value of ``key`` (generation, table) among the simulated rows."""
    import statistics
    out = []
    for value in dict.fromkeys(x[key] for x in results):
        errs = [x["error"] for x in results if x[key] == value and not x["fitted"]]
        row = {key: value, "rows": len(errs), "median_abs_error": None, "max_abs_error": None, "bias": None}
        if errs:
            row.update(median_abs_error=statistics.median(abs(e) for e in errs),
                       max_abs_error=max(abs(e) for e in errs), bias=statistics.median(errs))
        out.append(row)
    return out


def draw(results: list[dict]):
    """Predicted over reported, one point per run (fitted rows hollow), the y = 1 line and a ±10% band."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6, 5))
    ax = fig.add_subplot()
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.axhspan(0.9, 1.1, color="grey", alpha=0.15, label="±10%")
    for i, x in enumerate(results):
        ratio = x["predicted"] / x["reported"]
        ax.scatter([i], [ratio], facecolors="none" if x["fitted"] else "C0", edgecolors="C0")
        ax.annotate(x["name"], (i, ratio), fontsize=7, xytext=(3, 3), textcoords="offset points", rotation=30)
    ax.set_xlabel("run")
    ax.set_ylabel("simulated / reported")
    ax.set_title("distlab reproduce (hollow: fitted rows)")
    ax.legend(loc="upper left")
    return fig
