"""Arrival skew (sim/kernel/skew.py): with ``cluster.compute_jitter`` J, a collective starts e_n sqrt(J mu) after its last
member reached it, mu = the most compute a member did since its previous collective; hand-computed, milliseconds."""
import math
from dataclasses import replace

import pytest
from pytest import approx

from distlab.sim.cluster import PRESETS, cluster_from_dict
from distlab.sim.kernel.engine import simulate, simulate_collective
from distlab.sim.errors import ConfigError
from distlab.sim.parallel.fsdp.plan import build_fsdp
from distlab.sim.models import gpt
from distlab.sim.plan import Collective, Compute, Plan
from distlab.sim.kernel.skew import arrival_skew, expected_max_normal

CPU = PRESETS["localhost-cpu"]
NBYTES = 2**20
T = simulate_collective("all_reduce", NBYTES, CPU)[0].makespan
E2 = 1 / math.sqrt(math.pi)


def test_expected_max_of_normals_matches_the_closed_forms_and_tables():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == approx(1 / math.sqrt(math.pi), rel=1e-9)          # David & Nagaraja 4.2
    assert expected_max_normal(3) == approx(3 / (2 * math.sqrt(math.pi)), rel=1e-9)
    assert expected_max_normal(4) == approx(1.02938, abs=1e-5)                           # Tippett 1925
    assert expected_max_normal(10) == approx(1.53875, abs=1e-5)
    assert arrival_skew(0.01, 0.25, 2) == approx(E2 * 0.05)
    assert arrival_skew(0.0, 1.0, 8) == 0.0 and arrival_skew(0.01, 1.0, 1) == 0.0


def two_syncs(first=(1.0, 1.0), second=(0.25, 0.25)) -> Plan:
    ops = lambda r: [Compute(name="A", seconds=first[r]), Collective("all_reduce", NBYTES, name="ar1", stream="compute"),
                     Compute(name="B", seconds=second[r]), Collective("all_reduce", NBYTES, name="ar2",
                                                                                 stream="compute")]
    return Plan([ops(0), ops(1)]).validate()


def spans(trace, rank=0) -> dict:
    return {o.name: (o.start, o.end, o.launch) for o in trace.ops if o.rank == rank}


def test_each_collective_waits_for_the_expected_last_arrival():
    # J = 0.01 s: ar1 after 1 s of compute starts at 1 + e2 * 0.1, ar2 after 0.25 s at ... + e2 * 0.05
    got = spans(simulate(two_syncs(), replace(CPU, compute_jitter=0.01)))
    s1 = 1.0 + E2 * 0.1
    assert got["ar1"] == approx((1.0, s1 + T, s1))
    s2 = s1 + T + 0.25 + E2 * 0.05
    assert got["ar2"] == approx((s1 + T + 0.25, s2 + T, s2))


def test_the_member_that_computed_most_sets_the_spread():
    # rank 1 computes 0.36 s, rank 0 1 s: the collective starts at rank 0's arrival + e2 sqrt(J x 1 s)
    got = spans(simulate(two_syncs(first=(1.0, 0.36)), replace(CPU, compute_jitter=0.04)), rank=1)
    assert got["ar1"][2] == approx(1.0 + E2 * 0.2)


def test_no_jitter_no_change_and_the_presets_have_none():
    assert {c.compute_jitter for c in PRESETS.values()} == {0.0}
    got = spans(simulate(two_syncs(), CPU))
    assert got["ar2"] == approx((1.0 + T + 0.25, 1.0 + 2 * T + 0.25, 1.0 + T + 0.25))


def test_fsdp_step_grows_by_the_sum_over_its_synchronizations():
    model = gpt(layers=2, hidden=64, heads=2, seq_len=16, vocab=101, micro_batch=1, dtype="float32", arch="llama")
    plan = build_fsdp(model, 2, {"overlap": False})
    plain = simulate(plan, CPU, record_transfers=False)
    computed, extra = 0.0, 0.0
    for o in plain.for_rank(0):          # one stream: the compute between two collectives, then each one's skew
        if o.kind == "compute":
            computed += o.end - o.start
        elif o.kind == "collective":
            extra, computed = extra + arrival_skew(1e-4, computed, 2), 0.0
    assert extra > 0
    jittered = simulate(plan, replace(CPU, compute_jitter=1e-4), record_transfers=False)
    assert jittered.makespan == approx(plain.makespan + extra, rel=1e-9)


@pytest.mark.parametrize("shard_size", [8, 4])
def test_symmetric_and_full_simulation_agree_with_jitter(shard_size):
    model = gpt(layers=2, hidden=64, heads=2, seq_len=16, vocab=101, micro_batch=1, dtype="bfloat16", arch="llama")
    plan = build_fsdp(model, 8, {"shard_size": shard_size})
    cluster = replace(PRESETS["dgx-h100"], compute_jitter=1e-6)
    sym, full = simulate(plan, cluster, record_transfers=False), simulate(plan, cluster, symmetric=False,
                                                                          record_transfers=False)
    assert [(o.rank, o.index, o.end) for o in sym.ops] == [(o.rank, o.index, approx(o.end, rel=1e-9))
                                                           for o in full.ops]
    assert sym.makespan > simulate(plan, PRESETS["dgx-h100"], record_transfers=False).makespan


def test_jitter_round_trips_and_bad_values_are_refused():
    assert "compute_jitter" not in CPU.to_dict()
    assert cluster_from_dict(replace(CPU, compute_jitter=2e-5).to_dict()).compute_jitter == 2e-5
    for bad in (-1e-3, "x", float("nan"), 5.0):
        with pytest.raises(ConfigError) as e:
            cluster_from_dict({**CPU.to_dict(), "compute_jitter": bad}, where="c.yaml")
        assert e.value.where == "c.yaml: compute_jitter" and "seconds between 0 and 1" in str(e.value)
