"""Lesson 11 (plan a run): the questions, tables, the Pareto figure and the exercises, computed by the planner
(sim/planner/: layouts, estimate, search, explain), never typed in. No torch here: the notebook's real run uses
runtime/parallel/tp/validate.py (the TP runtime of lesson 09).

The published layout the lesson compares with is quoted in ``LLAMA3_405B_TABLE4`` (with its source); the planner
is never asked to reproduce it, only compared with it."""
from __future__ import annotations

from functools import lru_cache

from distlab.sim.lessons.checker import Exercise, quick
from distlab.sim.lessons.helpers import Figure, Table
from distlab.sim.planner.layouts import Layout

# The lesson's question: Llama 3 70B (sequence 8192, the preset's) on 8 x DGX H100 (64 GPUs), 256 sequences per
# step (2M tokens, Llama 3's batch early in pre-training was 4M: arXiv 2407.21783 sec. 3.4.1).
QUESTION_70B = {"model": {"preset": "llama3-70b"}, "cluster": "dgx-h100", "nodes": 8, "global_batch": 256}
# The tiny model of lesson 09 (runtime/parallel/tp), planned on this machine's 2 CPU ranks and run for real.
TINY_MODEL = {"arch": "llama", "layers": 2, "hidden": 32, "heads": 8, "kv_heads": 4, "ffn_hidden": 64, "seq_len": 8,
              "vocab": 128, "dtype": "float32"}
QUESTION_TINY = {"model": TINY_MODEL, "cluster": "localhost-cpu", "nodes": 1, "global_batch": 4}

# Llama Team, AI @ Meta, "The Llama 3 Herd of Models", arXiv 2407.21783 (v3, 23 Nov 2024), sec. 3.3.2, p. 10,
# Table 4 "Scaling configurations and MFU for each stage of Llama 3 405B pre-training", columns as printed.
# DP stands for FSDP (Figure 5's caption). Transcriptions of the third row's DP differ (4 or 8); 8 is what v3
# prints and what GPUs / (TP x CP x PP) = 16,384 / 2,048 gives.
LLAMA3_405B_TABLE4 = {
    "source": "arXiv 2407.21783 v3, Table 4 (Llama 3 405B pre-training)",
    "columns": ["GPUs", "TP", "CP", "PP", "DP", "Seq. Len.", "Batch size/DP", "Tokens/Batch", "TFLOPs/GPU",
                "BF16 MFU"],
    "rows": [[8192, 8, 1, 16, 64, 8192, 32, "16M", 430, "43%"],
             [16384, 8, 1, 16, 128, 8192, 16, "16M", 400, "41%"],
             [16384, 8, 16, 16, 8, 131072, 16, "16M", 380, "38%"]],
}


# The lesson's searches run in the notebook's own process (workers=1): the planner's default shares the estimate
# between 2 local processes, which each fill their own caches. Measured on a 2-core machine with other work on it
# (load 2.5-3, 2026-12-02): the 70B question took 17.4 s of CPU and 19 s in one process, 27 s of CPU and 30 s with
# 2 (the same ranking: tests/test_planner.py test_two_processes_estimate_what_one_does); since the planner's
# speed-ups of that day about 8.5 s of CPU in one process (docs/planner.md "Every layout, estimated"). The notebook tests run
# beside other tests, where a second process only takes a core from them.
SEARCH_WORKERS = 1


@lru_cache(maxsize=None)
def _search(name: str):
    from distlab.sim.planner.search import search
    q = {"70b": QUESTION_70B, "tiny": QUESTION_TINY, "405b-replica": meta_replica_question()}[name]
    return search(q["model"], q["cluster"], q["nodes"], q["global_batch"], confirm=0, workers=SEARCH_WORKERS)


def lesson_confirm() -> int:
    """How many of the best estimates the notebook simulates: 1, or 0 when DISTLAB_LESSONS_QUICK is set (the
    notebook tests; sim/lessons/checker.py ``quick``)."""
    return 0 if quick() else 1


def plan_70b():
    """The planner's search for the lesson's question (estimates only; the notebook confirms #1 with the
    discrete-event simulator: sim/planner/search.py ``confirm_top``). Cached: the checks read the same search."""
    return _search("70b")


def plan_tiny():
    """The tiny model on this machine's 2 CPU ranks (the preset localhost-cpu cluster), all layouts."""
    return _search("tiny")


