"""`distlab reproduce` (sim/reproduce/): the shipped runs (Megatron-LM Table 1 with its script's micro-batches and
virtual stages, Megatron-Core's H100 table, Llama 3's and torchtitan's rows), FLOPs as each source counts them, the
one-replica / one-TP-rank reduction equal to the full simulation, the CLI table, JSON and plot, rows listed as not
expressible with their reason, and bad runs files as one line naming the run and the key, exit code 2."""
import json

import pytest
import yaml

from distlab.runtime.cli import main
from distlab.sim.reproduce.predict import model_flops, step_seconds
from distlab.sim.reproduce.runs import load_runs

TINY = {"name": "tiny", "source": "a test", "model": {"arch": "gpt2", "layers": 2, "hidden": 256, "heads": 8,
                                                      "seq_len": 128, "vocab": 1024},
        "gpu": "a100", "cluster": "dgx-a100", "gpus": 32, "layout": {"tp": 8, "pp": 2, "dp": 2},
        "global_batch": 8, "micro_batch": 2, "precision": "float16", "recompute": "full",
        "attention": "unfused", "reported": {"tflops_per_gpu": 1.0}}


def runs_file(tmp_path, *runs):
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"runs": list(runs)}))
    return str(path)


def test_shipped_runs_are_table_1_with_eq3_flops():
    runs, gens = load_runs()
    table = [r for r in runs if r.source.startswith("Narayanan et al. 2021")]
    assert len(table) == 10 and all(r.gpus == r.layout["tp"] * r.layout["pp"] * r.layout["dp"] for r in table)
    assert [r.figure[1] for r in table] == [137, 138, 142, 135, 138, 140, 148, 155, 163, 163]
    # Megatron's examples/academic_paper_scripts/sc21/run_table_1.sh: MBS and layers per virtual stage
    assert [r.micro_batch for r in table] == [16, 16, 16, 8, 4, 2, 2, 1, 1, 1]
    assert [r.layout["virtual_stages"] for r in table] == [1, 1, 1, 1, 1, 3, 2, 2, 3, 1]
    assert all(len(g.fitted_on) <= 2 for g in gens.values())
    names = {r.name for r in runs}
    assert all(set(g.fitted_on) <= names for g in gens.values())
    top = table[-1]                       # 1T: B 3072, s 2048, l 128, h 25600, V 51200
    B, s, l, h, V = 3072, 2048, 128, 25600, 51200
    assert model_flops(top) == pytest.approx(96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h)))


@pytest.mark.parametrize("layout,gpus,overlap", [({"tp": 8, "pp": 2, "dp": 2}, 32, False),
                                                 ({"tp": 8, "pp": 2, "dp": 2}, 32, True),
                                                 ({"tp": 2, "pp": 1, "dp": 4}, 8, True)])
def test_one_replica_one_tp_rank_equals_the_full_simulation(tmp_path, layout, gpus, overlap):
    """Replica 0 alone (its dp collectives timed on the whole cluster), one TP rank per stage when tp fills
    nodes (all of them with --tp-comm-overlap, whose ring exchanges need every TP rank): the full simulation's
    step, with pipelines and without (pp 1: Megatron-Core's H100 rows), overlapped and not."""
    run = {**TINY, "layout": layout, "gpus": gpus, "global_batch": 8, "tp_comm_overlap": overlap,
           "sequence_parallel": True}
    runs, gens = load_runs(runs_file(tmp_path, run))
    reduced, full = step_seconds(runs[0], gens), step_seconds(runs[0], gens, replicas=False)
    assert reduced == pytest.approx(full, rel=1e-9)
    if overlap:                           # the overlapped plan is another plan: its ring exchanges, not collectives
        plain, _ = load_runs(runs_file(tmp_path, {**run, "tp_comm_overlap": False}))
        assert step_seconds(plain[0], gens) != pytest.approx(reduced, rel=1e-3)


