"""Real expert parallelism (torch 2.13 ``all_to_all_single`` with split sizes, autograd's adjoints, gloo) issues
exactly the simulated plan's ep collectives: kind, order, bytes sent to each peer, dtype and phase, per rank,
for two MoE shapes (balanced and skewed routing, with and without a shared expert) on 2 and 4 ranks. One
launch per world size."""
import pytest

from distlab.sim.mesh import Mesh
from distlab.sim.moe.model import from_spec
from distlab.sim.moe.plan import EPOptions, collective_sequence, ep_plan

pytestmark = pytest.mark.slow

SHAPES = [
    (dict(kind="moe", layers=2, hidden=16, experts=8, top_k=2, expert_ffn=8, seq_len=8, attention="none",
          embed=False, dtype="float32"), 0.0),
    (dict(kind="moe", layers=1, hidden=8, experts=4, top_k=3, expert_ffn=4, seq_len=12, attention="none",
          embed=False, dtype="float32", shared_experts=1), 1.5),
]


@pytest.fixture(scope="module", params=[2, 4])
def launched(request):
    from distlab.runtime.ep import run
    return request.param, run.run([{"model": from_spec(m), "skew": s} for m, s in SHAPES], world=request.param,
                                  steps=1, warmup=0, timeout=300)


@pytest.mark.parametrize("i", range(len(SHAPES)))
def test_simulated_all_to_alls_equal_what_torch_issues(launched, i):
    from distlab.runtime.ep.run import measured_sequence
    world, results = launched
    spec, skew = SHAPES[i]
    plan = ep_plan(from_spec(spec), Mesh({"ep": world}), EPOptions(skew=skew))
    for rank in range(world):
        measured = measured_sequence(results, i, rank)
        assert measured == collective_sequence(plan, rank)
    assert len(measured) == 5 * spec["layers"]          # counts, dispatch, combine; 2 adjoints
    sent = [sum(b) for _, b, d, _, _ in measured if d == "float32"]
    if skew:                                            # uneven: the hot rank receives more than it sends
        assert len({b for _, bs, *_ in measured for b in bs}) > 2
    assert all(s > 0 for s in sent)
