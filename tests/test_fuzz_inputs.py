"""Fuzzing every command and input kind (issues 32 and 41): clusters, scenarios, plans, runs files, cluster-jobs
files, traces, flight records, `distlab plan` questions, the runtime commands' bounds (ranks, threads, timeouts,
sizes, outputs that are FIFOs or links) and every command's flags, 1,510 generated inputs in all (QUOTAS), the
same ones on every run (hypothesis, derandomized). The CLI, run in this process, never shows a traceback: it
succeeds, or exits 2 with one line on stderr (check and diagnose exit 1 when they find problems), and a refused
input writes nothing: neither its named outputs nor anything in the folder it runs in. Runtime commands never
start ranks here: a launch the input would start stops at Launch.start.

Each input is measured (``run``): its wall time (under 10 s) and its peak memory (under 1 GB). In this process the
peak is the kernel's high-water mark of resident memory (VmHWM in /proc/self/status), reset before each input by
writing 5 to /proc/self/clear_refs (Linux >= 4.0, proc(5)); the input's peak is VmHWM after it less VmRSS before
it: how far the input raised the process's resident memory at its highest, however short the spike (sampling
could miss one). That is what a 1 GB limit on the command would see beyond the interpreter it starts with; memory
the process already held and the input reused is not counted again (the baseline itself is ~0.3 GB here). Where
clear_refs cannot be written, the growth of ru_maxrss is used (a lower bound: it misses an input that stays
under an earlier peak). Inputs that are built to blow up time or
memory are tests/test_bounded_inputs.py's, each under a 1 GB address-space limit in a subprocess."""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import os
import shutil

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from distlab.runtime.cli import main

QUOTAS = {"cluster": 140, "scenario": 150, "plan": 170, "runs": 110, "trace": 130, "flight": 130, "question": 100,
          "flags": 300, "runtime": 220, "jobs": 60}
LIMITS = {"seconds": 10.0, "bytes": 1 << 30}        # per input
MEASURED = {"inputs": 0, "seconds": 0.0, "bytes": 0}   # the largest seen, for the report
COUNT: dict[str, int] = {}
TMP = ""                     # this module's folder under pytest's tmp_path (fuzz_dir below)


class WouldLaunch(Exception):
    """A runtime command got valid input: it would start ranks now."""


@pytest.fixture(scope="module", autouse=True)
def fuzz_dir(tmp_path_factory):
    """One folder for every example's files, removed with pytest's other tmp_path folders."""
    global TMP
    TMP = str(tmp_path_factory.mktemp("fuzz"))
    yield TMP


@pytest.fixture(scope="module", autouse=True)
def one_parser():
    """main() builds the whole parser (every command's flags, ~15 ms) on each call: the 1,020 calls here share
    one, built once for this module (~60% of its CPU). argparse keeps nothing between parses, and nothing here
    changes what the flags are (a registered workload adds simulate flags: tests/test_workloads.py)."""
    from distlab.runtime import cli
    built = cli.build_parser()
    patch = pytest.MonkeyPatch()
    patch.setattr(cli, "build_parser", lambda: built)
    yield built
    patch.undo()


@pytest.fixture(autouse=True)
def empty_cwd(fuzz_dir, monkeypatch):
    """Commands run in an empty folder: a refused input must leave it empty (outputs with default names too)."""
    cwd = os.path.join(fuzz_dir, "cwd")
    os.makedirs(cwd, exist_ok=True)
    monkeypatch.chdir(cwd)


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    """Runtime commands stop where they would start ranks or JupyterLab."""
    from distlab.runtime.ranks import launch
    from distlab.sim.commands import lessons

    def refuse(*args, **kwargs):
        raise WouldLaunch
    monkeypatch.setattr(launch.Launch, "start", refuse)
    monkeypatch.setattr(lessons, "command", refuse)          # JupyterLab's command line: built just before Popen
    from distlab.runtime.measure import load                 # the machine's load, read before ranks would start:
    real = load.sample                                       # /proc read twice as usual, without the 0.25 s
    monkeypatch.setattr(load, "sample", lambda window=0.25, **kw: real(0.0, **kw))   # wait (~30 inputs x 0.25 s)


