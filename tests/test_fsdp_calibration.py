"""runtime/parallel/fsdp/validate.py's calibration, on hand-made rounds (no ranks): the compute jitter from the ranks'
spread, and one size band per plan size so that each size is predicted at its own measured time."""
import statistics

from pytest import approx

from distlab.runtime.measure.compute_probe import compute_jitter
from distlab.runtime.parallel.fsdp.validate import calibrated_cluster
from distlab.sim.kernel.engine import simulate_collective
from distlab.sim.models import gpt


def test_jitter_is_the_median_variance_per_second_over_the_chi2_median():
    # 2 ranks: rounds (1.0, 1.0 + d): s^2 = d^2 / 2, J_r = s^2 / mean; median J_r / 0.454936 (chi^2_1 median)
    rank0, rank1 = [1.0, 1.0, 1.0], [1.01, 1.02, 1.03]
    per_round = [(b - a) ** 2 / 2 / ((a + b) / 2) for a, b in zip(rank0, rank1)]
    assert compute_jitter([rank0, rank1]) == approx(statistics.median(per_round) / 0.454936)
    # a round another process spoiled (one rank 2x slower) leaves the median where it was
    assert compute_jitter([rank0 + [1.0, 1.0], rank1 + [2.0, 1.015]]) == approx(
        statistics.median(per_round + [0.5 / 1.5, 0.015 ** 2 / 2 / 1.0075]) / 0.454936)
    # 3 ranks: k = 2, Wilson-Hilferty median of chi^2_2 / 2 = (1 - 1/9)^3
    r = [[1.0, 2.0], [1.1, 2.0], [1.2, 2.3]]
    per_round = [statistics.variance(x) / statistics.fmean(x) for x in zip(*r)]
    assert compute_jitter(r) == approx(statistics.median(per_round) / (1 - 2 / 18) ** 3)
    assert compute_jitter([[1.0, 1.0], [1.0, 1.0]]) == 0.0


def test_each_plan_size_is_predicted_at_its_own_time_and_the_jitter_is_set():
    model = gpt(layers=2, hidden=64, heads=2, seq_len=16, vocab=101, dtype="float32", arch="llama")
    times = {"4101120": [0.0019] * 6, "4196352": [0.0036] * 6}      # 2% apart in bytes, 1.9x in time
    rank = lambda fb: {"calibration": {"all_gather": times}, "local": {"rounds": [fb, [0.008] * 6]}}
    results = [rank([0.090] * 6), rank([0.091, 0.092, 0.093, 0.091, 0.092, 0.093])]
    cluster = calibrated_cluster(results, model, 2)
    for size, t in times.items():
        assert simulate_collective("all_gather", int(size), cluster)[0].makespan == approx(t[0], rel=1e-4)
    assert cluster.compute_jitter == approx(compute_jitter([r["local"]["rounds"][0] for r in results]))
    assert cluster.compute_jitter > 0
