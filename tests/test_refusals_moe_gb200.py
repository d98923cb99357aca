"""Bad input of issue 39 "Must show", each as a reproduce row, a scenario and a flag: a GB200 job that is not a
whole number of compute trays (4 GPUs), expert parallelism on a dense model, an ep that does not divide dp. One
line naming the run or the key and what is allowed, exit code 2, in this process. And issue 39.6: a layout that
Megatron-LM, NeMo, torchtitan or MosaicML published either runs or is refused naming the missing feature (small
models, sim-only)."""
import pytest
import yaml

from cli_in_process import cli  # noqa: F401  (the fixture)
from distlab.sim.reproduce.predict import step_seconds
from distlab.sim.reproduce.runs import Run, load_runs, not_expressible

ROW = {"name": "bad", "source": "a test", "model": {"arch": "llama", "layers": 2, "hidden": 512, "heads": 8,
                                                    "seq_len": 256, "vocab": 32000},
       "gpu": "h100", "cluster": "dgx-h100", "gpus": 8, "layout": {"dp": 8}, "global_batch": 8, "micro_batch": 1,
       "reported": {"tokens_per_s_per_gpu": 1.0}}
MOE = {"kind": "moe", "layers": 2, "hidden": 512, "heads": 8, "attention": "gqa", "kv_heads": 4, "experts": 8,
       "top_k": 2, "expert_ffn": 1024, "seq_len": 256, "vocab": 32000}


def one_line_exit_2(rc, out, err, *words):
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert len(err.rstrip("\n")) <= 100 or "/" in err, err          # a long tmp path may widen it
    for w in words:
        assert w in err, (w, err)


def write(tmp_path, name, d) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(d))
    return str(path)


@pytest.mark.parametrize("change,words", [
    ({"gpu": "gb200", "cluster": "gb200-nvl72", "gpus": 6, "layout": {"dp": 6}, "global_batch": 6},
     ["run 'bad'.gpus", "not whole compute trays of 4", "allowed: a multiple of 4"]),
    ({"layout": {"dp": 8, "ep": 8}}, ["run 'bad'.layout.ep", "ep 8 on a dense model", "allowed: ep 1, or MoE",
                                      "mixtral-8x7b, deepseek-v3"]),
    ({"model": MOE, "layout": {"dp": 8, "ep": 3}}, ["run 'bad'.layout.ep", "ep 3 must divide dp 8"]),
    ({"layout": {"dp": 8, "dp_shard": 3, "zero": 3}}, ["run 'bad'.layout.dp_shard", "dp_shard 3 must divide dp 8"]),
])
def test_a_bad_reproduce_row(cli, tmp_path, change, words):
    one_line_exit_2(*cli("reproduce", write(tmp_path, "runs.yaml", {"runs": [{**ROW, **change}]})), *words)


@pytest.mark.parametrize("scenario,words", [
    ({"model": "gpt2-small", "ddp": {}, "cluster": "gb200-nvl72", "world_size": 6},
     ["world_size", "6 GPUs, not whole compute trays of 4; allowed: 1, 4, 8, ..."]),
    ({"model": "llama3-8b", "mesh": {"ep": 8}, "ep": {}, "cluster": "dgx-h100"},
     ["mesh.ep: llama3-8b has no experts; allowed: MoE (mixtral-8x7b, deepseek-v3)"]),
])
def test_a_bad_scenario(cli, tmp_path, scenario, words):
    path = write(tmp_path, "s.yaml", scenario)
    one_line_exit_2(*cli("simulate", path, "--no-files"), path, *words)


@pytest.mark.parametrize("argv,words", [
    (("--cluster", "gb200-nvl72", "--world-size", "130"),
     ["error: --world-size: 130 GPUs, not whole compute trays of 4; allowed: 1, 4, 8, ..."]),
    (("--cluster", "gb200-nvl72", "--nodes", "70000"), ["error: --nodes: 70000 is out of range; allowed: 1 to "
                                                        "65,536 trays of 4 GPUs"]),
    (("--model", "llama3-8b", "--mesh", "ep=8"),
     ["error: --mesh: llama3-8b has no experts; allowed: MoE (mixtral-8x7b"]),
])
def test_a_bad_flag(cli, argv, words):
    one_line_exit_2(*cli("simulate", *argv, "--no-files"), *words)


def test_collective_on_gb200_counts_trays(cli):
    """`collective --nodes` on GB200 counts compute trays, as simulate's does: its bound is 8,192 ranks / 4."""
    one_line_exit_2(*cli("collective", "all_reduce", "--cluster", "gb200-nvl72", "--nodes", "5000"),
                    "--nodes: 5000 is out of range; allowed: 1 to 2,048 trays of 4 GPUs")


