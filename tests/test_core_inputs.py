"""Plans and clusters: round trips, validation, bad input as one line with exit code 2, deterministic traces."""
import json

import pytest
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process

from distlab.sim.cluster import PRESETS, cluster_from_dict, load_cluster
from distlab.sim.kernel.engine import simulate
from distlab.sim.errors import ConfigError
from distlab.sim.io import parse_size, parse_size_range
from distlab.sim.plan import Collective, Compute, Plan, Record, Recv, Send, Wait
from tests.conftest import one_node

CUSTOM = """\
name: my-cluster
nodes: 2
gpus_per_node: 8
gpu: h100
intra_node: {kind: nvswitch, bandwidth_GBps: 450, latency_us: 0.6}
inter_node: {kind: infiniband, nics_per_node: 8, bandwidth_GBps: 50, latency_us: 5, fabric: rail-optimized, oversubscription: 1}
"""


def overlap_plan(n=4):
    ops = [Compute("fwd", seconds=1e-3), Record("fwd-done"), Compute("bwd", seconds=2e-3),
           Wait("fwd-done", stream="comm"), Collective("all_reduce", 2**24, name="bucket 0"),
           Send(peer=1, bytes=1024), Recv(peer=1, bytes=1024, stream="p2p")]
    ranks = []
    for r in range(n):
        rank_ops = [o for o in ops if not isinstance(o, (Send, Recv))]
        if r == 0:
            rank_ops += [Send(peer=1, bytes=4096, stream="p2p")]
        if r == 1:
            rank_ops += [Recv(peer=0, bytes=4096, stream="p2p")]
        ranks.append(rank_ops)
    return Plan(ranks, name="overlap").validate()


def test_plan_json_round_trip():
    p = overlap_plan()
    q = Plan.from_json(p.to_json())
    assert q.ranks == p.ranks and q.name == p.name and q.to_json() == p.to_json()


def test_overlap_semantics():
    t = simulate(overlap_plan(), one_node(4))
    r0 = {o.name: o for o in t.for_rank(0)}
    assert r0["bucket 0"].launch == pytest.approx(1e-3)          # waits for the forward's event only
    assert r0["bwd"].start == pytest.approx(1e-3) and r0["bwd"].end == pytest.approx(3e-3)
    assert r0["bucket 0"].end < r0["bwd"].end                     # overlapped with backward


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["ranks"][0].append({"kind": "collective", "op": "all_reduce", "bytes": 8, "group": [0, 9]}),
     "group names rank 9, outside the world (0..3)"),
    (lambda d: d["ranks"][0].append({"kind": "teleport"}), "unknown op kind 'teleport'"),
    (lambda d: d["ranks"][0].append({"kind": "send", "peer": 0, "bytes": 8}), "cannot send to itself"),
    (lambda d: d["ranks"][0].append({"kind": "collective", "op": "all_reduce", "bytes": -1}), "bytes must be"),
    (lambda d: d["ranks"][0].append({"kind": "collective", "op": "allreduce", "bytes": 1}), "unknown collective"),
    (lambda d: d["ranks"][0].append({"kind": "compute", "seconds": 1, "speed": 3}), "unknown key 'speed'"),
    (lambda d: d.update(world_size=7), "world_size is 7"),
])
def test_plan_validation(mutate, message):
    d = overlap_plan().to_dict()
    mutate(d)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Plan.from_dict(d)


def test_cluster_yaml_and_presets(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CUSTOM)
    c = load_cluster(str(path))
    assert c.world_size == 16 and c.gpu.tflops == 989 and c.inter_node.fabric == "rail-optimized"
    for name, preset in PRESETS.items():
        assert cluster_from_dict(__import__("yaml").safe_load(preset.to_yaml())) == preset


