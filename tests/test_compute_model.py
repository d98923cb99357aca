"""The per-op compute model (sim/compute.py): GEMM, FlashAttention and memory-bound times against hand-computed
values, the efficiency curve (log-linear, clamped), the engine's use of it, the TP builders' GEMM shapes (a TP
degree or micro-batch change moves each GEMM along the curve), and the plan / cluster file fields."""
import math
from dataclasses import replace

import pytest

from distlab.sim.cluster import GPUS, PRESETS, cluster_from_dict
from distlab.sim.compute import attention_time, gemm_efficiency, gemm_time, memory_time, op_seconds
from distlab.sim.kernel.engine import simulate
from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt
from distlab.sim.plan import Compute, Plan
from distlab.sim.parallel.tp.plan import TPOptions, tp_plan

# 100 TFLOP/s, 1000 GB/s; 25% of peak at 1 GFLOP, 75% at 100 GFLOP; 2 us per kernel.
GPU = replace(GPUS["h100"], compute=None, tflops=100.0, hbm_GBps=1000.0, gemm_efficiency=((1e9, 0.25), (1e11, 0.75)),
              launch_s=2e-6)


def test_gemm_time_by_hand():
    # 2·1000³ = 2e9 FLOPs: log10 = 9.30103, a quarter of the way from 1e9 to 1e11 -> eff 0.25 + 0.5 x 0.150515
    eff = 0.25 + 0.5 * (math.log10(2e9) - 9) / 2
    assert gemm_efficiency(2e9, GPU) == pytest.approx(eff, rel=1e-12)
    assert gemm_time(1000, 1000, 1000, 2, GPU) == pytest.approx(2e-6 + 2e9 / (100e12 * eff), rel=1e-12)


def test_curve_is_clamped_at_both_ends():
    assert gemm_efficiency(1e3, GPU) == 0.25 and gemm_efficiency(1e15, GPU) == 0.75
    # a large GEMM at 75%: 2·8192³ FLOPs / 75 TFLOP/s
    assert gemm_time(8192, 8192, 8192, 2, GPU) == pytest.approx(2e-6 + 2 * 8192**3 / 75e12, rel=1e-12)


def test_skinny_gemm_is_memory_bound():
    # (1 x 8192) @ (8192 x 8192): 134 MFLOP (at 25% = 5.4 us) but 8192² x 2 bytes of weight = 134 us of HBM
    t = gemm_time(1, 8192, 8192, 2, GPU)
    assert t == pytest.approx(2e-6 + (8192 + 8192 * 8192 + 8192) * 2 / 1e12, rel=1e-12)


def test_without_a_curve_the_old_flat_roofline():
    gpu = replace(GPUS["a100"], mfu=0.5, compute=None, launch_s=0.0)     # a custom GPU: no kernel model
    assert gemm_efficiency(1e6, gpu) == 0.5
    assert gemm_time(4096, 4096, 4096, 2, gpu) == pytest.approx(2 * 4096**3 / (312e12 * 0.5), rel=1e-12)
    old = Compute("x", flops=1e12, bytes=1e9)
    assert op_seconds(old, gpu) == max(1e12 / (312e12 * 0.5), 1e9 / 2039e9)


def test_flash_attention_flops_causal_and_backward():
    gpu = replace(GPU, attention_efficiency=0.5)
    full = 4.0 * 2 * 16 * 4096**2 * 128            # 4·b·heads·s²·d
    assert attention_time(2, 16, 4096, 128, gpu, causal=False) == pytest.approx(2e-6 + full / 50e12, rel=1e-12)
    assert attention_time(2, 16, 4096, 128, gpu) == pytest.approx(2e-6 + full / 2 / 50e12, rel=1e-12)
    assert attention_time(2, 16, 4096, 128, gpu, attention_pass="backward") == pytest.approx(
        2e-6 + 2.5 * full / 2 / 50e12, rel=1e-12)
    assert attention_time(2, 16, 4096, 128, gpu, attention_pass="recompute+backward") == pytest.approx(
        2e-6 + 3.5 * full / 2 / 50e12, rel=1e-12)


