"""A Trace as Chrome trace-event JSON, laid out for Perfetto (ui.perfetto.dev) and chrome://tracing.

Format: the Trace Event Format (docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
  - one process per rank (pid = rank), named once ("M" process_name) and sorted by rank (process_sort_index);
  - one thread per stream, the same tid on every rank, named once ("M" thread_name) and sorted as the timeline
    PNG (thread_sort_index: compute above comm, Trace.stream_order);
  - "X" complete events for ops (a collective's wait for its peers is its own "wait ..." slice before it);
  - flow arrows ("s" start / "f" finish, bound to the enclosing slice, "bp": "e"): from the rank that arrived
    last at a collective (the one the others waited for) to every other member, and from each send to the
    recv it meets (the k-th send from a to b meets the k-th recv of b from a, as in sim/check.py);
  - simulated transfers under a "network" process, one thread per channel: NCCL splits a collective over
    several channels, so the same (source, destination) pair carries concurrent transfers; each gets its own
    thread ("0 -> 1 ch 1") instead of overlapping slices on one.
Times are microseconds (ts, dur).
"""
from __future__ import annotations

from collections import defaultdict


def _meta(name: str, pid: int, tid: int, value) -> dict:
    key = "sort_index" if name.endswith("sort_index") else "name"
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {key: value}}


def _begin(o) -> float:
    return o.start if o.launch is None else o.launch


def chrome_events(trace) -> list[dict]:
    ops = [o for o in trace.ops if o.kind not in ("record", "wait")]
    order = trace.stream_order()
    tid = {s: i + 1 for i, s in enumerate(order)}
    events = []
    used = {(o.rank, o.stream) for o in trace.ops}        # one pass (a step of 1000s of ranks: millions of ops)
    for rank in sorted({r for r, _ in used}):
        events += [_meta("process_name", rank, 0, f"rank {rank}"), _meta("process_sort_index", rank, 0, rank)]
        for stream in order:
            if (rank, stream) in used:
                events += [_meta("thread_name", rank, tid[stream], stream),
                           _meta("thread_sort_index", rank, tid[stream], tid[stream])]
    for o in ops:
        args = {"bytes": o.bytes, "index": o.index}
        if o.kind == "collective":
            args.update(op=o.op, algorithm=o.algorithm, group=list(o.group or ()))
            if o.launch is not None and o.launch > o.start:
                events.append({"ph": "X", "name": f"wait {o.name or o.op}", "cat": "wait", "pid": o.rank,
                               "tid": tid[o.stream], "ts": o.start * 1e6, "dur": (o.launch - o.start) * 1e6,
                               "args": {"waiting_for": "the last member to arrive"}})
        elif o.peer is not None:
            args["peer"] = o.peer
        events.append({"ph": "X", "name": o.name or o.op or o.kind, "cat": o.kind, "pid": o.rank,
                       "tid": tid[o.stream], "ts": _begin(o) * 1e6, "dur": (o.end - _begin(o)) * 1e6, "args": args})
    events += flow_events(ops, tid)
    events += network_events(trace, 1 + max((o.rank for o in trace.ops), default=-1))
    return events


def _arrow(flow_id: int, name: str, cat: str, src, dst, tid: dict) -> list[dict]:
    """One arrow from the middle of ``src``'s slice to the middle of ``dst``'s."""
    mid = lambda o: (_begin(o) + o.end) / 2 * 1e6  # noqa: E731
    return [{"ph": "s", "id": flow_id, "name": name, "cat": cat, "pid": src.rank, "tid": tid[src.stream],
             "ts": mid(src)},
            {"ph": "f", "bp": "e", "id": flow_id, "name": name, "cat": cat, "pid": dst.rank, "tid": tid[dst.stream],
             "ts": mid(dst)}]


def collective_instances(ops) -> dict[tuple, list]:
    """(group, stream, k) -> the records of the k-th collective each member issued on that group and stream."""
    per_rank = defaultdict(list)
    for o in sorted((o for o in ops if o.kind == "collective"), key=lambda o: (o.rank, o.index)):
        per_rank[(tuple(o.group or ()), o.stream, o.rank)].append(o)
    instances = defaultdict(list)
    for (group, stream, _), recs in per_rank.items():
        for k, o in enumerate(recs):
            instances[(group, stream, k)].append(o)
    return instances


