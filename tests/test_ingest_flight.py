"""torch's flight recorder dumps (real ones, tests/data/flight_recorder/SOURCES.md) read by `distlab diagnose`:
JSON as is, pickle only with --allow-pickle and through an unpickler that refuses every global."""
from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest
from cli_in_process import cli  # noqa: F401  (the fixture)

DATA = os.path.join(os.path.dirname(__file__), "data", "flight_recorder")


@pytest.mark.parametrize("form, flags", [("json", ()), ("pickle", ("--allow-pickle",))])
def test_diagnose_names_the_rank_and_collective_of_a_torch_dump(cli, form, flags):
    rc, out, err = cli("diagnose", os.path.join(DATA, form), *flags, "--json")
    assert rc == 1, err
    d = json.loads(out)
    assert d["world_size"] == 2 and d["status"] == "missing_collective"
    assert d["verdict"] == "would hang: rank 0 waits in all_reduce #5 on group [0,1]; rank 1 never calls it"
    assert d["ranks"][1]["last_completed"]["op"] == "broadcast" and d["ranks"][0]["pending"][0]["bytes"] == 1024


def test_a_pickle_dump_needs_the_flag(cli):
    rc, out, err = cli("diagnose", os.path.join(DATA, "pickle"))
    assert rc == 2 and "--allow-pickle" in err and len(err.strip().splitlines()) == 1


class Planted:
    def __reduce__(self):
        return (os.system, ("touch planted-by-pickle",))


def test_a_planted_pickle_runs_nothing(cli, tmp_path):
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [Planted()]}))
    rc, out, err = cli("diagnose", tmp_path, "--allow-pickle")
    assert rc == 2 and "refused" in err and "posix.system" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists("planted-by-pickle") and not (tmp_path / "planted-by-pickle").exists()


def test_a_cut_json_dump_exits_2(cli, tmp_path):
    shutil.copy(os.path.join(DATA, "json", "nccl_trace_rank_1"), tmp_path / "nccl_trace_rank_1")
    text = open(os.path.join(DATA, "json", "nccl_trace_rank_0")).read()
    (tmp_path / "nccl_trace_rank_0").write_text(text[: len(text) // 2])
    rc, out, err = cli("diagnose", tmp_path)
    assert rc == 2 and "not valid JSON" in err and "nccl_trace_rank_0" in err
