"""DualPipeV and Looped BFS on the simulator: bubble against the closed form / dependency-only reference,
DualPipeV's OVERLAP_F_B pairs run as torch's runtime runs them (both inputs first, F then B, then both sends),
in-flight microbatches with mixed B and I/W, and the CLI's one-line errors."""
import pytest

from distlab.runtime.cli import main
from distlab.sim.cluster import PRESETS
from distlab.sim.kernel.engine import simulate
from distlab.sim.models import mlp
from distlab.sim.parallel.pipeline import metrics as M
from distlab.sim.parallel.pipeline import schedules as S
from distlab.sim.parallel.pipeline.plan import PipelineSpec, build_plan
from test_pipeline_plan import run


@pytest.mark.parametrize("p,m", [(2, 4), (3, 5), (4, 8)])
def test_loopedbfs_one_stage_bubble_equals_gpipe(p, m):
    """v = 1: all forwards, then all backwards in reverse: GPipe's (p-1)/(m+p-1) with uniform stages."""
    met = run("loopedbfs", p, m, 1)[2]
    assert met.bubble == pytest.approx((p - 1) / (m + p - 1), rel=1e-9)
    assert met.peak_in_flight == {s: m for s in range(p)}


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (3, 6, 2), (4, 8, 3)])
def test_loopedbfs_matches_dependency_reference(p, m, v):
    met = run("loopedbfs", p, m, v)[2]
    ideal = M.ideal_trace(S.build("loopedbfs", p, m, v), lambda a: {"F": 1, "B": 2}[a.kind] * 1e-3 / v)
    assert met.makespan == pytest.approx(ideal.makespan, rel=1e-9)


@pytest.mark.parametrize("p,m", [(2, 4), (3, 7), (4, 8)])
def test_dualpipev_pairs_run_as_torch_runs_them(p, m):
    plan, trace, met = run("dualpipev", p, m, 2)
    pairs = S.overlap_pairs("dualpipev", p, m, 2)
    assert plan.meta["pipeline"]["overlap_f_b"] == [[f"{f};{b}" for f, b in rank] for rank in pairs]
    ops = {(o.rank, o.name): o for o in trace.ops if o.kind == "compute"}
    sends = {o.name: o for o in trace.ops if o.kind == "send"}
    place = S.stage_to_rank("dualpipev", p, 2)
    for r, rank in enumerate(pairs):      # in the plan: the wait for B's gradient comes before F's compute
        names = [o.name if o.kind == "compute" else o.event if o.kind == "wait" and o.stream == "compute" else None
                 for o in plan.ranks[r]]
        for f, b in rank:
            if b.stage + 1 < 2 * p and place[b.stage + 1] != r:
                assert names.index(f"recv grad {b.stage + 1}>{b.stage} mb{b.mb}") < names.index(str(f))
    for r, rank in enumerate(pairs):
        for f, b in rank:
            fo, bo = ops[r, str(f)], ops[r, str(b)]
            assert bo.start == pytest.approx(fo.end, abs=1e-12)      # F then B, back to back
            if f.stage + 1 < 2 * p and place[f.stage + 1] != r:      # F's activation leaves after the pair
                assert sends[f"act {f.stage}>{f.stage + 1} mb{f.mb}"].start >= bo.end - 1e-12
    # pairs only add constraints to the dependency-only reference; never a deadlock
    ideal = M.ideal_trace(S.build("dualpipev", p, m, 2), lambda a: {"F": 1, "B": 2, "I": 1, "W": 1}[a.kind] * 5e-4)
    assert met.makespan >= ideal.makespan - 1e-12
    # in flight: stage 0 holds 2p microbatches before its first backward (B and I/W both release)
    assert met.peak_in_flight[0] == 2 * p and all(met.peak_in_flight[s] <= 2 * p for s in range(2 * p))


def test_dualpipev_on_a_real_fabric():
    model = mlp(*[256] * 9, batch=16, dtype="bfloat16")
    plan = build_plan(model, PipelineSpec("dualpipev", 4, 8, 2))
    met = M.compute(simulate(plan, PRESETS["dgx-h100"]), plan.meta["pipeline"])
    assert met.p2p_bytes == 2 * 8 * 6 * 16 * 256 * 2 and 0 < met.bubble < 1     # V: stages 3, 4 share rank 3


@pytest.mark.parametrize("args,words", [
    (["--schedule", "dualpipev", "--virtual-stages", "2", "--microbatches", "3"], ["microbatches >= 4"]),
    (["--schedule", "dualpipev", "--virtual-stages", "1", "--microbatches", "8"], ["virtual_stages 2"]),
    (["--schedule", "loopedbfs", "--virtual-stages", "0"], ["virtual_stages", ">= 1"])])
def test_cli_refuses_in_one_line(capsys, args, words):
    rc = main(["simulate", "scenarios/pipeline-cpu.yaml", "--no-files", *args])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
