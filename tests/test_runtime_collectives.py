"""Every collective under the runtime (real Gloo ranks, 2 and 4), ints and floats, checked against values
computed here with plain Python; one launch per world size also runs a multi-stream plan through the executor."""
from __future__ import annotations

import pytest

from distlab.runtime.execute.collectives import actual_bytes, element_counts
from distlab.runtime.execute.executor import merge_results
from distlab.runtime.measure.selfcheck import cases, value
from distlab.sim.plan import Collective, Compute, Plan, Record, Recv, Send, Wait

pytestmark = pytest.mark.slow


def mixed_plan(n: int) -> Plan:
    """Two streams with Record/Wait, a subgroup collective, send/recv between ranks 0 and 1."""
    ranks = []
    for r in range(n):
        ops = [Compute(name="fwd", seconds=0.005), Record("f", stream="compute"), Wait("f", stream="comm"),
               Collective("all_reduce", 64 * 1024, name="ar"), Compute(name="bwd", seconds=0.005),
               Collective("all_gather", 8 * 1024 * n, stream="comm2")]
        if r in (0, n - 1):
            ops.append(Collective("broadcast", 4096, group=(0, n - 1), root=n - 1, stream="comm"))
        if r == 0:
            ops.append(Send(1, 1024))
        if r == 1:
            ops.append(Recv(0, 1024))
        ranks.append(ops)
    return Plan(ranks, name=f"mixed-{n}").validate()


def expected(c: dict, rank: int, n_world: int):
    group, dt = c["group"], c["dtype"]
    m = len(group)
    inp_numel, out_numel = element_counts(c["op"], c["bytes"], dt, m)
    vals = {q: [value(q, j, dt) for j in range(inp_numel)] for q in group}
    op = c["op"]
    if op == "all_reduce":
        return [sum(vals[q][j] for q in group) for j in range(inp_numel)]
    if op == "all_gather":
        return [x for q in group for x in vals[q]]
    if op == "reduce_scatter":
        k = out_numel
        i = group.index(rank)
        return [sum(vals[q][i * k + j] for q in group) for j in range(k)]
    if op == "broadcast":
        return vals[c["root"]]
    if op == "reduce":
        return [sum(vals[q][j] for q in group) for j in range(inp_numel)] if rank == c["root"] else None
    if op == "all_to_all":
        k = inp_numel // m
        i = group.index(rank)
        return [x for q in group for x in vals[q][i * k:(i + 1) * k]]
    return None


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def launched(request):
    from distlab.runtime.ranks.launch import launch
    n = request.param
    plan = mixed_plan(n)
    results = launch("distlab.runtime.measure.selfcheck:collectives_task", {"plan": {"plan": plan.to_dict(), "warmup": 1,
                                                                     "repeat": 2}}, n, timeout=60)
    return n, plan, results


def test_every_collective_matches_independent_values(launched):
    n, _, results = launched
    todo = cases(n)
    assert {c["op"] for c in todo} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                                       "all_to_all", "barrier"}
    checked = 0
    for rank, res in enumerate(results):
        for i, c in enumerate(todo):
            if rank not in c["group"]:
                assert str(i) not in res["outputs"]
                continue
            want = expected(c, rank, n)
            if want is None:
                continue
            got = res["outputs"][str(i)]
            assert got == want, f"rank {rank}: {c}"
            checked += 1
    assert checked >= n * 5 * 4


def test_point_to_point_delivers_the_data(launched):
    n, _, results = launched
    for rank, res in enumerate(results):
        assert res["outputs"]["p2p"] == [value((rank - 1) % n, j, "float32") for j in range(5)]


def test_plan_trace_follows_streams_events_and_groups(launched):
    n, plan, results = launched
    runs = [r["plan"] for r in results]
    trace = merge_results(plan, runs)
    assert trace.meta["source"] == "measured" and trace.meta["complete"]
    for r in range(n):
        recs = {o.index: o for o in trace.for_rank(r)}
        assert sorted(recs) == list(range(len(plan.ranks[r])))           # every op once
        for stream in {o.stream for o in recs.values()}:
            seq = sorted((o for o in recs.values() if o.stream == stream), key=lambda o: o.index)
            for a, b in zip(seq, seq[1:]):
                assert a.end <= b.start + 1e-9                             # in order on its stream
        assert recs[2].end >= recs[1].start - 1e-9                         # Wait ends after the Record
        assert recs[3].start >= recs[2].end - 1e-9
        assert 0.0045 <= recs[0].duration < 2.0     # compute fills its planned seconds (more when cores are busy)
        assert recs[3].bytes == 64 * 1024 and recs[3].group == tuple(range(n))
    for o in trace.ops:
        if o.kind == "collective":
            peers = [p for p in trace.ops if p.kind == "collective" and p.index == o.index and p.op == o.op]
            assert o.launch == pytest.approx(max(p.start for p in peers))
            assert o.end >= o.launch
    sends = [o for o in trace.ops if o.kind in ("send", "recv")]
    assert len(sends) == 2 and sends[0].launch == sends[1].launch == max(o.start for o in sends)
    assert min(o.start for o in trace.ops) == pytest.approx(0.0, abs=0.05)


def test_element_counts_round_and_keep_totals():
    assert element_counts("all_reduce", 10, "float32", 4) == (3, 3)       # 2.5 -> 3 (halves up)
    assert element_counts("all_gather", 4 * 1024, "float32", 4) == (256, 1024)
    assert element_counts("reduce_scatter", 4 * 1024, "float32", 4) == (1024, 256)
    assert element_counts("all_to_all", 4 * 1024, "float32", 4) == (1024, 1024)
    assert element_counts("broadcast", 1, "float64", 2) == (1, 1)          # at least one element
    assert element_counts("barrier", 100, "float32", 2) == (0, 0)
    assert actual_bytes("all_gather", 1000, "float32", 3) == 3 * 83 * 4
