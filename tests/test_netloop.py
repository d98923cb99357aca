"""sim/kernel/netloop.py and sim/kernel/flowgroups.py: every collective's steps advanced in one loop, without a simpy event per
step, give the step-by-step simulation's times (1e-9 relative): random plans with collectives overlapping on
several streams, point-to-point transfers, and compute of random lengths between them, so that transfers start at
arbitrary instants of the others' steps; random step sequences on a bare network."""
import math
import random

import pytest

import simpy

from distlab.sim.kernel import flowgroups, solo
from distlab.sim.cluster import load_cluster
from distlab.sim.kernel.engine import simulate, simulate_collective
from distlab.sim.plan import Collective, Compute, Plan, Recv, Send

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def random_plan(seed: int, world: int = 16, count: int = 14) -> Plan:
    """Collectives on random groups and streams in one global order (so no deadlock), each rank's ops in that
    order, random compute before each op, and some send/recv pairs."""
    rng = random.Random(seed)
    ranks = [[] for _ in range(world)]
    for i in range(count):
        stream = rng.choice(("comm", "comm2", "comm3"))
        for r in range(world):
            if rng.random() < 0.5:
                ranks[r].append(Compute(seconds=rng.uniform(0, 3e-4), stream=stream, name=f"c{i}"))
        if rng.random() < 0.2:
            a, b = rng.sample(range(world), 2)
            nbytes = rng.choice((4096, 1 << 20, 1 << 24))
            ranks[a].append(Send(peer=b, bytes=nbytes, stream="p2p", name=f"p{i}"))
            ranks[b].append(Recv(peer=a, bytes=nbytes, stream="p2p", name=f"p{i}"))
            continue
        group = tuple(sorted(rng.sample(range(world), rng.choice((2, 3, 4, 8, 12, 16)))))
        op = Collective(op=rng.choice(OPS), bytes=rng.choice((4096, 96 * 1024, 1 << 20, 3 << 22, 1 << 26)),
                        group=group, root=rng.choice(group), stream=stream, name=f"x{i}")
        for r in group:
            ranks[r].append(op)
    return Plan(ranks, name=f"random-{seed}").validate()


def _run(plan, cluster, fast: bool, monkeypatch):
    monkeypatch.setattr(solo, "ENABLED", fast)
    trace = simulate(plan, cluster, record_transfers=False, symmetric=False)
    return [(o.rank, o.stream, o.index, o.kind, o.start, o.end) for o in trace.ops], trace.meta["flows"]


@pytest.mark.parametrize("seed", range(6))
def test_random_overlapping_plans_equal_the_steps_one_by_one(seed, monkeypatch):
    cluster = load_cluster("dgx-h100", nodes=2)
    plan = random_plan(seed)
    splits = []
    split = flowgroups.Groups.split

    def counting_split(self, rates, done):
        out = split(self, rates, done)
        splits.append(out[1] is not None)
        return out

    monkeypatch.setattr(flowgroups.Groups, "split", counting_split)
    (step, step_flows), (fast, fast_flows) = (_run(plan, cluster, f, monkeypatch) for f in (False, True))
    assert fast_flows == step_flows
    assert [o[:4] for o in fast] == [o[:4] for o in step]
    for a, b in zip(step, fast):
        assert math.isclose(a[4], b[4], rel_tol=1e-9, abs_tol=1e-15), (a, b)
        assert math.isclose(a[5], b[5], rel_tol=1e-9, abs_tol=1e-15), (a, b)
    comm = [o for o in fast if o[3] in ("collective", "send", "recv")]
    assert any(a[1] != b[1] and a[0] == b[0] and a[4] < b[4] < a[5] for a in comm for b in comm)   # overlaps
    assert any(splits)          # a step's flows got different rates from others' traffic: its groups split


def test_the_loop_needs_no_simpy_event_per_step(monkeypatch):
    """A 64-rank ring all-reduce (126 steps) costs the loop a handful of simpy events, step by step hundreds."""
    cluster = load_cluster("dgx-h100", nodes=8)
    events = []
    step = simpy.Environment.step

    def counting_step(env):
        events.append(1)
        return step(env)

    monkeypatch.setattr(simpy.Environment, "step", counting_step)
    counts, ends = [], []
    for fast in (False, True):
        monkeypatch.setattr(solo, "ENABLED", fast)
        events.clear()
        trace, _ = simulate_collective("all_reduce", 1 << 26, cluster, "ring")
        counts.append(len(events))
        ends.append(trace.makespan)
    assert counts[0] > 2 * 126 and counts[1] < 20, counts
    assert math.isclose(ends[0], ends[1], rel_tol=1e-9)


def _network_run(fast: bool, seed: int, monkeypatch) -> list[float]:
    """Sequences of steps (random pairs of a 2-node cluster, random sizes, latency 0, the route's or another)
    started at random instants on a bare Network; returns each sequence's end."""
    from distlab.sim.kernel.network import Network, Pairs, Topology
    monkeypatch.setattr(solo, "ENABLED", fast)
    rng = random.Random(seed)
    topo = Topology(load_cluster("dgx-h100", nodes=2))
    env = simpy.Environment()
    net = Network(env, topo)
    ends = []

    def sequence(start, steps, i):
        yield env.timeout(start)
        yield from solo.run_steps(net, steps)
        ends.append((i, env.now))

    for i in range(8):
        steps = []
        for _ in range(rng.randint(1, 6)):
            pairs = Pairs.build(topo, [tuple(rng.sample(range(16), 2)) for _ in range(rng.randint(1, 5))])
            sizes = rng.choice((float(rng.choice((0, 1e3, 1e6, 3e7))), [rng.uniform(0, 1e7) for _ in pairs.src]))
            steps.append((pairs, sizes, rng.choice((None, 0.0, 2e-6))))
        env.process(sequence(rng.uniform(0, 2e-4) * rng.randint(0, 1), steps, i))
    env.run()
    return [t for _, t in sorted(ends)]


@pytest.mark.parametrize("seed", range(20))
def test_random_step_sequences_on_a_bare_network_equal_the_steps_one_by_one(seed, monkeypatch):
    if seed % 2:
        monkeypatch.setattr(flowgroups, "WIDE", 2)     # steps of more than 2 groups on numpy arrays (uneven all-to-all)
    step, fast = (_network_run(f, seed, monkeypatch) for f in (False, True))
    assert len(fast) == len(step) == 8
    for a, b in zip(step, fast):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15), (step, fast)