@pytest.mark.parametrize("text,message", [
    (CUSTOM.replace("bandwidth_GBps: 450", "bandwidth_GBps: 0"), "intra_node.bandwidth_GBps: 0 must be a number > 0"),
    (CUSTOM.replace("bandwidth_GBps: 50", "bandwidth_GBps: -5"), "inter_node.bandwidth_GBps: -5"),
    (CUSTOM + "colour: blue\n", "unknown key 'colour'"),
    (CUSTOM.replace("gpu: h100", "gpu: h900"), "unknown gpu 'h900'"),
    (CUSTOM.replace("nvswitch", "hyperloop"), "unknown kind 'hyperloop'"),
    (CUSTOM.replace("rail-optimized", "torus"), "unknown fabric 'torus'"),
    (CUSTOM.replace("latency_us: 5,", "latency_us: 5, speed: 3,"), "unknown key 'speed'"),
    ("nodes: [1\n", "not valid YAML"),
])
def test_cluster_validation(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_cluster(str(path))


def test_sizes():
    assert parse_size("256MiB") == 256 * 2**20 and parse_size("2GB") == 2 * 10**9 and parse_size("8B") == 8
    assert parse_size_range("8B:64B") == [8, 16, 32, 64]
    assert len(parse_size_range("8B:8GiB")) == 31
    for bad in ("12XB", "", "MiB", "-4B"):
        with pytest.raises(ConfigError):
            parse_size(bad)


@pytest.mark.parametrize("args,message", [
    (["collective", "all_reduce", "--cluster", "dgx-h900"], "unknown cluster 'dgx-h900'"),
    (["collective", "all_reduce", "--size", "12XB"], "'12XB' is not a size"),
    (["collective", "all_reduce", "--nodes", "0"], "--nodes"),
    (["collective", "all_reduce", "--algo", "magic"], "--algo: 'magic' is not allowed; allowed: auto"),
    (["collective", "all_to_all", "--algo", "tree"], "does not implement all_to_all"),
    (["collective", "all_reduce", "--cluster", "CLUSTER"], "bandwidth_GBps: 0"),
    (["collective", "all_reduce", "--cluster", "CLUSTER2"], "unknown key 'colour'"),
    (["run", "PLAN"], "not valid JSON"),
])
def test_cli_bad_input_is_one_line_exit_2(cli, tmp_path, args, message):
    (tmp_path / "bad.yaml").write_text(CUSTOM.replace("bandwidth_GBps: 450", "bandwidth_GBps: 0"))
    (tmp_path / "bad2.yaml").write_text(CUSTOM + "colour: blue\n")
    (tmp_path / "plan.json").write_text("{not json")
    subst = {"CLUSTER": str(tmp_path / "bad.yaml"), "CLUSTER2": str(tmp_path / "bad2.yaml"),
             "PLAN": str(tmp_path / "plan.json")}
    out = tmp_path / "trace.json"
    extra = ["--trace", str(out)] if args[0] == "collective" else []
    rc, stdout, stderr = cli(*[subst.get(a, a) for a in args], *extra)
    assert rc == 2, (stdout, stderr)
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert not out.exists()


def test_bad_input_writes_nothing(cli, tmp_path):
    out, plot = tmp_path / "t.json", tmp_path / "p.png"
    rc, _, err = cli("collective", "all_reduce", "--size", "1MiB", "--cluster", "nope", "--trace", str(out),
                     "--plot", str(plot))
    assert rc == 2 and not out.exists() and not plot.exists()


def test_same_input_gives_byte_identical_trace(cli, tmp_path):
    from tests.conftest import run_cli
    outs = []
    for i, run in enumerate((run_cli, cli)):    # a new process (its own hash seed), then this one
        out = tmp_path / f"t{i}.json"
        rc, _, err = run("collective", "all_reduce", "--size", "3MiB", "--cluster", "dgx-h100", "--nodes", "2",
                         "--algo", "ring", "--trace", str(out))
        assert rc == 0, err
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    events = json.loads(outs[0])["traceEvents"]
    assert any(e.get("cat") == "transfer" for e in events) and any(e.get("cat") == "collective" for e in events)


def test_cli_json_and_sweep(cli, tmp_path):
    rc, out, err = cli("collective", "all_gather", "--sizes", "1KiB:1MiB", "--json", "--plot", str(tmp_path / "p.png"))
    assert rc == 0, err
    doc = json.loads(out)
    rows = doc["results"]
    assert doc["schema"] == "distlab.collective/1" and doc["world_size"] == 8
    assert len(rows) == 11 and (tmp_path / "p.png").stat().st_size > 1000
    for key in ("op", "algorithm", "bytes", "count", "type", "redop", "root", "time_s", "algbw_GBps", "busbw_GBps"):
        assert key in rows[0]
    assert rows[-1]["busbw_GBps"] > rows[0]["busbw_GBps"]
    rc, out, _ = cli("collective", "all_reduce", "--size", "256MiB", "--cluster", "dgx-h100", "--nodes", "2",
                     "--algo", "ring", "--json")
    doc = json.loads(out)
    row, = doc["results"]                               # one shape whatever the flags: a list even for one size
    assert doc["world_size"] == 16 and row["algorithm"] == "ring" and 300 < row["busbw_GBps"] < 400


def test_cli_timeline_figure(cli, tmp_path):
    out = tmp_path / "tl.png"
    rc, _, err = cli("collective", "all_reduce", "--size", "8MiB", "--algo", "tree", "--timeline", str(out))
    assert rc == 0, err
    assert out.read_bytes()[:4] == b"\x89PNG"
    rc, _, err = cli("collective", "all_reduce", "--sizes", "1KiB:4KiB", "--timeline", str(out) + "2")
    assert rc == 2 and "--timeline shows one collective" in err

