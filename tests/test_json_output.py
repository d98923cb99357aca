"""Issue 12.5: `--json` output is one object per command whose first key is its schema, with snake_case keys
(units in the names), `world_size` everywhere, one shape whatever the flags; `distlab --version`."""
from __future__ import annotations

import json
import re

import pytest

from distlab.runtime.cli import main
from distlab.sim.plan import Collective, Plan

KEY = re.compile(r"^[a-z][a-z0-9]*(_([a-z0-9]+|GBps|GiB|MiB|KiB|GB))*$")       # snake_case, units such as _GBps


def run_json(capsys, *argv) -> dict:
    rc = main([str(a) for a in argv] + ["--json"])
    out, err = capsys.readouterr()
    assert rc in (0, 1), err
    return json.loads(out)


def keys(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from keys(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from keys(v)


def shape(obj):
    """The keys at every level (lists: the union over their items), without the values."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        merged = {}
        for v in obj:
            s = shape(v)
            if isinstance(s, dict):
                merged.update(s)
        return [merged]
    return None


@pytest.fixture
def plans(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    Plan([[Collective("all_reduce", 1024)], [Collective("all_reduce", 1024)]]).save(str(good))
    Plan([[Collective("all_reduce", 1024)], [Collective("broadcast", 1024)]]).save(str(bad))
    return good, bad


def test_schema_first_snake_case_and_world_size(capsys, plans):
    good, bad = plans
    outputs = {
        "collective": run_json(capsys, "collective", "all_reduce", "--sizes", "1KiB:4KiB"),
        "check": run_json(capsys, "check", bad),
        "memory": run_json(capsys, "memory", "--model", "gpt2-small"),
        "simulate": run_json(capsys, "simulate", "--no-files"),
    }
    for command, doc in outputs.items():
        assert list(doc)[0] == "schema" and doc["schema"] == f"distlab.{command}/1", command
        assert "world_size" in (doc["results"][0] if command == "simulate" else doc), command
        if command != "simulate":                  # simulate's keys are sim/commands/simulate.py's (issue 11)
            odd = [k for k in keys(doc) if not KEY.match(k)]
            assert not odd, (command, odd)


def test_one_shape_whatever_the_flags(capsys, plans):
    good, bad = plans
    one = run_json(capsys, "collective", "all_reduce", "--size", "1MiB")
    many = run_json(capsys, "collective", "all_reduce", "--sizes", "1MiB:4MiB", "--algo", "ring")
    assert shape(one) == shape(many) and len(one["results"]) == 1 and len(many["results"]) == 3
    ok, problems = run_json(capsys, "check", good), run_json(capsys, "check", bad)
    assert set(ok) == set(problems) and ok["problems"] == [] and ok["ok"] and not problems["ok"]
    ddp, zero1 = run_json(capsys, "memory", "--zero", "0"), run_json(capsys, "memory", "--zero", "1")
    assert shape(ddp) == shape(zero1)
    assert [s["selected"] for s in zero1["stages"]] == [False, True, False, False]


def test_check_problems_are_objects(capsys, plans):
    _, bad = plans
    doc = run_json(capsys, "check", bad)
    problem, = doc["problems"]
    assert set(problem) == {"rank", "op_index", "kind", "message"}
    assert problem["rank"] == 1 and problem["op_index"] == 0 and problem["kind"] == "mismatched_collective"
    assert "rank 1 calls broadcast" in problem["message"] and "rank 0 calls all_reduce" in problem["message"]


def test_memory_terms_are_bytes(capsys):
    doc = run_json(capsys, "memory", "--model", "gpt2-small", "--world", "4", "--zero", "3")
    stage = next(s for s in doc["stages"] if s["selected"])
    terms = [k for k in stage if k.endswith("_bytes") and k != "total_bytes"]
    assert stage["zero"] == 3 and doc["world_size"] == 4
    assert stage["total_bytes"] == pytest.approx(sum(stage[k] for k in terms))


def test_version_and_no_command(capsys):
    from importlib.metadata import version
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"distlab {version('distlab')}"
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: distlab" in err and "collective" in err          # the help, then exit 2