def meta_replica_question() -> dict:
    """One data-parallel replica of Table 4's first row: Llama 3 405B on TP x CP x PP GPUs (16 DGX H100 nodes),
    with the replica's share of the batch (Batch size/DP sequences)."""
    gpus, tp, cp, pp, dp, seq, per_dp = LLAMA3_405B_TABLE4["rows"][0][:7]
    return {"model": {"preset": "llama3-405b", "seq_len": seq}, "cluster": "dgx-h100", "nodes": tp * cp * pp // 8,
            "global_batch": per_dp}


def plan_405b_replica():
    return _search("405b-replica")


# -- memory ----------------------------------------------------------------------------------------------------
ACCUMULATED = "TP 8 x FSDP 8, 1 sequence at a time"


def memory_layouts() -> list[tuple[str, Layout]]:
    """A few layouts of the 70B question (64 GPUs, 256 sequences; without a pipeline or gradient accumulation
    each FSDP replica takes 256 / dp sequences at once). ``ACCUMULATED``: TP 8 x FSDP 8 with one sequence per
    micro-batch and 32 micro-batches, a layout of the planner's search (FSDP2 reduce-scatters each
    micro-batch's gradients into the sharded ones, torchtitan's train loop: sim/parallel/fsdp/stage.py)."""
    return [("DDP", Layout(1, 1, 64, "ddp", 4, 1, False, "full")),
            ("FSDP", Layout(1, 1, 64, "fsdp", 4, 1, False, "full")),
            ("TP 8 x FSDP 8", Layout(8, 1, 8, "fsdp", 32, 1, True, "selective")),
            ("TP 8 x FSDP 8, full recompute", Layout(8, 1, 8, "fsdp", 32, 1, True, "full")),
            (ACCUMULATED, Layout(8, 1, 8, "fsdp", 1, 32, True, "selective", dp_shard=8)),
            ("PP 8 x TP 8", Layout(8, 8, 1, "ddp", 1, 256, True, "selective", "1f1b")),
            ("PP 8 x TP 4 x DDP 2", Layout(4, 8, 2, "ddp", 1, 128, True, "selective", "1f1b"))]


def memory_label(name: str, L: Layout) -> str:
    return L.label()


@lru_cache(maxsize=1)
def estimator_70b():
    """The planner's estimator for the 70B question (memory needs no search: sim/planner/step.py)."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.planner.step import Estimator
    q = QUESTION_70B
    return Estimator(q["model"], load_cluster(q["cluster"], q["nodes"]))


def layout_memory(name: str) -> dict:
    """Bytes per GPU by part of one of :func:`memory_layouts`, as every command counts them (sim/parallel/memory.py)."""
    L = dict(memory_layouts())[name]
    return estimator_70b().memory(L)


def model_state_GiB(name: str) -> float:
    """Params + grads + AdamW state per GPU, GiB."""
    m = layout_memory(name)
    return (m["params"] + m["grads"] + m["optimizer"]) / 2**30


def memory_table() -> Table:
    """Per layout: GiB per GPU by part, the total against the GPU and what is too big."""
    from distlab.sim.parallel.fsdp.memory import fits
    est = estimator_70b()
    gib = est.cluster.gpu.memory_GiB
    rows = []
    for name, L in memory_layouts():
        m = est.memory(L)
        total = sum(m.values()) / 2**30
        big = max(m, key=m.get)
        verdict = "fits" if fits(sum(m.values()), gib) else f"does not fit: {big} {m[big] / 2**30:.0f} GiB"
        rows.append([name, memory_label(name, L), *(f"{m[k] / 2**30:.1f}" for k in ("params", "grads", "optimizer",
                                                                         "activations")), f"{total:.1f}", verdict])
    return Table(["layout", "in full", "params", "grads", "optimizer", "activations", "total GiB",
                  f"on {gib:g} GiB"], rows, "Llama 3 70B, 64 x H100, 256 sequences of 8192: GiB per GPU")


# -- the ranking, the figure, the explanation ---------------------------------------------------------------------
def ranked_table(search, top: int = 8) -> Table:
    """The planner's ranking (~: estimate; the others simulated by the discrete-event simulator)."""
    from distlab.sim.planner.explain import breakdown
    rows = []
    for i, c in enumerate(search.ranked[:top]):
        b = breakdown(search, c)
        rows.append([i + 1, c.layout.label(), f"{c.step_s:.2f}" + ("" if c.simulated_s is not None else " ~"),
                     f"{b['mfu']:.1%}", f"{b['memory_GiB']:.1f}"])
    q = search.question
    return Table(["#", "layout", "step s", "MFU", "GiB per GPU"], rows,
                 f"{len(search.all)} layouts of {q['world_size']} GPUs, {len(search.ranked)} fit; fastest first")