def test_memory_bound_op_and_launch_overhead():
    assert memory_time(1e9, GPU) == pytest.approx(2e-6 + 1e-3, rel=1e-12)
    assert op_seconds(Compute("norm", bytes=1e9), GPU) == pytest.approx(2e-6 + 1e-3, rel=1e-12)
    op = Compute("mlp", gemms=((1000, 1000, 1000), (8192, 8192, 8192)))
    assert op_seconds(op, GPU) == pytest.approx(gemm_time(1000, 1000, 1000, 2, GPU)
                                                + gemm_time(8192, 8192, 8192, 2, GPU), rel=1e-12)


def test_the_engine_times_compute_with_the_model():
    cluster = replace(PRESETS["dgx-h100"], gpu=GPU).with_world_size(1)
    op = Compute("attn", gemms=((4096, 4096, 4096),), attention=(1, 32, 4096, 128))
    trace = simulate(Plan([[op]]), cluster)
    assert trace.makespan == pytest.approx(op_seconds(op, GPU), rel=1e-12)


LLAMA = gpt(layers=2, hidden=4096, heads=32, kv_heads=8, seq_len=4096, vocab=32000, micro_batch=1,
            arch="llama", ffn_hidden=14336)


def _op(plan, name):
    return next(o for o in plan.ranks[0] if isinstance(o, Compute) and o.name == name)


def test_tp_slices_gemms_and_moves_them_down_the_curve():
    one = _op(tp_plan(LLAMA, Mesh({"tp": 1}), TPOptions()), "fwd h.0.mlp")
    eight = _op(tp_plan(LLAMA, Mesh({"tp": 8}), TPOptions()), "fwd h.0.mlp")
    T = 4096
    assert one.gemms == ((T, 14336, 4096), (T, 14336, 4096), (T, 4096, 14336))       # gate, up, down
    assert eight.gemms == ((T, 1792, 4096), (T, 1792, 4096), (T, 4096, 1792))
    # each tp-8 slice has 1/8 of the FLOPs; on the curve it runs at a lower efficiency, as the curve says
    gpu = replace(GPU, gemm_efficiency=((1e9, 0.25), (1e13, 0.75)), launch_s=0.0)   # +0.125 per decade
    f1, f8 = 2.0 * T * 14336 * 4096, 2.0 * T * 1792 * 4096
    drop = gemm_efficiency(f1, gpu) - gemm_efficiency(f8, gpu)
    assert drop == pytest.approx(0.125 * math.log10(8), rel=1e-9)
    ratio = 8 * op_seconds(eight, gpu) / op_seconds(one, gpu)
    assert ratio == pytest.approx(gemm_efficiency(f1, gpu) / gemm_efficiency(f8, gpu), rel=1e-9)
    assert ratio > 1.1


def test_backward_gemms_and_micro_batch():
    plan = tp_plan(LLAMA, Mesh({"tp": 2}), TPOptions(sequence_parallel=False))
    fwd, bwd = _op(plan, "fwd h.0.attn"), _op(plan, "bwd h.0.attn")
    assert fwd.attention == (1, 16, 4096, 128) and bwd.attention_pass == "backward"
    assert bwd.gemms == tuple(g for M, N, K in fwd.gemms for g in ((M, K, N), (K, N, M)))
    full = _op(tp_plan(LLAMA, Mesh({"tp": 2}), TPOptions(recompute="full")), "bwd h.0.attn")
    assert full.gemms[:len(fwd.gemms)] == fwd.gemms and full.attention_pass == "recompute+backward"
    big = gpt(**{**{k: LLAMA.config[k] for k in ("layers", "hidden", "heads", "kv_heads", "seq_len", "vocab",
                                                 "arch", "ffn_hidden")}, "micro_batch": 4})
    assert _op(tp_plan(big, Mesh({"tp": 2}), TPOptions()), "fwd h.0.attn").gemms[0][0] == 4 * 4096


def test_plan_json_round_trip_and_old_plans_unchanged():
    op = Compute("attn", gemms=((8, 16, 32),), attention=(1, 2, 64, 8), causal=False, attention_pass="backward")
    plan = Plan([[op, Compute("norm", bytes=10.0)]])
    again = Plan.from_json(plan.to_json())
    assert again.ranks[0] == plan.ranks[0]
    assert set(plan.to_dict()["ranks"][0][1]) == {"kind", "name", "seconds", "flops", "bytes", "stream"}
    with pytest.raises(ConfigError, match="gemms"):
        Plan([[Compute("x", gemms=((8, 0, 32),))]]).validate()
    with pytest.raises(ConfigError, match="attention_pass"):
        Plan([[Compute("x", attention_pass="sideways")]]).validate()


