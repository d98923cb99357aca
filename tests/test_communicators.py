"""Process groups as communicators (sim/kernel/communicators.py): the collectives of one group run one at a time
(NCCL; at most two on Gloo), in issue order; two groups over the same ranks are two communicators; FSDP2's 2.13
options on a GPU preset; the plan format's group_name; `simulate --sweep separate_reduce_scatter_group`."""
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from distlab.sim import scenario as sc
from distlab.sim.analysis import collective_overlap_s, in_flight_by_communicator
from distlab.sim.check import check_plan
from distlab.sim.cluster import GPUS, Cluster, IntraNode
from distlab.sim.errors import ConfigError
from distlab.sim.kernel.engine import simulate
from distlab.sim.plan import Collective, Communicator, Compute, Plan
from tests.conftest import one_node

MiB = 2**20


def cpu_node(n: int) -> Cluster:
    """n gloo ranks on one host (arch cpu: ProcessGroupGloo's rules)."""
    return Cluster("cpu-test", 1, n, GPUS["cpu"], IntraNode("nvswitch", 5.0, 20.0))


@st.composite
def random_plans(draw):
    """A random plan: process groups (random rank sets, some over the same ranks under another name), then a
    global sequence of collectives (each member issuing it on a stream of its own choice) and computes, every
    rank's program the subsequence it takes part in (so the plan is consistent and cannot deadlock)."""
    n = draw(st.integers(2, 6))
    comms = []
    for _ in range(draw(st.integers(1, 4))):
        ranks = tuple(sorted(draw(st.sets(st.integers(0, n - 1), min_size=2, max_size=n))))
        comms.append(Communicator(ranks, draw(st.sampled_from(["", "", "b"]))))
    ranks = [[] for _ in range(n)]
    for _ in range(draw(st.integers(1, 14))):
        if draw(st.booleans()):
            c = draw(st.sampled_from(comms))
            op = draw(st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]))
            nbytes = draw(st.sampled_from([4096, MiB, 16 * MiB, 64 * MiB]))
            for r in c.ranks:
                ranks[r].append(Collective(op, nbytes, group=c.ranks, group_name=c.name,
                                           stream=draw(st.sampled_from(["s0", "s1", "s2"]))))
        else:
            r = draw(st.integers(0, n - 1))
            ranks[r].append(Compute("c", seconds=draw(st.sampled_from([1e-5, 1e-4, 1e-3])),
                                    stream=draw(st.sampled_from(["s0", "s1", "compute"]))))
    return Plan(ranks).validate()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(random_plans())
def test_no_two_collectives_of_one_communicator_overlap_on_a_rank(plan):
    """NCCL: at most one collective of a process group moves data at a time on each rank; Gloo: at most its two
    worker threads' worth, started in issue order."""
    n = plan.world_size
    nccl = simulate(plan, one_node(n))
    gloo = simulate(plan, cpu_node(n))
    for r in range(n):
        assert all(k <= 1 for k in in_flight_by_communicator(plan, nccl, r).values())
        assert all(k <= 2 for k in in_flight_by_communicator(plan, gloo, r).values())
        launches: dict = {}
        for o in sorted(gloo.for_rank(r), key=lambda o: o.index):       # issue order
            op = plan.ranks[r][o.index]
            if isinstance(op, Collective):
                launches.setdefault(plan.communicator_of(op), []).append(o.launch)
        assert all(a == sorted(a) for a in launches.values())


def _two_streams(name: str) -> Plan:
    ag = Collective("all_gather", 256 * MiB, "bfloat16", stream="ag")
    rs = Collective("reduce_scatter", 256 * MiB, stream="rs", group_name=name)
    return Plan([[ag, rs]] * 8)


def test_two_groups_over_the_same_ranks_overlap_and_share_the_links():
    cluster = one_node(8)
    one, two = (simulate(_two_streams(n), cluster).for_rank(0) for n in ("", "rs"))
    alone = simulate(Plan([[_two_streams("").ranks[0][0]]] * 8), cluster).makespan
    assert one[1].launch == pytest.approx(one[0].end)            # one communicator: the RS waits for the AG
    assert two[1].launch == pytest.approx(two[0].launch)         # two: both start at once ...
    assert two[0].end - two[0].launch > 1.5 * alone              # ... and share the NVLinks
    assert max(o.end for o in two) == pytest.approx(max(o.end for o in one), rel=0.05)   # the same bytes moved


