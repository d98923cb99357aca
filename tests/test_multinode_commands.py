"""`distlab bench` and `calibrate` under torchrun on two emulated nodes (two torchrun agents on localhost, 2 ranks
each, one c10d rendezvous; runtime/torchrun_rank.py): one launch runs both commands in turn, every rank of both
nodes takes part, and only global rank 0 prints and writes, once, on its node. (`validate` goes through the same
runtime/calibration.py ``measure`` as calibrate; it is left out to keep the test short.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from distlab.runtime.launch import free_port

pytestmark = pytest.mark.slow

# Each rank runs the two commands, as a user would run them one after the other under torchrun; a command's
# SystemExit(0) on ranks other than 0 ends that command only. Each node writes into its own folder (argv[1]).
SCRIPT = """
import sys
from distlab.runtime.cli import main
out = sys.argv[1]
tiny = ["--warmup", "1", "--iters", "2", "--backend", "gloo", "--timeout", "30"]
codes = []
for argv in (["bench", "--ops", "all_reduce,all_gather", "--sizes", "4KiB,16KiB", "--out", out + "/bench.json",
              "--json", *tiny],
             ["calibrate", "--ops", "all_reduce", "--sizes", "4KiB:64KiB:4", "--out", out + "/cluster.yaml", *tiny]):
    try:
        codes.append(main(argv))
    except SystemExit as e:
        codes.append(e.code)
sys.exit(max(codes))
"""


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    d = tmp_path_factory.mktemp("commands")
    (d / "two_commands.py").write_text(SCRIPT)
    port = free_port()
    procs = []
    for k in (0, 1):
        (d / f"node{k}").mkdir()
        with open(d / f"stdout{k}", "w") as out, open(d / f"stderr{k}", "w") as err:     # files: never full
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                 "--node-rank", str(k), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-conf", "join_timeout=60,read_timeout=60", "--log-dir", str(d / f"logs{k}"),
                 str(d / "two_commands.py"), str(d / f"node{k}")], stdout=out, stderr=err,
                stdin=subprocess.DEVNULL, start_new_session=True))
    try:
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    outs = [(p.returncode, (d / f"stdout{k}").read_text(), (d / f"stderr{k}").read_text())
            for k, p in enumerate(procs)]
    assert [rc for rc, _, _ in outs] == [0, 0], outs
    # c10d rendezvous numbers the nodes itself: global rank 0 is on either launcher
    (writer,) = [k for k in (0, 1) if (d / f"node{k}" / "bench.json").exists()]
    return d / f"node{writer}", outs[writer][1], d / f"node{1 - writer}", outs[1 - writer][1]


def test_only_rank_0_writes_and_prints_once(two_nodes):
    folder, stdout, other_folder, other_stdout = two_nodes
    assert sorted(p.name for p in folder.iterdir()) == ["bench.json", "cluster.yaml"]
    assert list(other_folder.iterdir()) == [] and other_stdout == ""
    assert stdout.count('"schema": "distlab.bench/1"') == 1
    assert stdout.count("wrote " + str(folder / "cluster.yaml")) == 1


def test_bench_measures_every_size_on_the_four_ranks(two_nodes):
    folder = two_nodes[0]
    bench = json.loads((folder / "bench.json").read_text())
    assert bench["schema"] == "distlab.bench/1" and bench["complete"] and bench["world_size"] == 4
    assert [(r["op"], r["bytes"]) for r in bench["results"]] == [
        ("all_reduce", 4096), ("all_reduce", 16384), ("all_gather", 4096), ("all_gather", 16384)]
    assert all(r["time_s"] > 0 and r["busbw_GBps"] > 0 for r in bench["results"])


def test_calibrate_fits_the_four_ranks(two_nodes):
    folder = two_nodes[0]
    from distlab.sim.cluster import load_cluster
    cluster = load_cluster(str(folder / "cluster.yaml"))
    fit = cluster.calibration["collectives"]["all_reduce"]
    assert [int(n) for n in fit] == [4] and list(fit.values())[0]["bandwidth_GBps"] > 0
    assert cluster.gpu.tflops > 0                   # the compute measured with the 4 ranks working at once
