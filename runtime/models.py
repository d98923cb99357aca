"""Bridge between sim models and torch: extract a ``sim.models.Model`` from any ``nn.Module``, and build a
real ``nn.Module`` from a model description, so the simulator and real DDP train the same network.

Extraction: parameters in ``named_parameters()`` order (shared ones once, frozen ones skipped, as DDP's
``_build_params_for_reducer``), grouped into layers by owning module; forward and backward FLOPs per layer
counted by ``torch.utils.flop_counter.FlopCounterMode``; the gradient-ready order recorded with
``register_post_accumulate_grad_hook`` during one backward (the order DDP's Reducer sees).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from distlab.sim.models import Layer, Model, Param

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "float64": torch.float64}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


# --- nn.Module -> Model ------------------------------------------------------------------------------------
def extract(module: nn.Module, example_input, name: str | None = None, loss_fn=None) -> Model:
    """A sim Model of ``module`` run on ``example_input`` (a tensor or tuple of tensors)."""
    from torch.utils.flop_counter import FlopCounterMode
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    loss_fn = loss_fn or (lambda out: out.float().sum())
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    index = {id(p): i for i, (_, p) in enumerate(named)}
    owner = [n.rpartition(".")[0] for n, _ in named]
    root = type(module).__name__

    acts: dict[str, int] = {}
    hooks = []
    for mname, sub in module.named_modules():
        if mname in set(owner):
            def hook(_m, _i, out, mname=mname):
                t = out[0] if isinstance(out, (tuple, list)) else out
                if torch.is_tensor(t):
                    acts[mname] = acts.get(mname, 0) + t.numel() * t.element_size()
            hooks.append(sub.register_forward_hook(hook))
    ready: list[int] = []
    for _, p in named:
        hooks.append(p.register_post_accumulate_grad_hook(lambda p: ready.append(index[id(p)])))
    try:
        with FlopCounterMode(display=False) as fwd_counter:
            with torch.no_grad():
                module(*inputs)
        acts.clear()
        with FlopCounterMode(display=False) as all_counter:
            loss_fn(module(*inputs)).backward()
    finally:
        for h in hooks:
            h.remove()
        module.zero_grad(set_to_none=True)

    def flops(counter, mname):
        key = f"{root}.{mname}" if mname else root
        return float(sum(counter.get_flop_counts().get(key, {}).values()))

    layers: list[Layer] = []
    for i, (pname, p) in enumerate(named):
        if not layers or layers[-1].name != owner[i] or i and owner[i - 1] != owner[i]:
            f = flops(fwd_counter, owner[i])
            layers.append(Layer(owner[i] or root, [], fwd_flops=f, bwd_flops=flops(all_counter, owner[i]) - f,
                                activation_bytes=acts.get(owner[i], 0)))
        layers[-1].params.append(Param(pname, tuple(p.shape), DTYPE_NAMES.get(p.dtype, "float32")))
    model = Model(name or root, layers, {"kind": "extracted"})
    model.ready = ready if len(ready) == len(named) else None
    return model


# --- Model -> nn.Module ------------------------------------------------------------------------------------
class MLP(nn.Module):
    """``layers.{i}`` = Linear, ReLU between: the module ``sim.models.mlp`` describes."""

    def __init__(self, widths, bias=True, dtype=torch.float32):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b, bias=bias, dtype=dtype) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


class RMSNormBias(nn.Module):
    """RMSNorm with a bias (``norm: rmsnorm, norm_bias: true``; torch's nn.RMSNorm has none)."""

    def __init__(self, h, dtype):
        super().__init__()
        self.norm = nn.RMSNorm(h, elementwise_affine=False, dtype=dtype)
        self.weight = nn.Parameter(torch.ones(h, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(h, dtype=dtype))

    def forward(self, x):
        return self.norm(x) * self.weight + self.bias


def _structure(c) -> dict:
    from distlab.sim.models import ARCH_DEFAULTS
    return {k: c.get(k, v) for k, v in ARCH_DEFAULTS[c["arch"]].items()}


def _norm(st, h, dtype):
    if st["norm"] == "layernorm":
        return nn.LayerNorm(h, bias=st["norm_bias"], dtype=dtype)
    return RMSNormBias(h, dtype) if st["norm_bias"] else nn.RMSNorm(h, dtype=dtype)


class Block(nn.Module):
    """One block of ``sim.models.gpt`` with its structural choices (qkv, mlp, norm, biases), parameters
    registered in the arch's order (llama: attn, mlp, norm1, norm2; gpt2: norm1, attn, norm2, mlp)."""

    def __init__(self, c, dtype):
        super().__init__()
        st = _structure(c)
        h, ffn, kv = c["hidden"], c["ffn_hidden"], c["kv_heads"] * (c["hidden"] // c["heads"])
        self.heads, self.kv_heads, self.st = c["heads"], c["kv_heads"], st
        L = lambda a, b: nn.Linear(a, b, bias=st["bias"], dtype=dtype)  # noqa: E731

        def attn():
            self.attn = nn.Module()
            if st["qkv"] == "fused":
                self.attn.qkv = L(h, h + 2 * kv)
            else:
                self.attn.q, self.attn.k, self.attn.v = L(h, h), L(h, kv), L(h, kv)
            self.attn.o = L(h, h)

        def mlp():
            self.mlp = nn.Module()
            if st["mlp"] == "swiglu":
                self.mlp.gate, self.mlp.up, self.mlp.down = L(h, ffn), L(h, ffn), L(ffn, h)
            else:
                self.mlp.fc, self.mlp.proj = L(h, ffn), L(ffn, h)
        if c["arch"] == "llama":
            attn()
            mlp()
            self.norm1, self.norm2 = _norm(st, h, dtype), _norm(st, h, dtype)
        else:
            self.norm1 = _norm(st, h, dtype)
            attn()
            self.norm2 = _norm(st, h, dtype)
            mlp()

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.heads
        y = self.norm1(x)
        if self.st["qkv"] == "fused":
            q, k, v = self.attn.qkv(y).split([h, self.kv_heads * d, self.kv_heads * d], dim=-1)
        else:
            q, k, v = self.attn.q(y), self.attn.k(y), self.attn.v(y)
        q = q.view(b, s, self.heads, d).transpose(1, 2)
        k, v = (t.view(b, s, self.kv_heads, d).transpose(1, 2) for t in (k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.attn.o(a.transpose(1, 2).reshape(b, s, h))
        y = self.norm2(x)
        if self.st["mlp"] == "swiglu":
            return x + self.mlp.down(nn.functional.silu(self.mlp.gate(y)) * self.mlp.up(y))
        act = nn.functional.gelu if self.st["mlp"] == "gelu" else torch.relu
        return x + self.mlp.proj(act(self.mlp.fc(y)))


class GPT(nn.Module):
    """The transformer ``sim.models.gpt`` describes, parameter for parameter (names, shapes, order); RoPE
    positions are not applied (they hold no parameters and do not change the collectives)."""

    def __init__(self, c, dtype=torch.float32):
        super().__init__()
        st = _structure(c)
        self.learned, self.tied = st["positions"] == "learned", st["tied"]
        self.embed = nn.Module()
        self.embed.tok = nn.Embedding(c["vocab"], c["hidden"], dtype=dtype)
        if self.learned:
            self.embed.pos = nn.Embedding(c.get("max_positions") or c["seq_len"], c["hidden"], dtype=dtype)
        self.h = nn.ModuleList(Block(c, dtype) for _ in range(c["layers"]))
        self.norm_f = _norm(st, c["hidden"], dtype)
        if not self.tied:
            self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False, dtype=dtype)

    def forward(self, idx):
        x = self.embed.tok(idx)
        if self.learned:
            x = x + self.embed.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        x = self.norm_f(x)
        return x @ self.embed.tok.weight.t() if self.tied else self.lm_head(x)


def build_module(model: Model) -> nn.Module:
    """A real module with exactly ``model.params`` (names, shapes, registration order)."""
    c = model.config
    dtype = TORCH_DTYPES[c.get("dtype", "float32")]
    if c.get("kind") == "mlp":
        module = MLP(c["widths"], c.get("bias", True), dtype)
    elif c.get("kind") == "gpt":
        module = GPT(c, dtype)
    else:
        raise ValueError(f"cannot build a module for model kind {c.get('kind')!r} (mlp and gpt only)")
    got = [(n, tuple(p.shape)) for n, p in module.named_parameters()]
    want = [(p.name, p.shape) for p in model.params]
    assert got == want, f"module does not match the description: {got[:3]} vs {want[:3]}"
    return module


def example_input(model: Model, batch: int | None = None):
    """An input batch for ``build_module(model)``."""
    c = model.config
    if c.get("kind") == "mlp":
        return torch.randn(batch or c.get("batch", 32), c["widths"][0], dtype=TORCH_DTYPES[c.get("dtype", "float32")])
    return torch.randint(0, c["vocab"], (batch or c.get("micro_batch", 1), c["seq_len"]))
