"""Why the planner ranked what it ranked: a breakdown per term, #1 against #2 (the term that differs most, and the
single change to #2 that closes most of the gap), and the best layout of every family that lost."""
from __future__ import annotations

from dataclasses import replace

from distlab.sim.parallel.fsdp.memory import fits
from distlab.sim.planner.layouts import RECOMPUTE, SCHEDULES, Layout
from distlab.sim.planner.search import ESTIMATE_BOUND

TERMS = {"compute_s": "compute", "recompute_s": "recompute", "tp_comm_s": "TP communication",
         "cp_comm_exposed_s": "exposed CP communication (ring attention)",
         "dp_comm_exposed_s": "exposed DP/FSDP communication", "bubble_and_p2p_s": "pipeline bubble and p2p",
         "composed_s": "whole step (CP inside stages: the composition's program, not split by term)"}


def breakdown(search, c) -> dict:
    """Seconds per term (estimate), step (simulated when confirmed), memory and its headroom on the GPU."""
    gib = search.gpu_GiB
    out = {name: c.estimate.terms.get(key, 0.0) for key, name in TERMS.items()}
    out.update({"step_s": c.step_s, "estimate_s": c.estimate.step_s, "simulated_s": c.simulated_s,
                "confirmed": c.simulated_s is not None,
                "estimate_bound": None if c.simulated_s is not None else ESTIMATE_BOUND,
                "memory_GiB": c.memory_bytes / 2**30, "headroom_GiB": gib - c.memory_bytes / 2**30,
                "mfu": search.mfu(c), "tokens_per_s_per_gpu": search.tokens_per_s_per_gpu(c)})
    return out


def largest_difference(a, b) -> tuple[str, float]:
    """The term (name, seconds) by which candidate b's estimate exceeds a's the most."""
    diffs = {name: b.estimate.terms.get(k, 0.0) - a.estimate.terms.get(k, 0.0) for k, name in TERMS.items()}
    name = max(diffs, key=diffs.get)
    return name, diffs[name]


def neighbours(L: Layout, world: int, global_batch: int, layers: int, space=None) -> list[tuple[str, Layout]]:
    """Layouts one change away from L that keep the world size and the global batch: tp, pp or cp doubled or
    halved (dp takes the rest), micro-batch doubled or halved (micro-batches take the rest), sequence or loss
    parallelism toggled, another recompute, schedule (with its virtual stages), split or data-parallel kind.
    Stages split the ``layers`` evenly unless a split is given; ``space`` (a set of layouts): keep only those."""
    out = []

    def add(what: str, **kw):
        M = replace(L, **kw)
        stages = M.pp * M.virtual_stages
        ok = (M.world_size == world and M.dp * M.micro_batch * M.microbatches == global_batch
              and (layers % stages == 0 or M.split is not None) and M != L
              and not (M.schedule == "1f1b" and M.pp > 1 and M.microbatches < M.pp))
        if ok and (space is None or M in space):
            out.append((what, M))

    plain = {"split": None, "virtual_stages": 1, "schedule": "1f1b" if L.schedule == "interleaved" else L.schedule}
    for f in (2, 0.5):
        for dim in ("tp", "pp", "cp"):
            new = int(getattr(L, dim) * f)
            if new >= 1 and getattr(L, dim) * f == new and world % new == 0:
                others = {"tp": L.tp, "pp": L.pp, "cp": L.cp, dim: new}
                rest = world // (others["tp"] * others["pp"] * others["cp"])
                if rest >= 1 and world % (others["tp"] * others["pp"] * others["cp"]) == 0 \
                        and global_batch % (rest * L.micro_batch) == 0:
                    m = global_batch // (rest * L.micro_batch)
                    pp = others["pp"]
                    kind = L.dp_kind if pp == 1 else "ddp"
                    shard = L.dp_shard if kind == "hsdp" and rest % max(L.dp_shard, 1) == 0 and rest > L.dp_shard else 0
                    kind = "fsdp" if kind == "hsdp" and not shard else kind
                    add(f"{dim} {getattr(L, dim)} -> {new}", **{dim: new}, dp=rest, microbatches=m if pp > 1 else 1,
                        dp_kind=kind, dp_shard=shard, **plain)
        mb = int(L.micro_batch * f)
        if mb >= 1 and L.micro_batch * f == mb and global_batch % (L.dp * mb) == 0:
            m = global_batch // (L.dp * mb)
            if L.pp > 1 or L.dp_kind == "ddp" or m == 1:
                add(f"micro-batch {L.micro_batch} -> {mb}", micro_batch=mb, microbatches=m)
        if L.virtual_stages > 1:
            v = int(L.virtual_stages * f)
            if v > 1 and L.virtual_stages * f == v:
                add(f"virtual stages {L.virtual_stages} -> {v}", virtual_stages=v, split=None)
    if L.tp > 1:
        add(f"sequence parallel {'off' if L.sequence_parallel else 'on'}", sequence_parallel=not L.sequence_parallel)
        add(f"loss parallel {'off' if L.loss_parallel else 'on'}", loss_parallel=not L.loss_parallel)
    for rc in RECOMPUTE:
        add(f"recompute {L.recompute} -> {rc}", recompute=rc)
    if L.pp > 1:
        for sched in SCHEDULES:
            if sched != "interleaved":
                add(f"schedule {L.schedule} -> {sched}", schedule=sched, virtual_stages=1, split=None)
            elif L.schedule != "interleaved":
                add("schedule -> interleaved v2", schedule=sched, virtual_stages=2, split=None)
        if L.split is not None:
            add("even split", split=None)
    elif L.dp > 1:
        for kind in ("ddp", "fsdp"):
            if kind != L.dp_kind and (kind == "fsdp" or L.cp == 1):
                add(f"dp {L.dp_kind} -> {kind}", dp_kind=kind, dp_shard=0)
    return out


