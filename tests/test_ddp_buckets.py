"""DDP buckets: the simulator's assignment (sim/parallel/ddp/buckets.py) against PyTorch's own, in steady state and
at iteration 0. One 2-rank gloo launch checks every model (tests marked slow). The assignment itself is held
against torch's own function in tests/test_ddp_buckets_torch.py."""
import pytest

from distlab.sim import models as m
from distlab.sim.parallel.ddp.buckets import MIB, bucket_limits, ddp_buckets, launch_times
from distlab.sim.errors import ConfigError


def sizes(buckets):
    return [b.bytes for b in buckets]


def test_default_cap_first_bucket_is_1mib_and_explicit_cap_applies_to_first():
    assert bucket_limits(None) == [MIB, 25 * MIB]
    assert bucket_limits(5) == [5 * MIB, 5 * MIB]
    assert bucket_limits(0.5) == [MIB // 2, MIB // 2]
    for bad in (0, -1, "25", True):
        with pytest.raises(ConfigError, match="bucket_cap_mb"):
            bucket_limits(bad)


def test_six_linears_match_the_reference_numbers():
    # shared/REFERENCES.md: 6 x Linear(1024, 1024), default cap -> 4 MiB + 20 MiB; cap 5 -> 3 x 8 MiB
    model = m.mlp(*[1024] * 7)
    w, b = 1024 * 1024 * 4, 1024 * 4
    assert sizes(ddp_buckets(model)) == [w + b, 5 * (w + b)]
    assert [bk.params for bk in ddp_buckets(model)][0] == (11, 10)        # bias ready before weight
    assert sizes(ddp_buckets(model, 5)) == [2 * (w + b)] * 3
    assert sizes(ddp_buckets(model, iteration=0)) == [6 * (w + b)]
    assert ddp_buckets(model, iteration=0)[0].params == tuple(range(12))


def test_a_parameter_larger_than_the_cap_is_alone():
    model = m.mlp(16, 4096, 16, bias=False)       # 256 KiB weights, cap 0.1 MiB
    assert [bk.params for bk in ddp_buckets(model, 0.1)] == [(1,), (0,)]


def test_launch_rule_waits_for_lower_buckets():
    model = m.mlp(8, 8, 8, 8, bias=False)
    buckets = ddp_buckets(model, 0.0001)                        # one weight per bucket: 2, 1, 0
    assert launch_times(buckets, ready=[3.0, 1.0, 2.0]) == [2.0, 2.0, 3.0]


CASES = [
    {"model": {"kind": "mlp", "widths": [1024] * 7}},                                     # default cap
    {"model": {"kind": "mlp", "widths": [1024] * 7}, "bucket_cap_mb": 5},
    {"model": {"kind": "mlp", "widths": [4, 8, 2]}},                                      # tiny
    {"model": {"kind": "mlp", "widths": [256, 2048, 2048, 256], "bias": False}},         # 2 + 16 + 2 MiB
    {"model": {"kind": "gpt", "arch": "gpt2", "layers": 2, "hidden": 64, "heads": 4, "seq_len": 16,
               "vocab": 5000, "dtype": "float32"}, "bucket_cap_mb": 0.25},             # 1.2 MiB tied embedding
    {"model": {"kind": "gpt", "arch": "llama", "layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2,
               "ffn_hidden": 344, "seq_len": 8, "vocab": 3000, "dtype": "float32"}, "bucket_cap_mb": 0.1},
    {"zoo": "embed-mlp", "bucket_cap_mb": 2},                                             # 9.8 MiB > cap
    {"zoo": "conv"},
]


@pytest.fixture(scope="module")
def real():
    pytest.importorskip("torch")
    from distlab.runtime.parallel.ddp.buckets import real_buckets
    return real_buckets(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES)))
def test_buckets_identical_to_real_ddp(real, i):
    from distlab.runtime.parallel.ddp.buckets import sim_model
    case = CASES[i]
    model = sim_model(case)
    steady = ddp_buckets(model, case.get("bucket_cap_mb"))
    assert sizes(steady) == real[i]["rebuilt_bucket_sizes"]
    assert [list(bk.params) for bk in steady] == real[i]["rebuilt_per_bucket_param_indices"]
    assert sizes(ddp_buckets(model, case.get("bucket_cap_mb"), iteration=0)) == real[i]["bucket_sizes"]


@pytest.mark.slow
def test_cases_cover_big_params_tiny_models_and_both_cap_kinds(real):
    from distlab.runtime.parallel.ddp.buckets import sim_model
    assert len(real[2]["rebuilt_bucket_sizes"]) == 1                                   # tiny: one bucket
    big = [c for c in CASES if c.get("bucket_cap_mb")
           and max(p.bytes for p in sim_model(c).params) > c["bucket_cap_mb"] * MIB]
    assert len(big) >= 2
    alone = [i for i, c in enumerate(CASES) for idx, size in zip(real[i]["rebuilt_per_bucket_param_indices"],
                                                                 real[i]["rebuilt_bucket_sizes"])
             if c.get("bucket_cap_mb") and len(idx) == 1 and size > c["bucket_cap_mb"] * MIB]
    assert len(set(alone)) >= 2           # a parameter larger than the cap gets a bucket alone
    assert any("bucket_cap_mb" not in c for c in CASES) and any("bucket_cap_mb" in c for c in CASES)
