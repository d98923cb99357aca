"""Two emulated nodes on this machine (two torchrun agents, 2 ranks each, one c10d rendezvous): the plan runs,
rank 0 writes one merged trace of 4 ranks, and a clock shift injected on node 1 is recovered within 100 us.
Bad input (an endpoint nobody serves, nodes that disagree on the world size) ends in one line, exit 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from distlab.runtime.launch import free_port
from distlab.sim.plan import Collective, Compute, Plan
from distlab.sim.trace import Trace

pytestmark = pytest.mark.slow
SHIFT_S = 3.25          # node 1's clock runs this far ahead of node 0's


def small_plan(world: int = 4) -> Plan:
    ops = [Compute(seconds=1e-3), Collective("all_reduce", 2**14)] * 3
    return Plan([list(ops) for _ in range(world)], name="small")


def cli(*args, env=None, timeout=90):
    return subprocess.Popen([sys.executable, "-m", "distlab.runtime.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {})))


def node(plan_path, out, k, port, nproc=2, nnodes=2, shift=0.0, timeout=20, host="127.0.0.1", as_json=False):
    env = {"DISTLAB_TEST_CLOCK_SHIFT_S": str(shift)} if shift else {}
    return cli("run", plan_path, "--nnodes", str(nnodes), "--node-rank", str(k), "--rdzv-endpoint",
               f"{host}:{port}", "--nproc", str(nproc), "--backend", "gloo", "--timeout", str(timeout),
               "--out", out, *(["--json"] if as_json else []), env=env)


def finish(procs, timeout=120):
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    d = tmp_path_factory.mktemp("nodes")
    plan = str(d / "small.json")
    small_plan().save(plan)
    port = free_port()
    procs = [node(plan, str(d / "merged.trace"), k, port, shift=SHIFT_S if k == 1 else 0.0, as_json=True)
             for k in (0, 1)]
    outs = finish(procs)
    return d, outs


def test_two_nodes_give_one_merged_trace_of_four_ranks(two_nodes):
    d, outs = two_nodes
    assert [rc for rc, _, _ in outs] == [0, 0], outs
    trace = Trace.from_json((d / "merged.trace").read_text())
    assert {o.rank for o in trace.ops} == {0, 1, 2, 3}
    assert trace.meta["complete"] and trace.meta["world_size"] == 4
    # c10d rendezvous assigns node ranks itself: rank 0 (which writes the trace) is on either launcher; with
    # --json its node prints one JSON object (the other node prints nothing)
    (writer,) = [json.loads(out) for _, out, _ in outs if out]
    assert writer["schema"] == "distlab.run/1" and writer["world_size"] == 4
    assert writer["trace"] == str(d / "merged.trace") and writer["makespan_s"] == pytest.approx(trace.makespan)
    assert {s["rank"] for s in writer["streams"]} == {0, 1, 2, 3}
    assert writer["clock"]["offset_s"] == trace.meta["clock"]["offset_s"]


def test_an_injected_clock_offset_is_recovered_within_100_us(two_nodes):
    d, outs = two_nodes
    trace = Trace.from_json((d / "merged.trace").read_text())
    clock = trace.meta["clock"]
    assert clock["offset_s"][:2] == [0.0, 0.0]                        # rank 0's node: the same clock
    expected = -SHIFT_S if outs[1][1] else SHIFT_S          # rank 0 on the shifted node (it prints), or not
    for r in (2, 3):
        assert abs(clock["offset_s"][r] - expected) < 100e-6, clock
        assert 0 < clock["uncertainty_s"][r] < 1e-3
    assert clock["nodes"][0] == clock["nodes"][1] != clock["nodes"][2] == clock["nodes"][3]
    # aligned: the k-th all_reduce ends at about the same time on all 4 ranks (unaligned, 3.25 s apart)
    ends = {}
    for o in trace.ops:
        if o.kind == "collective":
            ends.setdefault(o.index, []).append(o.end)
    for index, times in ends.items():
        assert len(times) == 4 and max(times) - min(times) < 0.05, (index, times)


def test_an_endpoint_nobody_serves_fails_in_one_line_with_exit_2(tmp_path):
    plan = str(tmp_path / "p.json")
    small_plan().save(plan)
    t0 = time.monotonic()
    port = free_port()           # a loopback port nobody listens on (tests never reach beyond this machine)
    p = node(plan, str(tmp_path / "t.trace"), 1, port, timeout=1)    # only the timeout has to fire
    rc, out, err = finish([p], timeout=60)[0]
    assert rc == 2
    # node 1 cannot reach a store on node 0: torchrun gives up at the timeout, reported as one line
    assert err.count("\n") == 1 and err.startswith("distlab run: error: --rdzv-endpoint: "), err
    assert f"rendezvous at 127.0.0.1:{port} within 1 s" in err, err
    assert time.monotonic() - t0 < 40
    assert not (tmp_path / "t.trace").exists()


def test_nodes_that_disagree_on_the_world_size_fail_in_one_line_with_exit_2(tmp_path):
    plan = str(tmp_path / "p.json")
    small_plan().save(plan)
    port = free_port()
    procs = [cli("run", plan, "--nnodes", "2", "--node-rank", str(k), "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--nproc", str(n), "--backend", "gloo", "--timeout", "2",
                 "--out", str(tmp_path / "t.trace")) for k, n in ((0, 2), (1, 1))]
    # node 1 asks for 1 rank per node: 2 x 1 is not the plan's 4, it refuses at once; node 0 waits for it in vain
    t0 = time.monotonic()
    outs = finish(procs, timeout=60)
    for rc, out, err in outs:
        assert rc == 2 and err.count("\n") == 1 and err.startswith("distlab run: error: "), err
    assert "--nproc: the plan has 4 ranks" in outs[1][2]
    assert "--rdzv-endpoint: not all 2 nodes joined" in outs[0][2]
    assert time.monotonic() - t0 < 40
    assert not (tmp_path / "t.trace").exists()


def test_ranks_refuse_a_plan_of_another_world_size_before_joining(tmp_path):
    """Direct torchrun: the worker compares WORLD_SIZE with the plan first, one line, exit code 2 per rank."""
    plan = str(tmp_path / "p.json")
    small_plan().save(plan)
    from distlab.runtime.worker import run_torchrun
    from distlab.sim.errors import ConfigError
    env = dict(os.environ)
    os.environ.update(RANK="0", WORLD_SIZE="3")
    try:
        with pytest.raises(ConfigError, match="the plan has 4 ranks but torchrun started 3"):
            run_torchrun([plan, "--out", str(tmp_path / "t.trace")])
    finally:
        os.environ.clear()
        os.environ.update(env)