def test_cluster_file_carries_the_curve():
    d = PRESETS["dgx-a100"].to_dict()
    assert "gemm_efficiency" not in d["gpu"] and d["gpu"]["compute"] == "a100"   # the preset's kernel model
    d["gpu"].update(gemm_efficiency=[[1e9, 0.3], [1e12, 0.7]], attention_efficiency=0.5, launch_s=3e-6)
    c = cluster_from_dict(d)
    assert c.gpu.gemm_efficiency == ((1e9, 0.3), (1e12, 0.7)) and c.gpu.launch_s == 3e-6
    assert cluster_from_dict(c.to_dict()).gpu == c.gpu
    d["gpu"]["gemm_efficiency"] = [[1e12, 0.3], [1e9, 0.7]]
    with pytest.raises(ConfigError, match="gemm_efficiency"):
        cluster_from_dict(d)


def test_unfused_attention_by_hand():
    # b·heads = 2 x 4 = 8 problems, s = 1024, d = 64, 2-byte elements; the curve at each batched GEMM's FLOPs
    gpu = replace(GPU, launch_s=0.0)
    f = 2.0 * 8 * 1024 * 1024 * 64
    gemm = 2 * f / (100e12 * gemm_efficiency(f, gpu))
    scores = 8 * 1024 * 1024
    fwd = gemm + scores * (4 + 5) / 1e12
    bwd = 2 * gemm + scores * (5 + 6) / 1e12
    op = Compute("attn", attention=(2, 4, 1024, 64), attention_kernel="unfused")
    assert op_seconds(op, gpu) == pytest.approx(fwd, rel=1e-12)
    assert op_seconds(replace(op, attention_pass="recompute+backward"), gpu) == pytest.approx(fwd + bwd, rel=1e-12)


def test_counted_launches_replace_the_per_kernel_overhead():
    """One rule for launch_s: per kernel, or, where the op counts the ops its host dispatches (``launches``, e.g.
    DTensor's in a TP plan), per dispatched op instead: never both."""
    from dataclasses import replace

    from distlab.sim.cluster import PRESETS
    from distlab.sim.compute import op_seconds
    from distlab.sim.plan import Compute
    gpu = replace(PRESETS["dgx-h100"].gpu, compute=None, launch_s=1e-5)    # launch_s alone, no kernel model
    bare = replace(gpu, launch_s=0.0)
    op = Compute("mlp", gemms=((512, 1024, 256), (512, 256, 1024)))
    assert op_seconds(op, gpu) == pytest.approx(op_seconds(op, bare) + 2e-5)
    assert op_seconds(replace(op, launches=7), gpu) == pytest.approx(op_seconds(op, bare) + 7e-5)
    flat = Compute("norm", bytes=1e6)
    assert op_seconds(replace(flat, launches=0), gpu) == pytest.approx(op_seconds(flat, bare))
    assert op_seconds(flat, gpu) == pytest.approx(op_seconds(flat, bare) + 1e-5)


def test_presets_reproduce_the_measurements_they_cite():
    """The H100 preset's GEMMs (sustained 1: micro-benchmark rates) against the measured ones: MAMF exactly at its
    best shape (794.5 TFLOP/s, ml-engineering's MAMF table) and the square GEMMs of zzc0721 issue #79 (176.6,
    676.6, 788.7, 797.5 TFLOP/s at 1024..8192) within 10%; the attention table's own points exactly."""
    from distlab.sim.compute.gpus import FA3_H100
    from distlab.sim.compute.kernels import launch_s
    h100 = replace(GPUS["h100"], sustained=1.0)
    M, N, K = 2048, 2048, 13312
    work = gemm_time(M, N, K, 2, h100) - launch_s(h100)
    assert 2.0 * M * N * K / work / 1e12 == pytest.approx(794.5, rel=1e-3)
    for n, measured in ((1024, 176.6), (2048, 676.6), (4096, 788.7), (8192, 797.5)):
        assert 2.0 * n ** 3 / gemm_time(n, n, n, 2, h100) / 1e12 == pytest.approx(measured, rel=0.10)
    t = attention_time(1, 16, 8192, 128, h100, causal=False) - launch_s(h100)
    assert 4.0 * 16 * 8192 ** 2 * 128 / t / 1e12 == pytest.approx(dict(FA3_H100.forward_tflops)[8192], rel=1e-9)
    causal = attention_time(1, 16, 8192, 128, h100) - launch_s(h100)
    assert causal / (t / 2) == pytest.approx((8192 + 350) / 8192, rel=1e-9)       # s / (s + s0) of the rate
    bwd = attention_time(1, 16, 8192, 128, h100, attention_pass="backward") - launch_s(h100)
    assert bwd == pytest.approx(2.5 * causal / 0.911, rel=1e-9)


