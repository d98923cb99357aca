"""A Llama-style transformer whose attention and MLP are modules with a ``forward`` (as torchtitan's), so that
``PrepareModuleInput`` can hook them; parameter names, shapes and registration order equal ``sim.models.gpt``'s
(``embed.tok``, ``h.{i}.attn.q|k|v|o``, ``h.{i}.mlp.gate|up|down``, ``h.{i}.norm1|2``, ``norm_f``, ``lm_head``).
Heads per rank are inferred from the (possibly column-sharded) projections (``view(b, s, -1, head_dim)``).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, dtype):
        super().__init__()
        self.head_dim = h // heads
        kv = kv_heads * self.head_dim
        self.q, self.k, self.v = (nn.Linear(h, n, bias=False, dtype=dtype) for n in (h, kv, kv))
        self.o = nn.Linear(h, h, bias=False, dtype=dtype)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (self.q(x), self.k(x), self.v(x)))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(a.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, h: int, ffn: int, dtype):
        super().__init__()
        self.gate, self.up = nn.Linear(h, ffn, bias=False, dtype=dtype), nn.Linear(h, ffn, bias=False, dtype=dtype)
        self.down = nn.Linear(ffn, h, bias=False, dtype=dtype)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, c: dict, dtype):
        super().__init__()
        h = c["hidden"]
        self.attn = Attention(h, c["heads"], c["kv_heads"], dtype)
        self.mlp = FeedForward(h, c["ffn_hidden"], dtype)
        self.norm1, self.norm2 = nn.RMSNorm(h, dtype=dtype), nn.RMSNorm(h, dtype=dtype)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Llama(nn.Module):
    def __init__(self, c: dict, dtype=torch.float32):
        super().__init__()
        self.embed = nn.Module()
        self.embed.tok = nn.Embedding(c["vocab"], c["hidden"], dtype=dtype)
        self.h = nn.ModuleList(Block(c, dtype) for _ in range(c["layers"]))
        self.norm_f = nn.RMSNorm(c["hidden"], dtype=dtype)
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False, dtype=dtype)

    def forward(self, idx):
        x = self.embed.tok(idx)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.norm_f(x))


def build_llama(model) -> Llama:
    """The module of a llama-arch ``sim.models`` Model (checked parameter for parameter)."""
    from distlab.runtime.modules.bridge import TORCH_DTYPES
    c = model.config
    module = Llama(c, TORCH_DTYPES[c.get("dtype", "float32")])
    got = [(n, tuple(p.shape)) for n, p in module.named_parameters()]
    want = [(p.name, p.shape) for p in model.params]
    assert got == want, f"module does not match the description: {got[:3]} vs {want[:3]}"
    return module


class Stage(nn.Module):
    """Layers ``names`` (sim layer names: embed, h.{i}, head) of ``full``, keeping their parameter names."""

    def __init__(self, full, names: list[str]):
        super().__init__()
        self.embed = full.embed if "embed" in names else None
        self.h = nn.ModuleDict({n.split(".")[1]: full.h[int(n.split(".")[1])] for n in names if n.startswith("h.")})
        self.norm_f = full.norm_f if "head" in names else None
        self.lm_head = full.lm_head if "head" in names else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed.tok(x)
        for block in self.h.values():
            x = block(x)
        return self.lm_head(self.norm_f(x)) if self.lm_head is not None else x