def fuzz(kind: str, *strategies):
    """A hypothesis test of ``QUOTAS[kind]`` derandomized examples that counts them (see run_quota)."""
    def wrap(body):
        @functools.wraps(body)
        def counted(*args, **kwargs):
            COUNT[kind] = COUNT.get(kind, 0) + 1
            body(*args, **kwargs)
        return settings(max_examples=QUOTAS[kind], deadline=None, suppress_health_check=list(HealthCheck),
                        database=None, derandomize=True)(given(*strategies)(counted))
    return wrap


def run_quota(kind: str, test) -> None:
    COUNT[kind] = 0
    test()
    assert COUNT[kind] >= QUOTAS[kind], (kind, COUNT[kind])


def test_the_quotas_add_up_to_1500_inputs():
    assert sum(QUOTAS.values()) >= 1500


PROC: dict[str, int] = {}        # /proc/self/status and clear_refs, opened once (not twice per input)


def _proc(name: str, flags: int) -> int:
    if name not in PROC:
        PROC[name] = os.open(f"/proc/self/{name}", flags | os.O_CLOEXEC)
    return PROC[name]


def _status(key: str) -> int:
    """VmRSS or VmHWM of this process, in bytes (/proc/self/status, read afresh from offset 0)."""
    for line in os.pread(_proc("status", os.O_RDONLY), 1 << 16, 0).decode().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _start_measure():
    """(t0, memory baseline, how the peak is read) for one input (module docstring)."""
    import resource
    import time
    try:
        os.write(_proc("clear_refs", os.O_WRONLY), b"5")   # VmHWM := VmRSS
        return time.monotonic(), _status("VmRSS"), "hwm"
    except OSError:
        return time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "maxrss"


def _end_measure(start, argv) -> None:
    import resource
    import time
    t0, base, how = start
    seconds = time.monotonic() - t0
    peak = _status("VmHWM") if how == "hwm" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    used = max(peak - base, 0)
    MEASURED.update(inputs=MEASURED["inputs"] + 1, seconds=max(MEASURED["seconds"], seconds),
                    bytes=max(MEASURED["bytes"], used))
    assert seconds < LIMITS["seconds"], (argv, seconds)
    assert used < LIMITS["bytes"], (argv, used)


def run(argv, ok_codes=(0,)):
    """Run the CLI in-process; assert the contract, the input's time and memory; return (code, stdout)."""
    out, err = io.StringIO(), io.StringIO()
    start = _start_measure()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except WouldLaunch:
            code = 0
    _end_measure(start, argv)
    stderr = err.getvalue()
    assert "Traceback" not in stderr, stderr
    assert code in (*ok_codes, 2), (argv, code, stderr)
    left = os.listdir(".")                     # the empty folder the command ran in (empty_cwd)
    if code == 2:
        assert len(stderr.strip().splitlines()) == 1, stderr
        assert stderr.strip(), "exit 2 needs a message"
        assert not left, (argv, left)
    for name in left:                          # a valid run's default outputs: gone before the next example
        shutil.rmtree(name) if os.path.isdir(name) and not os.path.islink(name) else os.unlink(name)
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


def write(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def mutate(base, edits):
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


# Every character UTF-8 can encode (all but the surrogates), as st.text() draws by default (codec="utf-8"), without
# hypothesis building its codec table: 1.1M encodes, ~2.6 s of CPU wherever its .hypothesis folder is new (CI).
TEXT = st.characters(exclude_categories=("Cs",))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 20), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(TEXT, max_size=8), st.lists(st.integers(0, 3), max_size=3),
                    st.sampled_from([10**40, -1, 0.0, 1e300, {"a": 1}, [[0]], "all", ""]))


