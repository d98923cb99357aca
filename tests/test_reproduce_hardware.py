"""Reproduce as the runs ran it (issue 39): Megatron's vocabulary padding, FP8 recipes as keys of runs, GB200 jobs
of whole compute trays, and bad runs files (float8 without FP8 tensor cores, partial trays) as one line naming the
run and the key, exit code 2. Small rows only: the shipped set runs in benchmarks/reproduce_accuracy.py."""
import pytest
import yaml

from distlab.runtime.cli import main
from distlab.sim.reproduce.predict import model_flops, step_seconds
from distlab.sim.reproduce.runs import load_runs

SMALL = {"name": "small", "source": "a test", "model": {"arch": "gpt2", "layers": 2, "hidden": 256, "heads": 8,
                                                        "seq_len": 128, "vocab": 50257},
         "gpu": "h100", "cluster": "dgx-h100", "gpus": 8, "layout": {"tp": 4, "pp": 2, "dp": 1},
         "global_batch": 4, "micro_batch": 2, "precision": "bfloat16", "reported": {"tflops_per_gpu": 1.0}}


def runs_file(tmp_path, *runs):
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"runs": list(runs)}))
    return str(path)


def test_megatron_pads_gpt3_vocabulary_to_128_x_tp(tmp_path):
    """GPT-3's 50,257 at tp 4: Megatron's _vocab_size_with_padding rounds up to a multiple of 128 x 4 = 512,
    50,688, which tp 4 divides; the FLOPs count the padded vocabulary as Megatron's do."""
    runs, _ = load_runs(runs_file(tmp_path, {**SMALL, "make_vocab_size_divisible_by": 128}))
    run = runs[0]
    assert run.padded_vocab == 50688 and run.model["vocab"] == 50257
    assert step_seconds(run) > 0
    unpadded = {**SMALL, "name": "unpadded", "layout": {"tp": 1, "pp": 1, "dp": 8}, "global_batch": 16}
    base, _ = load_runs(runs_file(tmp_path, unpadded))
    assert model_flops(run) / 4 > model_flops(base[0]) / 16   # per sample: eq. 3's V/(16·l·h) term with 50,688
    with pytest.raises(Exception, match="tp 4 does not divide"):
        step_seconds(load_runs(runs_file(tmp_path, SMALL))[0][0])