def test_gb200_jobs_of_whole_trays_simulate(cli):
    rc, out, err = cli("simulate", "--cluster", "gb200-nvl72", "--nodes", "2", "--no-files")
    assert rc == 0 and "8 ranks" in out, err


def run(name, model, gpus, layout, global_batch, micro_batch=1, **kw) -> Run:
    full = {"tp": 1, "pp": 1, "virtual_stages": 1, "dp": 1, "cp": 1, "zero": 0, "split": None, "ep": 1, **layout}
    return Run(name, "a published layout, shrunk", model, "h100", "dgx-h100", gpus, full, global_batch, micro_batch,
               reported={"tokens_per_s_per_gpu": 1.0}, **kw)


DENSE = {"arch": "llama", "layers": 8, "hidden": 1024, "heads": 8, "kv_heads": 4, "seq_len": 1024, "vocab": 32000}
PUBLISHED = [   # (framework's layout, run, words the refusal must hold; None: it runs)
    ("Megatron-LM PP x TP x DP, interleaved", run("megatron-3d", {**DENSE, "layers": 4}, 16, {"tp": 2, "pp": 2, "dp": 4,
                                                                             "virtual_stages": 2}, 32,
                                                  schedule="interleaved", sequence_parallel=True,
                                                  recompute="selective"), None),
    ("Megatron-LM distributed optimizer", run("megatron-zero1", DENSE, 8, {"dp": 8, "zero": 1}, 16,
                                               overlap_grad_reduce=True), None),
    ("torchtitan FSDP2 x TP", run("titan-2d", DENSE, 8, {"tp": 2, "dp": 4, "zero": 3}, 4), None),
    ("MosaicML HYBRID_SHARD (HSDP)", run("mosaic-hsdp", DENSE, 16, {"dp": 16, "dp_shard": 8, "zero": 3}, 16), None),
    ("torchtitan PP x FSDP2 x TP", run("titan-3d", DENSE, 16, {"tp": 2, "pp": 2, "dp": 4, "zero": 3}, 16), None),
    ("NeMo Megatron-FSDP with gradient accumulation", run("nemo-fsdp-ga", DENSE, 8, {"dp": 8, "zero": 3}, 16),
     None),                                   # FSDP2 with gradient accumulation (sim/reproduce/scenario.py)
    ("Megatron-LM context parallelism (TP x CP x DP)", run("megatron-cp", DENSE, 8, {"tp": 2, "cp": 2, "dp": 2}, 4),
     "context parallelism"),
    ("Megatron-Core MoE: EP x PP", run("mcore-ep-pp", MOE, 16, {"pp": 2, "dp": 8, "ep": 8, "zero": 1}, 32), None),
    ("Megatron-Core MoE: EP x TP (expert tensor parallelism)", run("mcore-ep-tp", MOE, 16,
                                                                 {"tp": 2, "dp": 8, "ep": 8}, 8),
     "expert tensor parallelism"),
    ("Megatron-Bridge MoE: 4 virtual stages", run("mbridge-ep-vp4", {**MOE, "layers": 8}, 16,
                                                  {"pp": 2, "virtual_stages": 4, "dp": 8, "ep": 8}, 32,
                                                  schedule="interleaved"), "4 stages per rank"),
    ("MosaicML / torchtitan FSDP2 of experts", run("moe-fsdp", MOE, 8, {"dp": 8, "ep": 8, "zero": 3}, 8),
     "ZeRO-1 only"),
]


@pytest.mark.parametrize("what,published,words", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_a_published_layout_runs_or_names_the_missing_feature(what, published, words):
    reason = not_expressible(published)
    if words is None:
        assert reason is None, (what, reason)
        assert step_seconds(published) > 0
    else:
        assert reason and words in reason, (what, reason)


def test_the_shipped_moe_rows_run_or_name_what_they_cannot_run():
    """The shipped runs file's MoE block: Mixtral runs, each DeepSeek-V3 row names its missing feature."""
    from distlab.sim.reproduce.scenario import is_moe
    runs, _ = load_runs()
    moe = [r for r in runs if is_moe(r)]
    assert {"nemo-gb200-mixtral-8x7b-fp8cs", "mbridge-b200-deepseek-v3-mxfp8"} <= {r.name for r in moe}
    assert len(moe) == 5
    for r in moe:
        reason = not_expressible(r)
        assert reason is None or len(reason.split()) >= 4, (r.name, reason)
    assert not_expressible(next(r for r in runs if r.name == "nemo-gb200-mixtral-8x7b-fp8cs")) is None
    assert "ops" in not_expressible(next(r for r in runs if r.name == "mbridge-b200-deepseek-v3-mxfp8"))
