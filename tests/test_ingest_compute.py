"""`distlab compare`: a profile's compute kernels matched to the plan's compute ops by kind and in order
(sim/ingest/compute_match.py), on the shipped real GPU traces (tests/data/profiles/SOURCES.md) and on a plan whose
ops name their GEMMs and attention. The CLI's table: tests/test_ingest_profile.py; the CPU (gloo) trace's
matmuls: tests/test_ingest_cpu_profile.py."""
from __future__ import annotations

import os

import pytest

from distlab.sim.cluster import load_cluster
from distlab.sim.ingest.compute_match import kernel_kind, match_compute, op_parts
from distlab.sim.ingest.kineto import Event, load_profile
from distlab.sim.ingest.scenario import plan_from_profile
from distlab.sim.ingest.versus import compare_profile
from distlab.sim.kernel.engine import simulate
from distlab.sim.ops import Compute
from distlab.sim.plan import Plan

DATA = os.path.join(os.path.dirname(__file__), "data", "profiles")
DDP = os.path.join(DATA, "hta_a100_2rank_nccl")         # ResNet-50 DDP on 2 A100, rank 0 (NCCL 2.17.1)
SAMPLED = os.path.join(DATA, "hta_128rank_sampled")     # ranks 0 and 1 of a 128-GPU recommendation model job


@pytest.mark.parametrize("name, kind", [
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(Params)", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm"),
    ("ampere_sgemm_32x32_sliced1x4_tn", "gemm"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw", "gemm"),   # cuDNN convolution
    ("aten::addmm", "gemm"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel)", "attention"),
    ("aten::scaled_dot_product_attention", "attention"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "memory-bound"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 32, true, 1>", "memory-bound"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "memory-bound"),
    ("void fbgemm_gpu::permute_2D_lengths_kernel<int>", "other"),          # fbgemm is not a GEMM
])
def test_kernel_kinds_from_their_names(name, kind):
    assert kernel_kind(name) == kind


def test_a_plan_op_is_split_into_the_kinds_of_the_kernels_it_names():
    gpu = load_cluster("dgx-h100").gpu
    block = Compute("fwd h.0.attn", gemms=((8192, 512, 4096), (8192, 4096, 512)), attention=(1, 4, 8192, 128))
    parts = {k: (w, n) for k, w, n in op_parts(block, gpu)}
    assert parts["gemm"][1] == 2 and parts["attention"][1] == 1 and parts["memory-bound"][1] is None
    assert all(w > 0 for w, _ in parts.values())
    assert op_parts(Compute("matmul", flops=2e9, bytes=1e6), gpu) == [("gemm", 1.0, 1)]
    assert op_parts(Compute("fwd norm", bytes=1e6), gpu) == [("memory-bound", 1.0, None)]
    assert op_parts(Compute("measured gemm x12", seconds=1e-3), gpu) == [("gemm", 1e-3, 12)]


def _kernel(name, start, dur):
    return Event(name, start, dur, 7, "compute", True)


def test_gemm_and_attention_kernels_taken_in_order_by_the_plan_ops_and_the_rest_said():
    gpu = load_cluster("dgx-h100").gpu
    plan = Plan([[Compute("fwd mlp", gemms=((4096, 4096, 4096),) * 2),
                  Compute("fwd attn", gemms=((4096, 4096, 4096),), attention=(1, 8, 4096, 128)),
                  Compute("bwd attn", attention=(1, 8, 4096, 128), attention_pass="backward")]])
    trace = simulate(plan, load_cluster("dgx-h100").with_world_size(1), record_transfers=False)
    gemm, flash = "sm90_xmma_gemm_bf16bf16_bf16f32", "flash_fwd_kernel"
    events = [_kernel(gemm, 0, 100), _kernel(gemm, 100, 100), _kernel("vectorized_elementwise_kernel", 200, 10),
              _kernel(gemm, 210, 100), _kernel(flash, 310, 50), _kernel(gemm, 400, 100)]
    m = match_compute(trace, plan, gpu, 0, events)
    assert [(p["op"], p["kind"], p["kernels"]) for p in m["matched"]] == [
        ("fwd mlp", "gemm", 2), ("fwd attn", "gemm", 1), ("fwd attn", "attention", 1)]
    assert m["matched"][0]["measured_s"] == pytest.approx(200e-6) and m["matched"][0]["predicted_s"] > 0
    assert m["unmatched"]["measured"]["gemm"]["kernels"] == 1                  # the 4th GEMM: no plan op left
    assert m["unmatched"]["plan_ops"] == ["bwd attn (attention)"]             # no attention kernel left for it
    assert m["kinds"]["gemm"]["measured_kernels"] == 4 and m["kinds"]["gemm"]["matched_kernels"] == 3
    assert m["kinds"]["memory-bound"]["measured_kernels"] == 1 and m["kinds"]["memory-bound"]["plan_ops"] == 2


@pytest.mark.parametrize("folder", [DDP, SAMPLED])
def test_the_real_traces_compute_kernels_all_matched_by_kind_to_the_plan_from_the_profile(folder):
    profile = load_profile(folder)
    plan, guessed, _ = plan_from_profile(profile)
    cluster = load_cluster(guessed["cluster"]).with_world_size(plan.world_size)
    c = compare_profile(simulate(plan, cluster, record_transfers=False), profile, plan=plan, gpu=cluster.gpu)
    for m in c["compute"]:
        kinds = m["kinds"]
        assert kinds["gemm"]["measured_kernels"] > 0 and kinds["memory-bound"]["measured_kernels"] > 0
        for k, v in kinds.items():
            assert v["matched_kernels"] == v["measured_kernels"], k       # the plan's ops are the measured runs
            assert v["predicted_s"] == pytest.approx(v["measured_s"], rel=0.05, abs=1e-6), k
        assert not m["unmatched"]["measured"] and not m["unmatched"]["plan_ops"]
        assert all(p["kind"] in p["op"] for p in m["matched"])

