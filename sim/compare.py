"""Predicted against measured, op by op: two traces of the same plan (sim/trace.py's format) side by side.

The simulator (sim/kernel/engine.py) and the runtime (runtime/execute/executor.py ``merge_results``) both record each op of a
plan as an OpRecord keyed by (rank, index): ``index`` is the op's position in that rank's list of the plan, so
the same key is the same op in both traces. Times are seconds from each trace's own start (both start at 0).
For every op: start (when the rank reached it), duration (end - start; a collective's includes waiting for its
peers, on both sides) and error = (predicted - measured) / measured, the convention of runtime/measure/validation.py
(positive: the simulator predicts it longer). Totals: the makespan and each (rank, stream)'s busy time
(Trace.busy_time, the union of its ops' spans). Record and Wait are markers without duration and are left out.

``combined_chrome`` writes both into one Chrome/Perfetto trace: one process per rank, and per stream two
sibling threads, "predicted <stream>" above "measured <stream>".
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from distlab.sim.errors import ConfigError
from distlab.sim.trace import FORMAT, OpRecord, Trace

MARKERS = ("record", "wait")


ALLOWED = f"allowed: a {FORMAT} file (*.trace) or the Chrome trace distlab writes (*.json)"


def load_trace(path: str, cluster: str | None = None) -> Trace:
    """A trace file: native (``*.trace``, or JSON with ``"format": "distlab-trace/1"``) or the Chrome trace
    ``Trace.save`` writes for ``*.json``. With ``cluster`` (a preset name or a cluster YAML, e.g. the one
    `distlab calibrate` writes), a plan file (distlab-plan/1) is accepted too and simulated here on that cluster
    sized to the plan's world size. Bad input is a one-line ConfigError naming the file."""
    from distlab.sim.plan import FORMAT as PLAN_FORMAT
    from distlab.sim.io import load_json
    if not os.path.isfile(path):
        raise ConfigError("no such trace file", path)
    allowed = ALLOWED + (f", or a {PLAN_FORMAT} plan" if cluster else "")
    try:
        data = load_json(path, "trace")
    except ConfigError as e:
        raise ConfigError(f"not a trace: {str(e).removeprefix(f'{path}: ')}; {allowed}", path) from None
    try:
        if isinstance(data, dict) and data.get("format") == FORMAT:
            return checked(Trace.from_dict(data), path)
        if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
            return checked(from_chrome(data, path), path)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        detail = str(e).splitlines()[0][:120] if str(e) else "malformed"
        raise ConfigError(f"not a trace distlab wrote ({type(e).__name__}: {detail}); {allowed}", path) from None
    if cluster and isinstance(data, dict) and data.get("format") == PLAN_FORMAT:
        from distlab.sim.cluster import load_cluster
        from distlab.sim.kernel.engine import simulate
        from distlab.sim.plan import Plan
        plan = Plan.from_dict(data, path)
        trace = simulate(plan, load_cluster(cluster).with_world_size(plan.world_size), record_transfers=False)
        if plan.scenario is not None:         # its header (sim/scenario/header.py), for compare to show
            trace.meta["scenario"] = plan.scenario
        return trace
    raise ConfigError(f"not a trace; {allowed}", path)


MAX_TRACE_RANK = 1 << 20


def checked(trace: Trace, where: str) -> Trace:
    """A loaded trace whose records have the types and ranges compare reads (a hand-edited or truncated trace is a
    ConfigError naming the first bad record, not a TypeError deep in the comparison)."""
    import math

    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    def whole(x, lo=0, hi=MAX_TRACE_RANK):
        return isinstance(x, int) and not isinstance(x, bool) and lo <= x < hi
    for i, o in enumerate(trace.ops):
        ok = (whole(o.rank) and whole(o.index, 0, 1 << 40) and all(isinstance(x, str) for x in
              (o.stream, o.kind, o.name, o.op, o.algorithm)) and number(o.start) and number(o.end)
              and whole(o.bytes, 0, 1 << 60) and (o.launch is None or number(o.launch))
              and (o.group is None or (isinstance(o.group, tuple) and all(whole(g) for g in o.group)))
              and (o.peer is None or whole(o.peer)))
        if not ok:
            raise ConfigError(f"op record {i} (rank {o.rank!r}, index {o.index!r}) has a field of the wrong type or "
                              f"out of range; {ALLOWED}", where)
    if not isinstance(trace.meta, dict):
        raise ConfigError(f"'meta' must be an object; {ALLOWED}", where)
    return trace


