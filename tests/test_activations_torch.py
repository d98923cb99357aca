"""The activation bytes of sim/models/activations.py against what torch 2.13's autograd really saves for backward
(``torch.autograd.graph.saved_tensors_hooks``; each saved storage once, parameters excluded), layer by layer,
on a small Llama and a small GPT built by runtime/modules/transformer.py, with and without recomputation, on CPU.

Two CPU kernels save more than the GPU kernels the formula counts, and the test adds exactly that, by name:
RMSNorm (CUDA's ``_fused_rms_norm`` keeps input and rstd; CPU decomposes it and also keeps x·rstd: the main
comparison runs the norm as an autograd Function saving what the CUDA kernel saves, and a second one checks
the CPU decomposition's extra b·s·h per norm), and dropout (CUDA's ``native_dropout`` keeps a bool mask; CPU's
``_dropout_impl`` keeps the mask in the input's dtype)."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from distlab.runtime.modules.bridge import build_module  # noqa: E402
from distlab.runtime.modules.saved import saved_by_layer  # noqa: E402
from distlab.sim.models import gpt  # noqa: E402
from distlab.sim.models.activations import activations  # noqa: E402

# autograd in this process on one intra-op thread (tests/conftest.py one_torch_thread): what it saves does not
# depend on threads
pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPE = dict(layers=2, hidden=128, heads=4, seq_len=64, vocab=512, micro_batch=2)
CASES = {
    "llama": dict(arch="llama", kv_heads=2, dtype="float32"),
    "gpt": dict(arch="gpt2", dtype="float32"),
    "megatron-gpt": dict(arch="gpt2", dtype="float32", dropout=0.1, attention="unfused"),
}


class FusedRMSNorm(torch.autograd.Function):
    """RMSNorm saving what CUDA's ``_fused_rms_norm`` saves: the input and rstd (derivatives.yaml)."""

    @staticmethod
    def forward(ctx, x, w, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, w)
        return (x.float() * rstd).to(x.dtype) * w

    @staticmethod
    def backward(ctx, g):
        x, rstd, w = ctx.saved_tensors
        xn = x.float() * rstd
        gw = (g.float() * xn).sum(dim=tuple(range(g.dim() - 1))).to(w.dtype)
        gx = g.float() * w.float()
        return (rstd * (gx - xn * (gx * xn).mean(-1, keepdim=True))).to(x.dtype), gw, None


def fuse_norms(module):
    for m in module.modules():
        if isinstance(m, nn.RMSNorm):
            eps = m.eps or torch.finfo(torch.float32).eps
            m.forward = (lambda m, eps: lambda x: FusedRMSNorm.apply(x, m.weight, eps))(m, eps)


def predicted_on_cpu(model, extra_per_norm: float = 0.0, **layout) -> dict:
    """The formula's bytes per layer with CPU's dropout masks in the activation dtype instead of one byte, plus
    ``extra_per_norm`` per RMSNorm (block: 2, head: 1)."""
    e = 4 if model.config["dtype"] == "float32" else 2
    out = {}
    for a in activations(model, **layout).layers:
        masks = sum(v for k, v in a.terms.items() if "1 byte" in k)
        norms = 2 if a.name.startswith("h.") else 1 if a.name == "head" else 0
        out[a.name] = a.saved + masks * (e - 1) + norms * extra_per_norm
    return out


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_saved_bytes_within_5_percent_of_autograd(case, recompute):
    torch.manual_seed(0)
    model = gpt(**SHAPE, **CASES[case], recompute=recompute)
    module = build_module(model)
    fuse_norms(module)
    got, want = saved_by_layer(module, model), predicted_on_cpu(model)
    for name, bytes_ in want.items():
        assert got.get(name, 0) == pytest.approx(bytes_, rel=0.05), (name, got, want)
    assert sum(got.values()) == pytest.approx(sum(want.values()), rel=0.05)
    if recompute == "full":                       # a block keeps its input only
        assert want["h.1"] == SHAPE["micro_batch"] * SHAPE["seq_len"] * SHAPE["hidden"] * (
            4 if model.config["dtype"] == "float32" else 2)


def test_cpu_rmsnorm_keeps_more_than_cudas():
    """Without the fused norm, CPU's decomposed RMSNorm also keeps x·rstd: b·s·h more elements per norm (fp32
    here), nothing else."""
    model = gpt(**SHAPE, **CASES["llama"])
    got = saved_by_layer(build_module(model), model)
    sbh = SHAPE["micro_batch"] * SHAPE["seq_len"] * SHAPE["hidden"]
    for name, bytes_ in predicted_on_cpu(model, extra_per_norm=4 * sbh).items():
        assert got.get(name, 0) == pytest.approx(bytes_, rel=0.05), name


TP_MODEL = dict(arch="llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, seq_len=16, vocab=256,
                micro_batch=2, dtype="float32")
TP_VARIANTS = [{"sequence_parallel": True, "loss_parallel": True}, {"sequence_parallel": False, "loss_parallel": False}]


@pytest.mark.slow
def test_tensor_parallel_saved_bytes_on_two_gloo_ranks():
    """torch's DTensor TP (+ SP, loss parallel) with torchtitan's plan (runtime/parallel/tp/run.py), 2 gloo ranks: each
    rank saves the formula's bytes at tp 2 (within 5%, layer by layer), in particular the gathered norm outputs
    whole under SP (PrepareModuleInput's all-gather is what the column-parallel linears keep), plus CPU's
    decomposed RMSNorm's x·rstd (on the sequence shard with SP, whole without)."""
    from distlab.runtime.ranks.launch import TRAINING, launch
    model = gpt(**TP_MODEL)
    results = launch("distlab.runtime.modules.saved:tp_task", {"model": dict(model.config), "variants": TP_VARIANTS}, 2,
                     timeout=120, preload=TRAINING)
    T, h = TP_MODEL["micro_batch"] * TP_MODEL["seq_len"], TP_MODEL["hidden"]
    for rank_result in results:
        for v, got in zip(TP_VARIANTS, rank_result):
            sp = v["sequence_parallel"]
            want = predicted_on_cpu(model, T * h * 4 / (2 if sp else 1), tp=2, **v)
            for name, bytes_ in want.items():
                assert got.get(name, 0) == pytest.approx(bytes_, rel=0.05), (v, name, got, want)
    one = activations(model, tp=2, sequence_parallel=True).layers[1].terms
    assert one["norm1 output (the next linears' input)"] == T * h * 4 and one["norm1 input"] == T * h * 4 / 2
