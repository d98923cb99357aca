"""Simulation at scale (issue 15 item 5, issue 13's speed target): each case in its own process pinned to one
core. Prints wall time (build + simulate + step summary), peak memory (the process's peak resident set,
resource.getrusage), CPU seconds (user + system: what the wall time is on an idle core) and the machine's load
average when it ran (other processes slow a shared core down: compare cpu_s with the targets then).

    python benchmarks/sim_scale.py [--full] [--json] [--only NAME]

Cases and targets:
- ddp-70b-256: scenarios/ddp-llama-70b.yaml on 32 nodes (no target; ``--full`` also runs every rank).
- ddp-70b-1024: the same on 128 nodes (1024 H100): <= 10 s, <= 1 GiB (issue 15).
- llama3-405b-16k: Llama 3 405B on 16,384 H100, tp 8, pp 16, dp 128, 1F1B, 16 micro-batches of one 8192-token
  sequence (Llama 3 paper, arXiv 2407.21783, Table 4: 16M tokens per batch, batch 16 per data-parallel
  replica; the first and last stage one block fewer, 7 + 14 x 8 + 7 = 126, sec. 3.3.2): <= 60 s, <= 4 GiB.
- gpt-1t-3072: GPT 1T of Narayanan et al. 2021 (arXiv 2104.04473) Table 1, last row: 128 layers, hidden 25600,
  160 heads, vocabulary 51,200, sequence 2048, tp 8, pp 64 on 3072 A100 (dp 6), global batch 3072 = 512
  micro-batches of 1 per pipeline, 1F1B, Megatron TP without sequence parallelism, full recompute: <= 60 s.
- llama3-70b-64: Llama 3 70B on 64 H100, tp 8, pp 4, dp 2, 1F1B, 32 micro-batches (issue 13): <= 30 s.
"""
import json
import os
import sys
import time

from one_core import finish, pin_to_one_core, run_child, usage

HERE = os.path.dirname(os.path.abspath(__file__))
DDP_70B = os.path.join(HERE, "..", "scenarios", "ddp-llama-70b.yaml")
CASES = {   # name -> (target s, target MiB)
    "ddp-70b-256": (None, None),
    "ddp-70b-1024": (10.0, 1024.0),
    "llama3-405b-16k": (60.0, 4096.0),
    "gpt-1t-3072": (60.0, None),
    "llama3-70b-64": (30.0, None),
}


def build(name: str):
    """(plan, cluster) of a case."""
    from distlab.sim import scenario as sc
    if name.startswith("ddp-70b"):
        r = sc.build(sc.validate({**sc.load(DDP_70B), "nodes": 32 if name.endswith("256") else 128}, "scenario"))
        return r.plan, r.cluster
    if name == "llama3-70b-64":
        d = {"model": {"preset": "llama3-70b", "micro_batch": 1}, "mesh": {"dp": 2, "pp": 4, "tp": 8},
             "tp": {"sequence_parallel": True, "recompute": "selective", "schedule": "1f1b", "microbatches": 32},
             "cluster": "dgx-h100", "nodes": 8}
        r = sc.build(sc.validate(d, "scenario"))
        return r.plan, r.cluster
    from distlab.sim.mesh import Mesh
    from distlab.sim.parallel.pipeline.plan import PipelineSpec
    from distlab.sim.parallel.tp.pipeline import pp_tp_plan
    from distlab.sim.parallel.tp.plan import TPOptions
    if name == "llama3-405b-16k":
        d = {"model": {"preset": "llama3-405b", "micro_batch": 1}, "cluster": "dgx-h100", "nodes": 2048}
        dims, split = {"dp": 128, "pp": 16, "tp": 8}, [7] + [8] * 14 + [7]
        opts = TPOptions(sequence_parallel=True, recompute="selective", schedule="1f1b", microbatches=16)
    else:
        d = {"model": {"arch": "gpt2", "layers": 128, "hidden": 25600, "heads": 160, "seq_len": 2048,
                       "vocab": 51200, "micro_batch": 1, "dtype": "bfloat16"}, "cluster": "dgx-a100", "nodes": 384}
        dims, split = {"dp": 6, "pp": 64, "tp": 8}, None
        opts = TPOptions(sequence_parallel=False, recompute="full", schedule="1f1b", microbatches=512)
    model, cluster = sc.resolve(d, name)
    spec = PipelineSpec(schedule="1f1b", stages=dims["pp"], microbatches=opts.microbatches,
                        data_parallel=dims["dp"], split=split)
    return pp_tp_plan(model, Mesh(dims), spec, opts, cluster=cluster), cluster


def one(name: str, symmetric: bool) -> dict:
    """Build and simulate one case in this process; return its figures."""
    pin_to_one_core()
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.result import step_summary
    t0 = time.perf_counter()
    plan, cluster = build(name)
    t1 = time.perf_counter()
    trace = simulate(plan, cluster, record_transfers=False, symmetric=symmetric)
    summary = step_summary(trace)
    wall = time.perf_counter() - t0
    simulated = len({o.rank for o in getattr(trace.ops, "records", trace.ops)})
    return {"case": name, "world_size": plan.world_size, "symmetric": symmetric, "wall_s": round(wall, 3),
            **usage(), "build_s": round(t1 - t0, 3),
            "ranks_simulated": simulated, "step_s": summary["step_s"], "ops": len(trace.ops)}


def main() -> int:
    if "--one" in sys.argv:
        name, symmetric = sys.argv[2], sys.argv[3] == "1"
        print(json.dumps(one(name, symmetric)))
        return 0
    names = [sys.argv[sys.argv.index("--only") + 1]] if "--only" in sys.argv else list(CASES)
    rows = []
    for name in names:
        target_s, target_mib = CASES[name]
        for symmetric in (True, False) if "--full" in sys.argv and name == "ddp-70b-256" else (True,):
            row = run_child(__file__, "--one", name, "1" if symmetric else "0")
            row["target_s"], row["target_MiB"] = target_s, target_mib
            row["ok"] = not symmetric or ((target_s is None or row["wall_s"] <= target_s)
                                          and (target_mib is None or row["peak_MiB"] <= target_mib))
            rows.append(row)
            if "--json" not in sys.argv:
                target = "".join([f" (target {target_s:.0f} s" if target_s else "",
                                  f", {target_mib:.0f} MiB" if target_mib else "", ")" if target_s else ""])
                print(f"{name:>16} {row['world_size']:>6} GPUs, {'symmetric' if symmetric else 'full':>9}: "
                      f"{row['wall_s']:7.2f} s wall ({row['cpu_s']:.2f} s CPU, build {row['build_s']:.2f} s), "
                      f"peak {row['peak_MiB']:7.1f} MiB"
                      f"{target}, {row['ranks_simulated']} ranks simulated, {row['ops']:,} op records, step "
                      f"{row['step_s']:.6f} s, load {row['load_1min']}", flush=True)
    return finish(rows)


if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    from accuracy_doc import run_main
    sys.exit(run_main("sim_scale", main))
