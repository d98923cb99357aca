"""What `distlab validate` prints: the summary first, then the overlap plan, the load and the verdict; every case
with --verbose. Within 100 columns (sim/cli.py) unless --wide.

    print_validation(cases, summary, load_before, load_after, verdict, ranks, nprocs, calib, held)

The summary (median and worst |error| per kind and world size) and the overlap plan's rows (what the issue's
target is judged on) always print; the held-out collective cases (one per op, size and world size: 40 by
default) print with --verbose, one table per kind; the workloads' scenario cases always print (a few rows).
"""
from __future__ import annotations

from distlab.sim.cli import STYLE, note, print_table, say
from distlab.sim.plan import format_bytes

SHORT_KINDS = ("held-out size", "held-out world size")


def _pct(x) -> str:
    return f"{x * 100:+.1f}%"


def case_rows(cases: list[dict]) -> list[list]:
    return [[c["case"], c["world_size"], format_bytes(c["bytes"]), f"{c['predicted_s'] * 1e3:.3f}",
             f"{c['measured_s'] * 1e3:.3f}", _pct(c["error"]),
             f"±{c['noise'] * 100:.0f}%" if "noise" in c else "-",
             f"{c['spread'] * 100:.0f}%" if "spread" in c else "-",
             "yes" if c.get("trusted", True) else "NO"] for c in cases]


def _repeats_a_row(s: dict, summary: list[dict]) -> bool:
    """The row over all world sizes of a kind measured at one world size only: the same figures again."""
    return s["world_size"] == "all" and sum(t["kind"] == s["kind"] and t["world_size"] != "all"
                                            for t in summary) == 1


CASE_COLUMNS = ["case", "ranks", "size", "predicted ms", "measured ms", "error", "noise", "spread", "trusted"]


def print_validation(cases, summary, before, after, verdict, ranks: int, nprocs, calib, held) -> None:
    from distlab.runtime.measure.trust import verdict_lines
    say(f"calibrated on {','.join(map(str, nprocs))} ranks with {format_bytes(min(calib))}..{format_bytes(max(calib))}; "
        f"predicted and measured: held-out sizes {format_bytes(min(held))}..{format_bytes(max(held))}, held-out "
        "world sizes, the overlap plan (median of the repeats)")
    print_table("|error| per kind and world size (noise: how far the median |error| moves when the repeats are "
                "drawn again)", ["kind", "ranks", "cases", "median |error|", "noise", "worst |error|", "worst case"],
                [[s["kind"], s["world_size"], s["cases"], f"{s['median_abs_error'] * 100:.1f}%",
                  f"±{s['median_abs_error_noise'] * 100:.1f}%" if "median_abs_error_noise" in s else "-",
                  f"{s['worst_abs_error'] * 100:.1f}%", s["worst_case"].removesuffix(f" on {s['world_size']} ranks")]
                 for s in summary if not _repeats_a_row(s, summary)])
    kinds = list(dict.fromkeys(c["kind"] for c in cases))
    for kind in kinds:
        rows = [c for c in cases if c["kind"] == kind]
        if kind in SHORT_KINDS and not STYLE.verbose:
            continue
        print_table(f"{kind}: simulated (calibrated) against measured (noise: how far the median of the repeats "
                    "moves by chance; spread: (slowest - fastest) / median)", CASE_COLUMNS, case_rows(rows))
    hidden = sum(c["kind"] in SHORT_KINDS for c in cases)
    if hidden and not STYLE.verbose:
        note(f"{hidden} held-out collective cases summarized above; --verbose prints each")
    overlap = [c for c in cases if c["kind"] == "overlap plan"]
    for c in overlap:
        say(f"overlap plan on {c['world_size']} ranks: interference {c.get('interference', 1):.3g}, "
            f"comm_interference {c.get('comm_interference', 1):.3g} (error without them "
            f"{_pct(c['error_without_interference'])}); repeats "
            + ", ".join(f"{t * 1e3:.0f}" for t in c.get("measured_runs_s", [])) + " ms", indent="  ")
    for when, reading in (("load before", before), ("load after", after)):
        if reading:
            say(f"{when}: {reading.line(ranks).removeprefix('load: ')}", indent="  ")
    for line in verdict_lines(verdict, "validation"):
        say(line, indent="    ")
