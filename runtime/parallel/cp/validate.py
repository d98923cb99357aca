"""Real context parallelism against the simulator: calibrate, simulate the same step, compare
(`distlab validate --scenario cp.yaml`, benchmarks/cp_accuracy.py).

``validate_cp`` builds the scenario's plan for ``nproc`` ranks (cp over all of them), runs the same model with
torch's ring attention and FSDP2 (runtime/parallel/cp/run.py) on gloo ranks with the calibration rounds of
runtime/parallel/cp/calibrate.py in the same launch, simulates the plan on the fitted cluster with FSDP2 on one stream
(on CPU with gloo its collectives block; the ring's functional collectives stay asynchronous), and reports the
step (per step the slowest rank's uncaptured time; median over steps) predicted vs measured, and whether every
rank's collective sequence (kind, bytes, dtype, group, per-peer bytes) equals the plan's.
"""
from __future__ import annotations

import statistics

from distlab.runtime.measure.validation import case
from distlab.sim.errors import ConfigError


def prepare(scenario, nproc: int):
    """(model, the run's variant, the plan on ``nproc`` CPU ranks: cp over all of them, FSDP2 on one stream);
    refuses what the real run cannot do (recompute) before starting ranks."""
    from distlab.sim import scenario as sc
    from distlab.sim.parallel.cp.plan import cp_plan
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.mesh import Mesh
    from distlab.sim.models import model_from_spec
    s = sc.scenario_of(scenario)               # a Scenario as parsed (a mapping or a path: parsed here, once)
    if "cp" not in s.parallelisms:
        raise ConfigError("validate_cp needs a scenario with a cp: section", "cp")
    model, opts = model_from_spec(s.model_spec()), s.options("cp")
    if opts.recompute != "none":
        raise ConfigError(f"the real run does not recompute activations; got recompute {opts.recompute!r}; "
                          "allowed for a real run: none", "cp.recompute")
    variant = {"model": model, "rotate_method": opts.rotate_method, "load_balance": opts.load_balance,
               "mesh": [["cp", nproc]]}
    plan = cp_plan(model, Mesh({"cp": nproc}), opts, fsdp=FSDPOptions(overlap=False))
    return model, variant, plan


def validate_cp(scenario, nproc: int = 2, steps: int = 5, warmup: int = 1, timeout: float = 300.0) -> dict:
    """Run the scenario for real on ``nproc`` gloo ranks and compare (:func:`compare`)."""
    from distlab.runtime.parallel.cp.calibrate import plan_sizes
    from distlab.runtime.parallel.cp.run import run
    model, variant, plan = prepare(scenario, nproc)
    results = run([variant], world=nproc, steps=steps, warmup=warmup, timeout=timeout, calibrate=plan_sizes(plan))
    return compare(model, plan, results)


def measured_steps(results: list[dict], variant: int = 0) -> list[float]:
    """Per step, the slowest rank's uncaptured step time."""
    n = min(len(r["variants"][variant]["steps"]) for r in results)
    return [max(r["variants"][variant]["steps"][i]["time"] for r in results) for i in range(n)]


def compare(model, plan, results: list[dict]) -> dict:
    """{rows: [{what, bytes, predicted_s, measured_s, repeats}], sequence_match, cluster, plan, results}."""
    from distlab.runtime.parallel.cp.calibrate import fit_cluster
    from distlab.runtime.parallel.cp.run import measured_sequence
    from distlab.sim.parallel.cp.plan import collective_sequence
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.mesh import Mesh
    nproc = plan.world_size
    mesh = Mesh({"cp": nproc})
    cluster = fit_cluster(results, model, nproc)
    trace = simulate(plan, cluster, record_transfers=False)
    match = all(measured_sequence(results, 0, r) == collective_sequence(plan, mesh, r) for r in range(nproc))
    times = measured_steps(results)
    seq = collective_sequence(plan, mesh, 0)
    rows = [{"what": f"cp step ({len(seq)} collectives per rank, {plan.meta['rotate_method']})",
             "bytes": sum(s[1] for s in seq), "predicted_s": trace.makespan, "measured_s": statistics.median(times),
             "repeats": times}]
    return {"rows": rows, "sequence_match": match, "cluster": cluster, "plan": plan, "results": results}


def cp_cases(scenario, args) -> list[dict]:
    """`distlab validate --scenario cp.yaml` rows (runtime.measure.validation.case format): the step predicted
    (calibrated in the same launch) against measured, with whether the collective sequences match."""
    from distlab.runtime.commands.common import scenario_nproc
    nproc = scenario_nproc(args, 2)
    r = validate_cp(scenario, nproc=nproc, steps=max(getattr(args, "iters", 5), 2),
                    warmup=max(getattr(args, "warmup", 1), 1))
    out = []
    for row in r["rows"]:
        c = case("cp scenario", row["what"], nproc, row["bytes"], row["predicted_s"], row["measured_s"],
                 row["repeats"])
        c["sequence_match"] = r["sequence_match"]
        out.append(c)
    return out


def sequence_rows(world: int = 2, rotate_method: str = "alltoall") -> list[list]:
    """Lesson 10: a tiny Llama-style model (1 block, 16 tokens) through torch's ring on ``world`` gloo ranks;
    rank 0's collectives [#, kind, bytes, per-peer bytes, simulated the same?] in issue order."""
    from distlab.runtime.parallel.cp.run import measured_sequence, run
    from distlab.sim.parallel.cp.plan import CPOptions, collective_sequence, cp_plan
    from distlab.sim.mesh import Mesh
    from distlab.sim.models import gpt
    model = gpt(layers=1, hidden=32, heads=4, kv_heads=2, seq_len=16, vocab=64, dtype="float32", arch="llama",
                ffn_hidden=64, name="tiny-llama")
    results = run([{"model": model, "rotate_method": rotate_method}], world=world, steps=1, warmup=1)
    mesh = Mesh({"cp": world})
    want = collective_sequence(cp_plan(model, mesh, CPOptions(rotate_method=rotate_method)), mesh, 0)
    got = measured_sequence(results, 0, 0)
    rows = [[i, g[0], g[1], "-" if g[4] is None else list(g[4]), "yes" if i < len(want) and want[i] == g else "NO"]
            for i, g in enumerate(got)]
    return rows + ([] if len(got) == len(want) else [["", f"{len(want)} simulated", "", "", "NO"]])
