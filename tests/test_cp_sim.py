"""Context parallelism in the simulator: ring attention's simulated time equals its closed form (sim/parallel/cp/ring.py
docstring) on an uncontended node, in the compute-bound and the communication-bound regime, for both rotate
methods, forward and backward; the rotation overlaps attention compute in the trace; torch's causal behaviour
per step (load balanced and not); bad cp -> one line, exit 2. Pure simulator: milliseconds."""
import pytest

from distlab.sim.parallel.cp.plan import CPOptions, collective_sequence, cp_plan
from distlab.sim.parallel.cp.ring import BWD_FACTOR, Ring, step_flops, step_kind
from distlab.sim.kernel.engine import compute_seconds, simulate, simulate_collective
from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt
from distlab.sim.plan import Compute, Plan
from tests.conftest import one_node
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process (no interpreter start)

ALPHA, BW = 2e-6, 100e9          # one_node(): 2 us per hop, 100 GB/s per GPU per direction
MODEL = gpt(layers=2, hidden=32, heads=4, kv_heads=2, seq_len=16, vocab=64, micro_batch=1, dtype="float32",
            arch="llama", ffn_hidden=64)


def ring_plan(n, b, s, h, method, direction, overlap=True):
    ranks = []
    for r in range(n):
        ops = []
        ring = Ring(ops, r, tuple(range(n)), b, s, h, "bfloat16", 2, method, True, overlap)
        getattr(ring, direction)("attn")
        ranks.append(ops)
    return Plan(ranks).validate()