@pytest.mark.parametrize("change,words", [
    ({"make_vocab_size_divisible_by": 0}, ["run 'small'.make_vocab_size_divisible_by", "whole number"]),
    ({"gpu": "gb200", "cluster": "gb200-nvl72", "gpus": 6, "layout": {"tp": 2, "pp": 1, "dp": 3},
      "global_batch": 6}, ["run 'small'.gpus", "not whole compute trays of 4"]),
])
def test_bad_runs_file_is_one_line_exit_2(tmp_path, capsys, change, words):
    assert main(["reproduce", runs_file(tmp_path, {**SMALL, **change})]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err


def test_float8_linear_speedup_matches_torchao_microbenchmarks():
    """torchao/float8/README.md "Performance" (H100, torch.compile): a Float8Linear's forward + backward over the
    bf16 one at M, K, N = 1024, 2048, 1024 is 0.80x, at 4096, 8192, 16384 1.39x; the tensorwise recipe's three
    GEMMs and casts come within 10% of both. TE's fused cast-transpose recipes cost less than torchao's casts."""
    from distlab.sim.cluster import GPUS
    from distlab.sim.compute.kernels import gemm_time
    h100 = GPUS["h100"]

    def speedup(M, K, N, recipe):
        shapes = ((M, N, K), (M, K, N), (K, N, M))          # forward, data gradient, weight gradient
        bf16 = sum(gemm_time(a, b, c, 2, h100) for a, b, c in shapes)
        return bf16 / sum(gemm_time(a, b, c, 2, h100, "float8_e4m3fn", recipe) for a, b, c in shapes)
    assert speedup(1024, 2048, 1024, "torchao-tensorwise") == pytest.approx(0.80, rel=0.10)
    assert speedup(4096, 8192, 16384, "torchao-tensorwise") == pytest.approx(1.39, rel=0.10)
    big = [speedup(4096, 8192, 16384, r) for r in ("torchao-rowwise", "torchao-tensorwise", "te-current",
                                                   "te-delayed")]
    assert big == sorted(big) and big[0] < big[-1]


def test_fp8_recipe_is_a_key_of_runs_and_changes_the_step(tmp_path):
    """One small float8 run under each recipe: TE's delayed scaling (one fused cast-transpose) is faster than
    torchao's tensorwise casts, which at this small size lose to bf16 (as torchao's README says of small shapes);
    MXFP8 runs on Blackwell."""
    row = {**SMALL, "model": {**SMALL["model"], "layers": 2, "hidden": 2048, "heads": 16, "seq_len": 2048,
                              "vocab": 32768},
           "layout": {"tp": 1, "pp": 1, "dp": 8}, "global_batch": 8, "micro_batch": 1, "precision": "float8"}
    runs = [{**row, "name": r, "fp8_recipe": r} for r in ("torchao-tensorwise", "te-current", "te-delayed")]
    runs.append({**row, "name": "bf16", "precision": "bfloat16"})
    runs.append({**row, "name": "mx", "fp8_recipe": "mxfp8", "gpu": "b200", "cluster": "dgx-b200"})
    loaded, _ = load_runs(runs_file(tmp_path, *runs))
    step = {r.name: step_seconds(r) for r in loaded}
    assert step["te-delayed"] < step["te-current"] < step["bf16"] < step["torchao-tensorwise"]
    assert step["mx"] < step["te-delayed"]                   # B200's FP8 peak is 2.3x H100's


@pytest.mark.parametrize("change,words", [
    ({"gpu": "a100", "cluster": "dgx-a100", "fp8_recipe": "te-delayed"},
     ["run 'small'.fp8_recipe", "needs FP8 tensor cores", "a100 has none"]),
    ({"precision": "float8", "fp8_recipe": "mxfp8"}, ["run 'small'.fp8_recipe", "needs Blackwell", "te-delayed"]),
    ({"precision": "float8", "fp8_recipe": "fp4"}, ["run 'small'.fp8_recipe", "unknown fp8_recipe 'fp4'"]),
    ({"fp8_recipe": "te-delayed"}, ["run 'small'.fp8_recipe", "goes with precision float8"]),
])
def test_bad_fp8_recipe_is_one_line_exit_2(tmp_path, capsys, change, words):
    assert main(["reproduce", runs_file(tmp_path, {**SMALL, **change})]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err


def test_a_stage_of_tp_overlap_runs_as_one_op_per_block_with_the_full_simulations_step(tmp_path):
    """PP x TP x DP with --tp-comm-overlap: one TP rank stands for its stage, each ring exchange a fixed-duration
    op, and each block of its local work one op (sim/reproduce/blocks.py): a few ops per micro-batch instead of
    hundreds, the step the full simulation's (every rank, every exchange on the network)."""
    from distlab.sim.reproduce.plans import build_plan
    from distlab.sim.reproduce.predict import cluster_for
    row = {**SMALL, "model": {**SMALL["model"], "vocab": 4096}, "gpus": 32, "layout": {"tp": 8, "pp": 2, "dp": 2},
           "global_batch": 8, "micro_batch": 1, "sequence_parallel": True, "tp_comm_overlap": True}
    run = load_runs(runs_file(tmp_path, row))[0][0]
    cluster = cluster_for(run)
    plan = build_plan(run, cluster, True, {"cluster": cluster})
    built = [ops for ops in plan.ranks if ops]
    assert len(built) == 2 and all(len(ops) < 60 for ops in built)          # 4 micro-batches, 2 stages
    blocks = sum(getattr(op, "name", "").startswith("block: ") for op in built[0])
    assert 7 <= blocks <= 8                        # a forward and a backward per micro-batch (two may join)
    assert step_seconds(run) == pytest.approx(step_seconds(run, replicas=False), rel=1e-9)


def test_reproduce_prints_one_line_per_row_when_not_on_a_terminal(tmp_path, capsys):
    path = runs_file(tmp_path, SMALL, {**SMALL, "name": "second", "make_vocab_size_divisible_by": 128})
    assert main(["reproduce", path, "--only", "second"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reproduce: 1/1 second (8 GPUs): ") and err[0].endswith(" s in all")


def test_sdpa_flash_attention_2_and_torchtitans_per_op_recompute(tmp_path):
    """torchtitan as it ran on Hopper: SDPA's FlashAttention-2 (attention flash2) at the rate flash-attention PR
    #1791 measured (causal, head_dim 128, seq 8192: forward 284.1 TFLOP/s, FA3 630.0) times the fitted sustained;
    per-op SAC (recompute op) re-runs every second matmul of a block (Llama: wk, wo, w3) and no attention."""
    from distlab.sim.cluster import GPUS
    from distlab.sim.compute.kernels import _attention_work, attention_flops, sustained
    h100 = GPUS["h100"]
    fa2, _ = _attention_work(1, 32, 8192, 128, h100, True, "forward", "flash2")
    fa3, _ = _attention_work(1, 32, 8192, 128, h100, True, "forward")
    rate = attention_flops(1, 32, 8192, 128) / fa2 / 1e12
    assert rate == pytest.approx(284.1 * sustained(h100), rel=0.01) and fa2 / fa3 > 2
    llama = {"arch": "llama", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 2, "ffn_hidden": 3584,
             "vocab": 32768, "seq_len": 2048}
    row = {**SMALL, "model": llama, "layout": {"dp": 8, "zero": 3}, "global_batch": 8, "micro_batch": 1,
           "compile": True, "attention": "flash2"}
    runs = [{**row, "name": rc, "recompute": rc} for rc in ("none", "op")]
    loaded, _ = load_runs(runs_file(tmp_path, *runs))
    from distlab.sim.reproduce.plans import build_plan
    from distlab.sim.reproduce.predict import cluster_for
    ops = {r.name: {op.name: op for op in build_plan(r, cluster_for(r)).ranks[0] if hasattr(op, "gemms")}
           for r in loaded}
    T, h, kv, f = 2048, 1024, 256, 3584
    added = {"bwd h.1.attn": ((T, kv, h), (T, h, h)), "bwd h.1.mlp": ((T, f, h),)}
    for name, gemms in added.items():
        assert ops["op"][name].gemms == gemms + ops["none"][name].gemms
        assert ops["op"][name].attention_kernel == ("flash2" if ".attn" in name else "flash")
        assert ops["op"][name].attention_pass == "backward"
