"""One activation count for every lesson: the bytes a block keeps for backward, read from the library per model
family (sim/models/activations.py, the accounting of `distlab memory`, `simulate` and the planner), and
Korthikanti et al.'s formula shown as what it is, **GPT's** (lessons 06, 09, 10, 11).

    >>> round(block_bytes_per_token("llama3-8b"))        # one Llama 3 8B block, bytes per token, no recompute
    168072
    >>> gpt_formula_bytes(s=2048, b=1, h=12288, a=96) / 2**30      # GPT-3's layer, Table 2 of 2205.05198
    2.671875

The rule: Korthikanti et al. 2022 (arXiv 2205.05198, sec. 4.1, Table 2) count what a GPT-3 layer keeps at 16 bits:
34·s·b·h bytes for its inputs, projections, GeLU MLP of width 4h and dropout masks, plus 5·a·s²·b for attention
(softmax output 2, dropout mask 1, dropout output 2 bytes per score; the raw QKᵀ scores are not kept: the
softmax's backward reads its output). A Llama block keeps other tensors (SwiGLU of width 14336 for 8B, grouped K/V,
no dropout, SDPA that never stores s x s): the library counts each family's own (sim/models/families.py), so a
lesson quoting a Llama's activations reads them from there, never from the GPT formula.
"""
from __future__ import annotations

GiB = 2**30


def _model(preset: str, seq_len: int | None = None, micro_batch: int = 1, **structure):
    from distlab.sim.models import model_from_spec
    spec = {"preset": preset, "micro_batch": micro_batch, **({"seq_len": seq_len} if seq_len else {}), **structure}
    return model_from_spec(spec)


def library_activations(preset: str, seq_len: int | None = None, micro_batch: int = 1, recompute: str = "none",
                        **structure):
    """sim/models/activations.py ``activations`` of the preset: what `distlab memory` prints."""
    from distlab.sim.models.activations import activations
    return activations(_model(preset, seq_len, micro_batch, **structure), recompute=recompute)


def _block(acts):
    return next(x for x in acts.layers if x.name.startswith("h."))


def block_terms(preset: str, seq_len: int | None = None, **structure) -> dict:
    """{tensor: bytes} one transformer block of ``preset`` keeps for backward (one sequence, no recompute)."""
    return dict(_block(library_activations(preset, seq_len, **structure)).terms)


def block_bytes_per_token(preset: str, seq_len: int | None = None, **structure) -> float:
    """Bytes one block keeps per token (the library's count over the sequence length)."""
    m = _model(preset, seq_len, **structure)
    return _block(library_activations(preset, seq_len, **structure)).saved / m.config["seq_len"]


def gpt_formula_bytes(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                      recompute: str = "none") -> float:
    """Korthikanti et al.'s Table 2 for one **GPT** layer at 16 bits: s·b·h·(34 + 5·a·s/h), /t with TP + SP
    (sim/parallel/tp/memory.py ``activation_bytes_per_layer``, the same formula)."""
    from distlab.sim.parallel.tp.memory import activation_bytes_per_layer
    return activation_bytes_per_layer(s, b, h, a, t, sequence_parallel, recompute)


GPT_BLOCK = {"dropout": 0.1, "attention": "unfused", "dtype": "bfloat16"}    # the block Korthikanti et al. count


def formula_rows(models=(("gpt2-medium", GPT_BLOCK), ("llama3-8b", {})), seq_len: int = 4096) -> list[list]:
    """[model, family, GPT's formula MiB, the library's MiB, library / formula] of one block at ``seq_len``: the
    formula is GPT's (it matches a GPT block with dropout and unfused attention within a few %), not Llama's."""
    rows = []
    for preset, structure in models:
        m = _model(preset, seq_len, **structure)
        c = m.config
        lib = _block(library_activations(preset, seq_len, **structure)).saved
        gpt = gpt_formula_bytes(c["seq_len"], 1, c["hidden"], c["heads"])
        label = " (bf16, dropout, unfused attention)" if structure.get("attention") == "unfused" else ""
        rows.append([preset + label, c.get("arch", c["kind"]),
                     round(gpt / 2**20, 1), round(lib / 2**20, 1), f"{lib / gpt:.2f}x"])
    return rows


def block_rows(preset: str = "llama3-8b", seq_len: int | None = None) -> list[list]:
    """[tensor, bytes per token] of one block, largest first: what the learner adds up (lesson 10)."""
    m = _model(preset, seq_len)
    s = m.config["seq_len"]
    terms = block_terms(preset, seq_len)
    return [[k, round(v / s, 1)] for k, v in sorted(terms.items(), key=lambda kv: -kv[1])]


def head_rows(preset: str = "llama3-8b", seq_len: int | None = None) -> list[list]:
    """[tensor, bytes per token, kept or held during its backward] of the output head (the logits dominate)."""
    acts = library_activations(preset, seq_len)
    head = next(x for x in acts.layers if x.name == "head")
    s = _model(preset, seq_len).config["seq_len"]
    rows = [[k, round(v / s, 1), "kept"] for k, v in head.terms.items()]
    return rows + [["logits and their fp32 copy (or their gradients)", round(head.transient / s, 1),
                    "held while its backward runs"]]
