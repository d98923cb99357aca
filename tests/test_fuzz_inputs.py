"""Fuzzing: malformed cluster files, scenario files, plans and CLI flags. The CLI never shows a traceback:
it succeeds, or exits 2 with one line on stderr (``distlab check`` exits 1 when it finds problems), and it
never leaves a half-written output file. 300 examples per input kind."""
import contextlib
import io
import json
import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from distlab.runtime.cli import main

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                    derandomize=True)      # the same examples every run: CI is not a lottery
TMP = ""                     # this module's folder under pytest's tmp_path (fuzz_dir below)


@pytest.fixture(scope="module", autouse=True)
def fuzz_dir(tmp_path_factory):
    """One folder for every example's files, removed with pytest's other tmp_path folders (no mkdtemp at import,
    which would leave a folder in the temp folder after every run)."""
    global TMP
    TMP = str(tmp_path_factory.mktemp("fuzz"))
    yield TMP


def run(argv, ok_codes=(0,)):
    """Run the CLI in-process; assert the contract; return (code, stdout)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    stderr = err.getvalue()
    assert "Traceback" not in stderr, stderr
    assert code in (*ok_codes, 2), (argv, code, stderr)
    if code == 2:
        assert len(stderr.strip().splitlines()) == 1, stderr
        assert stderr.strip(), "exit 2 needs a message"
    return code, out.getvalue()


def outputs_ok(code, paths):
    for p in paths:
        if code == 2:
            assert not os.path.exists(p), f"{p} written by a failing run"
        elif os.path.exists(p):
            assert os.path.getsize(p) > 0
            if p.endswith(".json"):
                json.loads(open(p).read())
        if os.path.exists(p):
            os.unlink(p)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 20), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=8), st.lists(st.integers(0, 3), max_size=3))
BASE_CLUSTER = {"name": "fz", "nodes": 2, "gpus_per_node": 4, "gpu": "h100",
                "intra_node": {"kind": "nvswitch", "bandwidth_GBps": 450, "latency_us": 0.6},
                "inter_node": {"kind": "infiniband", "nics_per_node": 4, "bandwidth_GBps": 50, "latency_us": 5,
                               "fabric": "fat-tree", "oversubscription": 2}}
CLUSTER_PATHS = [("name",), ("nodes",), ("gpus_per_node",), ("gpu",), ("gpu", "tflops"), ("intra_node",),
                 ("intra_node", "kind"), ("intra_node", "bandwidth_GBps"), ("intra_node", "latency_us"),
                 ("intra_node", "efficiency"), ("inter_node",), ("inter_node", "kind"), ("inter_node", "fabric"),
                 ("inter_node", "nics_per_node"), ("inter_node", "bandwidth_GBps"),
                 ("inter_node", "oversubscription"), ("extra_key",), ("intra_node", "extra"), ("calibration",)]


def mutate(base, edits):
    import copy
    d = copy.deepcopy(base)
    for path, value, delete in edits:
        target = d
        for k in path[:-1]:
            if not isinstance(target.get(k), dict):
                target[k] = {}
            target = target[k]
        if delete:
            target.pop(path[-1], None)
        else:
            target[path[-1]] = value
    return d


edits = st.lists(st.tuples(st.sampled_from(CLUSTER_PATHS), scalars, st.booleans()), max_size=3)


def write(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


@SETTINGS
@given(edits, st.sampled_from(["yaml", "garbage"]), st.sampled_from([True, False, False, False, False]))
def test_fuzz_cluster_files(changes, form, with_plot):
    """Every example checks the cluster and writes the trace; one in five also draws the plot (0.2 s each, most
    of this test's time when every example drew it; what can go wrong there does not depend on the cluster)."""
    d = mutate(BASE_CLUSTER, changes)
    if isinstance(d.get("nodes"), int) and d["nodes"] > 8 or isinstance(d.get("gpus_per_node"), int) and \
            d["gpus_per_node"] > 8:
        d["nodes"], d["gpus_per_node"] = 2, 4                   # keep valid runs small
    text = yaml.safe_dump(d) if form == "yaml" else yaml.safe_dump(d)[: len(str(changes)) % 40] + ": [\n"
    path = write("cluster.yaml", text)
    plot, trace = os.path.join(TMP, "c.png"), os.path.join(TMP, "c.json")
    code, _ = run(["collective", "all_reduce", "--size", "4KiB", "--cluster", path, "--trace", trace, "--json"]
                  + (["--plot", plot] if with_plot else []))
    outputs_ok(code, [plot, trace])


BASE_SCENARIO = {"model": {"kind": "mlp", "widths": [64, 64, 64], "batch": 4},
                 "parallelism": {"kind": "ddp", "bucket_cap_mb": 1}, "cluster": "dgx-h100", "nodes": 1}
SCENARIO_PATHS = [("model",), ("model", "kind"), ("model", "widths"), ("model", "preset"), ("parallelism",),
                  ("parallelism", "kind"), ("parallelism", "bucket_cap_mb"), ("parallelism", "grad_accum"),
                  ("parallelism", "iteration"), ("parallelism", "stages"), ("parallelism", "microbatches"),
                  ("parallelism", "schedule"), ("parallelism", "zero"), ("parallelism", "reshard_after_forward"),
                  ("cluster",), ("nodes",), ("world_size",), ("colour",), ("parallelism", "speed")]
scenario_edits = st.lists(st.tuples(st.sampled_from(SCENARIO_PATHS), scalars, st.booleans()), max_size=3)
KINDS = st.sampled_from([{}, {"kind": "fsdp"}, {"kind": "pipeline", "stages": 2, "microbatches": 4}])


@SETTINGS
@given(scenario_edits, KINDS)
def test_fuzz_scenario_files(changes, kind):
    base = mutate(BASE_SCENARIO, [(("parallelism",), {**BASE_SCENARIO["parallelism"], **kind}, False)]) \
        if kind else BASE_SCENARIO
    if kind.get("kind") == "pipeline":
        base["parallelism"].pop("bucket_cap_mb", None)
    d = mutate(base, changes)
    for k in ("nodes", "world_size"):
        if isinstance(d.get(k), int) and d[k] > 2:
            d[k] = 1
    path = write("scenario.yaml", yaml.safe_dump(d))
    run(["simulate", path, "--no-files", "--json"])


def plan_dict():
    return {"format": "distlab-plan/1", "name": "fz", "world_size": 2, "meta": {},
            "ranks": [[{"kind": "compute", "seconds": 0.001, "stream": "compute"},
                       {"kind": "record", "event": "e", "stream": "compute"},
                       {"kind": "wait", "event": "e", "stream": "comm"},
                       {"kind": "collective", "op": "all_reduce", "bytes": 1024, "group": [0, 1]},
                       {"kind": "send", "peer": 1, "bytes": 8}],
                      [{"kind": "collective", "op": "all_reduce", "bytes": 1024},
                       {"kind": "recv", "peer": 0, "bytes": 8}]]}


PLAN_FIELDS = ["kind", "op", "bytes", "group", "peer", "seconds", "stream", "event", "dtype", "root", "algorithm",
               "flops", "bogus"]


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 4), st.sampled_from(PLAN_FIELDS), scalars,
                          st.booleans()), max_size=3),
       st.sampled_from([None, "world_size", "ranks", "format", "truncate", "meta"]))