def test_group_name_in_the_plan_format_and_the_check():
    plan = _two_streams("rs")
    d = plan.to_dict()
    assert d["ranks"][0][1]["group_name"] == "rs" and "group_name" not in d["ranks"][0][0]   # old plans unchanged
    back = Plan.from_json(json.dumps(d))
    assert back.ranks[0] == plan.ranks[0] and back.communicator_of(back.ranks[0][1]) == Communicator(
        tuple(range(8)), "rs")
    d["ranks"][0][1]["group_name"] = 3
    with pytest.raises(ConfigError, match="group_name must be a string"):
        Plan.from_dict(d)
    # the check matches per communicator: rank 1 calls the RS on the other group
    odd = Plan([[Collective("all_reduce", 64, group_name="a")], [Collective("all_reduce", 64, group_name="b")]])
    problems = check_plan(odd)
    assert len(problems) == 2 and '[0,1] "a"' in problems[0] and "rank 1 never calls it" in problems[0]
    assert check_plan(Plan([[Collective("all_reduce", 64, group_name="a")]] * 2)) == []


SMALL_FSDP = {"model": {"preset": "llama3-8b", "layers": 4, "seq_len": 1024, "micro_batch": 1},
              "fsdp": {"zero": 3, "param_dtype": "bfloat16", "reduce_dtype": "float32"},
              "cluster": "dgx-h100", "nodes": 1}


def _fsdp(**options):
    d = json.loads(json.dumps(SMALL_FSDP))
    d["fsdp"].update(options)
    return sc.simulate(d, "s")


def test_fsdp_all_gathers_and_reduce_scatters_on_a_gpu_preset():
    """One dp_shard group: the backward all-gathers and reduce-scatters never move data at once (NCCL runs one
    collective of a communicator at a time); separate_reduce_scatter_group: they do, on a second group."""
    default, separate = _fsdp(), _fsdp(separate_reduce_scatter_group=True)
    assert collective_overlap_s(default.trace, 0, "backward", "reduce_scatter") == 0.0
    assert collective_overlap_s(separate.trace, 0, "backward", "reduce_scatter") > 1e-3
    world = tuple(range(8))
    assert set(in_flight_by_communicator(default.plan, default.trace, 0)) == {Communicator(world)}
    assert in_flight_by_communicator(separate.plan, separate.trace, 0) == {
        Communicator(world): 1, Communicator(world, "fsdp_reduce_scatter"): 1}


def test_fsdp_root_reshard_and_reduce_scatter_buffers():
    base, root = _fsdp(), _fsdp(root_reshard_after_forward=True)
    gathers = [o.name for o in root.plan.ranks[0] if isinstance(o, Collective) and o.op == "all_gather"]
    assert len(gathers) == len([o for o in base.plan.ranks[0] if getattr(o, "op", "") == "all_gather"]) + 1
    assert [g for g in gathers if g.endswith("backward")][0] == "all_gather root backward"   # first in backward
    def root_frees(r):         # memory events freeing the gathered root: post-backward (and post-forward)
        size = next(u[2] for u in r.plan.meta["units"] if u[0] == "root") * 2       # gathered, bf16
        return [e for e in r.plan.meta["memory"]["events"] if e[2] == -size and e[3] == "unsharded params"]
    assert len(root_frees(base)) == 1 and len(root_frees(root)) == 2
    assert root.summary["step_s"] > base.summary["step_s"]       # gathered again before the head's backward
    peak = lambda r: r.report["json"]["peak_memory"]["total_bytes"]         # noqa: E731
    # K = 2 input buffers: compute waits for the reduce-scatter two units back, two gradient buffers held
    two = _fsdp(reduce_scatter_max_input_buffers=2)
    assert two.summary["step_s"] <= base.summary["step_s"] * (1 + 1e-9)
    grads = lambda r: r.report["json"]["peak_memory"]["breakdown_bytes"]["unsharded grads"]   # noqa: E731
    assert grads(two) > grads(base) and peak(two) >= peak(base)
    with pytest.raises(ConfigError, match="reduce_scatter_max_input_buffers"):
        _fsdp(reduce_scatter_max_input_buffers=0)


