"""`distlab plan`: the fast estimate against the discrete-event simulator, the search never ranking what does
not fit, explanations, outputs and bad input."""
from __future__ import annotations

import json
import random

import pytest
import yaml

from distlab.sim.cluster import load_cluster
from distlab.sim.parallel.fsdp.memory import fits
from distlab.sim.parallel.pipeline import schedules as S
from distlab.sim.planner import explain
from distlab.sim.planner.estimate import streams_makespan
from distlab.sim.planner.schedule import compiled_schedule, run_schedule
from distlab.sim.planner.layouts import Layout, enumerate_layouts
from distlab.sim.planner.search import ESTIMATE_BOUND
from distlab.sim.planner.search import search
from distlab.sim.planner.step import Estimator
from distlab.sim.plan import Compute, Record, Wait
from distlab.sim.scenario import simulate

TINY = {"arch": "llama", "layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn_hidden": 512, "vocab": 1024,
        "seq_len": 128}


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory):
    """Two nodes of four H100s, a NIC each: layouts cross nodes, and the simulator stays fast."""
    c = load_cluster("dgx-h100", 2).to_dict()
    c["gpus_per_node"], c["inter_node"]["nics_per_node"] = 4, 4
    path = tmp_path_factory.mktemp("cluster") / "four-per-node.yaml"
    path.write_text(yaml.safe_dump(c))
    return str(path)


def test_estimate_agrees_with_the_simulator_on_50_random_layouts(small_cluster):
    cluster = load_cluster(small_cluster, 2)
    est = Estimator(TINY, cluster)
    layouts = enumerate_layouts(est.model(1).config, cluster.world_size, cluster.gpus_per_node, 8, (1, 2))
    feasible = [L for L in layouts if fits(sum(est.memory(L).values()), cluster.gpu.memory_GiB)]
    sample = stratified(feasible, 50, random.Random(0))
    assert len(sample) == 50
    assert {L.family for L in sample} >= {"TP x DDP", "TP x FSDP", "PP x TP x DDP", "PP x TP", "FSDP", "DDP",
                                          "TP x HSDP", "CP x FSDP", "CP x TP x FSDP", "CP x HSDP",
                                          "PP (interleaved) x TP x DDP", "PP x TP x FSDP", "PP x HSDP",
                                          "PP (interleaved) x TP x FSDP"}
    assert any(L.split for L in sample) and any(L.loss_parallel for L in sample)
    assert any(L.composed and L.pp == 1 and L.microbatches > 1 for L in sample)     # FSDP2 grad accumulation
    worst = {False: 0.0, True: 0.0}
    for L in sample:
        des = simulate(L.scenario(TINY, small_cluster, 2)).summary["step_s"]
        step = est.estimate(L).step_s
        worst[L.composed] = max(worst[L.composed], abs(step / des - 1))
        assert est.bound(L) <= step * (1 + 1e-12), L.label()         # the search's pruning bound
    # FSDP2 inside pipeline stages (sim/planner/stage_fsdp.py) is estimated to within ESTIMATE_BOUND
    assert worst[False] <= 0.05 and worst[True] <= ESTIMATE_BOUND, f"worst estimate errors {worst}"


def stratified(layouts: list, n: int, rng) -> list:
    """n layouts drawn family by family in turn (each family shuffled; split and gradient accumulation drawn
    apart), so every family is tested."""
    by: dict = {}
    for L in layouts:
        by.setdefault((L.family, L.split is not None, L.pp == 1 and L.microbatches > 1), []).append(L)
    for v in by.values():
        rng.shuffle(v)
    out = []
    while len(out) < n and any(by.values()):
        for fam in sorted(by):
            if by[fam] and len(out) < n:
                out.append(by[fam].pop())
    return out


def test_pipeline_list_schedule_is_the_1f1b_closed_form():
    """Uniform stages, free messages: 1F1B and GPipe take (m + p - 1)(F + B) (Narayanan et al. 2021, sec. 2.2);
    interleaved 1F1B with v stages per rank of F/v and B/v: (m + (p - 1)/v)(F + B) when m is a multiple of p
    (sec. 2.2.1); messages of d seconds add at least 2(p - 1)d (the first forward and the last backward cross
    every boundary)."""
    for sched, p, m, v in (("1f1b", 4, 8, 1), ("gpipe", 3, 5, 1), ("1f1b", 2, 2, 1), ("interleaved", 4, 8, 2)):
        c = compiled_schedule(sched, p, m, v)
        assert list(c.placement) == [s % p for s in range(p * v)]
        seconds = [(1.0 if kind == "F" else 2.0) / v for kind, _, _ in c.actions]
        _, ends = run_schedule(c, seconds, [0.0] * len(c.order))
        assert max(ends) == pytest.approx((m + (p - 1) / v) * 3.0)
    c = compiled_schedule("1f1b", 4, 8)
    _, ends = run_schedule(c, [1.0 if kind == "F" else 2.0 for kind, _, _ in c.actions], [0.25] * len(c.order))
    assert max(ends) >= 11 * 3.0 + 2 * 3 * 0.25


