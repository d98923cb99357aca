"""Real expert parallelism (torch 2.13 ``all_to_all_single`` with split sizes, autograd's adjoints, gloo) issues
exactly the simulated plan's ep collectives: kind, order, bytes sent to each peer, dtype, group and phase, per
rank, for two MoE shapes (balanced and skewed routing, with and without a shared expert) on expert-parallel
groups of 2 ranks (two groups, mesh {dp: 2, ep: 2}) and of 4 ranks. One launch of 4 ranks."""
import pytest

from distlab.sim.mesh import Mesh
from distlab.sim.parallel.ep.model import from_spec
from distlab.sim.parallel.ep.plan import EPOptions, collective_sequence, ep_plan
from distlab.sim.plan import Collective

pytestmark = pytest.mark.slow

SHAPES = [
    (dict(kind="moe", layers=2, hidden=16, experts=8, top_k=2, expert_ffn=8, seq_len=8, attention="none",
          embed=False, dtype="float32"), 0.0),
    (dict(kind="moe", layers=1, hidden=8, experts=4, top_k=3, expert_ffn=4, seq_len=12, attention="none",
          embed=False, dtype="float32", shared_experts=1), 1.5),
]
CASES = [(ep, i) for ep in (2, 4) for i in range(len(SHAPES))]


@pytest.fixture(scope="module")
def launched():
    from distlab.runtime.parallel.ep import run
    return run.run([{"model": from_spec(SHAPES[i][0]), "skew": SHAPES[i][1], "ep": ep} for ep, i in CASES],
                   world=4, steps=1, warmup=0, timeout=300)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"ep{ep}-shape{i}" for ep, i in CASES])
def test_simulated_all_to_alls_equal_what_torch_issues(launched, case):
    from distlab.runtime.parallel.ep.run import measured_sequence
    ep, i = CASES[case]
    spec, skew = SHAPES[i]
    plan = ep_plan(from_spec(spec), Mesh({"dp": 4 // ep, "ep": ep}), EPOptions(skew=skew))
    for rank in range(4):
        measured = measured_sequence(launched, case, rank)
        assert measured == collective_sequence(plan, rank)
        assert measured[0][3] == tuple(range(rank - rank % ep, rank - rank % ep + ep))
    assert len(measured) == 5 * spec["layers"]          # counts, dispatch, combine; the 2 adjoints
    if skew:                                            # uneven: per-peer sizes differ
        assert len({b for _, bs, *_ in measured for b in bs}) > 2


def test_the_executor_sends_a_split_all_to_all_with_its_row_and_receives_its_column():
    """`distlab run` of a plan with splits: member i's input holds row i, its output column i (elements)."""
    from distlab.runtime.execute.collectives import make_buffers, split_sizes
    op = Collective("all_to_all", 24, "float32", (0, 1, 2), splits=((0, 8, 16), (4, 4, 4), (12, 0, 0)))
    split = split_sizes(op, 1)
    assert split == ((1, 1, 1), (2, 1, 0))
    inp, out = make_buffers("all_to_all", op.bytes, op.dtype, 3, "cpu", split)
    assert (inp.numel(), out.numel()) == (3, 3)