def plot_pareto(search) -> Figure:
    """Step time against memory per GPU for every layout that fits, by family; the Pareto front (no layout both
    faster and smaller: sim/planner/figure.py ``pareto_front``) as a line; #1 ringed."""
    from distlab.sim.planner.figure import pareto_front
    cands = search.ranked
    pts = [(c.memory_bytes / 2**30, c.step_s) for c in cands]
    f = Figure(8, 4.6)
    for fam in sorted({c.layout.family for c in cands}):
        xs = [p for p, c in zip(pts, cands) if c.layout.family == fam]
        f.ax.scatter([x for x, _ in xs], [y for _, y in xs], s=14, alpha=0.7, label=fam)
    front = pareto_front(pts)
    f.ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color="black", lw=1, label="Pareto front")
    f.ax.scatter([pts[0][0]], [pts[0][1]], s=120, facecolors="none", edgecolors="red", label="#1")
    f.ax.axvline(search.gpu_GiB, color="grey", ls="--", lw=1)
    f.ax.set_xlabel("memory per GPU (GiB)")
    f.ax.set_ylabel("step (s)")
    f.ax.set_title(f"{len(cands)} layouts that fit on {search.question['world_size']} x {search.cluster.gpu.name}")
    f.ax.legend(fontsize=7)
    return f


def terms_table(search, ranks=(1, 2)) -> Table:
    """The estimate's terms (seconds on the critical rank) of the layouts ranked ``ranks``, side by side."""
    from distlab.sim.planner.explain import TERMS
    cs = [search.ranked[r - 1] for r in ranks]
    rows = [[name, *(f"{c.estimate.terms.get(key, 0.0):.2f}" for c in cs)] for key, name in TERMS.items()]
    rows.append(["step (estimate)", *(f"{c.estimate.step_s:.2f}" for c in cs)])
    return Table(["term (s)", *(f"#{r}" for r in ranks)], rows, " | ".join(f"#{r}: {c.layout.label()}"
                                                                          for r, c in zip(ranks, cs)))


def why_text(search) -> str:
    """#1 against #2 in one paragraph (sim/planner/explain.py ``first_vs_second``)."""
    from distlab.sim.planner.explain import first_vs_second
    w = first_vs_second(search, search.estimator)
    if w is None:
        return "only one layout fits"
    text = (f"#1 beats #2 by {w['gap_s']:.2f} s; the term that differs most: {w['term']} "
            f"(+{w['term_gap_s']:.2f} s in #2).")
    if "change" in w:
        text += (f" The single change to #2 that helps most: {w['change']} -> {w['changed_step_s']:.2f} s "
                 f"({'closes the gap' if w['closes_gap'] else 'still behind #1'}).")
    return text


def families_table(search) -> Table:
    from distlab.sim.planner.explain import families
    rows = [[f["family"], f["best"] or "-", f"{f['step_s']:.2f}" if f.get("step_s") else "-", f["why"]]
            for f in families(search)]
    return Table(["family", "its best layout", "step s", "why it lost"], rows, "the best of each family")


# -- the bubble ---------------------------------------------------------------------------------------------------
def best_pipeline(search):
    """The best-ranked layout with a pipeline of one stage per rank (pp > 1; 1F1B or GPipe, whose bubble the
    formula gives: interleaving divides it by the virtual stages)."""
    return next(c for c in search.ranked if c.layout.pp > 1 and c.layout.virtual_stages == 1)


def bubble_formula(p: int, m: int) -> float:
    """GPipe and 1F1B's idle fraction of the whole step, equal stages and free p2p: (p-1) / (m+p-1). The bubble
    is p-1 micro-batch slots of forward and backward; the step is m + p - 1 of them (GPipe, Huang et al. 2019,
    arXiv 1811.06965, sec. 2.3, writes it O((K-1)/(M+K-1)))."""
    return (p - 1) / (m + p - 1)


def bubble_over_ideal(p: int, m: int) -> float:
    """The same bubble over the ideal time m·(t_f + t_b) instead of the step: (p-1)/m, the "bubble time
    fraction" t_pb / t_id of Narayanan et al. 2021 (arXiv 2104.04473, sec. 2.2.1)."""
    return (p - 1) / m


