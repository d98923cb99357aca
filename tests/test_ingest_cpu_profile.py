"""A torch.profiler CPU trace this test makes on 2 gloo ranks (runtime/lessons/profile.py) held against the plan of the
same program: `distlab compare PLAN DIR` and `distlab simulate --from-profile DIR` on the learner's own machine."""
from __future__ import annotations

import json

import pytest
from cli_in_process import cli  # noqa: F401  (the fixture)

from distlab.sim.ingest.kineto import breakdown, load_profile
from distlab.sim.ingest.scenario import step_events


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    from distlab.runtime.lessons.profile import profile_here, program_plan
    out = tmp_path_factory.mktemp("gloo-profile")
    profile_here(str(out))
    plan = out.parent / "plan.json"
    plan.write_text(json.dumps(program_plan()))
    return out, plan


def test_the_cpu_trace_is_read_as_top_level_ops_with_collectives_and_steps(traces):
    profile = load_profile(str(traces[0]))
    assert sorted(profile.ranks) == [0, 1] and profile.world_size == 2
    for t in profile.ranks.values():
        assert not t.gpu and len(t.steps) == 2        # 3 active steps, the last dropped
        comm = [e for e in step_events(t, 0) if e.kind == "communication"]
        assert [(e.op, e.nbytes, e.group) for e in comm] == [("all_reduce", 1 << 20, (0, 1))] * 2
        assert [e.name for e in step_events(t, 0) if e.kind != "communication"] == ["aten::matmul"] * 2
        b = breakdown(t)
        assert b["compute_time_us"] + b["non_compute_time_us"] + b["idle_time_us"] == pytest.approx(
            b["kernel_time_us"])


def test_compare_the_plan_with_the_gloo_ranks_profile(cli, traces):
    folder, plan = traces
    rc, out, err = cli("compare", plan, folder, "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert len(d["collectives"]) == 4 and {p["measured_bytes"] for p in d["collectives"]} == {1 << 20}
    for r in d["ranks"]:
        assert r["measured"]["communication_s"] > 0 and r["predicted"]["communication_s"] > 0
        assert r["measured"]["by_kernel"]["gemm"] > 0 and r["predicted"]["compute_s"] > 0
    for m in d["compute"]:                          # each aten::matmul matched to the plan's "matmul" (a GEMM)
        assert [(p["op"], p["kind"], p["kernels"]) for p in m["matched"]] == [("matmul", "gemm", 1)] * 2
        gemm = m["kinds"]["gemm"]
        assert gemm["measured_kernels"] == gemm["matched_kernels"] == 2 and gemm["predicted_s"] > 0
        assert not m["unmatched"]["plan_ops"]
    rc, out, err = cli("simulate", "--from-profile", folder, "--no-files", "--json")
    assert rc == 0, err
    g = json.loads(out)["profile"]["guessed"]
    assert (g["world_size"], g["collectives"], g["cluster"], g["traced_ranks"]) == (2, 2, "localhost-cpu", [0, 1])
