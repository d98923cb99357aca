"""Loading a cluster: a preset name or a YAML file (the keys of sim/cluster/specs.py), checked before use.

Example: ``load_cluster("dgx-h100", nodes=2)``; ``load_cluster("my-cluster.yaml")``. An unknown key, a missing
one or a value out of range is one ConfigError naming the file and the key.
"""
from __future__ import annotations

import os
from dataclasses import fields

from distlab.sim.cluster.checks import validated
from distlab.sim.cluster.presets import GPUS, PRESETS
from distlab.sim.cluster.specs import Cluster, GPUSpec, InterNode, IntraNode
from distlab.sim.errors import ConfigError


def load_cluster(name_or_path: str, nodes: int | None = None) -> Cluster:
    """A preset name or a YAML file; ``nodes`` overrides the node count (on a cluster of trays, GB200 NVL72:
    the number of compute trays)."""
    if not isinstance(name_or_path, str):
        raise ConfigError(f"{name_or_path!r} must be a preset name or a cluster .yaml path", "cluster")
    if name_or_path in PRESETS:
        cluster = PRESETS[name_or_path]
    elif name_or_path.endswith((".yaml", ".yml")) or os.path.sep in name_or_path or os.path.exists(name_or_path):
        from distlab.sim.io import load_yaml
        cluster = cluster_from_dict(load_yaml(name_or_path), where=name_or_path)
    else:
        raise ConfigError(f"unknown cluster {name_or_path!r}; presets: {', '.join(PRESETS)}, or a .yaml file",
                          "--cluster")
    if nodes is not None and cluster.tray_gpus:        # a node of a cluster of trays is a compute tray
        return cluster.with_trays(nodes)
    if nodes is not None:
        if cluster.inter_node is None and nodes > 1:
            raise ConfigError(f"cluster {cluster.name!r} has no inter-node network, so nodes must be 1", "--nodes")
        cluster = cluster.with_nodes(nodes)
    return cluster


def _fields_of(cls, d: dict, where: str) -> dict:
    if not isinstance(d, dict):
        raise ConfigError(f"must be a mapping with keys {', '.join(f.name for f in fields(cls))}", where)
    allowed = {f.name: f for f in fields(cls)}
    for k in d:
        if k not in allowed:
            raise ConfigError(f"unknown key {k!r}; allowed: {', '.join(allowed)}", where)
    return dict(d)


def cluster_from_dict(d, where: str = "cluster") -> Cluster:
    d = _fields_of(Cluster, d, where)
    for key in ("name", "nodes", "gpus_per_node", "gpu", "intra_node"):
        if key not in d:
            raise ConfigError(f"missing key {key!r}", where)
    gpu = d["gpu"]
    if isinstance(gpu, str):
        if gpu not in GPUS:
            raise ConfigError(f"unknown gpu {gpu!r}; presets: {', '.join(GPUS)}, or {{tflops, hbm_GBps, memory_GiB}}",
                              f"{where}: gpu")
        gpu = GPUS[gpu]
    else:
        g = _fields_of(GPUSpec, gpu, f"{where}: gpu")
        g.setdefault("name", "custom")
        if isinstance(g.get("gemm_efficiency"), list):
            g["gemm_efficiency"] = tuple(tuple(p) if isinstance(p, list) else p for p in g["gemm_efficiency"])
        gpu = _construct(GPUSpec, g, f"{where}: gpu")
    intra = _construct(IntraNode, _fields_of(IntraNode, d["intra_node"], f"{where}: intra_node"),
                       f"{where}: intra_node")
    inter = d.get("inter_node")
    if inter is not None:
        inter = _construct(InterNode, _fields_of(InterNode, inter, f"{where}: inter_node"), f"{where}: inter_node")
    calibration = d.get("calibration") or {}
    if not isinstance(calibration, dict):
        raise ConfigError("must be a mapping (written by distlab calibrate)", f"{where}: calibration")
    from distlab.sim.calibration import check_calibration
    check_calibration(calibration, f"{where}: calibration")
    cluster = Cluster(str(d["name"]), d["nodes"], d["gpus_per_node"], gpu, intra, inter, calibration,
                      d.get("cpu_cores"), d.get("interference", 1.0), d.get("comm_interference", 1.0),
                      d.get("compute_jitter", 0.0),
                      d.get("comm_cpu_s", 0.0), d.get("comm_cpu_s_per_byte", 0.0), d.get("tray_gpus", 0),
                      d.get("domain_trays", 0))
    return validated(cluster, where)


def _construct(cls, kwargs: dict, where: str):
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(str(e), where) from None

