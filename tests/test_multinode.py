"""Two emulated nodes on this machine (two torchrun agents, 2 ranks each, one c10d rendezvous), one launch in
which every rank runs `distlab run --json`, `distlab bench` and `distlab calibrate` in turn, as torchrun's program
(runtime/ranks/torchrun_rank.py): the plan's merged trace has 4 ranks, a clock shift injected on node 1 is recovered
within 100 us, and only global rank 0 prints and writes, once, on its node. Bad input (an endpoint nobody serves,
nodes that disagree on the world size) given to `distlab run --nnodes` ends in one line, exit 2."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process
from distlab.runtime.ranks.launch import free_port
from distlab.sim.plan import Collective, Compute, Plan
from distlab.sim.trace import Trace

pytestmark = pytest.mark.slow
SHIFT_S = 1000.25       # node 1's clock runs this far ahead of node 0's (hosts' clocks are unrelated)

# Each rank runs the three commands, as a user would run them one after the other under torchrun on every node;
# a command's SystemExit(0) on the ranks other than 0 ends that command only. argv: plan, this node's folder.
SCRIPT = """
import sys
from distlab.runtime.cli import main
plan, out = sys.argv[1:]
tiny = ["--warmup", "1", "--backend", "gloo", "--timeout", "30"]
codes = []
for argv in (["run", plan, "--out", out + "/merged.trace", "--json", *tiny],
             ["bench", "--ops", "all_reduce,all_gather", "--sizes", "4KiB,16KiB", "--iters", "2",
              "--out", out + "/bench.json", *tiny],
             ["calibrate", "--ops", "all_reduce", "--sizes", "4KiB:64KiB:4", "--iters", "2", "--out",
              out + "/cluster.yaml", "--probe-seconds", "0.03", "--interference-rounds", "1", *tiny]):
    try:
        codes.append(main(argv))
    except SystemExit as e:
        codes.append(e.code)
sys.exit(max(codes))
"""


def small_plan(world: int = 4) -> Plan:
    ops = [Compute(seconds=1e-3), Collective("all_reduce", 2**14)] * 3
    return Plan([list(ops) for _ in range(world)], name="small")


SECRET = "test-run-secret-0123456789"     # every node's ranks present it to rank 0's store (runtime/ranks/rendezvous.py)


def node_args(plan_path, out, k, port, nproc=2, nnodes=2, timeout=20, host="127.0.0.1") -> list[str]:
    """`distlab run`'s arguments for node k of a multi-node run."""
    return ["run", plan_path, "--nnodes", str(nnodes), "--node-rank", str(k), "--rdzv-endpoint", f"{host}:{port}",
            "--nproc", str(nproc), "--backend", "gloo", "--timeout", str(timeout), "--out", out]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """{"folder": rank 0's node's folder, "stdout": its output, "other": the other node's folder and output,
    "shifted": whether rank 0 is on the shifted node}."""
    d = tmp_path_factory.mktemp("nodes")
    plan = str(d / "small.json")
    small_plan().save(plan)
    (d / "three_commands.py").write_text(SCRIPT)
    port, procs = free_port(), []
    for k in (0, 1):
        (d / f"node{k}").mkdir()
        env = dict(os.environ, DISTLAB_TEST_CLOCK_SHIFT_S=str(SHIFT_S if k == 1 else 0.0), DISTLAB_RUN_SECRET=SECRET)
        with open(d / f"stdout{k}", "w") as out, open(d / f"stderr{k}", "w") as err:     # files: never full
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                 "--node-rank", str(k), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-conf", "join_timeout=60,read_timeout=60", "--log-dir", str(d / f"logs{k}"),
                 str(d / "three_commands.py"), plan, str(d / f"node{k}")], stdout=out, stderr=err,
                stdin=subprocess.DEVNULL, start_new_session=True, env=env))
    try:
        for p in procs:
            p.wait(timeout=150)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    outs = [(p.returncode, (d / f"stdout{k}").read_text(), (d / f"stderr{k}").read_text())
            for k, p in enumerate(procs)]
    assert [rc for rc, _, _ in outs] == [0, 0], outs
    # c10d rendezvous numbers the nodes itself: global rank 0 is on either launcher
    (k,) = [k for k in (0, 1) if (d / f"node{k}" / "merged.trace").exists()]
    return {"folder": d / f"node{k}", "stdout": outs[k][1], "other": (d / f"node{1 - k}", outs[1 - k][1]),
            "shifted": k == 1}