def test_composed_tp_and_dp_shard_groups_overlap_one_group_does_not():
    d = {"model": {"preset": "llama3-8b", "layers": 2, "seq_len": 256, "micro_batch": 1},
         "mesh": {"dp_shard": 4, "tp": 2}, "tp": {}, "cluster": "dgx-h100", "nodes": 1}
    r = sc.simulate(d, "s")
    in_flight = in_flight_by_communicator(r.plan, r.trace, 0)
    assert len(in_flight) == 2 and all(k == 1 for k in in_flight.values())
    assert collective_overlap_s(r.trace, 0, "tp", "all_gather h") > 0      # tp collectives beside FSDP's


def test_sweep_reports_the_step_difference(tmp_path, capsys):
    from distlab.runtime.cli import main
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(SMALL_FSDP))
    assert main(["simulate", str(path), "--sweep", "separate_reduce_scatter_group=false,true", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["separate_reduce_scatter_group"] for r in rows] == [False, True]
    assert rows[0]["ag_rs_overlap_s"] == 0 < rows[1]["ag_rs_overlap_s"]
    assert rows[1]["step_change_pct"] == pytest.approx((rows[1]["step_s"] / rows[0]["step_s"] - 1) * 100)
    assert main(["simulate", str(path), "--sweep", "separate_reduce_scatter_group=false,true"]) == 0
    assert "step vs first (%)" in capsys.readouterr().out


def test_rank_classes_with_two_groups_over_the_same_ranks_equal_the_full_simulation():
    """FSDP 4 x TP 2 with the reduce-scatters on their own group: one rank per class simulated
    (sim/kernel/subgroups.py, one orbit per communicator) gives the full simulation's records."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.mesh import Mesh
    from distlab.sim.models import preset
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.parallel.tp.compose import fsdp_tp_plan
    from distlab.sim.trace import RankCopies
    model = preset("llama3-8b", layers=1, seq_len=256, micro_batch=1)
    cluster = load_cluster("dgx-h100", 1)
    plan = fsdp_tp_plan(model, Mesh({"dp_shard": 4, "tp": 2}), FSDPOptions(separate_reduce_scatter_group=True),
                        cluster=cluster)
    once = simulate(plan, cluster, record_transfers=False)
    full = simulate(plan, cluster, record_transfers=False, symmetric=False)
    assert isinstance(once.ops, RankCopies) and len(once.ops) == len(full.ops)
    for a, b in zip(once.ops, full.ops):
        assert (a.rank, a.index, a.name) == (b.rank, b.index, b.name)
        assert a.end == pytest.approx(b.end, rel=1e-6, abs=1e-15)
        assert (a.launch is None) == (b.launch is None) and (a.launch is None or a.launch == pytest.approx(b.launch))
    assert len(in_flight_by_communicator(plan, full, 0)) == 3      # tp, dp_shard, dp_shard "fsdp_reduce_scatter"


def test_module_examples():
    import doctest

    from distlab.sim.kernel import communicators
    from distlab.sim.scenario import what_if
    for module in (communicators, what_if):
        assert doctest.testmod(module).failed == 0


def test_runtime_issues_a_shared_group_in_plan_order():
    """runtime/execute/issue_order.py: the thread holding a group's 2nd collective waits for the 1st to be issued."""
    import threading
    import time

    from distlab.runtime.execute.issue_order import IssueOrder
    order, issued = IssueOrder(timeout=5.0), []
    comm = Communicator((0, 1))
    second = threading.Thread(target=order.issue, args=(lambda: issued.append("second"), comm, 1))
    second.start()
    time.sleep(0.05)
    assert issued == []
    order.issue(lambda: issued.append("first"), comm, 0)
    second.join(5)
    assert issued == ["first", "second"]
