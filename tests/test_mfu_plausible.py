"""Simulated MFU on every shipped GPU preset x every shipped dense model stays within 15% of the best MFU published
for the GPU's generation, or the output says why (sim/compute/flops.py ``plausibility``, sim/result.py
``throughput``): one GPU, the TP builder (the ops carry their GEMM shapes and attention calls), so no
communication hides anything: the compute model alone. Every other builder prices the same kernels
(tests/test_kernels_everywhere.py)."""
import pytest

from distlab.sim import scenario as sc
from distlab.sim.cluster import PRESETS
from distlab.sim.compute.flops import BEST_PUBLISHED_MFU, PLAUSIBLE_MARGIN, published_mfu
from distlab.sim.compute.kernels import kernel_model
from distlab.sim.models import PRESETS as MODELS

GPU_CLUSTERS = sorted({c.gpu.name: name for name, c in sorted(PRESETS.items(), reverse=True)
                       if c.gpu.arch != "cpu"}.values())          # one cluster preset per GPU preset


@pytest.mark.parametrize("cluster", GPU_CLUSTERS)
def test_mfu_of_every_model_is_plausible_or_explained(cluster):
    generation = kernel_model(PRESETS[cluster].gpu).generation
    for model in sorted(MODELS):
        d = {"model": {"preset": model, "micro_batch": 1, "dtype": "bfloat16"}, "mesh": {"tp": 1}, "tp": {},
             "cluster": cluster, "world_size": 1}
        s = sc.simulate(d, f"{cluster} x {model}").summary
        assert 0 < s["mfu"] < 1 and s["hfu"] >= s["mfu"]
        best = BEST_PUBLISHED_MFU.get(generation)
        assert published_mfu(PRESETS[cluster].gpu) == best
        if best is not None and s["mfu"] > best[0] * PLAUSIBLE_MARGIN:
            assert any("above the best published" in n for n in s["compute_notes"]), (cluster, model, s["mfu"])
        if best is None:                                  # nothing published to hold it to: the output says so
            assert s["compute_notes"], (cluster, model)
        if generation in ("ampere", "hopper"):            # never above the GEMMs' own measured ceiling
            assert s["mfu"] < kernel_model(PRESETS[cluster].gpu).gemm_fraction["bfloat16"], (cluster, model)


def test_ddp_prices_kernels_as_tp_does():
    """DDP's layers run TP's segments on one rank (sim/parallel/layers.py kernel_layers): no FLOPs-only upper
    bound, and within 3% of the TP builder's MFU on one GPU (DDP adds its all-reduces; its own optimizer op)."""
    s = sc.simulate({"model": {"preset": "llama3-8b", "micro_batch": 1}, "ddp": {}, "cluster": "dgx-h100",
                     "world_size": 8}).summary
    assert not any("without kernel shapes" in n or "upper bound" in n for n in s["compute_notes"])
    one = sc.simulate({"model": {"preset": "llama3-8b", "micro_batch": 1}, "mesh": {"tp": 1}, "tp": {},
                       "cluster": "dgx-h100", "world_size": 1}).summary
    assert s["mfu"] == pytest.approx(one["mfu"], rel=0.03)
    assert s["tokens_per_step"] == 8 * 8192 and s["tflops_per_gpu"] == pytest.approx(
        s["mfu"] * PRESETS["dgx-h100"].gpu.tflops)


def test_a_composed_pipeline_counts_every_micro_batch_and_replica():
    """pp 2 x dp_shard 2 x tp 2 with 4 micro-batches of 2 sequences: 2 x 4 x 2 = 16 sequences per step (the tp and
    pp ranks share theirs); tokens/s per GPU and MFU follow from them (a composition's options are
    sim/parallel/parallelize.py's Parallelisms, whose pipeline section holds the micro-batches)."""
    d = {"model": {"preset": "llama3-8b", "micro_batch": 2, "seq_len": 1024, "layers": 4}, "mesh": {"pp": 2,
         "dp_shard": 2, "tp": 2}, "pipeline": {"microbatches": 4}, "tp": {"recompute": "full"}, "fsdp": {},
         "cluster": "dgx-h100", "world_size": 8}
    s = sc.simulate(d).summary
    assert s["tokens_per_step"] == 16 * 1024
    assert s["tokens_per_s_per_gpu"] == pytest.approx(16 * 1024 / s["step_s"] / 8)
    assert s["hfu"] > s["mfu"]                              # full recompute counted as hardware FLOPs


def test_simulate_prints_the_throughput_and_json_carries_it(capsys):
    from distlab.runtime.cli import main
    args = ["simulate", "--model", "llama3-8b", "--micro-batch", "1", "--world-size", "8", "--no-files"]
    assert main(args + ["--json"]) == 0
    r = __import__("json").loads(capsys.readouterr().out)["results"][0]
    for key in ("model_flops_per_token", "hardware_flops_per_token", "flops_convention", "mfu", "hfu",
                "tflops_per_gpu", "tokens_per_s_per_gpu", "tokens_per_step", "compute_notes"):
        assert key in r, key
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"{100 * r['mfu']:.1f} %" in out and "tokens/s per GPU" in out


# one cluster preset per GPU generation, and the shipped models on enough of its nodes to fit
PLAN_CLUSTERS = sorted({kernel_model(PRESETS[c].gpu).generation: c for c in reversed(GPU_CLUSTERS)}.values())
PLAN_MODELS = {"gpt2-small": 1, "llama3-8b": 1}


@pytest.mark.parametrize("cluster", PLAN_CLUSTERS)
def test_plan_mfu_is_plausible_or_explained(cluster):
    """`distlab plan`'s table on the shipped models: every row's MFU within 15% of the best published MFU for
    the generation, or its notes say why (sim/planner/explain.py ``notes``; the search is cut to the common
    layouts and micro-batches of 1 and 2, to stay fast)."""
    from distlab.sim.planner.explain import notes
    from distlab.sim.planner.search import search
    generation = kernel_model(PRESETS[cluster].gpu).generation
    best = BEST_PUBLISHED_MFU.get(generation)

    def common(L):
        return L.cp == 1 and L.dp_kind != "hsdp" and L.virtual_stages == 1 and L.split is None and \
            L.recompute != "selective" and (L.tp == 1 or L.sequence_parallel)
    for model, nodes in PLAN_MODELS.items():
        s = search({"preset": model}, cluster, nodes, 16 * nodes, confirm=0, micro_batches=(1, 2), workers=1,
                   allow=common)
        top = max(s.mfu(c) for c in s.ranked[:10])
        assert 0 < top < 1
        said = notes(s, 10)
        if best is None:
            assert any("no published MFU" in n for n in said), (cluster, model)
        elif top > best[0] * PLAUSIBLE_MARGIN:
            assert any("above the best published" in n for n in said), (cluster, model, top)
        if generation in ("ampere", "hopper"):
            assert top <= best[0] * PLAUSIBLE_MARGIN, (cluster, model, top)