def flow_events(ops, tid: dict) -> list[dict]:
    events, flow_id = [], 0
    for (group, _, k), recs in sorted(collective_instances(ops).items()):
        last = max(recs, key=lambda o: (o.start, -o.rank))       # the member the others waited for
        for o in sorted(recs, key=lambda o: o.rank):
            if o is not last:
                flow_id += 1
                events += _arrow(flow_id, f"{last.op} #{k}", "collective", last, o, tid)
    sends, recvs = defaultdict(list), defaultdict(list)
    for o in sorted((o for o in ops if o.peer is not None), key=lambda o: (o.rank, o.index)):
        (sends[o.rank, o.peer] if o.kind == "send" else recvs[o.peer, o.rank]).append(o)
    for pair in sorted(sends):
        for k, (s, r) in enumerate(zip(sends[pair], recvs.get(pair, []))):
            flow_id += 1
            events += _arrow(flow_id, f"send #{k} {pair[0]} -> {pair[1]}", "p2p", s, r, tid)
    return events


def channels(transfers) -> list[tuple[tuple[int, int, int], object]]:
    """Each transfer with its (src, dst, channel): concurrent transfers between one pair get channels 0, 1, ...
    (the lowest channel free at its start), so no two slices of one thread overlap."""
    busy = defaultdict(list)             # (src, dst) -> end time of each channel's last transfer
    out = []
    for t in sorted(transfers, key=lambda t: (t.start, t.src, t.dst, t.end)):
        ends = busy[t.src, t.dst]
        ch = next((i for i, end in enumerate(ends) if end <= t.start), None)
        if ch is None:
            ends.append(0.0)
            ch = len(ends) - 1
        ends[ch] = t.end
        out.append(((t.src, t.dst, ch), t))
    return out


def transfer_lanes(transfers, max_ranks: int = 16) -> tuple[list[int], list[tuple[object, int]], dict[int, int]]:
    """The rows and lanes of a transfers timeline (the PNG figures of sim/plots.py and sim/timeline_png.py):
    the sending switch (-1, NVLS) if any, then the first ``max_ranks`` sending ranks (one row each), and each of their
    transfers, in ``channels`` order, with its lane: the lowest lane of its source free at its start, so
    concurrent transfers from one rank (NCCL's channels, a tree's two children) never overlap. Returns
    (sources, [(transfer, lane)], {source: number of lanes})."""
    transfers = list(transfers)
    senders = sorted({t.src for t in transfers})
    srcs = [s for s in senders if s < 0] + [s for s in senders if s >= 0][:max_ranks]
    shown = set(srcs)
    placed, ends = [], {}
    for _, t in channels(t for t in transfers if t.src in shown):
        free = ends.setdefault(t.src, [])             # end time of each lane's last transfer
        lane = next((i for i, end in enumerate(free) if end <= t.start), None)
        if lane is None:
            free.append(0.0)
            lane = len(free) - 1
        free[lane] = t.end
        placed.append((t, lane))
    return srcs, placed, {src: len(free) for src, free in ends.items()}


def network_events(trace, pid: int) -> list[dict]:
    if not trace.transfers:
        return []
    from distlab.sim.plan import format_bytes
    placed = channels(trace.transfers)
    threads = sorted({key for key, _ in placed})
    tid = {key: i + 1 for i, key in enumerate(threads)}
    who = lambda r: "switch" if r < 0 else str(r)  # noqa: E731
    events = [_meta("process_name", pid, 0, "network"), _meta("process_sort_index", pid, 0, pid)]
    for key in threads:
        src, dst, ch = key
        events += [_meta("thread_name", pid, tid[key], f"{who(src)} -> {who(dst)} ch {ch}"),
                   _meta("thread_sort_index", pid, tid[key], tid[key])]
    for (src, dst, ch), t in placed:
        events.append({"ph": "X", "name": format_bytes(t.bytes), "cat": "transfer", "pid": pid,
                       "tid": tid[src, dst, ch], "ts": t.start * 1e6, "dur": (t.end - t.start) * 1e6,
                       "args": {"src": src, "dst": dst, "channel": ch, "bytes": t.bytes, "links": list(t.links)}})
    return events
