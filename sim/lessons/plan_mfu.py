"""Lesson 11's MFU story: the planner's best layouts against Llama 3 405B's published MFU, and how much of the gap
each part of the step explains. No torch here.

    from distlab.sim.lessons.plan_mfu import mfu_table
    mfu_table()          # the planner's #1 for lesson 11's two questions (their searches, cached), Meta's rows

The planner's MFU (sim/planner/search.py ``Search.mfu``): the step's model FLOPs, three times the forward's
(forward, and a backward twice as long; recomputation not counted), over the GPUs' dense bf16 peak (989 TFLOP/s
per H100, datasheet) and the estimated step. Its compute term times every kernel with the compute model
(sim/compute/, docs/compute.md): the best GEMM measured on an H100 (80.3% of peak), tile and wave quantization,
FlashAttention-3's measured rates, and one fitted ``sustained`` fraction for Hopper (0.5254, fitted on the
Megatron-Core r0.8.0 1.7B row; sim/compute/fitted.py). "MFU of the compute alone" divides by the compute and
recompute terms only: what the step would reach with every collective hidden and no bubble.

Meta's figures: arXiv 2407.21783, Table 4 (BF16 MFU 38-43% at 8,192-16,384 H100, TP 8, PP 16).
"""
from __future__ import annotations

from distlab.sim.lessons.helpers import Table


def compute_only_mfu(search, candidate) -> float:
    """The MFU the step would reach if it lasted only its compute and recompute terms."""
    t = candidate.estimate.terms
    busy = t.get("compute_s", 0.0) + t.get("recompute_s", 0.0)
    return search.mfu(candidate) * candidate.estimate.step_s / busy


def tp_share(candidate) -> float:
    """Exposed TP communication over the estimated step."""
    return candidate.estimate.terms.get("tp_comm_s", 0.0) / candidate.estimate.step_s


def mfu_rows(searches: dict) -> list[dict]:
    """Per labelled search, its #1: layout, GPUs, MFU, MFU of the compute alone, exposed TP share of the step."""
    rows = []
    for label, s in searches.items():
        c = s.ranked[0]
        rows.append({"run": label, "gpus": s.question["world_size"], "layout": c.layout.label(),
                     "mfu": s.mfu(c), "compute_only_mfu": compute_only_mfu(s, c), "tp_share": tp_share(c)})
    return rows


def mfu_table(searches: dict | None = None) -> Table:
    """The planner's #1 for the lesson's two questions beside Meta's published rows."""
    from distlab.sim.lessons.bank_plan import LLAMA3_405B_TABLE4, plan_405b_replica, plan_70b
    searches = searches or {"planner #1, Llama 3 70B": plan_70b(),
                            "planner #1, one Llama 3 405B replica": plan_405b_replica()}
    rows = [[r["run"], f"{r['gpus']:,}", f"{r['mfu']:.1%}", f"{r['compute_only_mfu']:.1%}",
             f"{r['tp_share']:.0%}", r["layout"]] for r in mfu_rows(searches)]
    cols = LLAMA3_405B_TABLE4["columns"]
    for row in LLAMA3_405B_TABLE4["rows"]:
        d = dict(zip(cols, row))
        rows.append([f"Meta, Llama 3 405B (Table 4, seq {d['Seq. Len.']:,})", f"{d['GPUs']:,}", d["BF16 MFU"], "-",
                     "-", f"TP {d['TP']}, CP {d['CP']}, PP {d['PP']}, DP {d['DP']}"])
    return Table(["run", "GPUs", "MFU", "MFU of the compute alone", "exposed TP share of the step", "layout"],
                 rows, "H100, dense bf16 peak 989 TFLOP/s; the planner's figures are its estimates")
