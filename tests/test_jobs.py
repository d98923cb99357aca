"""Several jobs on one cluster (sim/jobs/): the max-min shares of two jobs on one spine link against a hand
computation and the network's reference, jobs that share nothing run exactly as alone, a job alone in a cluster
file is its single-job simulation, the symmetric reductions kept under sharing give the full simulation's times,
placement, and bad input."""
import math

import numpy as np
import pytest
import yaml

from distlab.runtime.cli import main
from distlab.sim import scenario as sc
from distlab.sim.errors import ConfigError
from distlab.sim.jobs import spec as specs
from distlab.sim.jobs.placement import place
from distlab.sim.jobs.together import simulate_jobs
from distlab.sim.kernel.network import Pairs, max_min_rates
from distlab.sim.plan import Plan, Recv, Send

NIC_GBPS, NIC_US = 10.0, 5.0


def write(path, data) -> str:
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(path)


def one_gpu_nodes(tmp_path, nodes=6, per_leaf=2, oversubscription=4):
    """Nodes of one GPU and one NIC, leaves of ``per_leaf`` nodes: a leaf's uplink carries
    per_leaf x 10 GB/s / oversubscription."""
    return write(tmp_path / "leafy.yaml", {
        "name": "leafy", "nodes": nodes, "gpus_per_node": 1, "gpu": "h100",
        "intra_node": {"kind": "nvswitch", "bandwidth_GBps": 100, "latency_us": 1},
        "inter_node": {"kind": "infiniband", "nics_per_node": 1, "bandwidth_GBps": NIC_GBPS, "latency_us": NIC_US,
                       "fabric": "fat-tree", "oversubscription": oversubscription, "nodes_per_leaf": per_leaf}})


def send_plan(tmp_path, name, nbytes) -> str:
    path = tmp_path / f"{name}.json"
    Plan([[Send(1, nbytes)], [Recv(0, nbytes)]], name=name).save(str(path))
    return str(path)


def test_two_jobs_on_one_spine_link_get_the_max_min_shares(tmp_path):
    """Leaves {0,1}, {2,3}, {4,5}; uplinks of 2 x 10 / 4 = 5 GB/s. Job a sends node 0 -> 2 (leaf0.up, leaf1.down),
    job b node 1 -> 4 (leaf0.up, leaf2.down): leaf0.up is the one link they share. Each gets half of it, 2.5 GB/s,
    until b's smaller message is done; then a gets the whole 5 GB/s (what it gets alone)."""
    a_bytes, b_bytes = 400e6, 100e6
    d = {"cluster": one_gpu_nodes(tmp_path), "jobs": [
        {"name": "a", "plan": send_plan(tmp_path, "a", int(a_bytes)), "placement": [0, 2]},
        {"name": "b", "plan": send_plan(tmp_path, "b", int(b_bytes)), "placement": [1, 4]}]}
    out = simulate_jobs(specs.resolve(specs.load(d)))
    a, b = out.runs
    alpha = NIC_US * 1e-6
    share, alone = 2.5e9, 5e9
    assert a.step_alone_s == pytest.approx(alpha + a_bytes / alone, rel=1e-12)
    assert b.step_shared_s == pytest.approx(alpha + b_bytes / share, rel=1e-12)
    assert a.step_shared_s == pytest.approx(alpha + b_bytes / share + (a_bytes - b_bytes) / alone, rel=1e-12)
    names = out.topology.names
    assert {names[x] for x in a.shared_links} == {"leaf0.up"} and out.groups == [[0, 1]]
    assert a.link_bytes == {names.index("leaf0.up"): a_bytes} and b.link_bytes == {names.index("leaf0.up"): b_bytes}
    # the network's own reference: max-min rates of the two flows by progressive filling
    topo = out.topology
    flows = Pairs.build(topo, [(0, 2), (1, 4)])
    rates = max_min_rates(topo.capacity, flows.entry_flow, flows.entry_link, 2)
    assert rates.tolist() == pytest.approx([share, share], rel=1e-12)


