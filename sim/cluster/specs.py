"""Cluster specs: GPUs, the fabric inside a node, the network between nodes, and a cluster of them.

Example: ``Cluster("two-nodes", 2, 8, GPUS["h100"], IntraNode("nvswitch", 450.0, 2.0),
InterNode("infiniband", 8, 50.0, 5.0)).world_size`` is 16 (GPUS and the named clusters: presets.py). Bandwidths are per direction, GB/s = 1e9 bytes/s. ``efficiency`` is the fraction of the line rate
that collectives reach in practice (NCCL's own tuning model, or published measurements; cited per preset).
A cluster file may also carry a ``calibration`` section written by ``distlab calibrate``: per collective and
group size, the ring model's per-step latency and per-rank bandwidth fitted on a real machine.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from distlab.sim.cluster.checks import validated
from distlab.sim.errors import ConfigError


@dataclass(frozen=True)
class GPUSpec:
    name: str
    tflops: float                 # dense bf16 TFLOP/s
    hbm_GBps: float               # memory bandwidth
    memory_GiB: float
    mfu: float = 1.0              # fraction of ``tflops`` a matmul reaches (roofline ceiling)
    arch: str = "hopper"          # NCCL's tuning row: ampere, hopper, blackwell; cpu = Gloo (no NCCL protocols)
    # The per-op compute model (sim/compute/); the defaults keep the flat roofline above:
    gemm_efficiency: tuple[tuple[float, float], ...] | None = None   # (FLOPs of one GEMM, fraction of tflops)
    attention_efficiency: float | None = None   # fraction of tflops FlashAttention reaches
    launch_s: float = 0.0                       # per op the host dispatches or kernel it launches (sim/compute/)
    compute: str | None = None      # the measured kernel model (sim/compute/gpus.py KERNEL_MODELS) of a GPU preset
    fp8_tflops: float | None = None     # dense FP8 tensor-core peak (None: no FP8 tensor cores)
    fp32_tflops: float | None = None    # FP32 on the CUDA cores (torch's matmul default: no TF32)
    sustained: float | None = None      # overrides the generation's fitted sustained fraction (sim/compute/fitted.py)
    elementwise_passes: float | None = None   # overrides its fitted elementwise passes (with sustained set: 0)


@dataclass(frozen=True)
class IntraNode:
    kind: str = "nvswitch"
    bandwidth_GBps: float = 450.0  # per GPU per direction
    latency_us: float = 0.6
    efficiency: float = 1.0
    nvls: bool = False             # NVSwitch with in-switch reduction (NVLink SHARP, Hopper and later)
    nvls_busbw_GBps: float | None = None   # measured ceiling of NVLS all-reduce bus bandwidth (None: no ceiling)


@dataclass(frozen=True)
class InterNode:
    kind: str = "infiniband"
    nics_per_node: int = 8
    bandwidth_GBps: float = 50.0   # per NIC per direction
    latency_us: float = 5.0
    fabric: str = "rail-optimized"
    oversubscription: float = 1.0  # fat-tree: node uplink capacity = nics x bandwidth / oversubscription
    efficiency: float = 1.0
    nodes_per_leaf: int = 0        # leaf switches of this many nodes under one spine layer (sim/kernel/network.py):
    #                                oversubscription then applies to each leaf's uplink; 0 = no leaf tier


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: int
    gpus_per_node: int
    gpu: GPUSpec
    intra_node: IntraNode
    inter_node: InterNode | None = None
    calibration: dict = field(default_factory=dict, compare=False, hash=False)
    cpu_cores: float | None = None  # cores per node shared by its ranks' compute (CPU ranks; fewer when other
    #                                 processes load the machine, runtime/measure/load.py); None = one each
    interference: float = 1.0       # compute slows by this factor while a collective is in flight on its rank
    #                                 (NCCL kernels take SMs and HBM bandwidth; gloo's threads take cores); 1 = none
    comm_interference: float = 1.0  # a collective slows by this factor while compute runs on its ranks' node
    #                                 (CPU) or GPU (sim/kernel/cores.py CommSlowdown); 1 = none (the GPU presets)
    compute_jitter: float = 0.0     # seconds: a rank's compute of mean mu varies with variance jitter x mu between
    #                                 ranks, so each collective waits for its last member (sim/kernel/skew.py); 0 = none
    comm_cpu_s: float = 0.0         # CPU work of one collective per member rank, w = comm_cpu_s + comm_cpu_s_per_byte
    comm_cpu_s_per_byte: float = 0.0  # x bytes, shared with compute on the node's cores (sim/kernel/cores.py); 0 = none
    tray_gpus: int = 0              # GPUs per compute tray where a job takes trays of a larger NVLink domain (GB200
    #                                 NVL72: 4); 0 = a node is the unit a job takes (module docstring)
    domain_trays: int = 0           # trays in one NVLink domain (GB200 NVL72: 18); with tray_gpus

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def with_nodes(self, nodes: int) -> "Cluster":
        return validated(replace(self, nodes=nodes), "nodes")

    def with_world_size(self, world_size: int) -> "Cluster":
        """One node of ``world_size`` ranks if it fits a node (or the cluster is one machine without an inter-node
        network, as localhost-cpu: any number of ranks on this machine), else whole nodes; on a cluster of trays
        (``tray_gpus``), whole trays (``with_trays``), or a single GPU."""
        if self.tray_gpus and world_size > 1:       # one GPU: its kernels alone, no fabric (as on any preset)
            if world_size % self.tray_gpus:
                raise ConfigError(f"{world_size} GPUs, not whole compute trays of {self.tray_gpus}; "
                                  f"allowed: 1, {self.tray_gpus}, {2 * self.tray_gpus}, ...", "world_size")
            return self.with_trays(world_size // self.tray_gpus)
        if self.nodes == 1 and (world_size <= self.gpus_per_node or self.inter_node is None):
            return validated(replace(self, gpus_per_node=world_size), "world_size")
        if world_size % self.gpus_per_node:
            raise ConfigError(f"{world_size} ranks do not fill whole nodes of {self.gpus_per_node} GPUs",
                              "world_size")
        return self.with_nodes(world_size // self.gpus_per_node)

    def with_trays(self, trays: int) -> "Cluster":
        """A job of ``trays`` compute trays: NVLink reaches across each domain, so the simulator's node is the
        job's part of one domain (NCCL's MNNVL treats an NVLink clique as one node); the trays spread evenly over
        the fewest domains that hold them (assumed: a scheduler fills racks evenly, e.g. 128 GB200 = 2 racks of
        16 trays), and each domain's trays leave through their own NICs, one per GPU."""
        if isinstance(trays, bool) or not isinstance(trays, int) or trays < 1:
            raise ConfigError(f"{trays!r} must be a whole number of compute trays >= 1", "nodes")
        domains = -(-trays // self.domain_trays)
        while trays % domains:
            domains += 1
        gpus = trays // domains * self.tray_gpus
        inter = replace(self.inter_node, nics_per_node=gpus) if self.inter_node else None
        return validated(replace(self, nodes=domains, gpus_per_node=gpus, inter_node=inter), "world_size")

    @property
    def trays(self) -> int:
        """Compute trays of a cluster of trays (0 otherwise)."""
        return self.world_size // self.tray_gpus if self.tray_gpus else 0

    def to_dict(self) -> dict:
        d = {"name": self.name, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
             "gpu": gpu_to_dict(self.gpu), "intra_node": asdict(self.intra_node),
             "inter_node": inter_to_dict(self.inter_node) if self.inter_node else None}
        if self.cpu_cores is not None:
            d["cpu_cores"] = self.cpu_cores
        if self.interference != 1.0:
            d["interference"] = self.interference
        if self.comm_interference != 1.0:
            d["comm_interference"] = self.comm_interference
        if self.compute_jitter:
            d["compute_jitter"] = self.compute_jitter
        if self.comm_cpu_s or self.comm_cpu_s_per_byte:
            d["comm_cpu_s"], d["comm_cpu_s_per_byte"] = self.comm_cpu_s, self.comm_cpu_s_per_byte
        if self.tray_gpus:
            d["tray_gpus"], d["domain_trays"] = self.tray_gpus, self.domain_trays
        if self.calibration:
            d["calibration"] = self.calibration
        return d

    def to_yaml(self) -> str:
        import yaml
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def inter_to_dict(inter: InterNode) -> dict:
    """The inter_node section of a cluster file; nodes_per_leaf only where there are leaf switches."""
    d = asdict(inter)
    if not d["nodes_per_leaf"]:
        del d["nodes_per_leaf"]
    return d


def gpu_to_dict(gpu: GPUSpec) -> dict:
    """The gpu section of a cluster file; the compute-model fields only where they differ from the defaults
    (older files and outputs stay as they were), the curve as a list of [flops, fraction] pairs."""
    d = asdict(gpu)
    for key, default in (("gemm_efficiency", None), ("attention_efficiency", None), ("launch_s", 0.0),
                         ("compute", None), ("fp8_tflops", None), ("fp32_tflops", None), ("sustained", None),
                         ("elementwise_passes", None)):
        if d[key] == default:
            del d[key]
    if "gemm_efficiency" in d:
        d["gemm_efficiency"] = [[float(f), float(e)] for f, e in d["gemm_efficiency"]]
    return d
