"""Real torch modules for the models sim/models describes, parameter for parameter (names, shapes, order).

    from distlab.sim.models import gpt
    from distlab.runtime.modules.transformer import GPT
    m = gpt(arch="llama", layers=2, hidden=64, heads=4, kv_heads=2, seq_len=16, vocab=100, dtype="float32")
    logits = GPT(m.config)(torch.randint(0, 100, (1, 16)))          # (1, 16, 100)

Each structural choice of sim/models/arch.py is built as the architecture's modelling code builds it: fused or
separate q/k/v (with their own biases), RMSNorm (torch's nn.RMSNorm) or LayerNorm, SwiGLU / GELU / ReLU MLPs,
RoPE (the rotate-half form of Hugging Face's Llama: q·cos + rotate_half(q)·sin with constant tables, so it
keeps nothing for backward but the tables), learned positions, tied or untied head, ``head_dim``. Attention:
``sdpa`` = ``F.scaled_dot_product_attention`` (is_causal, GQA native: k and v stay at kv_heads); ``unfused`` =
softmax(QKᵀ/√d + causal mask)·V with dropout on the probabilities, as Megatron-LM ran it in 2021. ``dropout``:
on the embedding output, the attention probabilities (SDPA's dropout_p) and both residual branches.
``recompute`` (from the model's config): ``full`` checkpoints each block (torch.utils.checkpoint, non-reentrant,
as torchtitan's full AC), ``selective`` checkpoints the attention core only (Korthikanti et al. 2022).
The activations these modules keep are what sim/models/activations.py counts (tests/test_activations_torch.py).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

ROPE_THETA = 10000.0


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


def _norm(st, h, dtype):
    if st["norm"] == "layernorm":
        return nn.LayerNorm(h, bias=st["norm_bias"], dtype=dtype)
    return RMSNormBias(h, dtype) if st["norm_bias"] else nn.RMSNorm(h, dtype=dtype)


def rope_tables(s: int, d: int, device, dtype, theta: float = ROPE_THETA):
    """cos, sin of shape (s, d) for the rotate-half RoPE (frequencies theta^(-2i/d), each used twice)."""
    inv = theta ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(s, device=device, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


class Block(nn.Module):
    """One block of ``sim.models.gpt`` with its structural choices, parameters registered in the arch's order
    (llama: attn, mlp, norm1, norm2; gpt2: norm1, attn, norm2, mlp)."""

    def __init__(self, c, dtype):
        super().__init__()
        from distlab.sim.models.arch import structure
        st = structure(c)
        h, ffn = c["hidden"], c["ffn_hidden"]
        self.d = c.get("head_dim") or h // c["heads"]
        self.heads, self.kv_heads, self.st = c["heads"], c["kv_heads"], st
        self.qdim, self.kv = self.heads * self.d, self.kv_heads * self.d
        self.p, self.recompute = st["dropout"], c.get("recompute", "none")
        if c.get("window") and c["window"] < c["seq_len"]:
            raise ValueError("sliding-window attention is not built in the runtime's modules")
        L = lambda a, b, bias: nn.Linear(a, b, bias=bias, dtype=dtype)  # noqa: E731

        def attn():
            self.attn = nn.Module()
            if st["qkv"] == "fused":
                self.attn.qkv = L(h, self.qdim + 2 * self.kv, st["qkv_bias"])
            else:
                self.attn.q, self.attn.k, self.attn.v = (L(h, self.qdim, st["qkv_bias"]), L(h, self.kv, st["qkv_bias"]),
                                                         L(h, self.kv, st["qkv_bias"]))
            self.attn.o = L(self.qdim, h, st["attention_bias"])

        def mlp():
            self.mlp = nn.Module()
            b = st["mlp_bias"]
            if st["mlp"] == "swiglu":
                self.mlp.gate, self.mlp.up, self.mlp.down = L(h, ffn, b), L(h, ffn, b), L(ffn, h, b)
            else:
                self.mlp.fc, self.mlp.proj = L(h, ffn, b), L(ffn, h, b)
        if c["arch"] == "llama":
            attn()
            mlp()
            self.norm1, self.norm2 = _norm(st, h, dtype), _norm(st, h, dtype)
        else:
            self.norm1 = _norm(st, h, dtype)
            attn()
            self.norm2 = _norm(st, h, dtype)
            mlp()

    def forward(self, x, rope=None):
        if self.recompute == "full" and torch.is_grad_enabled():
            return checkpoint(self._forward, x, rope, use_reentrant=False)
        return self._forward(x, rope)

    def _drop(self, x):
        return F.dropout(x, self.p, self.training) if self.p else x

    def _forward(self, x, rope=None):
        b, s, _ = x.shape
        y = self.norm1(x)
        if self.st["qkv"] == "fused":
            q, k, v = self.attn.qkv(y).split([self.qdim, self.kv, self.kv], dim=-1)
        else:
            q, k, v = self.attn.q(y), self.attn.k(y), self.attn.v(y)
        q = q.view(b, s, self.heads, self.d).transpose(1, 2)
        k, v = (t.view(b, s, self.kv_heads, self.d).transpose(1, 2) for t in (k, v))
        if rope is not None:
            q, k = _rotate(q, *rope), _rotate(k, *rope)
        if self.recompute == "selective" and torch.is_grad_enabled():
            a = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            a = self._core(q, k, v)
        x = x + self._drop(self.attn.o(a.transpose(1, 2).reshape(b, s, self.qdim)))
        y = self.norm2(x)
        if self.st["mlp"] == "swiglu":
            return x + self._drop(self.mlp.down(F.silu(self.mlp.gate(y)) * self.mlp.up(y)))
        act = F.gelu if self.st["mlp"] == "gelu" else torch.relu
        return x + self._drop(self.mlp.proj(act(self.mlp.fc(y))))

    def _core(self, q, k, v):
        if self.st["attention"] == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0,
                                                  is_causal=True, enable_gqa=True)
        if self.kv_heads != self.heads:
            k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
        s = q.shape[2]
        mask = torch.full((s, s), float("-inf"), device=q.device, dtype=q.dtype).triu(1)
        probs = torch.softmax(q @ k.transpose(-2, -1) * self.d ** -0.5 + mask, dim=-1)
        return self._drop(probs) @ v


class GPT(nn.Module):
    """The transformer ``sim.models.gpt`` describes (module docstring)."""

    def __init__(self, c, dtype=torch.float32):
        super().__init__()
        from distlab.sim.models.arch import structure
        st = structure(c)
        self.learned, self.tied, self.p = st["positions"] == "learned", st["tied"], st["dropout"]
        self.head_dim = c.get("head_dim") or c["hidden"] // c["heads"]
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
        rope = None
        if self.learned:
            x = x + self.embed.pos(torch.arange(idx.shape[1], device=idx.device))
        else:
            rope = rope_tables(idx.shape[1], self.head_dim, idx.device, x.dtype)
        if self.p:
            x = F.dropout(x, self.p, self.training)
        for block in self.h:
            x = block(x, rope)
        x = self.norm_f(x)
        return x @ self.embed.tok.weight.t() if self.tied else self.lm_head(x)
