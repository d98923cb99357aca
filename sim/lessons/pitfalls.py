"""Lesson 08 (pitfalls), the simulator side: DistributedSampler's arithmetic, the plan of the `if rank != 3` bug,
and barriers against a straggler, simulated; tables of what the real ranks of runtime/lessons/pitfalls.py saw. No torch.
"""
from __future__ import annotations

import math

from distlab.sim.lessons.helpers import Table

MiB = 2**20


def sampler_share(n: int, world: int, drop_last: bool = False) -> int:
    """Samples per rank per epoch with DistributedSampler (torch/utils/data/distributed.py): without drop_last
    the indices are padded by repeating the first ones up to ceil(n / world) per rank; with it, cut to floor."""
    if drop_last and n % world:
        return math.ceil((n - world) / world)
    return math.ceil(n / world)


def _short(xs, k: int = 8) -> str:
    return " ".join(map(str, xs[:k])) + (" ..." if len(xs) > k else "")


def sampler_table(results: list[dict], title: str = "") -> Table:
    """What each real rank read: without a sampler, with DistributedSampler but no set_epoch, and with it."""
    rows = []
    for r in results:
        rows.append([r["rank"], _short(r["naive"][0]), _short(r["no_set_epoch"][0]), _short(r["no_set_epoch"][1]),
                     _short(r["set_epoch"][0]), _short(r["set_epoch"][1])])
    return Table(["rank", "no sampler, epoch 0", "sampler, epoch 0", "sampler, epoch 1 (no set_epoch)",
                  "set_epoch(0)", "set_epoch(1)"], rows, title or "sample indices each rank reads")


def data_summary(results: list[dict]) -> dict:
    """Counts over the real ranks: samples read per epoch (all ranks), distinct ones, and whether epochs repeat."""
    def per_epoch(key, e):
        return [i for r in results for i in r[key][e]]
    naive, fixed = per_epoch("naive", 0), per_epoch("no_set_epoch", 0)
    return {"no sampler: samples read": len(naive), "no sampler: distinct": len(set(naive)),
            "sampler: samples read": len(fixed), "sampler: distinct": len(set(fixed)),
            "no set_epoch: epochs identical": all(r["no_set_epoch"][0] == r["no_set_epoch"][1] for r in results),
            "set_epoch: epochs identical": all(r["set_epoch"][0] == r["set_epoch"][1] for r in results),
            "len(sampler) of 18 samples": [r["odd_len"] for r in results]}


def seed_table(results: list[dict], base_seed: int = 1234) -> Table:
    return Table(["rank", f"torch.rand(3), seed {base_seed}", f"torch.rand(3), seed {base_seed} + rank",
                  "weight[0,0] before DDP", "after DDP(model)", "checkpoint loads equal"],
                 [[r["rank"], " ".join(f"{x:.3f}" for x in r["shared_seed"]),
                   " ".join(f"{x:.3f}" for x in r["rank_seed"]), f"{r['w_before_ddp']:+.4f}",
                   f"{r['w_after_ddp']:+.4f}", r["loaded_equal"]] for r in results],
                 "one seed everywhere against base_seed + rank; DDP broadcasts rank 0's weights")


# --- the hang -------------------------------------------------------------------------------------------------
def skip_plan(world: int = 4, skip: int = 3):
    """The plan of runtime.lessons.pitfalls._skip_task: all_reduce(grad), all_reduce(loss) except on ``skip``, barrier."""
    from distlab.sim.plan import Collective, Plan
    ranks = [[Collective("all_reduce", 4096)] + ([Collective("all_reduce", 4)] if r != skip else []) +
             [Collective("barrier", 0)] for r in range(world)]
    return Plan(ranks, name="skip").validate()


# --- barriers against a straggler -------------------------------------------------------------------------------
def barrier_plan(world: int = 4, micro: int = 4, barrier: bool = False, ms: float = 20.0, slow: dict | None = None,
                 grad_bytes: int = MiB):
    """One step of gradient accumulation: ``micro`` compute chunks of ``ms`` (times ``slow[(rank, m)]``), a
    barrier after each chunk if ``barrier`` (the overuse), then one all_reduce of the gradients."""
    from distlab.sim.plan import Collective, Compute, Plan
    ranks = []
    for r in range(world):
        ops = []
        for m in range(micro):
            ops.append(Compute(f"micro {m}", seconds=ms * 1e-3 * (slow or {}).get((r, m), 1.0)))
            if barrier:
                ops.append(Collective("barrier", 0, stream="compute"))
        ops.append(Collective("all_reduce", grad_bytes, stream="compute"))
        ranks.append(ops)
    return Plan(ranks, name=f"{'barriers' if barrier else 'no barriers'}").validate()


def rotating(world: int = 4, micro: int = 4, factor: float = 3.0) -> dict:
    """A straggler that moves: at micro-step m, rank m mod world is ``factor`` times slower (a data-loader
    hiccup, a noisy neighbour)."""
    return {(m % world, m): factor for m in range(micro)}


def barrier_variants(world: int = 4, micro: int = 4, ms: float = 20.0, factor: float = 3.0, straggler: int = 3):
    """name -> (plan, sim slowdown): rank ``straggler`` always slow (a sim straggler; the explicit plan for real
    ranks), or the slowness rotating; each with and without a barrier after every micro-step."""
    fixed = {(straggler, m): factor for m in range(micro)}
    out = {}
    for b in (False, True):
        tag = "barriers" if b else "no barriers"
        out[f"rank {straggler} slow, {tag}"] = (barrier_plan(world, micro, b, ms, fixed), None)
        out[f"rotating, {tag}"] = (barrier_plan(world, micro, b, ms, rotating(world, micro, factor)), None)
    out["sim straggler"] = (barrier_plan(world, micro, False, ms), {straggler: factor})
    return out


def simulate_variants(variants: dict, cluster: str = "dgx-h100") -> dict:
    """name -> simulated Trace (sim stragglers where the variant has a slowdown)."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.kernel.engine import simulate
    c = load_cluster(cluster, 1)
    return {name: simulate(plan, c, slowdown=slow) for name, (plan, slow) in variants.items()}


def waiting(trace) -> dict:
    """rank -> seconds spent waiting for peers in collectives (sim.analysis.time_breakdown)."""
    from distlab.sim.analysis import time_breakdown
    return {t.rank: t.waiting_s for t in time_breakdown(trace)}


def barrier_table(simulated: dict, measured: dict | None = None) -> Table:
    rows = []
    for name, tr in simulated.items():
        m = (measured or {}).get(name)
        w = waiting(tr)
        rows.append([name, f"{tr.makespan * 1e3:.1f}", f"{m.makespan * 1e3:.1f}" if m else "-",
                     f"{sum(w.values()) / len(w) * 1e3:.1f}",
                     f"{sum(waiting(m).values()) / len(w) * 1e3:.1f}" if m else "-"])
    return Table(["variant", "step simulated (ms)", "step measured (ms)", "mean wait, sim (ms)",
                  "mean wait, real (ms)"], rows, "gradient accumulation, 4 micro-steps of 20 ms")


def barrier_cost_ms(world: int = 4, micro: int = 4, ms: float = 20.0, factor: float = 3.0) -> float:
    """Simulated: how much longer a step takes with a barrier after every micro-step, rotating straggler."""
    v = simulate_variants(barrier_variants(world, micro, ms, factor))
    return (v["rotating, barriers"].makespan - v["rotating, no barriers"].makespan) * 1e3
