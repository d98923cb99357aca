"""The per-rank action order of sim.pipeline.schedules equals torch 2.13's own schedule classes.

Single-stage schedules (GPipe, 1F1B) are run for real on recording stand-in stages with no communication
(their ``pipeline_order`` attribute mislabels 1F1B's last rank); multi-stage ones expose ``pipeline_order``,
which is what they execute."""
import pytest

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.pipeline import schedules as S

torch_pp = pytest.importorskip("torch.distributed.pipelining")


class _Stage:
    """Duck-typed stand-in for a PipelineStage: records compute calls, sends and receives nothing."""

    def __init__(self, index, n, rank, size, log):
        self.stage_index, self.num_stages, self.group_rank, self.group_size = index, n, rank, size
        self.is_first, self.is_last = index == 0, index == n - 1
        self.submod, self.log, self.has_backward = None, log, True

    def __getattr__(self, name):
        if name.startswith("get_"):
            return lambda *a, **k: []
        raise AttributeError(name)

    def forward_one_chunk(self, mb, *a, **k):
        self.log.append(f"{self.stage_index}F{mb}")

    def backward_one_chunk(self, mb, *a, full_backward=True, **k):
        self.log.append(f"{self.stage_index}{'B' if full_backward else 'I'}{mb}")

    def clear_runtime_states(self):
        pass

    def perform_reduce_grad(self, *a):
        pass


def torch_order(schedule, p, m, v):
    cls = getattr(torch_pp, S.TORCH_CLASSES[schedule])
    if schedule in ("gpipe", "1f1b"):
        out = []
        for r in range(p):
            log = []
            sched = cls(_Stage(r, p, r, p, log), m)
            sched._initialize_stage = lambda *a, **k: None
            sched._step_microbatches()
            out.append(log)
        return out
    placement = S.stage_to_rank(schedule, p, v)
    out = []
    for r in range(p):
        stages = [_Stage(s, p * v, r, p, []) for s in range(p * v) if placement[s] == r]
        order = cls(stages, m).pipeline_order[r]
        out.append([str(a) for a in order if a is not None])
    return out


CASES = ([("gpipe", p, m, 1) for p in (1, 2, 3, 4) for m in (1, 2, 5, 8)]
         + [("1f1b", p, m, 1) for p in (1, 2, 3, 4) for m in (p, p + 1, 8, 12) if m >= p]
         + [(s, p, m, v) for s in ("interleaved", "zbh1") for p in (2, 3, 4) for v in (1, 2, 3)
            for m in (2, p, 2 * p, 8, 10) if m % max(1, m // p) == 0]
         + [("zbv", p, m, 2) for p in (1, 2, 3, 4) for m in (1, 2, p, 2 * p, 8, 9)])


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_order_equals_torch(schedule, p, m, v):
    ours = [[str(a) for a in acts] for acts in S.build(schedule, p, m, v)]
    assert ours == torch_order(schedule, p, m, v)


def test_every_action_once():
    for schedule, p, m, v in CASES:
        acts = [a for rank in S.build(schedule, p, m, v) for a in rank]
        kinds = ("F", "I", "W") if schedule in ("zbh1", "zbv") else ("F", "B")
        assert sorted(acts) == sorted(S.Action(s, k, i) for s in range(p * v) for k in kinds for i in range(m))


@pytest.mark.parametrize("schedule,p,m,v", [("1f1b", 4, 3, 1), ("interleaved", 3, 7, 2), ("zbh1", 3, 7, 1)])
def test_torch_rejects_what_we_reject(schedule, p, m, v):
    with pytest.raises(ConfigError):
        S.build(schedule, p, m, v)
    with pytest.raises(ValueError):
        torch_order(schedule, p, m, v)


@pytest.mark.parametrize("schedule,v", [("gpipe", 2), ("zbv", 1), ("zbv", 3), ("nope", 1)])
def test_bad_config(schedule, v):
    with pytest.raises(ConfigError) as e:
        S.build(schedule, 2, 4, v)
    assert "\n" not in str(e.value)


def test_action_parse_roundtrip():
    a = S.Action(12, "W", 7)
    assert S.Action.parse(str(a)) == a and str(a) == "12W7"
