"""sim/kernel/solo.py and sim/kernel/netloop.py: collectives' steps run at once in the network's step loop, alone or
overlapping: the same step and trace summary as the step-by-step simulation (1e-9 relative), overlaps included
(FSDP2's all-gathers and reduce-scatters overlap in backward on two process groups; TP collectives cut into
HSDP's)."""
import math

import pytest

from distlab.sim import scenario as sc
from distlab.sim.kernel import solo
from distlab.sim.kernel.engine import simulate
from distlab.sim.kernel.netloop import StepLoop
from distlab.sim.result import step_summary

LLAMA = {"preset": "llama3-8b", "layers": 3, "seq_len": 512, "micro_batch": 1}
CASES = {
    "fsdp 64 ranks, reduce-scatters on a group of their own": {
        "model": LLAMA, "mesh": {"dp_shard": 64}, "fsdp": {"separate_reduce_scatter_group": True},
        "cluster": "dgx-h100", "nodes": 8},
    "hsdp 2 x 16 x tp 2": {"model": LLAMA, "mesh": {"dp_replicate": 2, "dp_shard": 16, "tp": 2}, "tp": {},
                           "cluster": "dgx-h100", "nodes": 8},
    "cp 2 x hsdp 2 x 8": {"model": LLAMA, "mesh": {"dp_replicate": 2, "dp_shard": 8, "cp": 2}, "cp": {},
                          "cluster": "dgx-h100", "nodes": 4},
    "ddp 16, every rank simulated (symmetric=False)": {"model": {"preset": "gpt2-small", "micro_batch": 8},
                                                       "ddp": {}, "cluster": "dgx-h100", "nodes": 2},
}


def _close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-15)
                                        if isinstance(a[k], float) else a[k] == b[k] for k in a)


@pytest.mark.parametrize("name", CASES)
def test_steps_at_once_equal_the_steps_one_by_one(name, monkeypatch):
    r = sc.build(CASES[name], "s")
    symmetric = "symmetric=False" not in name
    overlaps = []
    advance = StepLoop._advance

    def counting_advance(self, horizon):
        overlaps.append(len({b.seq for b in self.batches} | {s for _, s in self.pending}) > 1)
        return advance(self, horizon)

    monkeypatch.setattr(StepLoop, "_advance", counting_advance)
    runs = []
    for enabled in (False, True):
        monkeypatch.setattr(solo, "ENABLED", enabled)
        runs.append(simulate(r.plan, r.cluster, record_transfers=False, symmetric=symmetric))
    step, at_once = runs
    assert math.isclose(step.makespan, at_once.makespan, rel_tol=1e-9)
    assert _close(step_summary(step), step_summary(at_once))
    assert step.meta["flows"] == at_once.meta["flows"]
    if name.startswith(("fsdp", "hsdp")):
        assert any(overlaps)        # the loop ran several collectives' steps together
