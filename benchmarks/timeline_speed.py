"""How much `--timeline` adds to `distlab collective` (issue 12.6: within 2x of the same command without it).

Runs `distlab collective all_reduce --size 64MiB --nodes 2` with and without `--timeline t.png`, each as a
fresh process (Python start, imports, simulation, and for the timeline Pillow's import, drawing and PNG
encoding: sim/timeline_png.py, no matplotlib), alternating, and prints the median wall time of each and their
ratio; then, in this process, the parts: the simulation, Pillow's import, drawing and encoding the PNG, and for
comparison matplotlib's import (~0.4 s, which the PNG path no longer pays) and its figure (sim/plots.py).

    python benchmarks/timeline_speed.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMMAND = ["collective", "all_reduce", "--size", "64MiB", "--nodes", "2"]


def wall(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "distlab.runtime.cli", *argv], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        png = os.path.join(tmp, "t.png")
        wall(COMMAND)                                   # warm the file cache and .pyc files
        wall(COMMAND + ["--timeline", png])
        plain, timeline = [], []
        for _ in range(args.repeats):
            plain.append(wall(COMMAND))
            timeline.append(wall(COMMAND + ["--timeline", png]))
    a, b = statistics.median(plain), statistics.median(timeline)
    print(f"distlab {' '.join(COMMAND)}: median of {args.repeats}")
    print(f"  without --timeline: {a:.3f} s")
    print(f"  with --timeline:    {b:.3f} s")
    print(f"  ratio: {b / a:.2f}x (goal: <= 2x)")
    parts()
    return 0 if b / a <= 2 else 1


def parts() -> None:
    """Seconds of each part of `--timeline`, in this process (median of 3 for all but the one-off imports)."""
    import io

    from distlab.sim.cluster import load_cluster
    from distlab.sim.kernel.engine import simulate_collective
    cluster = load_cluster("dgx-h100", 2)
    t0 = time.perf_counter()
    from PIL import Image, ImageDraw, ImageFont  # noqa: F401
    pillow_import = time.perf_counter() - t0
    from distlab.sim.timeline_png import timeline_png
    sim, png = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        trace, _ = simulate_collective("all_reduce", 64 * 2**20, cluster, "auto", 0, record_transfers=True)
        t1 = time.perf_counter()
        timeline_png(trace, title="timeline")
        sim.append(t1 - t0), png.append(time.perf_counter() - t1)
    m = statistics.median
    print(f"  parts: simulation {m(sim):.3f} s ({len(trace.transfers)} transfers), Pillow import "
          f"{pillow_import:.3f} s, drawing and encoding the PNG {m(png):.3f} s ({m(png) / m(sim):.2f}x the simulation)")
    t0 = time.perf_counter()
    import matplotlib.collections  # noqa: F401
    import matplotlib.figure  # noqa: F401
    from matplotlib.backends import backend_agg  # noqa: F401
    imports = time.perf_counter() - t0
    from distlab.sim.plots import transfers_timeline
    t0 = time.perf_counter()
    transfers_timeline(trace, title="timeline").savefig(io.BytesIO(), format="png", dpi=120,
                                                        pil_kwargs={"compress_level": 1})
    print(f"  for comparison, matplotlib (sim/plots.py, .svg/.pdf timelines): import {imports:.3f} s, "
          f"figure and PNG {time.perf_counter() - t0:.3f} s")

if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    from accuracy_doc import run_main
    sys.exit(run_main("timeline_speed", main))