def test_two_nodes_give_one_merged_trace_of_four_ranks(two_nodes):
    trace = Trace.from_json((two_nodes["folder"] / "merged.trace").read_text())
    assert {o.rank for o in trace.ops} == {0, 1, 2, 3}
    assert trace.meta["complete"] and trace.meta["world_size"] == 4
    # --json: rank 0 prints one line of JSON (distlab.run/1) for the run
    (line,) = [ln for ln in two_nodes["stdout"].splitlines() if ln.startswith('{"schema": "distlab.run/1"')]
    run = json.loads(line)
    assert run["world_size"] == 4 and run["trace"].endswith("merged.trace")
    assert run["makespan_s"] == pytest.approx(trace.makespan)
    assert {s["rank"] for s in run["streams"]} == {0, 1, 2, 3}
    assert run["clock"]["offset_s"] == trace.meta["clock"]["offset_s"]


def test_an_injected_clock_offset_is_recovered_within_100_us(two_nodes):
    trace = Trace.from_json((two_nodes["folder"] / "merged.trace").read_text())
    clock = trace.meta["clock"]
    assert clock["offset_s"][:2] == [0.0, 0.0]                        # rank 0's node: the same clock
    expected = -SHIFT_S if two_nodes["shifted"] else SHIFT_S          # rank 0 on the shifted node, or not
    for r in (2, 3):
        assert abs(clock["offset_s"][r] - expected) < 100e-6, clock
        assert 0 < clock["uncertainty_s"][r] < 1e-3
    assert clock["nodes"][0] == clock["nodes"][1] != clock["nodes"][2] == clock["nodes"][3]
    # aligned: the k-th all_reduce ends at about the same time on all 4 ranks (unaligned, 1000 s apart)
    ends = {}
    for o in trace.ops:
        if o.kind == "collective":
            ends.setdefault(o.index, []).append(o.end)
    for index, times in ends.items():
        assert len(times) == 4 and max(times) - min(times) < 0.05, (index, times)


def test_only_rank_0_writes_and_prints_once(two_nodes):
    folder, stdout = two_nodes["folder"], two_nodes["stdout"]
    assert sorted(p.name for p in folder.iterdir()) == ["bench.json", "cluster.yaml", "merged.trace"]
    other_folder, other_stdout = two_nodes["other"]
    assert list(other_folder.iterdir()) == [] and other_stdout == ""
    assert stdout.count('"schema": "distlab.run/1"') == 1 and stdout.count("# bench: 4 ranks") == 1
    assert stdout.count("wrote " + str(folder / "cluster.yaml")) == 1


def test_bench_and_calibrate_measure_the_four_ranks(two_nodes):
    folder = two_nodes["folder"]
    bench = json.loads((folder / "bench.json").read_text())
    assert bench["schema"] == "distlab.bench/1" and bench["complete"] and bench["world_size"] == 4
    assert [(r["op"], r["bytes"]) for r in bench["results"]] == [
        ("all_reduce", 4096), ("all_reduce", 16384), ("all_gather", 4096), ("all_gather", 16384)]
    # times compared across ranks are on rank 0's clock: 1000 s between the nodes' clocks never shows
    assert all(0 < r["time_s"] < 1 and 0 < r["launch_time_s"] < 1 for r in bench["results"])
    from distlab.sim.cluster import load_cluster
    cluster = load_cluster(str(folder / "cluster.yaml"))
    fit = cluster.calibration["collectives"]["all_reduce"]
    assert [int(n) for n in fit] == [4] and list(fit.values())[0]["bandwidth_GBps"] > 0
    # matmul rate of the 4 ranks at once, first start to last end on one clock: not work / 1000 s
    assert cluster.gpu.tflops > 1e-4


