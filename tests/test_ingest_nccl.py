"""nccl-tests logs read in (sim/ingest/nccl_tests.py), fitted (sim/ingest/fit.py) and reproduced: real published
logs (tests/data/nccl_tests/SOURCES.md), several nccl-tests versions and layouts; bad files exit 2 in one line."""
from __future__ import annotations

import json
import os

import pytest
from cli_in_process import cli  # noqa: F401  (the fixture)

from distlab.sim.errors import ConfigError
from distlab.sim.ingest.fit import busbw_rows, cluster_from_logs
from distlab.sim.ingest.nccl_tests import load, parse_json, parse_text

DATA = os.path.join(os.path.dirname(__file__), "data", "nccl_tests")
LOGS = sorted(f for f in os.listdir(DATA) if f.endswith(".txt"))


def test_headers_of_several_versions_and_layouts():
    a100 = load(os.path.join(DATA, "a100_1x8_all_reduce_v2.19.4.txt"))       # 2.19: version line, "#wrong"
    assert (a100.op, a100.nranks, a100.hosts, a100.tests_version, a100.nccl_version) == \
        ("all_reduce", 8, ["dkh"], "2.19.4", "2.19.3")
    assert a100.devices == ["NVIDIA A100-SXM4-80GB"] and len(a100.rows) == 25
    last = a100.rows[-1]
    assert (last.bytes, last.count, last.dtype, last.redop, last.root) == (134217728, 33554432, "float", "sum", -1)
    assert (last.oop.time_us, last.oop.busbw_GBps, last.ip.time_us, last.ip.busbw_GBps) == \
        (1295.41, 181.32, 1284.21, 182.90)
    g4 = load(os.path.join(DATA, "h100_2x4_all_reduce_g4.txt"))              # -g 4: 4 GPUs per process
    assert g4.nranks == 8 and g4.ranks_per_host == {"alpha-test-16way-node-001": 4, "alpha-test-16way-node-002": 4}
    nvl = load(os.path.join(DATA, "gb200_nvl72_72gpu_all_reduce.txt"))      # header cut to its last rank line
    assert nvl.nranks == 72 and nvl.hosts == [] and "cut" in nvl.notes[0]


def test_old_layout_without_root_and_with_error_column_and_mpirun_prefixes():
    old = ("# Using devices\n#   Rank  0 Pid   1320 on a device  0 [0x00] Tesla V100-SXM2-16GB\n"
           "#   Rank  1 Pid   2066 on b device  0 [0x00] Tesla V100-SXM2-16GB\n"
           "   134217728      33554432   float     sum    3298.6   40.69   40.69  0e+00    3070.3   43.71   43.71  "
           "0e+00\n")
    log = parse_text(old, "all_reduce_perf.log")
    assert (log.nranks, log.hosts, log.rows[0].redop, log.rows[0].oop.wrong) == (2, ["a", "b"], "sum", 0.0)
    tagged = "\n".join("[1,0]<stdout>:" + line for line in old.splitlines())
    assert parse_text(tagged, "all_reduce_perf.log").rows == log.rows


def test_json_output_in_the_schema_of_nccl_tests_util_cu():
    """No published -J file was found: the real A100 log's rows are put into util.cu's JSON (version 3) here."""
    text = load(os.path.join(DATA, "a100_1x8_all_reduce_v2.19.4.txt"))
    doc = {"version": 3, "nccl_version": 21903, "args": ["./build/all_reduce_perf", "-b", "8", "-e", "128M"],
           "devices": [{"rank": r, "hostname": "dkh", "device_info": "NVIDIA A100-SXM4-80GB"} for r in range(8)],
           "results": [{"size": r.bytes, "count": r.count, "type": r.dtype, "redop": r.redop, "root": "none",
                        "out_of_place": {"time": r.oop.time_us, "alg_bw": r.oop.algbw_GBps,
                                         "bus_bw": r.oop.busbw_GBps, "nwrong": 0},
                        "in_place": {"time": r.ip.time_us, "alg_bw": r.ip.algbw_GBps, "bus_bw": r.ip.busbw_GBps,
                                     "nwrong": None}} for r in text.rows]}
    log = parse_json(json.loads(json.dumps(doc)), "results.json")
    assert (log.op, log.nranks, log.nccl_version) == ("all_reduce", 8, "2.19.3")
    assert [r.oop.time_us for r in log.rows] == [r.oop.time_us for r in text.rows]
    with pytest.raises(ConfigError, match="results"):
        parse_json({"version": 3}, "x.json")


