"""Float32 priced as float32 (issue 28): every builder's Compute ops carry the dtype their matmuls run in (the
model's parameters' dtype; FSDP2's MixedPrecisionPolicy param_dtype where it is set), and the compute model prices
a float32 op on the FP32 peak (torch 2.13 runs float32 matmuls without TF32 by default: checked here on the
installed torch), not at the tensor cores' bf16 rate. `distlab simulate --autocast none` (gpt2-small in float32,
DDP on one DGX H100, without the default's bf16 autocast) then prints a float32 step's MFU and says against which
peak it is taken."""
import json

import pytest

from distlab.sim import scenario as sc
from distlab.sim.cluster import GPUS
from distlab.sim.compute import op_seconds
from distlab.sim.compute.kernels import kernel_model
from distlab.sim.plan import Compute

TINY = {"arch": "llama", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 512, "seq_len": 128,
        "vocab": 512, "micro_batch": 1}
MOE = {"kind": "moe", "layers": 2, "hidden": 256, "experts": 8, "top_k": 2, "expert_ffn": 512, "seq_len": 128,
       "shared_experts": 1, "attention": "none", "embed": False}
BUILDERS = {         # name: (model, mesh, sections): one of each builder, and PP x FSDP2 x TP composed
    "ddp": (TINY, {"dp": 2}, {"ddp": {}}),
    "fsdp": (TINY, {"dp_shard": 2}, {"fsdp": {}}),
    "pipeline": (TINY, {"pp": 2}, {"pipeline": {"microbatches": 2}}),
    "tp": (TINY, {"tp": 2}, {"tp": {"sequence_parallel": True}}),
    "cp": (TINY, {"cp": 2}, {"cp": {}}),
    "ep": (MOE, {"ep": 2}, {"ep": {}}),
    "pp x fsdp x tp": (TINY, {"pp": 2, "dp_shard": 2, "tp": 2},
                       {"pipeline": {"microbatches": 2}, "tp": {"sequence_parallel": True},
                        "fsdp": {"reshard_after_forward": False}}),
}


def _flop_ops(model, mesh, sections, dtype, param_dtype=None):
    sections = {k: dict(v) for k, v in sections.items()}
    if param_dtype:
        sections["fsdp"]["param_dtype"] = param_dtype
    d = {"model": {**model, "dtype": dtype}, "mesh": mesh, **sections, "cluster": "dgx-h100",
         "world_size": 1}
    for n in mesh.values():
        d["world_size"] *= n
    plan = sc.build(d).plan
    return [o for o in plan.ranks[0] if isinstance(o, Compute) and o.flops and not o.name.startswith("optimizer")]


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_builder_carries_the_dtype_its_matmuls_run_in(name):
    model, mesh, sections = BUILDERS[name]
    for dtype in ("float32", "bfloat16"):
        ops = _flop_ops(model, mesh, sections, dtype)
        assert ops and {o.dtype for o in ops} == {dtype}, (name, dtype, {o.dtype for o in ops})
    if "fsdp" in sections:              # MixedPrecisionPolicy(param_dtype=bf16) over float32 parameters
        ops = _flop_ops(model, mesh, sections, "float32", param_dtype="bfloat16")
        assert {o.dtype for o in ops} == {"bfloat16"}, name


def test_a_float32_op_is_priced_on_the_fp32_peak():
    h100 = GPUS["h100"]
    km = kernel_model(h100)
    flops = 1e14                                      # launches (2 us a kernel) negligible
    fp32, bf16 = (op_seconds(Compute(flops=flops, dtype=d), h100) for d in ("float32", "bfloat16"))
    # FLOPs-only ops: the best GEMM of the dtype (MAMF x sustained), below the datasheet's FP32 67 TFLOP/s
    assert flops / fp32 < h100.fp32_tflops * 1e12 * km.gemm_fraction["float32"] * 1.001
    assert flops / fp32 > 0.5 * h100.fp32_tflops * 1e12 * km.gemm_fraction["float32"]
    assert fp32 / bf16 == pytest.approx(h100.tflops * km.gemm_fraction["bfloat16"]
                                        / (h100.fp32_tflops * km.gemm_fraction["float32"]), rel=1e-3)
    shaped = [op_seconds(Compute(gemms=((4096, 4096, 4096),), dtype=d), h100) for d in ("float32", "bfloat16")]
    assert shaped[0] > 10 * shaped[1]                 # ops with kernel shapes too


def test_torch_runs_float32_matmuls_without_tf32_by_default():
    """The rule's premise on the installed torch (2.13): TF32 is off for matmul unless the user turns it on."""
    torch = pytest.importorskip("torch")
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.get_float32_matmul_precision() == "highest"


def test_quickstart_default_prints_a_float32_mfu_and_its_peak(capsys):
    from distlab.runtime.cli import main
    assert main(["simulate", "--autocast", "none", "--no-files", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["results"][0]
    h100 = GPUS["h100"]
    assert r["compute_dtype"] == "float32" and r["mfu_peak_tflops"] == h100.tflops
    assert r["compute_peak_tflops"] == h100.fp32_tflops
    assert r["tflops_per_gpu"] < h100.fp32_tflops * kernel_model(h100).gemm_fraction["float32"]
    assert r["mfu"] < h100.fp32_tflops / h100.tflops and 0 < r["mfu_of_compute_peak"] < 1
    assert r["mfu_of_compute_peak"] == pytest.approx(r["mfu"] * h100.tflops / h100.fp32_tflops)
    assert any("computes in float32" in n for n in r["compute_notes"])
    assert main(["simulate", "--autocast", "none", "--no-files"]) == 0
    out = capsys.readouterr().out
    assert f"MFU (HFU), bf16 peak {h100.tflops:g} TFLOP/s" in out and f"MFU, float32 peak {h100.fp32_tflops:g}" in out
