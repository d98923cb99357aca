"""Lesson 09's real run: the lesson's model (sim/lessons/bank_tp.py LESSON_MODEL) under the lesson's three plans
(bank_tp.PLANS: plain TP per module, plain TP with PrepareModuleInput, TP + SP) on 2 gloo ranks, one launch: each
rank's collectives as runtime/parallel/tp/run.py records them, and the counts torch's own CommDebugMode
(torch/distributed/tensor/debug/_comm_mode.py) reports for one more step."""
from __future__ import annotations

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")


def _kind(op_name: str) -> str:
    """CommDebugMode's key (e.g. ``c10d_functional.all_gather_into_tensor``) -> all_gather."""
    return next((k for k in KINDS if k in op_name), op_name)


def tp_commdebug(world: int = 2) -> dict:
    """{world_size, variants: [{sequence_parallel, prepare_input, sequence (rank 0, kind, bytes, dtype, group,
    phase), comm_debug {kind: calls}}]} for each plan of bank_tp.PLANS."""
    from distlab.runtime.parallel.tp.run import measured_sequence, run
    from distlab.sim.lessons.bank_tp import LESSON_MODEL, PLANS
    from distlab.sim.lessons.checker import quick
    variants = [{"model": LESSON_MODEL, **plan} for plan in PLANS]
    # Nothing here is timed: the lessons' quick mode skips the warm-up step (the captured step's collectives and
    # CommDebugMode's counts are the same with and without it, for all three plans: checked 2026-12-08).
    results = run(variants, world=world, steps=1, warmup=0 if quick() else 1, comm_debug=True)
    rank0 = next(r for r in results if r["rank"] == 0)["variants"]
    out = []
    for i, v in enumerate(variants):
        counts: dict = {}
        for name, n in rank0[i]["comm_debug"].items():
            counts[_kind(name)] = counts.get(_kind(name), 0) + n
        out.append({"sequence_parallel": v["sequence_parallel"], "prepare_input": v.get("prepare_input", False),
                    "comm_debug": counts,
                    "sequence": [list(c) for c in measured_sequence(results, i, 0)]})
    return {"world_size": world, "variants": out}
