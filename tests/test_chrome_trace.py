"""Issue 12.6: Chrome traces that read well in Perfetto (names once, sort order as the PNG, channels, flow
arrows) and timeline figures that draw quickly, with a legend and one title."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

from distlab.sim.cluster import load_cluster
from distlab.sim.kernel.engine import simulate, simulate_collective
from distlab.sim.plan import Collective, Compute, Plan, Record, Recv, Send, Wait
from distlab.sim.trace import Trace
from tests.conftest import one_node


def two_stream_plan(n: int = 4) -> Plan:
    """Compute (longer on higher ranks), then two all-reduces on 'comm' once it is done; rank 0 sends two
    messages to rank 1 ('p2p')."""
    ranks = []
    for r in range(n):
        ops = [Compute("forward", seconds=1e-3 * (1 + r)), Record("forward done"),
               Wait("forward done", stream="comm"), Collective("all_reduce", 2**20, stream="comm"),
               Collective("all_reduce", 2**16, stream="comm")]
        if r == 0:
            ops += [Send(peer=1, bytes=4096, stream="p2p"), Send(peer=1, bytes=8192, stream="p2p")]
        if r == 1:
            ops += [Recv(peer=0, bytes=4096, stream="p2p"), Recv(peer=0, bytes=8192, stream="p2p")]
        ranks.append(ops)
    return Plan(ranks, name="two-stream").validate()


def events_of(trace: Trace) -> list[dict]:
    return json.loads(trace.to_chrome())["traceEvents"]


def test_every_process_and_thread_named_once_and_sorted_as_the_png():
    trace = simulate(two_stream_plan(), one_node(4))
    events = events_of(trace)
    meta = Counter((e["name"], e["pid"], e["tid"]) for e in events if e["ph"] == "M")
    assert set(meta.values()) == {1}                                       # each name given once
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    order = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in events if e["name"] == "thread_sort_index"}
    assert set(names) == set(order)
    for rank in range(4):
        mine = sorted((order[k], names[k]) for k in names if k[0] == rank)
        assert [n for _, n in mine][:2] == ["compute", "comm"]            # compute above comm
    assert trace.stream_order() == ["compute", "comm", "p2p"]
    slices = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    assert slices <= set(names)                                            # every slice's thread has a name
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert [processes[r] for r in range(4)] == [f"rank {r}" for r in range(4)] and "network" in processes.values()


def test_flow_arrows_pair_collective_ranks_and_send_recv():
    trace = simulate(two_stream_plan(), one_node(4))
    events = events_of(trace)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and set(starts) == set(finishes)                         # every arrow starts and ends
    by_cat = defaultdict(list)
    for i, s in starts.items():
        by_cat[s["cat"]].append((s, finishes[i]))
    assert len(by_cat["collective"]) == 2 * 3                              # 2 collectives x (4 - 1) arrows
    first = [(s, f) for s, f in by_cat["collective"] if s["name"] == "all_reduce #0"]
    assert sorted(f["pid"] for _, f in first) == [0, 1, 2]                 # rank 3 computes longest: arrives last,
    assert all(s["pid"] == 3 and f["bp"] == "e" for s, f in first)         # the others' arrows come from it
    p2p = sorted(by_cat["p2p"], key=lambda sf: sf[0]["ts"])
    assert [(s["pid"], f["pid"]) for s, f in p2p] == [(0, 1), (0, 1)]
    slices = [e for e in events if e["ph"] == "X"]
    for s, f in by_cat["p2p"] + by_cat["collective"]:                      # each end inside a slice of its thread
        for end in (s, f):
            assert any(x["pid"] == end["pid"] and x["tid"] == end["tid"] and x["ts"] <= end["ts"] <= x["ts"] + x["dur"]
                       for x in slices)
    sends = [e for e in slices if e["cat"] == "send"]
    assert {e["args"]["peer"] for e in sends} == {1}


def test_network_channels_instead_of_overlapping_slices():
    trace, _ = simulate_collective("all_reduce", 64 * 2**20, load_cluster("dgx-h100", 2), "ring",
                                   record_transfers=True)
    events = events_of(trace)
    net = next(e["pid"] for e in events if e["name"] == "process_name" and e["args"]["name"] == "network")
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == net}
    per_thread = defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e["pid"] == net:
            per_thread[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    assert sum(map(len, per_thread.values())) == len(trace.transfers)
    for tid, spans in per_thread.items():                                  # no two slices of a thread overlap
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:])), threads[tid]
    assert "0 -> 1 ch 0" in threads.values() and "0 -> 1 ch 1" in threads.values()   # NCCL's channels, labelled


def test_transfer_timeline_is_one_collection_with_a_legend():
    from distlab.sim.plots import transfers_timeline
    trace, _ = simulate_collective("all_reduce", 8 * 2**20, load_cluster("dgx-h100", 2), "ring", record_transfers=True)
    fig = transfers_timeline(trace, title="t")
    ax, = fig.axes
    assert len(ax.collections) == 1 and len(ax.collections[0].get_paths()) == len(trace.transfers)
    from distlab.sim.timeline_png import NOTE
    assert ax.get_legend() is not None and ax.get_title(loc="left") == "t"
    assert [t.get_text() for t in fig.texts] == [NOTE]          # what a bar is (issue 33), no second title


def test_plan_timeline_has_a_legend_and_one_title():
    from distlab.sim.plots import timeline
    fig = timeline(simulate(two_stream_plan(), one_node(4)), title="step")
    ax, = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"forward", "collective", "send", "recv", "waiting for peers"} <= set(labels)
    assert ax.get_title(loc="left") == "step" and ax.get_title() == "" and not fig.texts
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows[:3] == ["rank 0 compute", "rank 0 comm", "rank 0 p2p"]