def test_dtypes_float32_and_float8():
    """float32 GEMMs run on the CUDA cores' FP32 peak; float8 ones at the FP8 peak plus torchao's casts of both bf16
    operands (5 bytes an element, two kernels); a GPU without FP8 refuses them."""
    from distlab.sim.compute.kernels import hbm_Bps, launch_s
    h100 = replace(GPUS["h100"], sustained=1.0)
    n = 8192
    assert gemm_time(n, n, n, 4, h100) / gemm_time(n, n, n, 2, h100) == pytest.approx(
        (989 * 0.803) / (67 * 0.775), rel=0.01)
    fp8, bf16 = gemm_time(n, n, n, 1, h100, "float8_e4m3fn"), gemm_time(n, n, n, 2, h100)
    casts = 2 * n * n * 5 / hbm_Bps(h100) + 2 * launch_s(h100)
    assert fp8 - casts == pytest.approx(2.0 * n ** 3 / (1979e12 * 0.709) + launch_s(h100), rel=1e-6)
    assert fp8 < bf16
    with pytest.raises(ConfigError, match="no FP8 tensor cores"):
        gemm_time(n, n, n, 1, GPUS["a100"], "float8_e4m3fn")


def test_wave_quantization():
    """A GEMM of fewer output tiles than SMs leaves SMs idle; one tile more than a wave starts a second wave."""
    from distlab.sim.compute.kernels import wave_efficiency
    assert wave_efficiency(128, 256, 132) == pytest.approx(1 / 132)
    assert wave_efficiency(128 * 12, 256 * 11, 132) == pytest.approx(1.0)                # 132 tiles: one wave
    assert wave_efficiency(128 * 133, 256, 132) == pytest.approx(133 / 264)              # two waves, one tile in the second


def test_elementwise_passes_ride_on_each_block_attention_op():
    """The fitted elementwise kernels of a block: passes x b·s·heads·d x bytes over HBM on its attention op, twice
    in the backward; a spec carrying its own sustained fraction keeps 0 unless it sets them; the H100 preset takes
    its generation's fitted value."""
    from distlab.sim.compute.fitted import FITTED
    from distlab.sim.compute.kernels import elementwise_passes, hbm_Bps
    h100 = replace(GPUS["h100"], sustained=1.0)
    assert elementwise_passes(h100) == 0 and elementwise_passes(GPUS["h100"]) == FITTED["hopper"].elementwise_passes
    three = replace(h100, elementwise_passes=3.0)
    b, heads, s, d = 2, 8, 4096, 128
    for attention_pass, factor in (("forward", 1), ("backward", 2)):
        op = Compute("blk", attention=(b, heads, s, d), attention_pass=attention_pass, dtype="bfloat16")
        assert op_seconds(op, three) - op_seconds(op, h100) == pytest.approx(
            3.0 * factor * b * s * heads * d * 2 / hbm_Bps(h100), rel=1e-9)
    gemm = Compute("gemm", gemms=((4096, 4096, 4096),), dtype="bfloat16")
    assert op_seconds(gemm, three) == op_seconds(gemm, h100)


def test_cluster_file_carries_elementwise_passes_and_refuses_bad_ones():
    from distlab.sim.cluster import gpu_to_dict
    g = gpu_to_dict(GPUS["h100"])
    d = {"name": "x", "nodes": 1, "gpus_per_node": 8, "gpu": {**g, "elementwise_passes": 3}, "intra_node": {}}
    assert cluster_from_dict(d).gpu.elementwise_passes == 3
    assert gpu_to_dict(cluster_from_dict(d).gpu)["elementwise_passes"] == 3 and "elementwise_passes" not in g
    with pytest.raises(ConfigError, match="elementwise_passes.*must be a number in"):
        cluster_from_dict({**d, "gpu": {**g, "elementwise_passes": -1}})