def from_chrome(data: dict, where: str = "trace") -> Trace:
    """The ops of a Chrome trace written by Trace.to_chrome: pid = rank, thread name = stream, one "X" event per
    op with ``args.index`` (its slice starts at the op's launch when it has one) and, for a collective that
    waited for its peers, a "wait" slice before it on the same thread: the op's start. (A send's or receive's
    start before its launch is not in a Chrome trace: there it is the launch.)"""
    names, ops, waits = {}, [], {}
    for e in data["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e.get("pid"), e.get("tid")] = str(e.get("args", {}).get("name", e.get("tid")))
    for e in data["traceEvents"]:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "wait":
            waits.setdefault((e["pid"], e["tid"]), []).append(e)
        elif "index" in e.get("args", {}):
            ops.append(e)
    records = []
    for e in ops:
        args, begin, end = e["args"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6
        start = next((w["ts"] / 1e6 for w in waits.get((e["pid"], e["tid"]), ())
                      if abs(w["ts"] + w["dur"] - e["ts"]) < 1e-3), begin)
        kind, group = e.get("cat", "compute"), args.get("group")
        records.append(OpRecord(int(e["pid"]), names.get((e["pid"], e["tid"]), str(e["tid"])), int(args["index"]),
                                kind, e.get("name", ""), start, end, int(args.get("bytes", 0)), args.get("op", ""),
                                begin if kind in ("collective", "send", "recv") else None,
                                tuple(group) if group else None, args.get("algorithm", "")))
    if not records:
        raise ConfigError("a Chrome trace without distlab ops (no event has args.index)", where)
    records.sort(key=lambda o: (o.rank, o.index))
    return Trace(records, [], dict(data.get("otherData") or {}))


@dataclass
class OpPair:
    """One op of the plan in both traces."""
    predicted: OpRecord
    measured: OpRecord

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured duration; None when the measured op took no time."""
        m = self.measured.duration
        return (self.predicted.duration - m) / m if m > 0 else None

    def to_dict(self) -> dict:
        p, m = self.predicted, self.measured
        return {"rank": p.rank, "index": p.index, "stream": p.stream, "kind": p.kind, "name": p.name,
                "bytes": p.bytes, "predicted_start_s": p.start, "measured_start_s": m.start,
                "start_diff_s": p.start - m.start, "predicted_duration_s": p.duration,
                "measured_duration_s": m.duration, "duration_diff_s": p.duration - m.duration, "error": self.error}


@dataclass
class Comparison:
    predicted: Trace
    measured: Trace
    pairs: list[OpPair]
    missing: list[OpRecord] = field(default_factory=list)   # predicted ops the measured trace lacks

    def totals(self) -> dict:
        """Makespan and per (rank, stream) busy time, predicted against measured."""
        streams = sorted({(o.rank, o.stream) for o in self.predicted.ops if o.kind not in MARKERS})
        return {"makespan": _total(self.predicted.makespan, self.measured.makespan),
                "streams": [{"rank": r, "stream": s, **_total(self.predicted.busy_time(r, s),
                                                              self.measured.busy_time(r, s), "busy")}
                            for r, s in streams]}

    def worst(self, n: int = 5) -> list[OpPair]:
        """The ``n`` ops whose predicted duration is furthest from the measured one, in seconds."""
        return sorted(self.pairs, key=lambda p: -abs(p.predicted.duration - p.measured.duration))[:n]

    def to_dict(self, worst: int = 5) -> dict:
        meta = self.predicted.meta
        return {"schema": "distlab.compare/1", "plan": meta.get("plan"), "world_size": world_size(self.predicted),
                "predicted_source": meta.get("source"), "measured_source": self.measured.meta.get("source"),
                "totals": self.totals(), "ops": [p.to_dict() for p in self.pairs],
                "worst": [p.to_dict() for p in self.worst(worst)],
                "missing": [{"rank": o.rank, "index": o.index, "name": o.name} for o in self.missing]}


def _total(predicted: float, measured: float, what: str = "") -> dict:
    key = f"{what}_" if what else ""
    return {f"predicted_{key}s": predicted, f"measured_{key}s": measured,
            "error": (predicted - measured) / measured if measured > 0 else None}


def world_size(trace: Trace) -> int:
    return int(trace.meta.get("world_size") or 1 + max((o.rank for o in trace.ops), default=-1))


def compare(predicted: Trace, measured: Trace, where: str = "MEASURED") -> Comparison:
    """Pair the ops of two traces of the same plan by (rank, index). Different plans (their names, world sizes,
    or an op of another kind or name at the same place), or a measured op the prediction lacks, are a
    ConfigError at ``where``; predicted ops a partial measured run lacks are listed in ``missing``."""
    same = {"plan": (predicted.meta.get("plan"), measured.meta.get("plan")),
            "world_size": (world_size(predicted), world_size(measured))}
    for key, (p, m) in same.items():
        if p is not None and m is not None and p != m:
            raise ConfigError(f"the traces are of different plans: {key} {p!r} predicted, {m!r} measured", where)
    ops = {(o.rank, o.index): o for o in predicted.ops if o.kind not in MARKERS}
    pairs, seen = [], set()
    for m in sorted((o for o in measured.ops if o.kind not in MARKERS), key=lambda o: (o.rank, o.index)):
        p = ops.get((m.rank, m.index))
        if p is None or p.kind != m.kind or p.name != m.name:
            found = f"{p.kind} {p.name!r}" if p else "nothing"
            raise ConfigError(f"the traces are of different plans: rank {m.rank} op {m.index} is {m.kind} "
                              f"{m.name!r} measured, {found} predicted", where)
        pairs.append(OpPair(p, m))
        seen.add((m.rank, m.index))
    if not pairs:
        raise ConfigError("no op of the plan in the measured trace", where)
    return Comparison(predicted, measured, pairs, [o for k, o in sorted(ops.items()) if k not in seen])


def combined_chrome(c: Comparison) -> dict:
    """One Chrome/Perfetto trace of both: pid = rank ("rank r"), per stream the threads "predicted <stream>"
    and "measured <stream>" next to each other (thread_sort_index), each op an "X" slice (a collective's wait for
    its peers a separate "wait" slice before it), args with the op's index and the error."""
    events, tid = [], {}
    errors = {(p.measured.rank, p.measured.index): p.error for p in c.pairs}
    streams = sorted({(o.rank, o.stream) for t in (c.predicted, c.measured) for o in t.ops if o.kind not in MARKERS})
    for rank in sorted({r for r, _ in streams}):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    for rank, stream in streams:
        for side in ("predicted", "measured"):
            tid[rank, stream, side] = n = len([k for k in tid if k[0] == rank]) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": n,
                           "args": {"name": f"{side} {stream}"}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": n, "args": {"sort_index": n}})
    for side, trace in (("predicted", c.predicted), ("measured", c.measured)):
        for o in trace.ops:
            if o.kind in MARKERS:
                continue
            t, begin = tid[o.rank, o.stream, side], o.start if o.launch is None else o.launch
            if begin > o.start:
                events.append({"ph": "X", "name": f"wait {o.name or o.op}", "cat": "wait", "pid": o.rank, "tid": t,
                               "ts": o.start * 1e6, "dur": (begin - o.start) * 1e6})
            events.append({"ph": "X", "name": o.name or o.op or o.kind, "cat": o.kind, "pid": o.rank, "tid": t,
                           "ts": begin * 1e6, "dur": (o.end - begin) * 1e6,
                           "args": {"side": side, "index": o.index, "bytes": o.bytes, "op": o.op,
                                    "error": errors.get((o.rank, o.index))}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"plan": c.predicted.meta.get("plan"), "world_size": world_size(c.predicted),
                          "predicted": c.predicted.meta, "measured": c.measured.meta}}
