"""Activation memory per Korthikanti et al. 2022 (arXiv 2205.05198) Table 2, for the paper's own model shapes
(its Table 3: 22B, 175B, 530B, 1T; s = 2048, t = 8), and the per-rank memory of a TP plan on local shards."""
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


def test_model_activation_bytes_equal_the_no_parallelism_row():
    m = gpt(layers=2, hidden=4096, heads=32, seq_len=2048, vocab=1000, micro_batch=2, dtype="bfloat16",
            arch="llama")
    assert m.layers[1].activation_bytes == pytest.approx(act(2048, 2, 4096, 32))
    assert act(2048, 2, 4096, 32, elem_bytes=4) == 2 * act(2048, 2, 4096, 32)


def test_tp_memory_divides_shards_and_activations():
    m = preset("llama3-70b", micro_batch=1)
    one, eight = tp_memory(m, 1, False), tp_memory(m, 8, True)
    norms = sum(p.numel for p in m.params if "norm" in p.name)          # replicated on every rank
    assert eight["params"] == ((m.num_params - norms) // 8 + norms) * 2
    assert eight["optimizer"] == eight["params"] // 2 * 12
    assert eight["activations"] == pytest.approx(one["activations"] / 8)    # 34/t + 5as/(ht) = (34 + 5as/h)/t
    assert tp_memory(m, 8, True, "selective")["activations"] == pytest.approx(80 * act(8192, 1, 8192, 64, 8, True, "selective"))