def test_fuzz_plans(changes, top):
    d = plan_dict()
    for rank, i, key, value, delete in changes:
        ops = d["ranks"][rank]
        if i < len(ops):
            if delete:
                ops[i].pop(key, None)
            else:
                ops[i][key] = value
    text = json.dumps(d)
    if top == "truncate":
        text = text[: len(text) // 2]
    elif top:
        d[top] = changes[0][3] if changes else None
        text = json.dumps(d)
    path = write("plan.json", text)
    run(["check", path], ok_codes=(0, 1))


WORDS = ["collective", "simulate", "memory", "check", "all_reduce", "broadcast", "all_to_all", "--size", "--sizes",
         "--cluster", "--nodes", "--algo", "--root", "--json", "--model", "--world", "--zero", "--bucket-cap-mb",
         "--sweep", "--no-files", "--gpus-per-node", "1KiB", "12XB", "8B:64KiB", "0", "-3", "2", "ring", "tree",
         "nvls", "dgx-h100", "pcie-8gpu", "nope", "llama-7b", "gpt2-small", "bucket_cap_mb=1,25", "=", "3",
         "--help-me", "1e3", "1.5"]


@SETTINGS
@given(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6))
def test_fuzz_cli_flags(argv):
    if argv[0] == "simulate":
        argv = argv + ["--no-files"]
    run(argv)


def test_fuzz_bases_are_valid():
    """The fuzzers start from valid inputs, so their examples exercise both paths."""
    assert run(["collective", "all_reduce", "--size", "4KiB", "--cluster",
                write("ok.yaml", yaml.safe_dump(BASE_CLUSTER)), "--json"])[0] == 0
    assert run(["simulate", write("ok-s.yaml", yaml.safe_dump(BASE_SCENARIO)), "--no-files", "--json"])[0] == 0
    assert run(["check", write("ok-p.json", json.dumps(plan_dict()))])[0] == 0
