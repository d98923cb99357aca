"""`distlab run --nnodes`: the torchrun command it builds, its checks, and how it reads torchrun's failures."""
from __future__ import annotations

import pytest

from distlab.runtime.ranks.multinode import NodeSpec, explain, torchrun_command
from distlab.sim.errors import ConfigError


def test_the_command_is_torchrun_with_static_rendezvous_and_the_timeout():
    """Static, not c10d: c10d's rendezvous unpickles what it reads from its store (anyone reaching it runs code)."""
    spec = NodeSpec(2, 1, "node0:29500", 8, max_restarts=1, timeout_s=30)
    cmd = torchrun_command(spec, "distlab.runtime.ranks.worker", ["plan.json"])
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    text = " ".join(cmd[3:])
    assert ("--nnodes 2 --nproc-per-node 8 --node-rank 1 --rdzv-backend static --rdzv-endpoint node0:29500 "
            "--rdzv-conf timeout=30 --max-restarts 1 -m distlab.runtime.ranks.worker plan.json") == text


@pytest.mark.parametrize("spec, where", [
    (NodeSpec(0, 0, "h:1", 1), "--nnodes"), (NodeSpec(2, 2, "h:1", 1), "--node-rank"),
    (NodeSpec(2, 0, "h", 1), "--rdzv-endpoint"), (NodeSpec(2, 0, "h:99999", 1), "--rdzv-endpoint"),
    (NodeSpec(2, 0, "h:1", 1, timeout_s=0), "--timeout")])
def test_bad_options_are_config_errors(spec, where):
    with pytest.raises(ConfigError) as e:
        spec.check()
    assert e.value.where == where


def test_torchrun_failures_become_one_line():
    spec = NodeSpec(2, 0, "node0:29500", 4, timeout_s=5)
    code, line = explain("...\ntorch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n", spec)
    assert code == 2 and line.startswith("--rdzv-endpoint: not all 2 nodes joined the rendezvous at node0:29500 "
                                         "within 5 s")
    code, line = explain("torch.distributed.DistNetworkError: The client socket has timed out\n", spec)
    assert code == 2 and line.startswith("--rdzv-endpoint: cannot reach the rendezvous at node0:29500")
    code, line = explain("W1130 x\ndistlab.runtime.ranks.worker: error: WORLD_SIZE: the plan has 4 ranks\n", spec)
    assert (code, line) == (2, "WORLD_SIZE: the plan has 4 ranks")
    code, line = explain("[rank1]: RuntimeError: boom\n", spec)
    assert code == 1 and "RuntimeError: boom" in line
    code, line = explain("torch.distributed.DistStoreError: Timed out after 6 seconds waiting for clients. 1/2 "
                         "clients joined.\n", spec)          # the static rendezvous: node 0 waited in vain
    assert code == 2 and line.startswith("--rdzv-endpoint: not all 2 nodes joined")
    code, line = explain("distlab.runtime.ranks.worker: error: refused a connection to the run's store from 10.0.0.9:4242: "
                         "it did not present this run's secret; the run was stopped\n", spec)
    assert code == 1 and line.startswith("refused a connection to the run's store from 10.0.0.9:4242")


def test_under_torchrun_the_world_size_is_torchruns(monkeypatch):
    """bench/calibrate/validate under torchrun measure WORLD_SIZE ranks: --nproc left out, or equal to it."""
    from distlab.runtime.ranks.torchrun_rank import one_world_size, world_sizes
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert world_sizes(None, "2,4") == [2, 4] and one_world_size("3", "2") == 3
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert world_sizes(None, "2,4") == [8] and world_sizes("8", "2,4") == [8] and one_world_size(None, "2") == 8
    with pytest.raises(ConfigError, match="torchrun started 8 ranks") as e:
        world_sizes("2,4", "2,4")
    assert e.value.where == "--nproc"
    with pytest.raises(ConfigError):
        one_world_size("4,8", "2")