def as_yaml(d, form):
    text = yaml.safe_dump(d)
    return text if form == "yaml" else text[: len(text) // 2] + ": [\n"


# --- clusters (collective --cluster) ----------------------------------------------------------------------------
BASE_CLUSTER = {"name": "fz", "nodes": 2, "gpus_per_node": 4, "gpu": "h100",
                "intra_node": {"kind": "nvswitch", "bandwidth_GBps": 450, "latency_us": 0.6},
                "inter_node": {"kind": "infiniband", "nics_per_node": 4, "bandwidth_GBps": 50, "latency_us": 5,
                               "fabric": "fat-tree", "oversubscription": 2}}
CLUSTER_PATHS = [("name",), ("nodes",), ("gpus_per_node",), ("gpu",), ("gpu", "tflops"), ("intra_node",),
                 ("intra_node", "kind"), ("intra_node", "bandwidth_GBps"), ("intra_node", "latency_us"),
                 ("intra_node", "efficiency"), ("inter_node",), ("inter_node", "kind"), ("inter_node", "fabric"),
                 ("inter_node", "nics_per_node"), ("inter_node", "bandwidth_GBps"),
                 ("inter_node", "oversubscription"), ("extra_key",), ("intra_node", "extra"), ("calibration",),
                 ("calibration", "collectives"), ("calibration", "collectives", "all_reduce"),
                 ("calibration", "collectives", "all_reduce", "4"),
                 ("calibration", "collectives", "all_reduce", "4", "bandwidth_GBps"), ("cpu_cores",),
                 ("interference",), ("compute_jitter",)]


@fuzz("cluster", st.lists(st.tuples(st.sampled_from(CLUSTER_PATHS), scalars, st.booleans()), max_size=3),
      st.sampled_from(["yaml", "yaml", "yaml", "garbage"]))
def _clusters(changes, form):
    d = mutate(BASE_CLUSTER, changes)
    if isinstance(d.get("nodes"), int) and d["nodes"] > 8 or isinstance(d.get("gpus_per_node"), int) and \
            d["gpus_per_node"] > 8:
        d["nodes"], d["gpus_per_node"] = 2, 4                   # keep valid runs small
    trace = os.path.join(TMP, "c.json")
    code, _ = run(["collective", "all_reduce", "--size", "4KiB", "--cluster", write("cluster.yaml", as_yaml(d, form)),
                   "--trace", trace, "--json"])
    outputs_ok(code, [trace])


def test_fuzz_cluster_files():
    run_quota("cluster", _clusters)


# --- scenarios (simulate) ---------------------------------------------------------------------------------------
BASE_SCENARIO = {"model": {"kind": "mlp", "widths": [64, 64, 64], "batch": 4},
                 "ddp": {"bucket_cap_mb": 1}, "cluster": "dgx-h100", "nodes": 1}
SCENARIO_PATHS = [("model",), ("model", "kind"), ("model", "widths"), ("model", "preset"), ("model", "batch"),
                  ("ddp",), ("ddp", "bucket_cap_mb"), ("ddp", "grad_accum"), ("fsdp",), ("fsdp", "zero"),
                  ("pipeline",), ("pipeline", "microbatches"), ("pipeline", "schedule"), ("mesh",), ("mesh", "dp"),
                  ("mesh", "pp"), ("cluster",), ("nodes",), ("world_size",), ("colour",), ("stragglers",),
                  ("stragglers", 0), ("degraded_links",), ("name",)]


@fuzz("scenario", st.lists(st.tuples(st.sampled_from(SCENARIO_PATHS), scalars, st.booleans()), max_size=3),
      st.sampled_from([None, "fsdp", "pipeline"]))
def _scenarios(changes, section):
    base = copy.deepcopy(BASE_SCENARIO)
    if section == "fsdp":
        del base["ddp"]
        base["fsdp"] = {"zero": 3}
    elif section == "pipeline":
        base.pop("ddp")
        base.update(pipeline={"microbatches": 4}, mesh={"pp": 2})
    d = mutate(base, changes)
    for k in ("nodes", "world_size"):
        if isinstance(d.get(k), int) and d[k] > 2:
            d[k] = 1
    run(["simulate", write("scenario.yaml", yaml.safe_dump(d)), "--no-files", "--json"])


def test_fuzz_scenario_files():
    run_quota("scenario", _scenarios)


# --- plans (check, simulate, run) -------------------------------------------------------------------------------
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
               "flops", "name", "splits", "gemms", "bogus"]


@fuzz("plan", st.lists(st.tuples(st.integers(0, 1), st.integers(0, 4), st.sampled_from(PLAN_FIELDS), scalars,
                                 st.booleans()), max_size=3),
      st.sampled_from([None, "world_size", "ranks", "format", "truncate", "meta", "deep", "bigint"]),
      st.sampled_from(["check", "check", "simulate", "run"]))
def _plans(changes, top, command):
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
    elif top == "deep":
        text = text[:-1] + ', "x": ' + "[" * 3000 + "]" * 3000 + "}"
    elif top == "bigint":
        text = text.replace('"bytes": 8', '"bytes": ' + "9" * 5000, 1)
    elif top:
        d[top] = changes[0][3] if changes else None
        text = json.dumps(d)
    path = write("plan.json", text)
    out = os.path.join(TMP, "p.trace")
    argv = {"check": ["check", path], "simulate": ["simulate", path, "--no-files", "--json"],
            "run": ["run", path, "--out", out, "--backend", "gloo"]}[command]
    code, _ = run(argv, ok_codes=(0, 1))
    outputs_ok(code, [out])