def test_work_after_an_action_keeps_its_rank_not_its_output():
    """``after_s`` (a stage's gradient reduction after its last backward) delays only its own rank: GPipe on two
    ranks, one micro-batch: stage 1's reduction after its backward does not delay stage 0's backward."""
    c = compiled_schedule("gpipe", 2, 1)
    seconds = [1.0] * len(c.order)
    last_b, ends = run_schedule(c, seconds, [0.0] * len(c.order), {c.last_b[1]: 5.0})
    assert last_b == [4.0, 3.0] and ends == [4.0, 8.0]


def test_streams_share_the_network_but_not_latency():
    """Two 1 s transfers on two streams of the same link end together at 2 s (each at half rate) after their
    unshared latency; compute on its own stream overlaps them."""
    ops = [Record("go", "compute"), Compute("c", seconds=1.5), Wait("go", "a"), Wait("go", "b"),
           Compute("x", seconds=0.0, stream="a"), Compute("y", seconds=0.0, stream="b")]
    times = {"x": (0.1, 1.0), "y": (0.1, 1.0), "c": (0.0, 1.5)}
    t = streams_makespan(ops, lambda op: times[op.name], lambda op: "link" if op.name in "xy" else None)
    assert t == pytest.approx(2.1)


def test_search_ranks_only_layouts_that_fit_and_confirms_the_best(small_cluster, tmp_path):
    c = load_cluster(small_cluster, 2).to_dict()
    c["gpu"]["memory_GiB"] = 0.03              # tiny GPUs: some layouts of the tiny model do not fit
    path = tmp_path / "tiny-gpus.yaml"
    path.write_text(yaml.safe_dump(c))
    # one process: what fits and the ranking do not depend on the workers (test_two_processes_estimate_what_one_does)
    s = search(TINY, str(path), 2, 8, confirm=2, micro_batches=(1, 2), workers=1)
    assert len(s.ranked) < len(s.all)
    assert all(fits(x.memory_bytes, 0.03) for x in s.ranked)
    assert [x.step_s for x in s.ranked[:2]] == sorted(x.step_s for x in s.ranked[:2])
    first = s.ranked[0]
    assert first.simulated_s == pytest.approx(simulate(first.layout.scenario(TINY, str(path), 2))
                                              .summary["step_s"], rel=1e-9)
    rows = explain.families(s)
    assert any(r["best"] is None and r["why"].startswith("does not fit") for r in rows)
    why = explain.first_vs_second(s, s.estimator)
    assert why["term"] in explain.TERMS.values()
    assert why["changed_step_s"] < s.ranked[1].estimate.step_s


def test_neighbours_keep_the_world_and_the_batch():
    L = Layout(2, 2, 2, "ddp", 1, 4, True, "none")
    around = explain.neighbours(L, 8, 8, 4)
    assert around and all(M.world_size == 8 and M.dp * M.micro_batch * M.microbatches == 8 for _, M in around)
    assert {"sequence parallel off", "schedule 1f1b -> gpipe"} <= {w for w, _ in around}


