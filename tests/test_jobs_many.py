"""Many simulations at once (sim/workers.py): a sweep of a job mix, its interference matrix and capacity search,
and a planner confirmation give identical results on one process, on local processes and on a local Dask
cluster this test starts (two workers, a real scheduler address over TCP)."""
import copy

import pytest
import yaml

from distlab.sim.cluster import load_cluster
from distlab.sim.jobs import spec as specs
from distlab.sim.jobs.whatif import capacity, matrix, sweep
from distlab.sim.planner.search import confirm_top, search
from distlab.sim.plan import Plan, Recv, Send
from distlab.sim.workers import run_many

distributed = pytest.importorskip("distributed")     # in the dev extra: installed wherever the tests run


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    import dask
    from distributed import LocalCluster
    scratch = str(tmp_path_factory.mktemp("dask"))        # Dask's scratch space stays in pytest's folders
    # workers as threads of this process, reached over TCP like remote ones: every case and result is pickled
    with dask.config.set({"temporary-directory": scratch}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp",
                         dashboard_address=None) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    """Three jobs sending across the leaves of one-GPU nodes (leaves of two, a 4:1 spine)."""
    tmp = tmp_path_factory.mktemp("mix")
    cluster = {"name": "leafy", "nodes": 8, "gpus_per_node": 1, "gpu": "h100", "intra_node": {},
               "inter_node": {"nics_per_node": 1, "bandwidth_GBps": 10, "fabric": "fat-tree", "oversubscription": 4,
                              "nodes_per_leaf": 2}}
    (tmp / "leafy.yaml").write_text(yaml.safe_dump(cluster))
    jobs = []
    for name, nbytes in (("a", 40_000_000), ("b", 10_000_000), ("c", 20_000_000)):
        Plan([[Send(1, nbytes)], [Recv(0, nbytes)]], name=name).save(str(tmp / f"{name}.json"))
        jobs.append({"name": name, "plan": f"{name}.json"})
    (tmp / "mix.yaml").write_text(yaml.safe_dump({"cluster": "leafy.yaml", "placement": "spread", "jobs": jobs}))
    return specs.load(str(tmp / "mix.yaml"))


def test_what_ifs_are_the_same_on_local_processes_and_on_a_dask_cluster(mix, scheduler):
    keys = {"placement": ["packed", "spread"], "oversubscription": [1, 4]}
    serial = sweep(mix, keys, workers=2)                         # two local processes
    assert sweep(mix, keys, scheduler=scheduler) == serial
    by = {(r["values"]["placement"], r["values"]["oversubscription"]): r["worst_slowdown"] for r in serial}
    assert by["packed", 1] == by["spread", 1] == 1.0            # non-blocking: nothing is shared
    assert by["spread", 4] > 1.0
    m = matrix(mix, workers=1)
    assert matrix(mix, scheduler=scheduler) == m
    assert m["jobs"] == ["a", "b", "c"] and all(m["slowdown"][i][i] == 1.0 for i in range(3))
    assert m["slowdown"][0][1] > 1.0 and m["slowdown"][1][0] > 1.0
    c = capacity(mix, 1.5, workers=1)
    assert capacity(mix, 1.5, scheduler=scheduler) == c
    assert [r["jobs"] for r in c["rows"]] == [1, 2, 3, 4] and c["rows"][0]["worst_slowdown"] == 1.0
    assert c["gpus"] == 2 * c["jobs"]


def test_planner_confirmation_is_the_same_on_a_dask_cluster(scheduler, tmp_path):
    c = load_cluster("dgx-h100", 2).to_dict()
    c["gpus_per_node"], c["inter_node"]["nics_per_node"] = 4, 4
    path = tmp_path / "four-per-node.yaml"
    path.write_text(yaml.safe_dump(c))
    model = {"arch": "llama", "layers": 2, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn_hidden": 512,
             "vocab": 1024, "seq_len": 128}
    local = search(model, str(path), 2, 8, confirm=0, micro_batches=(1,), workers=1, allow=lambda L: L.pp == 1)
    remote = copy.deepcopy(local)
    confirm_top(local, 2, workers=2)                              # two local processes
    confirm_top(remote, 2, scheduler=scheduler)
    assert [(x.layout, x.simulated) for x in local.ranked[:2]] == [(x.layout, x.simulated) for x in remote.ranked[:2]]
    assert local.confirmed == 2 and local.ranked[0].simulated is not None


def test_a_scheduler_nobody_serves_is_one_clear_error():
    from distlab.sim.errors import ConfigError
    from distlab.sim import workers
    old, workers.CONNECT_S = workers.CONNECT_S, 0.3
    try:
        with pytest.raises(ConfigError, match="cannot reach a Dask scheduler at 'tcp://127.0.0.1:9'"):
            run_many(abs, [1, 2], scheduler="tcp://127.0.0.1:9")
    finally:
        workers.CONNECT_S = old