def test_cli_table_json_and_plot(tmp_path, capsys):
    path = runs_file(tmp_path, {**TINY, "gpus": 8, "layout": {"tp": 2, "pp": 1, "dp": 4}},
                     {**TINY, "name": "big", "gpus": 4096, "layout": {"tp": 8, "pp": 2, "dp": 256},
                      "global_batch": 512})
    png = tmp_path / "r.png"
    assert main(["reproduce", path, "--plot", str(png), "--max-gpus", "64"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "predicted" in out and "skipped: big" in out and "more than --max-gpus 64" in out
    assert png.stat().st_size > 1000
    assert main(["reproduce", path, "--json", "--only", "tiny"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema"] == "distlab.reproduce/1" and [r["name"] for r in d["results"]] == ["tiny"]
    assert d["results"][0]["world_size"] == 8 and d["summary"]["rows"] == 1
    r = d["results"][0]
    assert r["predicted"] == pytest.approx(model_flops(load_runs(path)[0][0]) / (r["step_time_s"] * 8) / 1e12)
    assert r["error"] == pytest.approx(r["predicted"] / r["reported"] - 1)
    assert d["by_generation"][0]["generation"] == "ampere" and d["by_generation"][0]["rows"] == 1


def test_rows_not_expressible_are_listed_with_their_reason(tmp_path, capsys):
    path = runs_file(tmp_path, {**TINY, "gpus": 8, "layout": {"tp": 2, "pp": 1, "dp": 4}},
                     {**TINY, "name": "cp", "gpus": 64, "layout": {"tp": 8, "pp": 2, "dp": 2, "cp": 2}},
                     {**TINY, "name": "fsdp-pp", "layout": {"tp": 8, "pp": 2, "dp": 2, "zero": 3}},
                     {**TINY, "name": "fsdp-accum", "gpus": 16, "layout": {"tp": 8, "dp": 2, "zero": 3}},
                     {**TINY, "name": "elsewhere", "not_expressible": "a GPU no preset has"})
    assert main(["reproduce", path, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    reasons = {x["name"]: x["reason"] for x in d["not_expressible"]}
    # PP x FSDP2 x TP (parallelize.py), and FSDP2 with gradient accumulation as a one-stage pipeline
    assert [x["name"] for x in d["results"]] == ["tiny", "fsdp-pp", "fsdp-accum"]
    assert d["results"][1]["step_time_s"] > 0 and d["results"][2]["step_time_s"] > 0
    assert "context parallelism" in reasons["cp"] and "fsdp-accum" not in reasons
    assert reasons["elsewhere"] == "a GPU no preset has"
    assert main(["reproduce", path]) == 0
    out = capsys.readouterr().out
    assert "not expressible yet: cp\n  because context parallelism" in out
    assert max(len(line) for line in out.splitlines()) <= 100


@pytest.mark.parametrize("change,words", [
    ({"layout": {"tp": 8, "pp": 2, "dp": 3}}, ["run 'tiny'.layout", "48", "32 GPUs"]),
    ({"gpu": "a200"}, ["run 'tiny'.gpu", "unknown gpu 'a200'"]),
    ({"reported": {}}, ["run 'tiny'.reported", "no reported figure"]),
    ({"precision": "float8"}, ["run 'tiny'.precision", "float8 needs FP8", "a100 has none", "bfloat16"]),
    ({"layout": {"tp": 8, "pp": 2, "dp": 2, "split": [1, 2]}}, ["run 'tiny'.layout.split", "2 in all"]),
    ({"compile": "yes"}, ["run 'tiny'.compile", "true or false"]),
])
def test_bad_runs_file_is_one_line_exit_2(tmp_path, capsys, change, words):
    assert main(["reproduce", runs_file(tmp_path, {**TINY, **change})]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err


def test_llama3_405b_rows_are_pp_x_fsdp2_x_tp_and_the_cp_row_says_why():
    """arXiv 2407.21783 Table 4: the 8K rows build as PP x FSDP2 x TP (FSDP2 inside each stage, not resharded after
    forward), interleaved with 8 one-layer chunks per rank, the first chunk the embedding alone and the last the
    head alone (sec. 3.3.2): 7 layers on the first and last ranks, 8 on the others; the CP 16 row names what is
    missing (benchmarks/reproduce_accuracy.py simulates the others, 1-2 minutes each)."""
    from distlab.sim.parallel.pipeline.plan import stage_ranges
    from distlab.sim.reproduce.predict import build_model
    from distlab.sim.reproduce.runs import not_expressible
    from distlab.sim.reproduce.scenario import scenario_of
    runs = {r.name: r for r in load_runs()[0]}
    for name, dp in (("llama3-405b-8192", 64), ("llama3-405b-16384", 128)):
        run = runs[name]
        assert not_expressible(run) is None
        d = scenario_of(run)
        assert d["mesh"] == {"pp": 16, "dp_shard": dp, "tp": 8}
        assert d["pipeline"]["split"] == [0] + [1] * 126 + [0] and d["pipeline"]["microbatches"] == 2048 // dp
        assert d["pipeline"]["virtual_stages"] == 8 and d["pipeline"]["schedule"] == "interleaved"
        assert "layout.virtual_stages" in run.assumed
        assert d["fsdp"]["reshard_after_forward"] is False and d["tp"]["sequence_parallel"] is True
    model = build_model(run)
    ranges = stage_ranges(model, 128, [0] + [1] * 126 + [0])
    names = [layer.name for layer in model.layers]
    assert [names[i] for i in ranges[0]] == ["embed"] and [names[i] for i in ranges[-1]] == ["head"]
    per_rank = [sum(len(ranges[c]) for c in range(r, 128, 16)) for r in range(16)]
    assert per_rank == [8] * 16                                   # 7 layers + the embedding / the head at the ends
    from distlab.sim.errors import ConfigError
    with pytest.raises(ConfigError, match="the first and last may be 0"):            # an empty middle stage: no
        stage_ranges(model, 128, [1, 0] + [1] * 125 + [1])
    assert "context parallelism" in not_expressible(runs["llama3-405b-16384-cp"])
