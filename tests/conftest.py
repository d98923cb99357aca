import os
import subprocess
import sys

import pytest

from distlab.sim.cluster import Cluster, GPUS, InterNode, IntraNode


def one_node(n: int, gbps: float = 100.0, latency_us: float = 2.0, nvls: bool = False) -> Cluster:
    """An uncontended single-node cluster: n GPUs on a non-blocking switch."""
    return Cluster("test-node", 1, n, GPUS["h100"], IntraNode("nvswitch", gbps, latency_us, 1.0, nvls))


def multi_node(nodes: int, g: int, intra_gbps=100.0, intra_us=2.0, inter_gbps=10.0, inter_us=7.0,
               fabric="rail-optimized", oversubscription=1.0, nics=None) -> Cluster:
    return Cluster("test-multi", nodes, g, GPUS["h100"], IntraNode("nvswitch", intra_gbps, intra_us),
                   InterNode("infiniband", nics or g, inter_gbps, inter_us, fabric, oversubscription))


def run_cli(*args, timeout=120):
    """Run `distlab ARGS` in a subprocess: (returncode, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "distlab.runtime.cli", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=os.path.dirname(os.path.dirname(__file__)))
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def cli():
    return run_cli
