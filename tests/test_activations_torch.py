"""The activation bytes of sim/models/activations.py against what torch 2.13's autograd really saves for backward
(``torch.autograd.graph.saved_tensors_hooks``; each saved storage once, parameters excluded), layer by layer,
on a small Llama and a small GPT built by runtime/transformer.py, with and without recomputation, on CPU.

Two CPU kernels save more than the GPU kernels the formula counts, and the test adds exactly that, by name:
RMSNorm (CUDA's ``_fused_rms_norm`` keeps input and rstd; CPU decomposes it and also keeps x·rstd: the main
comparison runs the norm as an autograd Function saving what the CUDA kernel saves, and a second one checks
the CPU decomposition's extra b·s·h per norm), and dropout (CUDA's ``native_dropout`` keeps a bool mask; CPU's
``_dropout_impl`` keeps the mask in the input's dtype)."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from distlab.runtime.models import build_module  # noqa: E402
from distlab.sim.models import gpt  # noqa: E402
from distlab.sim.models.activations import activations  # noqa: E402

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


def saved_by_layer(module, model) -> dict:
    """Bytes autograd saves during one forward + loss (torchtitan's: cross-entropy of the fp32 logits), charged
    to the layer running (embed before the first block, head after the last); backward then runs once."""
    c = model.config
    g = torch.Generator().manual_seed(0)
    idx, tgt = (torch.randint(0, c["vocab"], (c["micro_batch"], c["seq_len"]), generator=g) for _ in range(2))
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    current, saved, seen = ["embed"], {}, set()
    hooks = [b.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, f"h.{i}"))
             for i, b in enumerate(module.h)]
    hooks.append(module.h[-1].register_forward_hook(lambda *a: current.__setitem__(0, "head")))

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params and key not in seen:
            seen.add(key)
            saved[current[0]] = saved.get(current[0], 0) + t.untyped_storage().nbytes()
        return t
    module.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(module(idx).float().flatten(0, 1), tgt.flatten())
    loss.backward()
    for h in hooks:
        h.remove()
    return saved


def predicted_on_cpu(model, extra_per_norm: float = 0.0) -> dict:
    """The formula's bytes per layer with CPU's dropout masks in the activation dtype instead of one byte, plus
    ``extra_per_norm`` per RMSNorm (block: 2, head: 1)."""
    e = 4 if model.config["dtype"] == "float32" else 2
    out = {}
    for a in activations(model).layers:
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