def test_the_node_command_prints_the_workers_json_indented(capsys):
    """`distlab run --nnodes --json` on rank 0's node: the worker's one-line JSON, printed as print_json does."""
    from distlab.runtime.ranks.multinode import NodeSpec, _run_node
    line = json.dumps({"schema": "distlab.run/1", "world_size": 4})
    cmd = [sys.executable, "-c", f"print({line!r}); print('W1130 torchrun noise')"]
    assert _run_node(NodeSpec(2, 0, "h:1", 2), cmd, False, "distlab run") == 0
    assert capsys.readouterr().out == json.dumps(json.loads(line), indent=2) + "\n"


def test_an_endpoint_nobody_serves_fails_in_one_line_with_exit_2(tmp_path, cli, monkeypatch):
    """`distlab run --nnodes` in this process (tests/cli_in_process.py: no interpreter start for the command); its
    torchrun is still a process of its own, as on a real node."""
    monkeypatch.setenv("DISTLAB_RUN_SECRET", SECRET)
    plan = str(tmp_path / "p.json")
    small_plan().save(plan)
    t0 = time.monotonic()
    port = free_port()           # a loopback port nobody listens on (tests never reach beyond this machine)
    rc, out, err = cli(*node_args(plan, str(tmp_path / "t.trace"), 1, port, timeout=1))   # only the timeout fires
    assert rc == 2
    # node 1 cannot reach a store on node 0: torchrun gives up at the timeout, reported as one line
    assert err.count("\n") == 1 and err.startswith("distlab run: error: --rdzv-endpoint: "), err
    assert f"rendezvous at 127.0.0.1:{port} within 1 s" in err, err
    assert time.monotonic() - t0 < 40
    assert not (tmp_path / "t.trace").exists()


def test_nodes_that_disagree_on_the_world_size_fail_in_one_line_with_exit_2(tmp_path, cli, monkeypatch):
    """Node 1 asks for 1 rank per node: 2 x 1 is not the plan's 4, it refuses at once, before starting torchrun or
    reaching the endpoint; node 0 waits for it in vain. Both in this process, one after the other: node 1's
    refusal never depends on node 0."""
    monkeypatch.setenv("DISTLAB_RUN_SECRET", SECRET)
    plan = str(tmp_path / "p.json")
    small_plan().save(plan)
    port = free_port()
    t0 = time.monotonic()
    outs = {k: cli(*node_args(plan, str(tmp_path / "t.trace"), k, port, nproc=n, timeout=2))
            for k, n in ((1, 1), (0, 2))}
    for rc, out, err in outs.values():
        assert rc == 2 and err.count("\n") == 1 and err.startswith("distlab run: error: "), err
    assert "--nproc: the plan has 4 ranks" in outs[1][2]
    assert "--rdzv-endpoint: not all 2 nodes joined" in outs[0][2]
    assert time.monotonic() - t0 < 40
    assert not (tmp_path / "t.trace").exists()


def test_ranks_refuse_a_plan_of_another_world_size_before_joining(tmp_path):
    """Direct torchrun: the worker compares WORLD_SIZE with the plan first, one line, exit code 2 per rank."""
    plan = str(tmp_path / "p.json")
    small_plan().save(plan)
    from distlab.runtime.ranks.worker import run_torchrun
    from distlab.sim.errors import ConfigError
    env = dict(os.environ)
    os.environ.update(RANK="0", WORLD_SIZE="3")
    try:
        with pytest.raises(ConfigError, match="the plan has 4 ranks but torchrun started 3"):
            run_torchrun([plan, "--out", str(tmp_path / "t.trace")])
    finally:
        os.environ.clear()
        os.environ.update(env)


@pytest.mark.parametrize("flag,value", [("--probe-seconds", "0"), ("--interference-rounds", "0")])
def test_calibrate_refuses_probes_it_cannot_run_in_one_line_with_exit_2(capsys, tmp_path, flag, value):
    """The flags the launch above shrinks its probes with: bad values end in one line before any rank starts."""
    from distlab.runtime.cli import main
    rc = main(["calibrate", "--ops", "all_reduce", "--sizes", "4KiB,8KiB", "--out", str(tmp_path / "c.yaml"),
               flag, value])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"distlab calibrate: error: {flag}: "), err
    assert not (tmp_path / "c.yaml").exists()
