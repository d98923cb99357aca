"""Clusters: what the simulator runs on. ``load_cluster("dgx-h100", nodes=4)`` is 4 DGX H100 nodes (32 GPUs).

- specs.py: the dataclasses (GPUSpec, IntraNode, InterNode, Cluster) and their file form;
- presets.py: the named GPUs and clusters, each number cited;
- load.py: a preset name or a YAML file, checked (checks.py: the limits and checks every cluster passes).

Everything is importable from here: ``from distlab.sim.cluster import Cluster, PRESETS, load_cluster``.
"""
from distlab.sim.cluster.checks import (FABRICS, GPU_ARCHS, INTER_KINDS, INTRA_KINDS, MAX_GPUS_PER_NODE, MAX_RANKS,
                                        nodes_bound, validated)
from distlab.sim.cluster.load import cluster_from_dict, load_cluster
from distlab.sim.cluster.presets import GPU_INTERFERENCE, GPUS, NDR_IB, NVLINK5, NVLINK5_NVL72, PRESETS
from distlab.sim.cluster.specs import Cluster, GPUSpec, InterNode, IntraNode, gpu_to_dict, inter_to_dict

__all__ = ["FABRICS", "GPU_ARCHS", "INTER_KINDS", "INTRA_KINDS", "MAX_GPUS_PER_NODE", "MAX_RANKS", "nodes_bound",
           "validated",
           "cluster_from_dict", "load_cluster", "GPU_INTERFERENCE", "GPUS", "NDR_IB", "NVLINK5", "NVLINK5_NVL72",
           "PRESETS", "Cluster", "GPUSpec", "InterNode", "IntraNode", "gpu_to_dict", "inter_to_dict"]