def test_cli_saves_a_scenario_that_simulate_takes(small_cluster, tmp_path, capsys):
    from distlab.runtime.cli import main
    q = tmp_path / "question.yaml"
    q.write_text(yaml.safe_dump({"model": TINY, "cluster": small_cluster, "nodes": 2, "global_batch": 8,
                                 "confirm": 1}))
    out = tmp_path / "best.yaml"
    assert main(["plan", str(q), "--save", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "distlab.plan/1" and report["ranked"][0]["rank"] == 1
    assert report["candidates"] >= report["fit"] >= len(report["ranked"]) > 0
    assert main(["simulate", str(out), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["results"][0]["step_s"] == pytest.approx(report["ranked"][0]["simulated_s"], rel=1e-9)


@pytest.mark.parametrize("args, words", [
    (["--global-batch", "7"], "allowed nearby: 4, 6, 8, 10"),
    (["--global-batch", "8", "--model", "llama3-405b"], "smallest needs"),
])
def test_bad_questions_get_one_line_and_exit_2(small_cluster, args, words, tmp_path, capsys):
    """Three blocks on 8 GPUs: no pipeline divides them, so the data-parallel size is even and an odd batch has
    no layout. Llama 3 405B fits no layout of 8 GPUs."""
    from distlab.runtime.cli import main
    base = ["plan", "--cluster", small_cluster, "--nodes", "2", "--confirm", "0"]
    if "--model" not in args:
        q = tmp_path / "three-blocks.yaml"
        q.write_text(yaml.safe_dump({"model": {**TINY, "layers": 3}}))
        base.insert(1, str(q))
    assert main(base + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "Traceback" not in err[0]


def test_memory_is_what_simulate_reports_for_the_new_kinds(small_cluster):
    """Interleaved with an uneven split (the fullest rank found by walking the schedule), CP x TP, HSDP: the
    planner's memory per GPU is `distlab simulate`'s report."""
    model = {**TINY, "layers": 8}
    est = Estimator(model, load_cluster(small_cluster, 2))
    for L in (Layout(2, 2, 2, "ddp", 1, 4, True, "selective", "interleaved", 2, (2, 2, 3, 1)),
              Layout(2, 2, 2, "ddp", 2, 2, False, "none", "gpipe", 1, (5, 3), loss_parallel=True),
              Layout(2, 1, 2, "fsdp", 4, 1, True, "full", cp=2),
              Layout(1, 1, 8, "hsdp", 1, 1, False, "selective", dp_shard=2)):
        r = simulate(L.scenario(model, small_cluster, 2))
        report = r.reports["cp" if L.cp > 1 else "tp"]["json"]["memory"]
        assert report["total_bytes"] == pytest.approx(sum(est.memory(L).values()), rel=1e-9), L.label()


def test_validate_refuses_pipelines_the_real_run_does_not_build(small_cluster):
    """The real PP x TP run (torch's ScheduleGPipe / Schedule1F1B, even stages) cannot run an interleaved or
    unevenly split plan the planner may save: validate says so in one line instead of running something else."""
    from distlab.runtime.parallel.tp.validate import prepare
    from distlab.sim.errors import ConfigError
    for L in (Layout(2, 2, 1, "ddp", 1, 4, True, "none", "interleaved", 2), Layout(2, 2, 1, "ddp", 1, 4, True, "none",
                                                                                    "1f1b", 1, (3, 1))):
        with pytest.raises(ConfigError, match="allowed for a real run: schedule gpipe or 1f1b, virtual_stages 1"):
            prepare(L.scenario(TINY, small_cluster, 2), 4)


def test_two_processes_estimate_what_one_does(small_cluster):
    """The estimate shared out between forked processes (chunks by shape, results back in order) is the serial
    one, layout for layout."""
    from distlab.sim.planner.search import PARALLEL_FROM, estimate_all
    cluster = load_cluster(small_cluster, 2)
    est = Estimator(TINY, cluster)
    layouts = enumerate_layouts(est.model(1).config, cluster.world_size, cluster.gpus_per_node, 8, (1, 2))
    layouts = layouts[::len(layouts) // PARALLEL_FROM][:PARALLEL_FROM]        # every family, just enough
    assert len(layouts) == PARALLEL_FROM
    serial = [e.step_s for e in estimate_all(Estimator(TINY, cluster), layouts, workers=1)]
    assert [e.step_s for e in estimate_all(est, layouts, workers=2)] == serial


def test_fsdp_in_stages_is_read_off_one_micro_batch():
    """sim/planner/stage_fsdp.py reads FSDP2's ops inside pipeline stages off a program of STAGE_MICROBATCHES
    micro-batches: they are the ops (and their order) of a program of one micro-batch per stage, or two, for
    interleaved stages (unsharded up front, reduced after each stage's last backward) and GPipe, even or split."""
    from distlab.sim.mesh import Mesh
    from distlab.sim.models import model_from_spec
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.parallel.parallelize import choose, parallelize
    from distlab.sim.parallel.pipeline.plan import PipelineOptions
    from distlab.sim.planner.stage_fsdp import STAGE_MICROBATCHES, _fsdp_op
    model = model_from_spec({**TINY, "layers": 8}, "model")

    def fsdp_ops(pp, v, m, shard, split):
        mesh = Mesh({"pp": pp, "dp_replicate": 2, "dp_shard": shard})
        pipe = PipelineOptions(schedule="gpipe" if v == 1 else "interleaved", microbatches=m, virtual_stages=v,
                               split=split)
        par = choose(mesh, {"pipeline": pipe, "fsdp": FSDPOptions(reshard_after_forward=False)})
        plan = parallelize(model, mesh, par, only=[q * 2 * shard for q in range(pp)])
        return [[op for op in ops if _fsdp_op(op)] for ops in plan.ranks]
    for pp, v, split in ((2, 1, None), (2, 1, [5, 3]), (2, 2, None), (2, 4, None), (4, 2, None),
                         (2, 2, [3, 2, 2, 1])):
        for shard in (2, 4):
            ops = fsdp_ops(pp, v, STAGE_MICROBATCHES, shard, split)
            assert any(ops) and any(op.name == "optimizer" for op in ops[0])
            for m in (pp, 2 * pp):
                assert fsdp_ops(pp, v, m, shard, split) == ops, (pp, v, split, shard, m)