def test_fuzz_plans():
    run_quota("plan", _plans)


# --- runs files (reproduce) -------------------------------------------------------------------------------------
BASE_RUN = {"name": "tiny", "source": "fuzz", "model": {"arch": "gpt2", "layers": 2, "hidden": 256, "heads": 4,
                                                         "seq_len": 128, "vocab": 1024},
            "gpu": "a100", "cluster": "dgx-a100", "gpus": 8, "layout": {"tp": 1, "pp": 1, "dp": 8},
            "global_batch": 16, "micro_batch": 1, "precision": "float16", "reported": {"tflops_per_gpu": 100}}
RUN_PATHS = [("name",), ("model",), ("model", "layers"), ("model", "hidden"), ("gpu",), ("cluster",), ("gpus",),
             ("layout",), ("layout", "tp"), ("layout", "dp"), ("layout", "zero"), ("global_batch",), ("micro_batch",),
             ("reported",), ("reported", "tflops_per_gpu"), ("precision",), ("recompute",), ("bogus",)]


@fuzz("runs", st.lists(st.tuples(st.sampled_from(RUN_PATHS), scalars, st.booleans()), max_size=3),
      st.sampled_from(["run", "run", "generations", "runs-not-a-list", "garbage"]))
def _runs(changes, form):
    r = mutate(BASE_RUN, changes)
    if isinstance(r.get("gpus"), int) and r["gpus"] > 8:
        r["gpus"] = 8
    d = {"runs": [r]}
    if form == "generations":
        d["generations"] = {"ampere": {"peak_fraction": changes[0][1] if changes else 0.5, "half_flops": 1e10}}
    elif form == "runs-not-a-list":
        d["runs"] = r
    run(["reproduce", write("runs.yaml", as_yaml(d, "garbage" if form == "garbage" else "yaml")), "--json"])


def test_fuzz_runs_files():
    run_quota("runs", _runs)


# --- traces (compare) -------------------------------------------------------------------------------------------
def trace_texts():
    from distlab.sim.cluster import load_cluster
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.plan import Plan
    plan = Plan.from_dict(plan_dict())
    t = simulate(plan, load_cluster("localhost-cpu").with_world_size(2))
    return plan, t.to_dict(), json.loads(t.to_chrome())


TRACE_FIELDS = ["rank", "stream", "index", "kind", "name", "start", "end", "bytes", "op", "launch", "group",
                "algorithm", "peer", "bogus"]
CHROME_FIELDS = ["ph", "pid", "tid", "ts", "dur", "cat", "name", "args"]


@fuzz("trace", st.lists(st.tuples(st.integers(0, 7), st.sampled_from(TRACE_FIELDS + CHROME_FIELDS), scalars,
                                  st.booleans()), max_size=3),
      st.sampled_from(["native", "chrome", "truncate", "list", "meta"]), st.booleans())
def _traces(changes, form, measured_side):
    plan, native, chrome = trace_texts_cached()
    d = copy.deepcopy(chrome if form == "chrome" else native)
    items = d["traceEvents"] if form == "chrome" else d["ops"]
    for i, key, value, delete in changes:
        if i < len(items) and isinstance(items[i], dict):
            if delete:
                items[i].pop(key, None)
            else:
                items[i][key] = value
    text = json.dumps(d)
    if form == "truncate":
        text = text[: len(text) // 2]
    elif form == "list":
        text = json.dumps(items)
    elif form == "meta":
        d["meta" if "meta" in d else "otherData"] = changes[0][2] if changes else None
        text = json.dumps(d)
    bad = write("t.json" if form == "chrome" else "t.trace", text)
    good = write("g.trace", json.dumps(native))
    both = os.path.join(TMP, "both.json")
    argv = ["compare", good, bad] if measured_side else ["compare", bad, good]
    code, _ = run(argv + ["--out", both])
    outputs_ok(code, [both])


_TRACES: list = []


def trace_texts_cached():
    if not _TRACES:
        _TRACES.append(trace_texts())
    return _TRACES[0]


def test_fuzz_traces():
    run_quota("trace", _traces)


# --- flight records (diagnose) ----------------------------------------------------------------------------------
def flight_dump(rank):
    rec = {"gen": 0, "seq": 0, "op": "all_reduce", "group": [0, 1], "stream": "comm", "bytes": 1024,
           "dtype": "float32", "root": 0, "index": 3, "state": "completed", "t_issued": 1.0, "t_started": 1.1,
           "t_completed": 1.2}
    return {"format": "distlab-flight/1", "rank": rank, "world_size": 2, "pid": 100 + rank, "capacity": 1024,
            "records": [rec, dict(rec, gen=1, seq=1, state="started", t_completed=None)], "reason": "SIGTERM"}


FLIGHT_FIELDS = ["gen", "seq", "op", "group", "stream", "bytes", "dtype", "root", "index", "state", "t_issued",
                 "t_started", "t_completed"]


@fuzz("flight", st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1), st.sampled_from(FLIGHT_FIELDS), scalars,
                                   st.booleans()), max_size=3),
      st.sampled_from([None, "world_size", "records", "run-list", "run-dict", "truncate", "ring"]), scalars)