def bubble_table(search) -> Table:
    """The formula against the planner's term for the best pipeline layout: the bubble and p2p seconds over the
    pipeline's part of the step (the step less exposed DP communication)."""
    c = best_pipeline(search)
    t = c.estimate.terms
    pipe = c.estimate.step_s - t.get("dp_comm_exposed_s", 0.0)
    p, m, bubble = c.layout.pp, c.layout.microbatches, t["bubble_and_p2p_s"]
    rows = [["(p-1)/(m+p-1): the bubble over the step", f"{bubble_formula(p, m):.2%}"],
            ["planner: bubble and p2p over the pipeline's time", f"{bubble / pipe:.2%}"],
            ["(p-1)/m: the bubble over the ideal time (Narayanan et al. sec. 2.2.1)", f"{bubble_over_ideal(p, m):.2%}"],
            ["planner: bubble and p2p over the rest of the pipeline's time", f"{bubble / (pipe - bubble):.2%}"],
            ["planner: bubble and p2p (s)", f"{bubble:.2f}"]]
    return Table(["", "value"], rows, c.layout.label())


def meta_middle_layers(layers: int = 126, pp: int = 16) -> int:
    """Layers per middle stage when the first and last stages hold one fewer (arXiv 2407.21783 sec. 3.3.2)."""
    middle = (layers + 2) // pp
    if (pp - 2) * middle + 2 * (middle - 1) != layers:
        raise ValueError(f"{layers} layers do not split so over {pp} stages")
    return middle


def table4() -> Table:
    t = LLAMA3_405B_TABLE4
    return Table(t["columns"], [[f"{v:,}" if isinstance(v, int) else v for v in r] for r in t["rows"]], t["source"])


EXERCISES = (
    Exercise("11-ddp-state", "Llama 3 70B (70.6B parameters, bf16) under plain DDP: each GPU holds the whole model. "
             "Params + grads + AdamW state per GPU, in GiB?", "GiB", lambda: model_state_GiB("DDP"),
             tolerance=0.02, hint="bf16 params and grads (2 + 2 bytes) and AdamW's fp32 master, m and v "
                                  "(12 bytes): 16 bytes per parameter",
             why="16 bytes x 70.6e9: over 13 times an 80 GiB H100, before a single activation."),
    Exercise("11-fsdp-state", "The same model under FSDP over all 64 GPUs: params + grads + AdamW state per GPU, "
             "in GiB?", "GiB", lambda: model_state_GiB("FSDP"), tolerance=0.02,
             hint="FSDP shards all three over the 64 ranks",
             why="1/64 of DDP's: the model state fits; what is left of 80 GiB is for activations."),
    Exercise("11-best-tp", "The planner's #1 layout for Llama 3 70B on 64 H100 (8 per node), 256 sequences of "
             "8192: its tensor-parallel size tp?", "count", lambda: plan_70b().ranked[0].layout.tp, tolerance=0,
             hint="TP costs communication inside every layer; FSDP shards the model without it",
             why="see the explanation below: which terms decide."),
    Exercise("11-best-pp", "And its pipeline size pp (1 = no pipeline)?", "count",
             lambda: plan_70b().ranked[0].layout.pp, tolerance=0,
             hint="a pipeline idles (p-1)/(m+p-1) of the step and its stages run TP groups of their own",
             why="see the families table below for what each family lost on."),
    Exercise("11-bubble", "The best pipeline layout of the ranking (printed above): from its p stages and m "
             "micro-batches per step, the bubble fraction (p-1)/(m+p-1), in %?", "%",
             lambda: 100 * bubble_formula(best_pipeline(plan_70b()).layout.pp,
                                          best_pipeline(plan_70b()).layout.microbatches),
             tolerance=0.02, abs_tolerance=0.1,
             hint="p and m are in its label: pp p, mb b x m; the bubble is p-1 slots of a step of m+p-1",
             why="with m >> p the bubble is small; the planner's term adds p2p and unequal stages. Narayanan et "
                 "al. divide the same bubble by the ideal time instead, (p-1)/m: a little larger."),
    Exercise("11-meta-stage-layers", "Llama 3 405B has 126 layers on PP 16 (Table 4). To balance the pipeline, "
             "Meta \"reduce[s] one Transformer layer each from the first and the last stages\" (sec. 3.3.2), "
             "which also hold the embedding and the head. How many layers does each of the 14 middle stages "
             "hold?", "count", lambda: meta_middle_layers(), tolerance=0,
             hint="14 stages of x layers and 2 of x - 1 hold all 126",
             why="16 x 8 = 128 = 126 + 2: the middle stages hold 8, the first and last 7, where an even split "
                 "would need 7.875 layers per stage. The planner's even splits cannot express this."),
)
