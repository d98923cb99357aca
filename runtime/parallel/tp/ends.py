"""The host CPU of a TP model's ends (the embedding; the final norm, head and loss) beyond what their DTensor ops
cost at the block's rate, measured on its own in the TP calibration rounds (runtime/parallel/tp/calibrate.py).

The block probe (calibrate.py; fit.py ``launch_seconds``) prices a DTensor op as a transformer block dispatches them
(~35-55 us here). The ends dispatch few DTensor ops but do more host work per op: RowwiseParallel on the
embedding shards the table on rows and masks the tokens outside this rank's rows (torch 2.13
torch/distributed/tensor/_ops/_embedding_ops.py ``MaskPartial``: the mask, the offset, the masked lookup and its
reduction to Shard(1), all inside one dispatched op), its backward the masked embedding backward; the head's
ColwiseParallel redistributes its Shard(1) input and Shard(-1) output to Replicate (tensor/parallel/style.py)
around one matmul, then the plain loss. Per step on 2 gloo ranks (tp 2, one micro-batch), thread CPU: embedding
~1.0 ms forward, ~0.8 ms backward for 1 and 2 DTensor ops; head ~1.8 and ~1.8 ms for 11 and 27.

Rank side (``EndsProbe``): each end parallelized with the run's root plan (runtime/parallel/tp/run.py root_plan, no loss
parallel) on the tp group, and the same end unparallelized; per end and direction (forward, backward), thread CPU
(``time.thread_time``), the median of ``CALLS`` calls: parallel - plain - its collectives' issue CPU (the block
probe's bare functional collective of each kind, which the fitted collectives carry: calibrate.py), the DTensor
ops and collectives of each counted once by the capture (runtime/parallel/tp/capture.py CollectiveCapture).
Host side (``ends_host``): per end and direction, host = the median over rounds of the slowest rank's value minus
its DTensor ops x launch_s (charged already: sim/parallel/tp/plan.py DTENSOR_OPS), at least 0; runtime/parallel/tp/validate.py puts
it in the timed plan as a Compute op "host END PHASE" after the end's compute op.
"""
from __future__ import annotations

import statistics
import time

CALLS = 5
ENDS = ("embed", "head")
PHASES = ("fwd", "bwd")
AFTER = {"embed fwd": "fwd embed", "embed bwd": "bwd embed", "head fwd": "fwd lm_head", "head bwd": "bwd lm_head"}


class EndsProbe:
    """Rank side (module docstring). ``c``: the model config; ``mesh``: a 1-D DeviceMesh of the tp group;
    ``root``: the run's root plan; ``capture``: the dispatch-mode class that counts DTensor ops and collectives."""

    def __init__(self, model, mesh, root: dict, capture):
        import torch
        from torch.distributed.tensor.parallel import parallelize_module

        from distlab.runtime.parallel.tp.model import Stage, build_llama
        c, n = model.config, mesh.size()
        torch.manual_seed(0)
        self.x = torch.randint(0, c["vocab"], (c["micro_batch"], c["seq_len"]))
        sp = "norm_f" in root                                     # SP: the head's input is Shard(1) of the sequence
        self.h_par = torch.ones(c["micro_batch"], c["seq_len"] // n if sp else c["seq_len"], c["hidden"],
                                requires_grad=True)
        self.h_plain = torch.ones(c["micro_batch"], c["seq_len"], c["hidden"], requires_grad=True)
        self.mods = {}
        for end in ENDS:
            plan = {k: v for k, v in root.items() if k.startswith("embed") == (end == "embed")}
            self.mods[end] = (parallelize_module(Stage(build_llama(model), [end]), mesh, plan),
                              Stage(build_llama(model), [end]))
        self.ops, self.calls = {}, {}
        for end in ENDS:
            self._step(end, 0)                                      # warm-up (sharding propagation caches)
            cap = capture()
            with cap:
                self._step(end, 0, cap)
            for phase, name in zip(PHASES, ("forward", "backward")):
                self.ops[f"{end} {phase}"] = cap.dtensor_ops.get(name, 0)
                self.calls[f"{end} {phase}"] = [k for k, *rest in cap.calls if rest[-1] == name]

    def _step(self, end: str, which: int, cap=None) -> tuple[float, float]:
        """Thread CPU seconds (forward, backward) of one step of ``end``, parallel (0) or plain (1)."""
        import torch.nn.functional as F
        m = self.mods[end][which]
        m.zero_grad(set_to_none=True)
        if cap is not None:
            cap.phase = "forward"
        t0 = time.thread_time()
        if end == "embed":
            y = m(self.x).sum()
        else:
            logits = m(self.h_par if which == 0 else self.h_plain)
            y = F.cross_entropy(logits.flatten(0, 1).float(), self.x.flatten())
        t1 = time.thread_time()
        if cap is not None:
            cap.phase = "backward"
        y.backward()
        return t1 - t0, time.thread_time() - t1

    def round(self, issue: dict) -> dict:
        """{"END PHASE": host CPU seconds} of one round; ``issue``: {collective kind: issue CPU seconds}."""
        out = {}
        for end in ENDS:
            par = [self._step(end, 0) for _ in range(CALLS)]
            plain = [self._step(end, 1) for _ in range(CALLS)]
            for i, phase in enumerate(PHASES):
                key = f"{end} {phase}"
                out[key] = (statistics.median(p[i] for p in par) - statistics.median(p[i] for p in plain)
                            - sum(issue.get(k, 0.0) for k in self.calls[key]))
        return out

    def kinds(self) -> set:
        """The collective kinds the ends issue (their issue CPU is needed)."""
        return {k for calls in self.calls.values() for k in calls}


def ends_host(results: list[dict], launch_s: float) -> dict:
    """{"END PHASE": seconds} (module docstring); {} for a calibration without the probe."""
    cals = [r["variants"][0].get("calibration") or {} for r in results]
    if not all(c.get("ends") for c in cals):
        return {}
    out = {}
    for key in cals[0]["ends"]:
        rounds = min(len(c["ends"][key]) for c in cals)
        host = statistics.median(max(c["ends"][key][i] for c in cals) for i in range(rounds))
        out[key] = max(host - cals[0]["ends_ops"][key] * launch_s, 0.0)
    return out


def with_ends_host(plan, host: dict):
    """``plan`` with a Compute "host END PHASE" of ``host[END PHASE]`` seconds after each of the end's compute op
    (AFTER; on its stream) on every rank that runs it."""
    from distlab.sim.plan import Compute, Plan
    after = {AFTER[k]: (f"host {k}", s) for k, s in host.items() if s > 0}
    if not after:
        return plan
    ranks = []
    for ops in plan.ranks:
        out = []
        for o in ops:
            out.append(o)
            if isinstance(o, Compute) and o.name in after:
                name, s = after[o.name]
                out.append(Compute(name, seconds=s, stream=o.stream))
        ranks.append(out)
    return Plan(ranks, name=plan.name, meta=plan.meta).validate()