def _flights(changes, top, value):
    folder = os.path.join(TMP, "flight")
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    dumps = [flight_dump(0), flight_dump(1)]
    for rank, i, key, v, delete in changes:
        rec = dumps[rank]["records"][i]
        if delete:
            rec.pop(key, None)
        else:
            rec[key] = v
    if top in ("world_size", "records"):
        dumps[0][top] = value
    for r, d in enumerate(dumps):
        text = json.dumps(d)
        write(f"flight/flight.{r}.json", text[: len(text) // 2] if top == "truncate" and r else text)
    if top == "run-list":
        write("flight/run.json", json.dumps([value]))
    elif top == "run-dict":
        write("flight/run.json", json.dumps({"world_size": value, "exit_codes": {"0": value}, "failures": value}))
    elif top == "ring":
        with open(os.path.join(folder, "flight.1.ring"), "wb") as f:
            f.write(json.dumps({"format": "distlab-flight/1", "capacity": value, "world_size": 2,
                                "keys": [[[[0, value]], "comm"]]}).encode().ljust(1 << 16) + b"\1" * 640)
    run(["diagnose", folder, "--json"], ok_codes=(0, 1))


def test_fuzz_flight_records():
    run_quota("flight", _flights)


# --- `distlab plan` questions -----------------------------------------------------------------------------------
BASE_QUESTION = {"model": "gpt2-small", "cluster": "dgx-h100", "nodes": 1, "global_batch": 16}
QUESTION_PATHS = [("model",), ("cluster",), ("nodes",), ("global_batch",), ("seq_len",), ("bogus",), ("tp",)]


@fuzz("question", st.lists(st.tuples(st.sampled_from(QUESTION_PATHS), scalars, st.booleans()), max_size=2),
      st.sampled_from(["yaml", "yaml", "garbage"]))
def _questions(changes, form):
    d = mutate(BASE_QUESTION, changes)
    run(["plan", write("q.yaml", as_yaml(d, form)), "--confirm", "0", "--json"])


def no_search(monkeypatch):
    """`distlab plan` reads and checks its question; a valid one stops where the search (seconds) would begin, and
    `distlab reproduce` (flags) where it would simulate the shipped runs (32 to 3072 GPUs)."""
    from distlab.sim.planner import search
    from distlab.sim.reproduce import predict

    def searched(model, cluster, *args, **kwargs):
        from distlab.sim.cluster import load_cluster
        load_cluster(cluster)
        raise WouldLaunch

    def predicted(*args, **kwargs):
        raise WouldLaunch
    monkeypatch.setattr(search, "search", searched)
    monkeypatch.setattr(predict, "predict", predicted)


def test_fuzz_plan_questions(monkeypatch):
    no_search(monkeypatch)
    run_quota("question", _questions)


# --- every command's flags --------------------------------------------------------------------------------------
WORDS = ["collective", "simulate", "memory", "check", "plan", "reproduce", "lessons", "cluster", "run", "bench",
         "calibrate", "validate", "diagnose", "compare", "--matrix", "--capacity", "--top", "all_reduce", "broadcast",
         "--allow-code", "--scheduler", "tcp://10.0.0.1:8786", "--insecure-scheduler", "--out", "--plot",
         "mypkg:build", "sys:exit", "builtins:input",
         "all_to_all", "--size", "--sizes",
         "--cluster", "--nodes", "--algo", "--root", "--json", "--model", "--world", "--zero", "--bucket-cap-mb",
         "--sweep", "--no-files", "--gpus-per-node", "--nproc", "--ops", "--iters", "--timeout", "--threads",
         "--backend", "--dtype", "--port", "--only", "--max-gpus", "--global-batch", "--confirm", "1KiB", "12XB",
         "8B:64KiB", "0", "-3", "2", "ring", "tree", "nvls", "dgx-h100", "pcie-8gpu", "nope", "llama-7b",
         "gpt2-small", "bucket_cap_mb=1,25", "bucket_cap_mb=1,inf", "=", "3", "nan", "inf", "1e400", "-1e-9",
         "9" * 5000, "--help-me", "1e3", "1.5", "gloo", "nccl", "all"]


@fuzz("flags", st.lists(st.sampled_from(WORDS), min_size=1, max_size=6))
def _flags(argv):
    if argv[0] == "simulate":
        argv = argv + ["--no-files"]
    run(argv, ok_codes=(0, 1))


def test_fuzz_cli_flags(monkeypatch):
    no_search(monkeypatch)
    run_quota("flags", _flags)


# --- cluster-jobs files (cluster) -----------------------------------------------------------------------------------
BASE_JOBS = {"cluster": "dgx-h100", "nodes": 2, "placement": "packed",
             "jobs": [{"name": "a", "scenario": {"model": {"kind": "mlp", "widths": [64, 64], "batch": 4}, "ddp": {}},
                       "nodes": 1}]}
JOBS_PATHS = [("cluster",), ("nodes",), ("placement",), ("fabric",), ("fabric", "layout"),
              ("fabric", "oversubscription"), ("fabric", "nodes_per_leaf"), ("seed",), ("name",), ("jobs",),
              ("bogus",)]
JOB_FIELDS = ["name", "scenario", "nodes", "start_s", "steps", "placement", "bogus"]


@fuzz("jobs", st.lists(st.tuples(st.sampled_from(JOBS_PATHS), scalars, st.booleans()), max_size=2),
      st.lists(st.tuples(st.sampled_from(JOB_FIELDS), scalars, st.booleans()), max_size=2),
      st.sampled_from(["yaml", "yaml", "garbage", "factory"]))
def _jobs(changes, job_changes, form):
    d = mutate(BASE_JOBS, changes)
    if isinstance(d.get("nodes"), int) and d["nodes"] > 4:
        d["nodes"] = 2
    if isinstance(d.get("jobs"), list) and d["jobs"] and isinstance(d["jobs"][0], dict):
        job = d["jobs"][0]
        for key, value, delete in job_changes:
            job.pop(key, None) if delete else job.__setitem__(key, value)
        if form == "factory":                               # a data file never runs code (issue 41)
            job["scenario"] = {"model": {"factory": "os:getcwd"}, "ddp": {}}
    run(["cluster", write("jobs.yaml", as_yaml(d, "garbage" if form == "garbage" else "yaml")), "--no-files",
         "--json"])


def test_fuzz_jobs_files():
    run_quota("jobs", _jobs)


# --- the runtime commands' bounds and outputs (no rank starts) ------------------------------------------------------
RUNTIME_FLAGS = {"--nproc": ["2", "4", "0", "17", "1000", "-1", "2,4", "x", "1e3"],
                 "--threads": ["1", "2", "0", "3", "1000000", "-2", "x"],
                 "--timeout": ["60", "1", "0.5", "1e-9", "inf", "nan", "-1", "1e300", "604800", "604801"],
                 "--sizes": ["1KiB", "1KiB:4KiB", "8GiB", "1024TiB", "2PiB", "0", "1KiB:0", "x", "1KiB,7B"],
                 "--iters": ["1", "0", "-1", "10"], "--warmup": ["0", "-1", "2"],
                 "--ops": ["all_reduce", "all_gather", "barrier", "nope", "all"],
                 "--out": ["@o.json", "@fifo.json", "@linked/o.json", "@open/o.json", "/dev/null", "", "@nodir/o.json"],
                 "--dump-dir": ["@dd", "@linked", "@open", "@fifo.json"], "--allow-code": [None],
                 "--insecure-scheduler": [None]}


@fuzz("runtime", st.sampled_from(["bench", "run", "calibrate", "validate", "memory", "diagnose", "cluster", "plan"]),
      st.lists(st.tuples(st.sampled_from(sorted(RUNTIME_FLAGS)), st.integers(0, 9)), max_size=4))
def _runtime(command, flags):
    argv = {"run": ["run", RUNTIME_INPUTS["plan"]], "diagnose": ["diagnose", RUNTIME_INPUTS["flight"]],
            "cluster": ["cluster", RUNTIME_INPUTS["jobs"], "--no-files"], "plan": ["plan", "--confirm", "0"]}.get(
        command, [command])
    for flag, i in flags:
        value = RUNTIME_FLAGS[flag][i % len(RUNTIME_FLAGS[flag])]          # @NAME: a path in the fuzz folder
        argv += [flag] if value is None else [flag, os.path.join(TMP, value[1:]) if value.startswith("@") else value]
    code, _ = run(argv, ok_codes=(0, 1))
    for name in ("o.json", "linked/o.json", "open/o.json"):
        assert code != 2 or not os.path.exists(os.path.join(TMP, name)), (argv, name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(TMP, name))


RUNTIME_INPUTS: dict = {}


def test_fuzz_runtime_bounds(monkeypatch):
    """The runtime commands' flags: ranks, threads, timeouts, sizes against memory, outputs that are a FIFO, in a
    folder reached through a link or writable by everyone; each refused in one line or stopped at Launch.start."""
    no_search(monkeypatch)
    os.makedirs(os.path.join(TMP, "real"), exist_ok=True)
    os.makedirs(os.path.join(TMP, "open"), exist_ok=True)
    os.chmod(os.path.join(TMP, "open"), 0o777)
    if not os.path.lexists(os.path.join(TMP, "linked")):
        os.symlink(os.path.join(TMP, "real"), os.path.join(TMP, "linked"))
    if not os.path.lexists(os.path.join(TMP, "fifo.json")):
        os.mkfifo(os.path.join(TMP, "fifo.json"))
    os.makedirs(os.path.join(TMP, "rt-flight"), exist_ok=True)
    for r in (0, 1):
        write(f"rt-flight/flight.{r}.json", json.dumps(flight_dump(r)))
    RUNTIME_INPUTS.update(plan=write("rt-plan.json", json.dumps(plan_dict())), flight=os.path.join(TMP, "rt-flight"),
                          jobs=write("rt-jobs.yaml", yaml.safe_dump(BASE_JOBS)))
    run_quota("runtime", _runtime)


def test_fuzz_bases_are_valid():
    """The fuzzers start from valid inputs, so their examples exercise both paths."""
    assert run(["collective", "all_reduce", "--size", "4KiB", "--cluster",
                write("ok.yaml", yaml.safe_dump(BASE_CLUSTER)), "--json"])[0] == 0
    assert run(["cluster", write("ok-j.yaml", yaml.safe_dump(BASE_JOBS)), "--no-files", "--json"])[0] == 0
    assert run(["simulate", write("ok-s.yaml", yaml.safe_dump(BASE_SCENARIO)), "--no-files", "--json"])[0] == 0
    assert run(["check", write("ok-p.json", json.dumps(plan_dict()))])[0] == 0
    assert run(["reproduce", write("ok-r.yaml", yaml.safe_dump({"runs": [BASE_RUN]})), "--json"])[0] == 0
    _, native, chrome = trace_texts_cached()
    assert run(["compare", write("ok.trace", json.dumps(native)), write("ok-c.json", json.dumps(chrome))])[0] == 0
    folder = os.path.join(TMP, "ok-flight")
    os.makedirs(folder, exist_ok=True)
    for r in (0, 1):
        write(f"ok-flight/flight.{r}.json", json.dumps(flight_dump(r)))
    assert run(["diagnose", folder, "--json"], ok_codes=(0, 1))[0] in (0, 1)


def test_zz_every_input_was_measured():
    """Last in this module: every fuzzed input went through ``run``'s measurement (the maxima: pytest -s)."""
    if MEASURED["inputs"] < sum(QUOTAS.values()):
        pytest.skip("only part of the module ran")
    print(f"\nfuzz: {MEASURED['inputs']} inputs; slowest {MEASURED['seconds']:.2f} s, largest peak "
          f"{MEASURED['bytes'] / 2**20:.0f} MiB above the baseline")
    assert MEASURED["seconds"] < LIMITS["seconds"] and MEASURED["bytes"] < LIMITS["bytes"]