MODEL = {"preset": "llama3-8b", "layers": 1, "seq_len": 64, "micro_batch": 1}
DDP = {"model": {"preset": "gpt2-small", "micro_batch": 2}, "ddp": {"bucket_cap_mb": 50}}
TP = {"model": MODEL, "mesh": {"tp": 4}, "tp": {}}
FSDP = {"model": {"preset": "gpt2-small", "micro_batch": 2, "layers": 2}, "fsdp": {"zero": 3}}


def _mix(cluster, placements, steps=(1, 1, 1), starts=(0.0, 0.0, 0.0)):
    return {"cluster": cluster, "jobs": [
        {"name": name, "scenario": s, "placement": p, "steps": k, "start_s": t}
        for name, s, p, k, t in zip(("tp", "ddp", "fsdp"), (TP, DDP, FSDP), placements, steps, starts)]}


def _leafy_h100(tmp_path, oversubscription=2):
    """H100 nodes of 4 GPUs and 4 NICs (fewer ranks: a quick full simulation), leaves of 4 nodes."""
    from distlab.sim.cluster import PRESETS
    d = PRESETS["dgx-h100"].to_dict()
    d.update(nodes=12, gpus_per_node=4)
    d["inter_node"].update(fabric="fat-tree", nodes_per_leaf=4, oversubscription=oversubscription, nics_per_node=4)
    return write(tmp_path / "h100-leaves.yaml", d)


def test_jobs_that_share_no_link_run_exactly_as_alone(tmp_path):
    """Each job inside its own leaf: no traffic crosses the spine, so nothing is shared; one simulation of all
    jobs together, every rank of each, gives the same step times (1e-9)."""
    d = _mix(_leafy_h100(tmp_path), ([0, 1], [4, 5, 6], [8, 9]), steps=(1, 2, 1), starts=(0.0, 0.002, 0.001))
    spec = specs.resolve(specs.load(d))
    out = simulate_jobs(spec)
    assert out.groups == [] and all(not r.shared_links for r in out.runs)
    assert [r.shared_s for r in out.runs] == [r.alone_s for r in out.runs]
    assert len(out.runs[1].shared_s) == 2 and out.runs[1].alone_s[1] == pytest.approx(out.runs[1].alone_s[0], rel=1e-6)
    full = simulate_jobs(spec, together=True, symmetric=False)
    for r, f in zip(out.runs, full.runs):
        assert f.simulated_shared == r.job.world_size and r.simulated_alone < r.job.world_size
        assert f.shared_s == pytest.approx(r.shared_s, rel=1e-9)


def test_reductions_kept_under_sharing_give_the_full_simulation(tmp_path):
    """Jobs spread over the leaves share their uplinks: each keeps only the renamings that fix the links it shares
    (a DDP job: every rank alike still; the TP x FSDP job: renamings inside its nodes); every step time equals
    one simulation of all jobs with every rank (1e-9), and the jobs are slower than alone."""
    d = _mix(_leafy_h100(tmp_path, oversubscription=4), ([0, 1, 4, 5], [2, 6, 8], [3, 9]), steps=(1, 1, 2),
             starts=(0.0, 0.001, 0.0))
    spec = specs.resolve(specs.load(d))
    out = simulate_jobs(spec)
    assert out.groups == [[0, 1, 2]]
    full = simulate_jobs(spec, together=True, symmetric=False)
    for r, f in zip(out.runs, full.runs):
        assert f.shared_s == pytest.approx(r.shared_s, rel=1e-9)
        assert r.link_bytes == pytest.approx(f.link_bytes, rel=1e-9)
    assert out.runs[1].simulated_shared == 1                  # whole-world collectives: one rank stands for all
    assert max(r.slowdown for r in out.runs) > 1.01


def test_a_job_alone_in_a_cluster_file_is_its_single_job_simulation(tmp_path):
    cluster = _leafy_h100(tmp_path, oversubscription=4)
    scenario = {**TP, "cluster": cluster, "nodes": 8}      # two leaves: spine traffic
    single = sc.simulate(sc.validate(dict(scenario), "single"))
    out = simulate_jobs(specs.resolve(specs.load({"cluster": cluster, "jobs": [{"scenario": scenario}]})))
    run, = out.runs
    assert run.job.nodes == tuple(range(8))
    assert run.step_alone_s == pytest.approx(single.summary["step_s"], rel=1e-9)
    assert run.step_shared_s == pytest.approx(single.summary["step_s"], rel=1e-9)


