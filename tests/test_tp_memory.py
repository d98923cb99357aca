"""Activation memory per Korthikanti et al. 2022 (arXiv 2205.05198) Table 2, for the paper's own model shapes
(its Table 3: 22B, 175B, 530B, 1T; s = 2048, t = 8); the GPT family reproduces it for Megatron's GPT; and the
per-rank memory of a TP plan on local shards."""
import pytest

from distlab.sim.models import gpt, preset
from distlab.sim.parallel.tp.memory import activation_bytes_per_layer as act
from distlab.sim.parallel.tp.memory import tp_memory

# (heads a, hidden h, layers) of the paper's Table 3
SHAPES = {"22B": (64, 6144, 48), "175B": (96, 12288, 96), "530B": (128, 20480, 105), "1T": (160, 25600, 128)}


@pytest.mark.parametrize("name", SHAPES)
def test_table2_closed_forms(name):
    """Each row of Table 2 in units of s·b·h bytes, worked out by hand: 5·a·s/h = 80 (175B), 53.33 (22B),
    64 (530B, 1T)."""
    a, h, _ = SHAPES[name]
    s, b, t = 2048, 1, 8
    sbh = s * b * h
    r = 5 * a * s / h
    assert r == {"22B": 5 * 64 * 2048 / 6144, "175B": 80.0, "530B": 64.0, "1T": 64.0}[name]
    rows = {("none", 1, False): 34 + r, ("selective", 1, False): 34, ("none", t, False): 10 + 3 + r / 8,
            ("none", t, True): 34 / 8 + r / 8, ("selective", t, False): 13, ("selective", t, True): 4.25,
            ("full", t, True): 2, ("full", 1, False): 2}
    for (rc, tt, sp), per in rows.items():
        assert act(s, b, h, a, tt, sp, rc) == pytest.approx(sbh * per, rel=1e-12), (rc, tt, sp)


@pytest.mark.parametrize("name", SHAPES)
def test_sequence_parallel_with_selective_recompute_cuts_about_5x(name):
    """The paper's abstract: SP + selective recompute reduce activation memory by 5x vs TP alone."""
    a, h, _ = SHAPES[name]
    ratio = act(2048, 1, h, a, 8, False, "none") / act(2048, 1, h, a, 8, True, "selective")
    assert 4.5 < ratio < 6.5


def test_the_gpt_family_reproduces_table2_for_megatrons_gpt():
    """A GPT with dropout and unfused attention (Megatron-LM 2021) keeps Table 2's bytes per block, plus the
    LayerNorms' fp32 mean and rstd (2 x 2 x 4 bytes a token), for no parallelism, TP and selective recompute; TP
    + SP differs only by the gathered norm outputs torch keeps whole (4·s·b·h of the 34 at 16 bits)."""
    from distlab.sim.models.activations import activations
    s, b, h, a = 2048, 2, 4096, 32
    m = gpt(layers=2, hidden=h, heads=a, seq_len=s, vocab=1000, micro_batch=b, dtype="bfloat16", arch="gpt2",
            dropout=0.1, attention="unfused")
    stats = lambda t, sp: 16 * s * b / (t if sp else 1)  # noqa: E731
    lse = 0                                                 # unfused: no logsumexp
    for t, sp, rc in ((1, False, "none"), (1, False, "selective"), (8, False, "none"), (8, False, "selective")):
        got = activations(m, rc, tp=t, sequence_parallel=sp).layers[1].saved
        assert got == pytest.approx(act(s, b, h, a, t, sp, rc) + stats(t, sp) + lse), (t, sp, rc)
    got = activations(m, "none", tp=8, sequence_parallel=True).layers[1].saved
    assert got == pytest.approx(act(s, b, h, a, 8, True) + 4 * s * b * h * (1 - 1 / 8) + stats(8, True))
    assert m.layers[1].activation_bytes == pytest.approx(act(s, b, h, a) + stats(1, False))
    assert act(2048, 2, 4096, 32, elem_bytes=4) == 2 * act(2048, 2, 4096, 32)


def test_tp_memory_divides_shards_and_activations():
    """Llama 3 70B at tp 8 + SP: shards divide by 8; a block keeps its norms' inputs / 8, their gathered outputs
    whole, the heads' and the FFN's tensors / 8 (sim/models/activations.py)."""
    from distlab.sim.models.activations import activations
    m = preset("llama3-70b", micro_batch=1)
    eight = tp_memory(m, 8, True)
    norms = sum(p.numel for p in m.params if "norm" in p.name)          # replicated on every rank
    assert eight["params"] == ((m.num_params - norms) // 8 + norms) * 2
    assert eight["optimizer"] == eight["params"] // 2 * 12
    T, h, kv, f, e = 8192, 8192, 1024, 28672, 2
    block = T * e * (2 * h / 8 + 2 * h + 2 * h / 8 + 2 * kv / 8 + 4 * f / 8) + T * 4 * (2 / 8 + 64 / 8)
    acts = activations(m, tp=8, sequence_parallel=True)
    assert acts.layers[1].saved == pytest.approx(block)
    assert eight["activations"] == acts.peak_bytes
    assert tp_memory(m, 8, True, "full")["activations"] < eight["activations"] / 4
