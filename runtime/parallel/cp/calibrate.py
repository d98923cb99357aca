"""Calibration for context parallelism, measured in the same launch as the CP steps (runtime/parallel/cp/run.py), and the
cluster fitted to it (runtime/parallel/cp/validate.py).

On the ranks (``Calibrator``), one round before each captured step, so that load from other processes falls on
both alike: every collective kind and size of the plan on the world group (cp only: the cp group is the world),
as the run issues them (all_gather / reduce_scatter as FSDP2's c10d calls; the ring's all_gather and permutes as
torch's functional collectives, issue to ``wait_tensor``); the model's forward+backward on one rank's s = S/cp
tokens alone (plain causal SDPA: the linears exactly as in the step, attention one ring step's size; every rank
runs it at once); a memory copy into a buffer (bytes/s).

On the host (``fit_cluster``): per collective the ring model t = steps·α + f·S/B (sim.collectives.ring_cost),
least squares over the sizes; the permute t = α + B/bw the same way, as the node's link (sim Send/Recv use the
link); a FLOP rate F (bisection, runtime/measure/validation.py roofline_cluster) such that the roofline total of the
cp = 1 plan's forward and backward ops on s tokens equals the forward+backward of one rank alone: the measured
time x min(1, cores / ranks), since all ranks computed at once on the machine's cores; the cluster then shares
its ``cpu_cores`` among the ranks computing (sim/kernel/cores.py), so a rank waiting for a rotation leaves its core to
the others. Per quantity: the median over rounds of the slowest rank (collectives) or of the median rank
(compute and copy, which each rank does on its own: the slowest of several short local timings on a busy
machine is mostly scheduler noise, and the simulator already makes ranks wait for each other).
"""
from __future__ import annotations

import statistics
import time


