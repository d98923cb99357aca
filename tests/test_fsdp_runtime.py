"""Real FSDP2 (``fully_shard``, 2 gloo ranks) issues exactly the simulated plan's collective sequence (kind,
order, bytes, dtype, group) for every variant, on the same process groups (two collectives share a real group
exactly when they share a communicator in the plan: torch 2.13's separate reduce-scatter group); one launch runs
them all. 4 ranks: HSDP, reshard to a group, and the 2.13 options with HSDP."""
import pytest

from distlab.sim.parallel.fsdp.plan import build_fsdp, collective_sequence
from distlab.sim.plan import Collective
from distlab.sim.models import gpt, mlp

pytestmark = pytest.mark.slow

LLAMA = gpt(layers=3, hidden=16, heads=2, seq_len=8, vocab=51, micro_batch=2, dtype="float32", arch="llama")
GPT2 = gpt(layers=2, hidden=16, heads=2, seq_len=7, vocab=51, micro_batch=2, dtype="float32", arch="gpt2")
MLP = mlp(17, 33, 9, batch=4)
VARIANTS = [(LLAMA, {}), (LLAMA, {"reshard_after_forward": False}),
            (LLAMA, {"param_dtype": "bfloat16", "reduce_dtype": "float32"}),
            (LLAMA, {"reshard_after_forward": False, "param_dtype": "bfloat16"}),
            (LLAMA, {"prefetch": 2, "backward_prefetch": 2}), (LLAMA, {"shard_size": 1}),
            (GPT2, {}), (MLP, {}), (MLP, {"reshard_after_forward": False}),
            (LLAMA, {"root_reshard_after_forward": True}), (LLAMA, {"separate_reduce_scatter_group": True}),
            (LLAMA, {"reduce_scatter_max_input_buffers": 2, "root_reshard_after_forward": True,
                     "reshard_after_forward": False, "backward_prefetch": 2})]


@pytest.fixture(scope="module")
def results():
    from distlab.runtime.parallel.fsdp import run as fsdp
    return fsdp.run(LLAMA, 2, VARIANTS, steps=1, warmup=1, timeout=180)


@pytest.mark.parametrize("i", range(len(VARIANTS)), ids=[f"{m.config['kind']}-{o}" for m, o in VARIANTS])
def test_simulated_sequence_equals_real_fsdp2(results, i):
    from distlab.runtime.parallel.fsdp import run as fsdp
    model, opts = VARIANTS[i]
    plan = build_fsdp(model, 2, opts)
    for rank in (0, 1):
        assert fsdp.measured_sequence(results, i, rank, groups=True) == collective_sequence(plan, rank, groups=True)
        assert_same_groups(plan, rank, fsdp.measured_group_names(results, i, rank))


def assert_same_groups(plan, rank, measured_names):
    """The plan's communicators and the real process groups partition the collectives alike."""
    comms = [plan.communicator_of(o) for o in plan.ranks[rank] if isinstance(o, Collective)]
    pairs = set(zip(comms, measured_names))
    assert len(comms) == len(measured_names) and len(pairs) == len(set(comms)) == len(set(measured_names))


def test_measured_trace(results):
    from distlab.runtime.parallel.fsdp import run as fsdp
    from distlab.runtime.parallel.fsdp import validate as fsdp_validate
    trace = fsdp.to_trace(results, 0)
    assert trace.meta["source"] == "measured"
    assert len(trace.for_rank(0)) == len(trace.for_rank(1)) == 11
    assert all(0 <= o.start <= o.end and o.bytes > 0 and o.group == (0, 1) for o in trace.ops)
    assert fsdp_validate.measured_step(results, 0) >= max(o.end for o in trace.ops) * 0.999


def test_validate_fsdp_reports_match_and_prediction():
    from distlab.runtime.parallel.fsdp.validate import validate_fsdp
    scenario = {"model": {"kind": "gpt", "arch": "llama", "layers": 2, "hidden": 32, "heads": 2, "seq_len": 16,
                          "vocab": 101, "dtype": "float32"},
                "parallelism": {"kind": "fsdp", "reshard_after_forward": False}, "cluster": "localhost-cpu"}
    rep = validate_fsdp(scenario, nproc=2, steps=2)
    assert rep["sequence_match"], (rep["simulated_sequence"], rep["measured_sequence"])
    assert rep["predicted_step_s"] > 0 and rep["measured_step_s"] > 0 and "error_pct" in rep


def test_hsdp_and_reshard_to_a_group_on_4_ranks():
    """HSDP 2 x 2 (shard in pairs, all-reduce across them) and reshard_after_forward=2, groups included."""
    from distlab.runtime.parallel.fsdp import run as fsdp
    model = gpt(layers=2, hidden=16, heads=2, seq_len=8, vocab=51, micro_batch=2, dtype="float32", arch="llama")
    variants = [{"shard_size": 2, "param_dtype": "bfloat16", "reduce_dtype": "float32"},
                {"reshard_after_forward": 2},
                {"shard_size": 2, "separate_reduce_scatter_group": True, "root_reshard_after_forward": True}]
    res = fsdp.run(model, 4, variants, steps=1, warmup=1, timeout=240)
    for i, opts in enumerate(variants):
        plan = build_fsdp(model, 4, opts)
        for rank in range(4):
            assert fsdp.measured_sequence(res, i, rank, groups=True) == collective_sequence(plan, rank, groups=True)
            assert_same_groups(plan, rank, fsdp.measured_group_names(res, i, rank))
    assert len({c.name for c in map(plan.communicator_of, [o for o in plan.ranks[0] if o.kind == "collective"])}) == 2