def test_split_k_fills_the_sms_for_few_tiles_and_a_deep_k():
    """Fewer output tiles than SMs and a deep K: the K loop is cut (each slice >= SPLIT_K_MIN_DEPTH) when that
    beats the fp32 partials' traffic; the measured 1024³ GEMM and GEMMs of a wave or more stay unsplit."""
    from distlab.sim.compute.kernels import SPLIT_K_MIN_DEPTH, tiling
    assert tiling(1024, 1024, 132, 1024, 265) == (pytest.approx(32 / 132), 1)
    assert tiling(8192, 8192, 132, 8192, 265)[1] == 1
    eff, splits = tiling(512, 2688, 132, 7168, 265)          # a tp-8 overlap chunk: 44 tiles of 128 x 256
    assert splits == 3 and eff == pytest.approx(512 * 2688 / (128 * 256) * 3 / 132) and 7168 // 3 >= SPLIT_K_MIN_DEPTH
    assert tiling(512, 2688, 132, 7168, 1e9)[1] == 1           # partials too costly: no split


def test_tp_overlap_chunks_share_the_waves():
    """Transformer Engine issues a TP overlap's t chunk GEMMs round-robin on 3 streams (comm_gemm_overlap.cpp):
    their tiles form one pool over the SMs. H100 (132 SMs), a 1024 x 6144 chunk: 8 x 24 = 192 tiles of 128 x 256,
    alone 2 waves (192 / 264 of the SMs' time); four such chunks: 768 tiles in 6 waves (768 / 792)."""
    from distlab.sim.compute.kernels import tiling
    from distlab.sim.plan import Plan
    assert tiling(1024, 6144, 132)[0] == pytest.approx(192 / 264)
    assert tiling(1024, 6144, 132, chunks=4)[0] == pytest.approx(768 / 792)
    assert tiling(128, 256, 132, chunks=2)[0] == pytest.approx(2 / 132)       # few tiles: 3 streams cap the pool
    h100 = GPUS["h100"]
    alone, pooled = (op_seconds(Compute(gemms=((1024, 6144, 6144),), chunks=c), h100) for c in (1, 4))
    assert pooled < alone
    plan = Plan([[Compute("c", gemms=((1024, 6144, 6144),), chunks=4)], [Compute("d")]])
    back = Plan.from_json(plan.to_json())
    assert back.ranks[0][0].chunks == 4 and '"chunks"' not in Plan([[Compute("d")]]).to_json()
    from distlab.sim import scenario as sc
    d = {"model": {"arch": "llama", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 512,
                   "seq_len": 128, "vocab": 512, "micro_batch": 1}, "mesh": {"tp": 4},
         "tp": {"sequence_parallel": True, "comm_overlap": True}, "cluster": "dgx-h100", "world_size": 4}
    ops = [o for o in sc.build(d).plan.ranks[0] if isinstance(o, Compute) and " step " in o.name and o.gemms]
    assert ops and {o.chunks for o in ops} == {4}


def test_an_ops_gemms_priced_once_per_shape_sum_as_one_by_one():
    """_kernel_work prices each distinct GEMM shape of an op once and ``tiling`` is cached (an MoE layer repeats a
    few shapes hundreds of times): the op's time is still every GEMM's, summed in order, bit for bit, including
    shapes that share M, or M and N, and differ in K (H100's kernel model; bf16 and float8)."""
    from distlab.sim.compute import kernels
    h100 = GPUS["h100"]
    shapes = ((512, 2688, 7168), (512, 2688, 1024), (512, 7168, 2688), (512, 2688, 7168), (64, 2688, 7168),
              (512, 2688, 1024), (4096, 4096, 4096))
    for dtype in ("bfloat16", "float8_e4m3fn"):
        op = Compute(f"moe {dtype}", gemms=shapes, dtype=dtype)
        work, kernels_n = 0.0, 0
        for M, N, K in shapes:
            w, k = kernels._gemm_work(M, N, K, 1 if dtype == "float8_e4m3fn" else 2, h100, dtype)
            work, kernels_n = work + w, kernels_n + k
        assert kernels._kernel_work(op, h100) == (work, kernels_n)
    for args in ((512, 2688, 132, 7168, 265.0), (512, 2688, 132, 1024, 265.0), (1024, 6144, 132, None, 0.0, 4)):
        assert kernels.tiling(*args) == kernels.tiling.__wrapped__(*args)
