"""Lesson 10's experts exercises (sim/lessons/bank_ep.py): each expected answer equals the hand computation the
lesson's hint describes, so the lesson teaches what the simulator does. Pure simulator: well under a second."""
import math

import pytest

from distlab.sim.lessons import bank_ep as ep
from distlab.sim.lessons import check, solution

T, K, H, E = 4096, 8, 7168, 256            # DeepSeek-V3: tokens per GPU, top-k, hidden, routed experts


def test_dispatch_bytes_are_the_copies_that_leave_the_rank():
    fp8 = H + 4 * H // 128                      # FP8 values and one fp32 scale per 128 (DeepSeek-V3 sec. 3.3.2-3)
    assert ep.dispatch_MiB() == pytest.approx(T * K * fp8 * 7 / 8 / 2**20)            # 202.1 MiB
    assert ep.dispatch_MiB(fp8=False) == pytest.approx(T * K * H * 2 * 7 / 8 / 2**20)  # 392 MiB in bf16
    assert ep.dispatch_MiB(own=True) == pytest.approx(T * K * fp8 / 2**20)
    assert check("10-dispatch-MiB", "202.1 MiB").ok
    assert "own 32 experts" in check("10-dispatch-MiB", f"{T * K * fp8 / 2**20:.1f} MiB").message
    assert "bf16" in check("10-dispatch-MiB", "392 MiB").message


def test_hot_share_is_the_harmonic_ratio_and_ib_share_follows_the_node_limit():
    harmonic = [sum(1 / i for i in range(1, n + 1)) for n in (32, 256)]
    assert ep.hot_share(1.0) == pytest.approx(100 * harmonic[0] / harmonic[1], abs=0.01)     # 66.3%
    assert ep.hot_share(0.0) == pytest.approx(100 / 8)
    assert ep.ib_share(4) == pytest.approx(75.0) and ep.ib_share(None) == pytest.approx(87.5)
    assert ep.ib_share(1) == 0.0
    assert check("10-ib-share", "75%").ok and not check("10-ib-share", "87.5%").ok


def test_skewed_step_is_the_balanced_block_with_the_hot_ranks_gemms_and_links_scaled():
    """Rank 0's ops of the balanced block: the expert GEMMs scale with rank 0's copies; each token all_to_all
    with the busiest link, rank 0's ingress (dispatch) or egress (combine): 7 peers' copies for it against
    7/8 of a balanced row; the rest is unchanged. The sum is the simulated skewed step (what 10-skew-step asks)."""
    rows = {name: ms for name, _, ms in ep.breakdown_rows(0.0)}
    received = ep.received_per_rank(1.0)
    gemm = received[0] / (T * K)                       # rank 0's copies against its balanced share
    links = 7 * (received[0] / 8) / (T * K * 7 / 8)    # each of the 7 others sends rank 0 its eighth of the copies
    a2a = [n for n in rows if n.startswith("ep all_to_all") and "counts" not in n]
    hand = sum(ms * (gemm if n.endswith("experts") else links if n in a2a else 1.0) for n, ms in rows.items())
    assert len(a2a) == 4
    assert ep.step_ms(1.0) == pytest.approx(hand, rel=0.01)
    assert float(solution("10-skew-step").split()[0]) == pytest.approx(ep.step_ms(1.0), rel=1e-3)
    assert ep.step_ms(1.0) > 2.5 * ep.step_ms(0.0)          # the exercise's "why": over 2.5x the balanced block


def test_dualpipe_pair_overlap_is_shorter_and_node_limit_shortens_the_dispatch():
    assert ep.pair_ms(True) < ep.pair_ms(False) == pytest.approx(ep.step_ms(0.0), rel=1e-9)
    rows = ep.node_limit_rows()
    assert [r[0] for r in rows] == ["none", 4, 1]
    assert [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)
    assert not math.isclose(rows[0][2], rows[1][2])


def test_fp8_dispatch_halves_the_dispatch_bytes_and_keeps_the_combine_in_bf16():
    """DeepSeek-V3 sec. 3.3.3: dispatch (and the combine's adjoint) in FP8 with an fp32 scale per 128 values,
    combine (and the dispatch's adjoint) in the model's bf16 (sim/parallel/ep/plan.py EPOptions.fp8_dispatch)."""
    from distlab.sim.parallel.ep.plan import collective_sequence
    from distlab.sim.lessons import bank_ep as ep
    c = ep._config()
    bf16, fp8 = ep.layout(8, fp8=False), ep.layout(8, fp8=True)
    assert fp8.tokens == bf16.tokens and fp8.combine == bf16.combine
    per_copy = c.hidden + 4 * (c.hidden // 128)
    assert all(fp8.dispatch[i][j] == bf16.tokens[i][j] * per_copy for i in range(8) for j in range(8))
    assert ep.dispatch_MiB(fp8=True) / ep.dispatch_MiB(fp8=False) == pytest.approx(per_copy / (2 * c.hidden))
    dtypes = [(name, dtype) for name, (_, _, dtype, _, _) in zip(
        [o.name for o in ep.block_plan(8).ranks[0] if getattr(o, "name", "").startswith("ep ")],
        collective_sequence(ep.block_plan(8)))]
    assert [d for _, d in dtypes] == ["int64", "float8_e4m3fn", "bfloat16", "float8_e4m3fn", "bfloat16"]
    assert ep.step_ms(0.0) < ep.block_trace(8, fp8=False).makespan * 1e3