def first_vs_second(search, estimator) -> dict | None:
    """Why #1 beats #2 and the single change to #2 that would close the gap (or most of it)."""
    if len(search.ranked) < 2:
        return None
    a, b = search.ranked[0], search.ranked[1]
    term, seconds = largest_difference(a, b)
    best = None
    q = search.question
    layers = estimator.model(1).config["layers"]
    space = {c.layout for c in search.all}
    for what, M in neighbours(b.layout, q["world_size"], q["global_batch"], layers, space):
        mem = sum(estimator.memory(M).values())
        if not fits(mem, search.gpu_GiB):
            continue
        t = estimator.estimate(M).step_s
        if best is None or t < best[2]:
            best = (what, M, t)
    out = {"first": a.layout.label(), "second": b.layout.label(), "gap_s": b.step_s - a.step_s,
           "term": term, "term_gap_s": seconds}
    if best:      # an estimate (its bound: ESTIMATE_BOUND), held against #1's step as the table shows it
        out.update({"change": best[0], "changed": best[1].label(), "changed_step_s": best[2],
                    "changed_estimate_bound": ESTIMATE_BOUND, "closes_gap": best[2] <= a.step_s})
    return out


def families(search) -> list[dict]:
    """The best layout of each family (sim/planner/layouts.py Layout.family) and why it lost to #1."""
    top = search.ranked[0]
    best: dict[str, object] = {}
    smallest: dict[str, object] = {}
    for c in search.all:
        fam = c.layout.family
        if c.estimate is not None and (fam not in best or c.step_s < best[fam].step_s):
            best[fam] = c
        if fam not in smallest or c.memory_bytes < smallest[fam].memory_bytes:
            smallest[fam] = c
    rows = []
    for fam in sorted(smallest):
        if fam not in best:
            c = smallest[fam]
            rows.append({"family": fam, "best": None, "why": f"does not fit: needs at least "
                         f"{c.memory_bytes / 2**30:.1f} GiB per GPU ({c.layout.label()}) > {search.gpu_GiB:g} GiB"})
            continue
        c = top if fam == top.layout.family else best[fam]      # #1 is its family's best (the table's order)
        row = {"family": fam, "best": c.layout.label(), "step_s": c.step_s, "confirmed": c.simulated_s is not None,
               "estimate_bound": None if c.simulated_s is not None else ESTIMATE_BOUND}
        if c is top:
            rows.append({**row, "why": "the winner's family"})
            continue
        term, seconds = largest_difference(top, c)
        share = c.estimate.terms.get(_key(term), 0.0) / c.estimate.step_s
        if c.step_s < top.step_s:      # only an estimate can be shorter than the confirmed #1
            why = (f"estimated {(1 - c.step_s / top.step_s):.1%} shorter than #1, within the estimate's "
                   f"±{ESTIMATE_BOUND:.0%} (not simulated)")
        else:
            why = f"{term} {share:.0%} of its step (+{(c.step_s - top.step_s) * 1e3:.1f} ms over #1)"
        rows.append({**row, "why": why})
    return rows


def _key(name: str) -> str:
    return next(k for k, v in TERMS.items() if v == name)


def notes(search, top: int) -> list[str]:
    """What bounds the table's numbers: #1's compute notes from `distlab simulate` (sim/result.py ``throughput``:
    an MFU above the best published one for the GPU's generation by more than 15%, a generation without a fitted
    row), and any shown row whose MFU is above that bound (sim/compute/flops.py ``plausibility``)."""
    from distlab.sim.compute.flops import plausibility
    first = search.ranked[0]
    out = list((first.simulated or {}).get("compute_notes", []))
    worst = max(search.ranked[:max(top, 1)], key=search.mfu)
    line = plausibility(search.mfu(worst), search.cluster.gpu)
    if line and line.startswith("MFU") and not any(n.startswith("MFU") for n in out):
        out.append(line + (" (#1)" if worst is first else f" (row {search.ranked.index(worst) + 1}, an estimate)"))
    elif line and line not in out:           # no published MFU for the generation to hold the table to
        out.append(line)
    return out
