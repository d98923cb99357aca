"""Flight recorder and `distlab diagnose`: a real hang or death on gloo ranks (short timeouts) is named in the
static check's own words; the static check refuses a mismatched plan before any rank starts."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from distlab.runtime.diagnosis.diagnose import diagnose
from distlab.runtime.diagnosis.flight import HEADER, SLOT, Recorder, decode
from distlab.runtime.diagnosis.flight_read import load_dir
from distlab.runtime.ranks.launch import Launch, RunFailed
from distlab.sim.check import PlanMismatch, check_plan
from distlab.sim.plan import Collective, Plan
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab` in this process, its ranks from its fork server
from tests.test_runtime_launch import alive, long_plan, wait_running

MiB = 2**20
TIMEOUT = 2.0


def plan_with(n: int, odd_rank: int, odd) -> Plan:
    """Five all_reduces everywhere, then a sixth, which ``odd_rank`` replaces by ``odd`` (None: skips it)."""
    def ops(r):
        sixth = Collective("all_reduce", 4 * MiB) if r != odd_rank else odd
        return [Collective("all_reduce", 4 * MiB) for _ in range(5)] + ([sixth] if sixth is not None else [])
    return Plan([ops(r) for r in range(n)], name="odd").validate()


# --- the recorder and the diagnosis, without ranks ------------------------------------------------------------
def test_ring_survives_without_a_dump_and_the_dump_wins(tmp_path):
    rec = Recorder(str(tmp_path), 1, 2, capacity=4)
    key = rec.key((0, 1), "comm")
    for i in range(6):                                   # more than the capacity: the oldest two drop out
        r = rec.issued(key, 0, 1024, 0, 0, i)
        rec.started(r)
        if i < 5:
            rec.completed(r)
    with open(rec.path, "rb") as f:
        data = f.read()
    d = decode(data)
    assert [x["seq"] for x in d["records"]] == [2, 3, 4, 5]
    assert [x["state"] for x in d["records"]] == ["completed"] * 3 + ["started"]
    assert d["records"][0]["group"] == [0, 1] and d["records"][0]["op"] == "all_reduce"
    torn = bytearray(data)                               # a slot half written when the rank was killed
    SLOT.pack_into(torn, HEADER, 9, 9, 77, 0, 0, 0, 0, 0, 2, 0.0, 0.0, 0.0)
    assert len(decode(bytes(torn))["records"]) == 3
    assert load_dir(str(tmp_path))["ranks"][1]["source"] == "live"
    rec.dump("RuntimeError: timed out")
    rec.dump("later reasons do not replace the first")
    loaded = load_dir(str(tmp_path))
    assert loaded["ranks"][1]["source"] == "dump" and loaded["ranks"][1]["reason"] == "RuntimeError: timed out"


def test_diagnosis_lines_up_truncated_rings_by_sequence_number():
    def recs(r, seqs, last_op="all_reduce"):
        return [{"gen": s, "seq": s, "op": last_op if s == seqs[-1] else "all_reduce", "group": [0, 1, 2],
                 "stream": "comm", "bytes": 0 if last_op == "barrier" and s == seqs[-1] else 8, "dtype": "float32",
                 "root": 0, "index": s,
                 "state": "started" if s == seqs[-1] else "completed", "t_issued": 1.0, "t_started": 1.0,
                 "t_completed": None} for s in seqs]
    flight = {"world_size": 3, "ranks": {0: {"source": "dump", "records": recs(0, range(90, 101))},
                                         1: {"source": "dump", "records": recs(1, range(95, 101), "barrier")},
                                         2: {"source": "dump", "records": recs(2, range(93, 101))}}}
    d = diagnose(flight)
    message = "group [0..2], collective #100: rank 1 calls barrier(0 B); ranks 0, 2 call all_reduce(8 B)"
    assert d["problems"] == [{"rank": 1, "op_index": 100, "kind": "mismatched_collective", "message": message}]
    assert str(d["problems"][0]) == d["verdict"] == message and d["status"] == "mismatched_collective"


def test_check_and_diagnose_name_a_problem_alike():
    """Issue 33: one name for one thing. The same divergence, as a plan (`distlab check`) and as the flight records
    a run of it leaves (`distlab diagnose`), gets the same kind and message."""
    from distlab.runtime.diagnosis.diagnose import KINDS
    from distlab.sim.check import KINDS as CHECK_KINDS, plan_problems
    for odd in (Collective("broadcast", 4 * MiB), None):           # a different collective; none at all
        plan = plan_with(3, 2, odd)
        checked = plan_problems(plan)[0]

        def records(r):
            return [{"gen": i, "seq": i, "op": op.op, "group": [0, 1, 2], "stream": "comm", "bytes": op.bytes,
                     "dtype": op.dtype, "root": op.root, "index": i, "state": "completed" if i < 5 else "started",
                     "t_issued": 1.0, "t_started": 1.0, "t_completed": None} for i, op in enumerate(plan.ranks[r])]
        flight = {"world_size": 3, "ranks": {r: {"source": "dump", "records": records(r)} for r in range(3)}}
        diagnosed = diagnose(flight)["problems"][0]
        assert diagnosed["kind"] == checked.kind in CHECK_KINDS and diagnosed["message"] == checked.message
        assert diagnosed["rank"] == checked.rank == 2
    assert set(CHECK_KINDS) >= set(KINDS) - {"died", "no_record"}


def _interrupted_flight(waited: float, completed_s: float = 0.01) -> dict:
    """Rank 0 completed all_reduce #0-#9 and waits in #10 for ``waited`` s; rank 1 completed #0-#9 and was
    stopped between collectives; the launcher was interrupted by SIGINT."""
    def rec(seq, state):
        return {"gen": seq, "seq": seq, "op": "all_reduce", "group": [0, 1], "stream": "comm", "bytes": 8,
                "dtype": "float32", "root": 0, "index": seq, "state": state, "t_issued": 100.0 + seq,
                "t_started": 100.0 + seq, "t_completed": 100.0 + seq + completed_s if state == "completed" else None}
    r0 = [rec(s, "completed") for s in range(10)] + [rec(10, "started")]
    r1 = [rec(s, "completed") for s in range(10)]
    dumped = 110.0 + waited
    return {"world_size": 2, "run": {"world_size": 2, "exit_codes": {"0": -15, "1": -15}, "failures": [],
                                     "interrupted": "SIGINT"},
            "ranks": {0: {"source": "dump", "reason": "signal SIGTERM", "dumped_at": dumped, "records": r0},
                      1: {"source": "dump", "reason": "signal SIGTERM", "dumped_at": dumped, "records": r1}}}


def test_an_interrupted_healthy_run_is_not_called_a_hang():
    from distlab.runtime.diagnosis.diagnose import exit_code
    d = diagnose(_interrupted_flight(waited=0.05))
    assert d["status"] == "interrupted" and d["problems"] == [] and exit_code(d) == 0
    assert d["verdict"].startswith("interrupted by SIGINT: the run was stopped, it did not hang")
    assert "rank 0 in all_reduce(8 B) #10 on group [0,1]" in d["verdict"]
    # the same records, but rank 0 had waited 30 s (10 x its longest collective is 0.1 s): a hang, then Ctrl-C
    d = diagnose(_interrupted_flight(waited=30.0))
    assert d["status"] == "missing_collective" and exit_code(d) == 1
    assert d["problems"] == [{"rank": 1, "op_index": None, "kind": "missing_collective", "message": "would hang: rank 0 waits in "
                              "all_reduce #10 on group [0,1]; rank 1 never calls it"}]
    # a failure before the interruption is never excused
    f = _interrupted_flight(waited=0.05)
    f["run"]["failures"] = [{"rank": 1, "message": "rank 1 failed: RuntimeError: boom"}]
    assert diagnose(f)["status"] == "missing_collective"


def test_diagnose_bad_input_is_one_line_exit_2(tmp_path, cli):
    rc, out, err = cli("diagnose", str(tmp_path / "nope"))
    assert rc == 2 and "not a directory" in err and len(err.splitlines()) == 1
    (tmp_path / "flight.0.json").write_text('{"records": [{"op": "all_reduce"}], "world_size": 2}')
    (tmp_path / "flight.1.ring").write_bytes(b"garbage")
    rc, out, err = cli("diagnose", str(tmp_path))
    assert rc == 2 and "no flight records here" in err and len(err.splitlines()) == 1


# --- before any rank starts ---------------------------------------------------------------------------------
def test_the_static_check_refuses_a_mismatched_plan_before_launch(tmp_path, cli):
    plan = plan_with(4, 3, Collective("broadcast", 4 * MiB, root=0))
    expected = check_plan(plan)[0]
    with pytest.raises(PlanMismatch, match="rank 3 calls broadcast"):
        Launch("distlab.runtime.execute.executor:plan_task", {"plan": plan.to_dict()}, 4)
    path = tmp_path / "odd.json"
    plan.save(str(path))
    t0 = time.monotonic()
    rc, out, err = cli("run", str(path))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and expected in err
    assert "--no-check" in err and time.monotonic() - t0 < 10
    assert sorted(os.listdir(tmp_path)) == ["odd.json"]               # no trace, no flight records


# --- real gloo ranks ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_real_mismatch_times_out_and_diagnose_names_rank_3(tmp_path, cli):
    plan = plan_with(4, 3, Collective("broadcast", 4 * MiB, root=0))
    path, dump = tmp_path / "odd.json", tmp_path / "dumps"
    plan.save(str(path))
    t0 = time.monotonic()
    rc, out, err = cli("run", str(path), "--no-check", "--timeout", str(TIMEOUT), "--warmup", "0",
                       "--dump-dir", str(dump))
    assert rc == 1 and "timed out" in err.lower() and f"distlab diagnose {dump}" in err
    assert time.monotonic() - t0 < 40
    rc, out, err = cli("diagnose", str(dump))
    assert rc == 1, err
    lines = out.splitlines()
    assert lines[0] == check_plan(plan)[0] == ("group [0..3], collective #5: rank 3 calls broadcast(4 MiB, root 0); "
                                               "ranks 0-2 call all_reduce(4 MiB)")
    assert "rank 3: last completed all_reduce(4 MiB) #4 on group [0..3]; waits in broadcast(4 MiB, root 0) #5" in out
    rc, out, _ = cli("diagnose", str(dump), "--json")
    d = json.loads(out)
    assert d["problems"] == [{"rank": 3, "op_index": 5, "kind": "mismatched_collective", "message": lines[0]}]
    assert {r["record"] for r in d["ranks"]} == {"dump"} and not any(r["died"] for r in d["ranks"])
    assert [r["last_completed"]["seq"] for r in d["ranks"]] == [4, 4, 4, 4]


@pytest.mark.slow
def test_a_skipped_collective_is_named_with_who_waits():
    plan = plan_with(3, 2, None)                          # rank 2 never calls the sixth all_reduce
    expected = "would hang: ranks 0-1 wait in all_reduce #5 on group [0..2]; rank 2 never calls it"
    assert check_plan(plan) == [expected]
    with pytest.raises(RunFailed) as e:
        Launch("distlab.runtime.execute.executor:plan_task", {"plan": plan.to_dict(), "warmup": 0, "repeat": 1}, 3,
               timeout=TIMEOUT, check=False).start().wait()
    assert e.value.flight is not None and e.value.dump_dir is None        # read back before the run dir went
    d = diagnose(e.value.flight)
    assert d["problems"] == [{"rank": 2, "op_index": None, "kind": "missing_collective", "message": expected}]
    assert [len(r["pending"]) for r in d["ranks"]] == [1, 1, 0]
    assert d["ranks"][2]["last_completed"]["seq"] == 4


@pytest.mark.slow
def test_a_sigkilled_rank_is_reported_from_its_live_record(tmp_path):
    dump = tmp_path / "dumps"
    launch = Launch("distlab.runtime.execute.executor:plan_task", {"plan": long_plan(2, 4000).to_dict(), "warmup": 0, "repeat": 1},
                    2, timeout=10, dump_dir=str(dump)).start()
    try:
        wait_running(launch)
        time.sleep(0.3)
        os.kill(launch.pids[1], signal.SIGKILL)
        with pytest.raises(RunFailed):
            launch.wait()
    finally:
        launch.stop()
    assert not any(alive(pid) for pid in launch.pids)
    files = sorted(os.listdir(dump))
    assert "flight.1.ring" in files and "flight.1.json" not in files and "flight.0.json" in files
    d = diagnose(load_dir(str(dump)))
    last = d["ranks"][1]["last_completed"]
    assert d["problems"][0]["rank"] == 1 and d["problems"][0]["kind"] == "died"
    assert d["problems"][0]["op_index"] == last["index"]                  # the plan's op index
    assert d["verdict"].startswith(f"rank 1 died without a final dump (killed by SIGKILL) after its last "
                                   f"completed op, all_reduce(1 MiB) #{last['seq']} on group [0,1] (plan op "
                                   f"{last['index']}); its last record: all_reduce(1 MiB) #")
    assert d["ranks"][1]["died"] and not d["ranks"][0]["died"] and d["ranks"][1]["last_completed"]["seq"] > 0