def closed_form(n, b, s, h, method, direction, cluster):
    """The docstring's formulas, written out: c one step's compute, a the K/V permute, A the K/V all_gather,
    g the fp32 dK/dV permute."""
    B, G = 2 * b * s * h * 2, 2 * b * s * h * 4
    factor = 1.0 if direction == "forward" else BWD_FACTOR
    c = compute_seconds(Compute(flops=factor * 2.0 * b * s * s * h), cluster)
    a, g = ALPHA + B / BW, ALPHA + G / BW
    A = simulate_collective("all_gather", n * B, cluster)[0].makespan
    if direction == "forward":
        return ((n - 1) * max(c, a) + c if method == "alltoall" else max(c, A) + (n - 1) * c), c, a
    if method == "alltoall":
        return max(c, a) + (n - 2) * max(c, a + g) + max(c, g) + g, c, a + g
    return max(c, A) + (n - 1) * max(c, g) + g, c, g


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("method", ["allgather", "alltoall"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_ring_attention_time_equals_closed_form(n, method, direction):
    cluster = one_node(n)
    regimes = set()
    for b, s, h in [(1, 512, 1024), (1, 8192, 4096), (2, 32768, 4096)]:
        t = simulate(ring_plan(n, b, s, h, method, direction), cluster).makespan
        want, c, comm = closed_form(n, b, s, h, method, direction, cluster)
        assert abs(t - want) <= 1e-9 * want, (b, s, h, t, want)
        regimes.add(c > comm)
    assert regimes == {True, False}          # both compute-bound and communication-bound shapes were checked


def test_without_overlap_the_times_add():
    n, b, s, h, cluster = 4, 1, 8192, 4096, one_node(4)
    c = compute_seconds(Compute(flops=2.0 * b * s * s * h), cluster)
    a = ALPHA + 2 * b * s * h * 2 / BW
    assert simulate(ring_plan(n, b, s, h, "alltoall", "forward", overlap=False), cluster).makespan == \
        pytest.approx(n * c + (n - 1) * a, rel=1e-9)


def test_rotation_overlaps_attention_compute_in_the_trace():
    """Each K/V permute (stream cp) runs while a ring step computes (stream compute), on every rank."""
    trace = simulate(ring_plan(4, 1, 8192, 4096, "alltoall", "forward"), one_node(4))
    for r in range(4):
        ops = [o for o in trace.ops if o.rank == r]
        rotations = [o for o in ops if o.stream == "cp" and o.kind == "send"]
        steps = [o for o in ops if o.stream == "compute" and o.kind == "compute"]
        assert len(rotations) == 3 and len(steps) == 4
        for k, rot in enumerate(rotations):
            step = steps[k]
            assert rot.start < step.end and step.start < rot.end          # the spans intersect
            assert rot.start == pytest.approx(step.start)                  # issued as the step starts


def test_causal_behaviour_per_step_as_torch():
    """torch's _is_causal_behavior: step 0 causal; load balanced every later step half a block; without
    balancing rank j computes steps 1..j fully and skips the rest (rank n-1 does the most)."""
    assert [step_kind(2, 4, i, True) for i in range(4)] == ["causal", "half", "half", "half"]
    assert [step_kind(0, 4, i, False) for i in range(4)] == ["causal", "skip", "skip", "skip"]
    assert [step_kind(3, 4, i, False) for i in range(4)] == ["causal", "full", "full", "full"]
    # load balancing evens the work: every rank does S²/2 / n pairs; unbalanced the last rank does 2n-1 halves
    S, n = 64, 4
    s = S // n
    balanced = [sum(step_flops(step_kind(j, n, i, True), 1, s, 1) for i in range(n)) for j in range(n)]
    assert balanced == [4.0 * S * S / 2 / n] * n
    unbalanced = [sum(step_flops(step_kind(j, n, i, False), 1, s, 1) for i in range(n)) for j in range(n)]
    assert unbalanced[-1] == (2 * n - 1) * 2.0 * s * s and unbalanced[0] == 2.0 * s * s


def test_step_plan_collectives_per_method():
    """alltoall: n-1 K/V permutes forward, n-1 + n dK/dV backward per layer; allgather: one all_gather each
    way plus n dK/dV permutes; permutes send B to the next rank only."""
    mesh = Mesh({"cp": 4})
    for method, fwd, bwd in (("alltoall", 3, 3 + 4), ("allgather", 1, 1 + 4)):
        plan = cp_plan(MODEL, mesh, CPOptions(rotate_method=method))
        seq = [x for x in collective_sequence(plan, mesh, 1) if x[4] is not None or x[1] == 4 * 2 * 4 * 32 * 4]
        assert len(seq) == 2 * (fwd + bwd)
        kv = 2 * 1 * 4 * 32 * 4                    # cat(k, v) of 4 local tokens, hidden 32, float32
        for kind, nbytes, dtype, group, per in seq:
            assert group == (0, 1, 2, 3)
            if kind == "all_to_all":
                assert per in ((0, 0, kv, 0),) and nbytes == kv        # rank 1 sends to rank 2 only
            else:
                assert nbytes == 4 * kv
    s = simulate(cp_plan(MODEL, Mesh({"dp_shard": 2, "cp": 2})), one_node(4))
    assert s.makespan > 0


def test_cp_composes_with_tp_fsdp_and_replicas():
    """torchtitan's (dp_replicate, dp_shard, cp, tp) mesh: the ring runs over cp on the local heads (K/V bytes
    / tp), TP's collectives over tp on the cp-local tokens, FSDP2 over dp_shard x cp, HSDP all-reduces over
    dp_replicate; dims out of order are a one-line error."""
    mesh = Mesh({"dp_replicate": 2, "dp_shard": 1, "cp": 2, "tp": 2})
    plan = cp_plan(MODEL, mesh, CPOptions(rotate_method="alltoall"))
    seq = collective_sequence(plan, mesh, 1)
    s, h = 16 // 2, 32
    permutes = [x for x in seq if x[0] == "all_to_all"]
    # cat(k, v) of s tokens on h / tp channels (float32: the fp32 dK/dV are the same size), all to rank 3
    assert {x[3] for x in permutes} == {(1, 3)} and {x[4] for x in permutes} == {(0, 2 * s * (h // 2) * 4)}
    groups = {x[3] for x in seq}
    assert groups == {(0, 1), (1, 3), (1, 5)}                      # tp, cp (= dp_shard_cp), dp_replicate
    assert simulate(plan, one_node(8)).makespan > 0
    with pytest.raises(ConfigError, match="in that order"):
        cp_plan(MODEL, Mesh({"tp": 2, "cp": 2}))


@pytest.mark.parametrize("seq_len, cp, balance", [(12, 4, True), (10, 4, False)])
def test_cp_that_does_not_divide_the_sequence_is_a_config_error(seq_len, cp, balance):
    m = gpt(layers=1, hidden=32, heads=4, seq_len=seq_len, vocab=64, arch="llama")
    with pytest.raises(ConfigError, match="does not split into"):
        cp_plan(m, Mesh({"cp": cp}), CPOptions(load_balance=balance))


def test_cli_bad_cp_is_one_line_and_exit_2(tmp_path, cli):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {arch: llama, layers: 1, hidden: 32, heads: 4, seq_len: 12, vocab: 64}\n"
                   "mesh: {cp: 4}\ncp: {}\ncluster: dgx-h100\nworld_size: 4\n")
    rc, out, err = cli("simulate", str(bad), "--no-files")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "mesh.cp: seq_len 12 does not split into 2 x cp = 8 chunks" in err and "allowed cp: 1, 2, 3, 6" in err
