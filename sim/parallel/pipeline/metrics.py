"""Pipeline metrics from a trace (simulated or measured): makespan, bubble, in-flight microbatches, memory, p2p.

- bubble fraction = 1 - busy / (ranks x makespan), busy = time in compute ops, summed over ranks (a receive
  on the compute stream is waiting, not busy).
  Ideal (uniform stages, free p2p): GPipe and 1F1B (p-1)/(m+p-1); interleaved 1F1B (p-1)/(v·m+p-1)
  (Megatron-LM 2104.04473 section 2.2: bubble time / ideal time = (p-1)/m, resp. (p-1)/(v·m)).
- in flight: a microbatch is in flight on a stage from the start of its F until the end of its B (or of its W
  when the backward is split, Zero Bubble 2401.10241): its activations are held that long. Peak: GPipe m,
  1F1B p - s for stage s.
- activation memory of a rank = sum over its stages of in-flight microbatches x activation bytes per
  microbatch (plan meta), its peak over the step.
- p2p time: seconds the sends spent moving data (from both sides posted to done), summed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from distlab.sim.parallel.pipeline.schedules import Action
from distlab.sim.kernel.spans import union_length


def ideal_bubble(schedule: str, p: int, m: int, v: int = 1) -> float | None:
    """Closed-form bubble fraction for uniform stages and free p2p (None where there is no simple one)."""
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved":
        return (p - 1) / (v * m + p - 1)
    return None


@dataclass
class PipelineMetrics:
    makespan: float
    bubble: float
    busy: list[float]                  # compute busy seconds per rank
    peak_in_flight: dict[int, int]     # stage -> peak in-flight microbatches
    peak_stage_memory: dict[int, float]   # stage -> peak activation bytes
    peak_rank_memory: list[float]      # rank -> peak activation bytes
    p2p_seconds: float
    p2p_bytes: int

    def to_dict(self) -> dict:
        d = asdict(self)
        d["peak_in_flight"] = {str(k): v for k, v in self.peak_in_flight.items()}
        d["peak_stage_memory"] = {str(k): v for k, v in self.peak_stage_memory.items()}
        return d

    def rows(self) -> list[list]:
        return [[f"stage {s}", self.peak_in_flight[s], f"{self.peak_stage_memory[s] / 2**20:.3g} MiB"]
                for s in sorted(self.peak_in_flight)]


def actions_of(trace, rank: int | None = None) -> list[tuple[Action, object]]:
    """(action, op record) for every compute op whose name is an action ("2F5"), by start time. An action run
    as its kernels (ops named "2F5 fwd h.0.attn", sim/parallel/pipeline/plan.py) is one record from its first
    kernel's start to its last kernel's end."""
    from dataclasses import replace
    out, last = [], {}
    for o in sorted((o for o in trace.ops if o.kind == "compute" and (rank is None or o.rank == rank)),
                    key=lambda o: (o.start, o.end)):
        head, _, rest = o.name.partition(" ")
        a = Action.parse(head)
        if a is None:
            continue
        k = last.get(o.rank)
        if rest and k is not None and out[k][0] == a:
            out[k] = (a, replace(out[k][1], end=max(out[k][1].end, o.end)))
            continue
        last[o.rank] = len(out)
        out.append((a, o))
    out.sort(key=lambda t: (t[1].start, t[1].end))
    return out


def compute(trace, meta: dict | None = None) -> PipelineMetrics:
    """Metrics of ``trace``; ``meta`` = the plan's meta["pipeline"] (activation bytes); else trace.meta's."""
    meta = meta if meta is not None else trace.meta.get("pipeline", {})
    act_bytes = meta.get("activation_bytes") or []
    ranks = sorted({o.rank for o in trace.ops})
    makespan = trace.makespan
    acts = actions_of(trace)
    busy = [union_length((o.start, o.end) for _, o in acts if o.rank == r) for r in ranks]
    bubble = 1 - sum(busy) / (len(ranks) * makespan) if makespan > 0 else 0.0
    peak_flight: dict[int, int] = {}
    peak_stage_mem: dict[int, float] = {}
    peak_rank_mem = []
    for r in ranks:
        flight: dict[int, int] = {}
        mem = peak = 0.0
        events = []
        for a, o in actions_of(trace, r):
            if a.kind == "F":
                events.append((o.start, 1, a.stage))
            elif a.kind in ("B", "W"):        # a microbatch ends with its B, or with its W when split
                events.append((o.end, -1, a.stage))
        for _, delta, s in sorted(events, key=lambda e: (e[0], e[1])):
            per_mb = act_bytes[s] if s < len(act_bytes) else 0.0
            flight[s] = flight.get(s, 0) + delta
            mem += delta * per_mb
            peak = max(peak, mem)
            peak_flight[s] = max(peak_flight.get(s, 0), flight[s])
            peak_stage_mem[s] = max(peak_stage_mem.get(s, 0.0), flight[s] * per_mb)
        peak_rank_mem.append(peak)
    sends = [o for o in trace.ops if o.kind == "send"]
    p2p = sum(o.end - (o.launch if o.launch is not None else o.start) for o in sends)
    return PipelineMetrics(makespan, bubble, busy, dict(sorted(peak_flight.items())),
                           dict(sorted(peak_stage_mem.items())), peak_rank_mem, p2p, sum(o.bytes for o in sends))


def ideal_trace(actions: list[list[Action]], seconds, placement: list[int] | None = None):
    """Run per-rank action lists as soon as dependencies allow, with free p2p: a reference timeline
    (sim.trace.Trace) that needs no network. ``seconds(action) -> float``."""
    from distlab.sim.trace import OpRecord, Trace
    n_stages = 1 + max(a.stage for acts in actions for a in acts)
    done: dict[tuple, float] = {}
    pos = [0] * len(actions)
    clock = [0.0] * len(actions)
    ops = []
    progress = True
    while progress:
        progress = False
        for r, acts in enumerate(actions):
            while pos[r] < len(acts):
                a = acts[pos[r]]
                if a.kind == "F":
                    dep = (a.stage - 1, "F", a.mb) if a.stage > 0 else None
                elif a.kind in "BI":
                    dep = (a.stage + 1, "BI", a.mb) if a.stage + 1 < n_stages else (a.stage, "F", a.mb)
                else:
                    dep = (a.stage, "BI", a.mb)
                if dep is not None and dep not in done:
                    break
                start = max(clock[r], done.get(dep, 0.0))
                clock[r] = start + seconds(a)
                done[(a.stage, "BI" if a.kind in "BI" else a.kind, a.mb)] = clock[r]
                ops.append(OpRecord(r, "compute", pos[r], "compute", str(a), start, clock[r]))
                pos[r] += 1
                progress = True
    if any(pos[r] < len(acts) for r, acts in enumerate(actions)):
        raise RuntimeError("schedule deadlocks: " + ", ".join(str(acts[pos[r]]) for r, acts in enumerate(actions)
                                                              if pos[r] < len(acts)))
    return Trace(ops, [], {"source": "ideal"})
