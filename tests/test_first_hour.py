"""Issue 43, the first hour: defaults a practitioner would choose (bf16 autocast, micro-batches from the pipeline's
depth, the batch printed, memory's inputs and allocator headroom), errors that name the flag the user typed with
the range really enforced, calibrate/validate ranks that fit the cores, fitted values below their resolution,
progress off a terminal. Sim-only and in this process, but for nothing."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from cli_in_process import run_in_process

TINY_LLAMA = {"arch": "llama", "layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn_hidden": 512,
              "vocab": 1024, "seq_len": 128, "micro_batch": 1}


def simulate(capsys, *argv):
    rc, out, err = run_in_process(capsys, "simulate", *argv, "--no-files")
    assert rc == 0, err
    return out


# --- 1. defaults -------------------------------------------------------------------------------------------------
def test_the_default_scenario_trains_in_bf16_autocast_and_prints_its_batch(capsys):
    rc, out, err = run_in_process(capsys, "simulate", "--no-files", "--json")
    assert rc == 0, err
    r = json.loads(out)["results"][0]
    assert r["options"]["autocast"] == "bfloat16" and r["compute_dtype"] == "bfloat16"
    assert r["assumptions"]["param_dtype"] == "float32"          # autocast: fp32 parameters, bf16 matmuls
    assert not any("computes in float32" in n for n in r["compute_notes"])
    assert r["global_batch"] == 8 * 8 and r["seq_len"] == 1024 and r["tokens_per_step"] == 64 * 1024
    text = " ".join(simulate(capsys).split())
    assert "autocast=bfloat16" in text and "float32 peak" not in text
    assert "global batch (sequences x length) 64 x 1,024" in text and "tokens per step 65,536" in text
    fp32 = json.loads(run_in_process(capsys, "simulate", "--autocast", "none", "--no-files", "--json")[1])
    assert fp32["results"][0]["compute_dtype"] == "float32"
    assert fp32["results"][0]["step_s"] > 5 * r["step_s"]          # the FP32 peak is ~15x below bf16's


def test_a_pipelines_micro_batches_default_to_twice_its_depth_and_the_bubble_is_printed(capsys, tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"model": TINY_LLAMA, "mesh": {"pp": 2, "dp": 2},
                                                     "pipeline": {"schedule": "interleaved", "virtual_stages": 2},
                                                     "cluster": "dgx-h100", "world_size": 4}))
    out = " ".join(simulate(capsys, tmp_path / "s.yaml").split())
    assert "microbatches=8" in out                                # 2 x pp 2 x virtual_stages 2
    assert re.search(r"bubble \(idle share of ranks x makespan\) [\d.]+%", out), out
    assert "global batch (sequences x length) 16 x 128" in out     # 8 micro-batches x dp 2
    out = " ".join(simulate(capsys, tiny(tmp_path, {"pp": 2, "dp_shard": 2, "tp": 2})).split())
    assert "microbatches=4" in out and re.search(r"bubble \(idle share of the pipeline ranks x makespan\) [\d.]+%",
                                                 out)


def test_memory_prints_its_inputs_and_keeps_allocator_headroom(capsys):
    rc, out, err = run_in_process(capsys, "memory", "--model", "llama-7b", "--world-size", "8", "--seq-len", "4096",
                                  "--micro-batch", "2", "--gpu", "56")
    assert rc == 0, err
    assert "inputs: micro_batch 2, seq_len 4,096, dtype bfloat16, recompute none" in out
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.startswith(("DDP", "ZeRO"))}
    totals = {line.split()[0]: float(line.split()[-2]) for line in out.splitlines() if line.startswith(("DDP", "ZeRO"))}
    for stage, total in totals.items():                           # 10% of 56 GiB kept: 50.4..56 is "tight"
        assert rows[stage] == ("NO" if total > 56 else "tight" if total > 50.4 else "yes"), (stage, total, out)
    assert "tight" in rows.values(), out
    assert "tight: within the 5.6 GiB (10%) kept for the CUDA context" in " ".join(out.split())


def tiny(tmp_path, mesh: dict) -> str:
    """A scenario of TINY_LLAMA on ``mesh`` (dgx-h100, as many ranks as the mesh)."""
    path = tmp_path / ("tiny-" + "-".join(f"{k}{v}" for k, v in mesh.items()) + ".yaml")
    world = 1
    for v in mesh.values():
        world *= v
    path.write_text(yaml.safe_dump({"model": TINY_LLAMA, "mesh": mesh, "cluster": "dgx-h100", "world_size": world}))
    return str(path)


def test_no_pipeline_rank_without_a_pipeline(capsys, tmp_path):
    out = simulate(capsys, tiny(tmp_path, {"dp_shard": 2, "tp": 4}))
    assert "memory per GPU (total)" in out and "pipeline rank" not in out
    out = simulate(capsys, tiny(tmp_path, {"pp": 2, "tp": 4}))
    assert "memory per GPU (total; pipeline rank 1)" in out     # the last stage: head and loss


# --- 5. messages -------------------------------------------------------------------------------------------------
ERRORS = [  # argv, the flag the error must start with, words it must hold
    (("simulate", "--world-size", "1000000000000"), "--world-size", "allowed: 1 to 262,144"),
    (("simulate", "--nodes", "100000000000"), "--nodes", "allowed: 1 to 32,768 nodes of 8 GPUs"),
    (("simulate", "--nodes", "40000"), "--nodes", "allowed: 1 to 32,768"),
    (("simulate", "--micro-batch", "0"), "--micro-batch", "allowed: 1 to"),
    (("simulate", "--model", "no-such-model"), "--model", "unknown model preset"),
    (("simulate", "--mesh", "dp_shard=8", "--param-dtype", "int64"), "--param-dtype", "float32, bfloat16"),
    (("memory", "--seq-len", "10000000000"), "--seq-len", "allowed: 1 to 16,777,216"),
    (("memory", "--seq-len", "16777216", "--micro-batch", "16"), "--seq-len", "PiB per GPU"),
    (("memory", "--dtype", "int64"), "--dtype", "not a training dtype"),
    (("memory", "--model", "no-such-model"), "--model", "unknown model preset"),
    (("plan", "--model", "no-such-model", "--nodes", "1", "--global-batch", "8"), "--model", "unknown model preset"),
    (("collective", "all_reduce", "--size", "2PiB"), "--size", "larger than 1 PiB"),
    (("collective", "all_reduce", "--nodes", "40000"), "--nodes", "allowed: 1 to 1,024 nodes of 8 GPUs"),
    (("collective", "all_reduce", "--nodes", "1024", "--sizes", "1KiB:1GiB"), "--sizes", "32,768 rank-sizes"),
]


@pytest.mark.parametrize("argv,flag,words", ERRORS, ids=lambda x: " ".join(x) if isinstance(x, tuple) else None)
def test_errors_name_the_flag_typed_and_the_range_enforced(argv, flag, words, capsys):
    rc, out, err = run_in_process(capsys, *argv)
    assert rc == 2 and err.count("\n") == 1, err
    message = err.split(": error: ", 1)[1]
    assert message.startswith(f"{flag}: ") and words in message, message
    assert "scenario:" not in message and f"{flag}: {flag}" not in message and "1e-06" not in message


def test_sizes_reach_pib_and_the_cap_agrees(capsys):
    from distlab.sim.io import MAX_BYTES, parse_size
    assert parse_size("1PiB") == MAX_BYTES == 2**50 and parse_size("1PB") == 10**15
    rc, out, err = run_in_process(capsys, "collective", "all_reduce", "--size", "1PiB", "--nodes", "2")
    assert rc == 0, err


def test_no_python_repr_reaches_the_output(capsys):
    out = simulate(capsys, "scenarios/tp-llama3-8b.yaml")
    assert "sequence_parallel=true" in out and "split=none" in out
    for repr_word in ("=None", "=True", "=False", "{'", " True\n", " False\n", " None\n"):
        assert repr_word not in out, repr_word
    rc, out, _ = run_in_process(capsys, "memory", "--scenario", "scenarios/tp-llama3-8b.yaml")
    assert rc == 0 and "{" not in out and "mesh: tp=8 (8 ranks)" in out


def test_a_hugging_face_model_is_named_after_its_folder(tmp_path):
    from distlab.sim.models import model_from_spec
    folder = tmp_path / "my-mistral"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["MistralForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1024}))
    for path in (folder, folder / "config.json"):
        assert model_from_spec({"hf_config": str(path)}).name == "my-mistral"


# --- 6. calibrate and validate -------------------------------------------------------------------------------
@pytest.mark.parametrize("cores,expected", [(1, "2"), (2, "2"), (3, "2"), (4, "2,4"), (64, "2,4")])
def test_default_world_sizes_fit_the_cores(cores, expected, monkeypatch):
    from distlab.runtime.ranks import preflight
    monkeypatch.setattr(preflight, "cpu_cores", lambda: cores)
    assert preflight.default_world_sizes() == expected
    assert preflight.default_world_sizes(threads=2) == ("2,4" if cores >= 8 else "2")


def test_calibrate_measures_the_default_on_two_cores_without_a_warning(monkeypatch, capsys):
    from distlab.runtime.ranks import preflight
    from distlab.runtime.cli import build_parser
    from distlab.runtime.commands import calibrate
    monkeypatch.setattr(preflight, "cpu_cores", lambda: 2)
    monkeypatch.setattr(preflight, "_warned", set())
    parser, _ = build_parser()
    args = parser.parse_args(["calibrate"])
    assert calibrate.check(args)[2] == [2]
    args = parser.parse_args(["calibrate", "--nproc", "2,4"])
    assert calibrate.check(args)[2] == [2, 4]
    source = open(calibrate.__file__).read() + open(__import__("distlab.runtime.commands.validate",
                                                               fromlist=["x"]).__file__).read()
    # the cores warning only for world sizes the user asked for
    assert source.count("warn_cores(") == 2 and "args.nproc is not None" in source and "given" in source


def test_a_fitted_latency_below_its_resolution_says_so():
    from distlab.runtime.measure.fit import fit_op, latency_text
    sizes = [2**20, 2**22, 2**24]
    noisy = fit_op("all_reduce", 2, sizes, [[t * f for f in (0.8, 1.0, 1.25)] for t in (0.001, 0.004, 0.016)])
    assert noisy["latency_us"] < noisy["latency_resolution_us"]
    assert latency_text(noisy) == f"< {noisy['latency_resolution_us']:.1f}"
    clean = fit_op("all_reduce", 2, sizes, [[0.0005 + 0.001 * k] * 3 for k in (1, 4, 16)])
    assert clean["latency_us"] == pytest.approx(250.0) and latency_text(clean) == "250.0"     # 2 ring steps


# --- 7. progress -------------------------------------------------------------------------------------------------
def test_progress_off_a_terminal_is_a_line_per_unit_with_the_time_elapsed(capsys):
    from distlab.sim.cli import Progress, progress
    assert list(progress(range(3), 3, "sweep of x", delay_s=0.0)) == [0, 1, 2]
    err = capsys.readouterr().err.splitlines()
    assert [re.sub(r"[\d.]+ s", "T s", line) for line in err] == [
        f"sweep of x: {k} of 3 done, T s elapsed" for k in (1, 2, 3)]
    list(progress(range(3), 3, "quick"))                 # under 2 s: nothing
    bar = Progress(200, "many", delay_s=0.0)
    for k in range(200):
        bar.update(k + 1)
    assert capsys.readouterr().err.count("\n") == 21     # the first unit, then a line per twentieth of a long job


def test_cluster_what_ifs_report_progress(monkeypatch, capsys, tmp_path):
    import distlab.sim.cli as cli_module
    real = cli_module.Progress
    monkeypatch.setattr(cli_module, "Progress", lambda total, label, enabled=True: real(total, label, enabled, 0.0))
    d = {"name": "two jobs", "cluster": "dgx-h100", "nodes": 2,
         "jobs": [{"name": "a", "scenario": {"model": {"preset": "gpt2-small", "micro_batch": 1}, "ddp": {}},
                   "nodes": 1},
                  {"name": "b", "scenario": {"model": {"preset": "gpt2-small", "micro_batch": 1}, "ddp": {}},
                   "nodes": 1}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(d))
    rc, out, err = run_in_process(capsys, "cluster", tmp_path / "c.yaml", "--sweep", "placement=packed,spread",
                                  "--workers", "1")
    assert rc == 0, err
    assert re.search(r"distlab cluster --sweep: 2 of 2 done, [\d.]+ s elapsed", err), err