def test_placement_policies():
    assert place([(4, "packed"), (4, "packed")], 16, 4) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert place([(3, "packed"), (4, "packed")], 16, 4) == [(0, 1, 2), (4, 5, 6, 7)]     # fewest leaves first
    assert place([(4, "spread")], 16, 4) == [(0, 4, 8, 12)]
    assert place([(2, (5, 1)), (4, "spread")], 8, 4) == [(5, 1), (0, 2, 4, 6)]            # lists first, as given
    first, again = place([(3, "random")], 16, 4, seed=7), place([(3, "random")], 16, 4, seed=7)
    assert first == again and len(set(first[0])) == 3
    assert place([(2, "packed")], 4, 0) == [(0, 1)]                                     # no leaves
    for requests, message in (
            ([(2, (0, 1)), (2, (1, 2))], "jobs 'job 0' and 'job 1' both ask for node 1"),
            ([(3, "packed"), (2, "spread")], "the jobs need 5 nodes but the cluster has 4"),
            ([(1, "pack")], "unknown placement 'pack'; allowed: packed, spread, random, or a list"),
            ([(1, (9,))], "asks for node 9; the cluster has nodes 0..3")):
        with pytest.raises(ConfigError, match=message):
            place(requests, 4, 2)


def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, cli):
    base = {"cluster": "dgx-h100", "nodes": 4, "jobs": [{"scenario": DDP, "nodes": 2}]}
    cases = {
        "overlap": ({**base, "jobs": [{"scenario": DDP, "placement": [0, 1]}, {"scenario": DDP, "placement": [1, 2]}]},
                    "both ask for node 1; a node runs one job"),
        "too many": ({**base, "jobs": [{"scenario": DDP, "nodes": 3}, {"scenario": DDP, "nodes": 2}]},
                     "the jobs need 5 nodes but the cluster has 4"),
        "policy": ({**base, "placement": "tight"}, "unknown placement 'tight'; allowed: packed, spread, random"),
        "key": ({**base, "jobz": []}, "unknown key 'jobz'"),
    }
    for name, (d, message) in cases.items():
        path = write(tmp_path / f"{name.replace(' ', '-')}.yaml", d)
        assert main(["cluster", path, "--no-files"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (name, err)
    rc, out, err = cli("cluster", str(tmp_path / "overlap.yaml"), "--no-files")   # the installed command
    assert rc == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err


def test_json_report_and_timeline(tmp_path, capsys):
    d = {"cluster": one_gpu_nodes(tmp_path), "jobs": [
        {"name": "a", "plan": send_plan(tmp_path, "a", 40_000_000), "placement": [0, 2], "steps": 2},
        {"name": "b", "plan": send_plan(tmp_path, "b", 10_000_000), "placement": [1, 4], "start_s": 0.001}]}
    path = write(tmp_path / "two.yaml", d)
    assert main(["cluster", path, "--json", "--out", str(tmp_path)]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "distlab.cluster/1" and [j["name"] for j in out["jobs"]] == ["a", "b"]
    a = out["jobs"][0]
    assert len(a["steps_shared_s"]) == 2 and a["slowdown"] == pytest.approx(a["step_shared_s"] / a["step_alone_s"])
    assert math.isclose(sum(a["steps_shared_s"]), a["steps"] * a["step_shared_s"])
    assert out["contended_links"][0]["link"] == "leaf0.up" and set(out["contended_links"][0]["bytes_by_job"]) == {
        "a", "b"}
    assert (tmp_path / "cluster-timeline.png").stat().st_size > 0
    assert main(["cluster", path, "--no-files"]) == 0
    text = capsys.readouterr().out
    assert "contended links" in text and "leaf0.up" in text and "b 0.010" in text


def test_link_bytes_count_each_step():
    from distlab.sim.jobs.together import LinkBytes
    pairs = Pairs(np.array([0, 1]), np.array([2, 3]), np.array([0, 0, 1, 1]), np.array([5, 7, 5, 8]), 0.0)
    count = LinkBytes(frozenset({5, 8}), 10)
    count(pairs, np.array([3.0, 4.0]), None)
    count(pairs, 2.0, None)
    assert count.bytes() == {5: 3.0 + 4.0 + 4.0, 8: 4.0 + 2.0}


def test_cluster_command_what_ifs(tmp_path, capsys):
    """`distlab cluster --sweep/--matrix/--capacity` on two jobs spread over leaves of two nodes (two GPUs and two
    10 GB/s NICs per node, 2:1): each job sends from GPU 0 of its first node to GPU 0 of its second. Fat-tree: a
    leaf's uplink carries 2 x 2 x 10 / 2 = 20 GB/s, both flows run at their NICs' 10 GB/s: no slowdown.
    Rail-optimized: rail 0's leaf uplink carries 2 x 10 / 2 = 10 GB/s, shared 5 + 5 until b's 20 MB are through,
    then a alone at 10. Packed: nothing crosses the spine."""
    import json
    cluster = {"name": "railed", "nodes": 4, "gpus_per_node": 2, "gpu": "h100", "intra_node": {},
               "inter_node": {"nics_per_node": 2, "bandwidth_GBps": 10, "fabric": "fat-tree", "oversubscription": 2,
                              "nodes_per_leaf": 2}}
    write(tmp_path / "railed.yaml", cluster)
    jobs = []
    for name, nbytes in (("a", 40_000_000), ("b", 20_000_000)):
        Plan([[Send(2, nbytes)], [], [Recv(0, nbytes)], []], name=name).save(str(tmp_path / f"{name}.json"))
        jobs.append({"name": name, "plan": f"{name}.json", "nodes": 2})
    path = write(tmp_path / "mix.yaml", {"cluster": "railed.yaml", "placement": "spread", "jobs": jobs})
    assert main(["cluster", path, "--sweep", "placement=packed,spread", "--sweep", "layout=fat-tree,rail-optimized",
                 "--workers", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sweep"] == {"placement": ["packed", "spread"], "layout": ["fat-tree", "rail-optimized"]}
    by = {(r["placement"], r["layout"]): r for r in out["results"]}
    assert len(by) == 4 and all(by[k]["worst_slowdown"] == 1.0 for k in by if k != ("spread", "rail-optimized"))
    a, b = by["spread", "rail-optimized"]["jobs"]
    alpha = a["step_alone_s"] - 40e6 / 10e9                       # the NIC's latency
    assert b["step_alone_s"] == pytest.approx(alpha + 20e6 / 10e9, rel=1e-12)
    assert b["step_shared_s"] == pytest.approx(alpha + 20e6 / 5e9, rel=1e-12)
    assert a["step_shared_s"] == pytest.approx(alpha + 20e6 / 5e9 + 20e6 / 10e9, rel=1e-12)
    assert by["spread", "rail-optimized"]["contended_links"][0]["link"] == "leaf0.rail0.up"
    assert main(["cluster", path, "--sweep", "oversubscription=1,2", "--sweep", "layout=rail-optimized"]) == 0
    assert "1.998x" in capsys.readouterr().out                   # text: b's slowdown at 2:1 (alpha in both)
    assert main(["cluster", path, "--matrix", "--workers", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matrix"] == {"jobs": ["a", "b"], "slowdown": [[1.0, 1.0], [1.0, 1.0]]}
    assert main(["cluster", path, "--capacity", "1.5", "--workers", "1"]) == 0
    assert "8 of its 8 GPUs (2 jobs)" in capsys.readouterr().out
    for argv, message in ((["--sweep", "colour=1,2"], "KEY one of placement"),
                          (["--sweep", "layout=fat-tree", "--matrix"], "one what-if at a time"),
                          (["--capacity", "0.9"], "must be a slowdown >= 1")):
        assert main(["cluster", path, "--no-files", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (argv, err)