@pytest.mark.parametrize("name", LOGS)
def test_calibration_reproduces_each_log_within_5_percent_above_1MiB(name):
    log = load(os.path.join(DATA, name))
    cluster = cluster_from_logs([log])
    rows = [r for r in busbw_rows(log, cluster) if r["bytes"] > 1 << 20]
    assert rows, name
    worst = max(rows, key=lambda r: abs(r["error"]))
    assert abs(worst["error"]) <= 0.05, worst


def test_calibrate_from_logs_writes_a_cluster_collective_reproduces(cli, tmp_path, monkeypatch):
    import distlab.runtime.ranks.launch as launch

    def no_ranks(*a, **k):
        raise AssertionError("calibrate --from-nccl-tests started ranks")
    monkeypatch.setattr(launch, "launch", no_ranks)
    monkeypatch.setattr(launch.Launch, "start", no_ranks)
    log = os.path.join(DATA, "h100_2x8_gcp_a3mega_all_reduce.txt")
    out = tmp_path / "fitted.yaml"
    rc, text, err = cli("calibrate", "--from-nccl-tests", log, "--out", out)
    assert rc == 0, err
    assert "h100_2x8_gcp_a3mega" in text and "+1." in text and out.exists()
    rc, text, err = cli("collective", "all_reduce", "--cluster", out, "--sizes", "256MiB,8GiB", "--json")
    assert rc == 0, err
    got = {r["bytes"]: r["busbw_GBps"] for r in json.loads(text)["results"]}
    measured = {r.bytes: r.oop.busbw_GBps for r in load(log).rows}
    for size, busbw in got.items():
        assert busbw == pytest.approx(measured[size], rel=0.05)
    assert json.loads(text)["world_size"] == 16


@pytest.mark.parametrize("content, says", [
    ("", "no nccl-tests table"),
    ("hello\nworld\n", "no nccl-tests table"),
    ("#  Rank  0 Group  0 Pid 1 on h device  0 [0x0] X\n#  Rank  1 Group  0 Pid 1 on h device  1 [0x0] X\n"
     "    1048576        262144     float     sum      -1    67.31   15.58   27.26       0    65.27   16",
     "columns"),
    ("    1048576        262144     float     sum      -1    67.31   15.58   27.26       0    65.27   16.07   28.11"
     "       0\n", "Rank"),
    ('{"version": 3, "results": [', "not valid JSON"),
])
def test_bad_or_truncated_logs_exit_2_in_one_line(cli, tmp_path, content, says):
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(content)
    rc, out, err = cli("calibrate", "--from-nccl-tests", path, "--out", tmp_path / "c.yaml")
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "c.yaml").exists()


def test_a_point_to_point_log_is_refused_by_name(cli, tmp_path):
    table = open(os.path.join(DATA, "a100_1x8_all_reduce_v2.19.4.txt")).read().replace(
        "Collective test starting: all_reduce_perf", "Collective test starting: sendrecv_perf")
    (tmp_path / "sendrecv_perf.txt").write_text(table)
    rc, out, err = cli("calibrate", "--from-nccl-tests", tmp_path / "sendrecv_perf.txt", "--out", tmp_path / "c.yaml")
    assert rc == 2 and "sendrecv" in err and "point-to-point" in err and len(err.strip().splitlines()) == 1