class Calibrator:
    """Rank side. ``sizes``: {op: [bytes, ...]} (nccl-tests bytes; "permute": bytes sent); ``model``: the sim
    Model of one rank's s tokens (:func:`local_model`); ``group``: the world group."""

    def __init__(self, sizes: dict, model, group):
        import torch
        import torch.distributed as dist

        from distlab.runtime.parallel.tp.model import build_llama
        self.sizes, self.group, self.n = sizes, group, dist.get_world_size(group)
        torch.manual_seed(0)
        self.module = build_llama(model)
        c = model.config
        self.x = torch.randint(0, c["vocab"], (c["micro_batch"], c["seq_len"]))
        self.buf, self.dst = torch.ones(4 << 20), torch.empty(4 << 20)
        self.times = {"collectives": {op: {str(b): [] for b in bs} for op, bs in sizes.items()},
                      "fwd_bwd": [], "copy": []}
        self._local_step()

    def _local_step(self) -> float:
        import torch.nn.functional as F
        t0 = time.perf_counter()
        F.cross_entropy(self.module(self.x).flatten(0, 1).float(), self.x.roll(-1, 1).flatten()).backward()
        t = time.perf_counter() - t0
        self.module.zero_grad(set_to_none=True)
        return t

    def round(self) -> None:
        import torch.distributed as dist
        for op, table in self.times["collectives"].items():
            for size, times in table.items():
                times.append(self._collective(op, int(size)))
        dist.barrier()
        self.times["fwd_bwd"].append(self._local_step())
        t0 = time.perf_counter()
        self.dst.copy_(self.buf)
        self.times["copy"].append(time.perf_counter() - t0)

    def _collective(self, op: str, nbytes: int) -> float:
        import torch
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol
        n, g = self.n, self.group
        numel = max(nbytes // 4 // n * n, n)
        dist.barrier(group=g)
        t0 = time.perf_counter()
        if op == "permute":
            out = funcol.permute_tensor(torch.ones(max(nbytes // 4, 1)), list(range(1, n)) + [0], g)
            funcol.wait_tensor(out)
        elif op == "all_gather":
            dist.all_gather_into_tensor(torch.empty(numel), torch.ones(numel // n), group=g)
        else:
            dist.reduce_scatter_tensor(torch.empty(numel // n), torch.ones(numel), group=g)
        return time.perf_counter() - t0

    def results(self) -> dict:
        from distlab.runtime.ranks.preflight import cpu_cores
        return {**self.times, "cores": cpu_cores()}


def local_model(model, cp: int):
    """``model`` on one cp rank's s = S/cp tokens, run alone (what the Calibrator times)."""
    from distlab.sim.models import model_from_spec
    return model_from_spec({**model.config, "seq_len": model.config["seq_len"] // cp, "name": model.name})


def plan_sizes(plan) -> dict:
    """{op: sorted distinct bytes} of ``plan``'s collectives and permutes (Send bytes), plus 8 x the largest
    (a second point for the fit)."""
    from distlab.sim.plan import Collective, Send
    out: dict = {}
    for o in plan.ranks[0]:
        if isinstance(o, Collective):
            out.setdefault(o.op, set()).add(o.bytes)
        elif isinstance(o, Send):
            out.setdefault("permute", set()).add(o.bytes)
    return {op: sorted(v | {8 * max(v)}) for op, v in out.items()}


def _over_rounds(cals: list[dict], get, across=max) -> float:
    """Median over rounds of ``across`` (the slowest, or the median) over ranks."""
    rounds = min(len(get(c)) for c in cals)
    return statistics.median(across([get(c)[i] for c in cals]) for i in range(rounds))


def _fit(pts, steps: int, f: float) -> tuple[float, float]:
    """(α per step seconds, bandwidth bytes/s) of t = steps·α + f·S/B by least squares (α = 0 if negative)."""
    import numpy as np
    slope, icpt = np.polyfit(*zip(*pts), 1) if len(pts) > 1 else (0.0, -1.0)
    if icpt < 0 or slope <= 0:
        slope, icpt = pts[-1][1] / pts[-1][0], 0.0
    return float(icpt) / steps, f / float(slope)


def fit_cluster(results: list[dict], model, world: int):
    """localhost-cpu on ``world`` ranks: fitted collectives, permute link, compute and memory rates."""
    from dataclasses import replace

    from distlab.runtime.measure.validation import roofline_cluster
    from distlab.sim.collectives import ring_cost
    from distlab.sim.parallel.cp.plan import cp_plan
    from distlab.sim.mesh import Mesh
    from distlab.sim.plan import Compute
    cals = [r["calibration"] for r in results]
    coll, link = {}, None
    for op, table in cals[0]["collectives"].items():
        pts = sorted((int(s), _over_rounds(cals, lambda c, op=op, s=s: c["collectives"][op][s])) for s in table)
        if op == "permute":
            link = _fit(pts, 1, 1.0)
            continue
        alpha, bw = _fit(pts, *ring_cost(op, world))
        coll[op] = {str(world): {"latency_us": alpha * 1e6 + 1e-3, "bandwidth_GBps": bw / 1e9}}
    cores = cals[0]["cores"]
    share = min(1.0, cores / world)          # all ranks timed the local work at once: each had this much core
    M = 2 * 4 * (4 << 20) / (_over_rounds(cals, lambda c: c["copy"], statistics.median) * share)
    one = cp_plan(local_model(model, world), Mesh({"cp": 1}))
    work = [(o.flops, o.bytes) for o in one.ranks[0] if isinstance(o, Compute)
            and o.name.split(" ")[0] in ("fwd", "bwd")]
    fb = _over_rounds(cals, lambda c: c["fwd_bwd"], statistics.median)
    two = roofline_cluster(work, fb * share, M, 2, coll)
    intra = two.intra_node if not link else replace(two.intra_node, bandwidth_GBps=link[1] / 1e9,
                                                     latency_us=link[0] * 1e6)
    # all ranks on this one machine, sharing its cores (sim/kernel/cores.py)
    return replace(two, gpus_per_node=world, intra_node=intra, cpu_cores=cores)
