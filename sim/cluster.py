"""Cluster specs: GPUs, the fabric inside a node, the network between nodes; presets and YAML files.

Bandwidths are per direction, GB/s = 1e9 bytes/s. ``efficiency`` is the fraction of the line rate that
collectives reach in practice (NCCL's own tuning model, or published measurements; cited per preset).
A cluster file may also carry a ``calibration`` section written by ``distlab calibrate``: per collective and
group size, the ring model's per-step latency and per-rank bandwidth fitted on a real machine.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace

from distlab.sim.errors import ConfigError

MAX_RANKS = 65536            # a bound, so that a typo cannot exhaust memory (8192 ranks simulate in seconds)
# GPUs in one node's fabric: the presets' largest is 72 (gb200-nvl72). A typo such as 65536 made one node's ring so
# long that a single all_reduce simulated for minutes; 1024 leaves room for any NVLink or PCIe node.
MAX_GPUS_PER_NODE = 1024
INTRA_KINDS = ("nvswitch", "nvlink-mesh", "pcie", "loopback")
INTER_KINDS = ("infiniband", "ethernet")
FABRICS = ("rail-optimized", "fat-tree")
GPU_ARCHS = ("ampere", "hopper", "blackwell", "cpu")   # NCCL's tuning rows (sim.collectives.protocols)


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
    #                                 processes load the machine, runtime/load.py); None = one each
    interference: float = 1.0       # compute slows by this factor while a collective is in flight on its rank
    #                                 (NCCL kernels take SMs and HBM bandwidth; gloo's threads take cores); 1 = none
    comm_interference: float = 1.0  # a collective slows by this factor while compute runs on its ranks' node
    #                                 (CPU) or GPU (sim/kernel/cores.py CommSlowdown); 1 = none (the GPU presets)
    compute_jitter: float = 0.0     # seconds: a rank's compute of mean mu varies with variance jitter x mu between
    #                                 ranks, so each collective waits for its last member (sim/kernel/skew.py); 0 = none
    comm_cpu_s: float = 0.0         # CPU work of one collective per member rank, w = comm_cpu_s + comm_cpu_s_per_byte
    comm_cpu_s_per_byte: float = 0.0  # x bytes, shared with compute on the node's cores (sim/kernel/cores.py); 0 = none

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def with_nodes(self, nodes: int) -> "Cluster":
        return _validated(replace(self, nodes=nodes), "nodes")

    def with_world_size(self, world_size: int) -> "Cluster":
        """One node of ``world_size`` ranks if it fits a node (or the cluster is one machine without an inter-node
        network, as localhost-cpu: any number of ranks on this machine), else whole nodes."""
        if self.nodes == 1 and (world_size <= self.gpus_per_node or self.inter_node is None):
            return _validated(replace(self, gpus_per_node=world_size), "world_size")
        if world_size % self.gpus_per_node:
            raise ConfigError(f"{world_size} ranks do not fill whole nodes of {self.gpus_per_node} GPUs",
                              "world_size")
        return self.with_nodes(world_size // self.gpus_per_node)

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


# --- presets ------------------------------------------------------------------------------------------------
GPUS = {
    # Peaks are datasheet dense figures (half the "with sparsity" ones); ``compute`` names the measured kernel model
    # (sim/compute/gpus.py: best GEMM, attention, HBM, SMs, per-kernel cost), which applies while the spec keeps
    # the preset's peak and bandwidth (a spec with other numbers is another GPU: the flat roofline at mfu).
    # NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOP/s dense bf16, 19.5 FP32, no FP8, 2,039 GB/s HBM2e, 80 GB.
    "a100": GPUSpec("a100", tflops=312.0, hbm_GBps=2039.0, memory_GiB=80.0, arch="ampere", compute="a100",
                    fp32_tflops=19.5),
    # NVIDIA H100 datasheet (SXM5): 989 TFLOP/s dense bf16, 1,979 FP8, 67 FP32, 3.35 TB/s HBM3, 80 GB.
    "h100": GPUSpec("h100", tflops=989.0, hbm_GBps=3350.0, memory_GiB=80.0, compute="h100", fp8_tflops=1979.0,
                    fp32_tflops=67.0),
    # NVIDIA H200 datasheet (SXM): H100 compute, 141 GB HBM3e (nvidia-smi: 143,771 MiB) at 4.8 TB/s.
    "h200": GPUSpec("h200", tflops=989.0, hbm_GBps=4800.0, memory_GiB=140.4, compute="h200", fp8_tflops=1979.0,
                    fp32_tflops=67.0),
    # NVIDIA HGX B200 / DGX B200 datasheets: 2.25 PFLOP/s dense bf16 per GPU (4.5 with sparsity), 4.5 dense FP8,
    # FP32 600 TFLOP/s for 8 GPUs (HGX B200), HBM3e 8 TB/s, 180 GB (DGX B200: 1,440 GB for 8 GPUs).
    "b200": GPUSpec("b200", tflops=2250.0, hbm_GBps=8000.0, memory_GiB=180.0, arch="blackwell", compute="b200",
                    fp8_tflops=4500.0, fp32_tflops=75.0),
    # NVIDIA GB200 NVL72 datasheet: 360 PFLOP/s bf16 with sparsity for 72 GPUs = 2.5 PFLOP/s dense per GPU, 720
    # PFLOP/s FP8 with sparsity = 5 dense, FP32 5,760 TFLOP/s = 80 per GPU; HBM3e 13.4 TB at 576 TB/s for 72 GPUs
    # = 186 GB at 8 TB/s per GPU.
    "gb200": GPUSpec("gb200", tflops=2500.0, hbm_GBps=8000.0, memory_GiB=186.0, arch="blackwell", compute="gb200",
                     fp8_tflops=5000.0, fp32_tflops=80.0),
    # NVIDIA L40S datasheet: 362 TFLOP/s dense bf16 (733 with sparsity), 733 dense FP8, 91.6 FP32, 864 GB/s GDDR6,
    # 48 GB; PCIe only. NCCL tunes sm89 with the Ampere row (tuning.cc:263-266).
    "l40s": GPUSpec("l40s", tflops=362.0, hbm_GBps=864.0, memory_GiB=48.0, arch="ampere", compute="l40s",
                    fp8_tflops=733.0, fp32_tflops=91.6),
    # A CPU rank on a laptop-class core; `distlab calibrate` replaces it with measured numbers. Gloo: no NCCL.
    "cpu": GPUSpec("cpu", tflops=0.05, hbm_GBps=10.0, memory_GiB=8.0, arch="cpu"),
}

# NDR InfiniBand / 400 GbE: ConnectX-7 400 Gb/s = 50 GB/s per NIC per direction (NVIDIA ConnectX-7 datasheet).
NDR_IB = InterNode("infiniband", 8, 50.0, 5.0, "rail-optimized")
# NVLink 5 (Blackwell): 18 links, 1.8 TB/s bidirectional = 900 GB/s per direction per GPU (NVIDIA B200 / GB200
# datasheets). Efficiency 0.802 = NCCL's 18 links x 40.1 GB/s = 721.8 GB/s (topo.h:24 SM100_NVLINK_BW, NCCL
# 2.30.7). NVLink Switch with SHARP (NVLS).
NVLINK5 = IntraNode("nvswitch", 900.0, 0.6, efficiency=0.802, nvls=True)
# The NVL72 rack's NVLink Switch fabric: NVLS all-reduce tops out at 834.6 GB/s bus bandwidth across the whole rack
# (nccl-tests all_reduce_perf, 72 GB200, 8 GiB float sum, out-of-place: coreweave/nccl-tests PR #43, "Example output
# for a full nvl72 rack run"; in-place 846.8, 4 GiB 839.2), where NCCL's model (tuning.cc:307-316, Blackwell
# nvlsEfficiency 0.74) gives about 1,000: the switch's reduction throughput, not the links, bounds it at 72 GPUs.
# 8 GPUs of a rack stay below the ceiling (NCCL's model: ~830; measured 811 GB/s on 2 trays x 4 GB200 over
# MNNVL: lixueduan.com, "GB200 MNNVL" nccl-tests, 2 nodes, 8 GPUs).
NVLINK5_NVL72 = replace(NVLINK5, nvls_busbw_GBps=834.6)

PRESETS = {
    # DGX A100: 8 x A100 SXM, NVSwitch gen 2 = NVLink 3, 12 links, 600 GB/s bidirectional = 300 GB/s per
    # direction (NVIDIA DGX A100 datasheet). Efficiency 0.8 = NCCL tuning.cc's 12 links x 20 GB/s = 240 GB/s;
    # nccl-tests shows ~232 GB/s all_reduce busbw on 8 x A100. 8 x ConnectX-6 HDR 200 Gb/s = 25 GB/s per NIC.
    "dgx-a100": Cluster("dgx-a100", 1, 8, GPUS["a100"],
                        IntraNode("nvswitch", 300.0, 0.6, efficiency=0.8),
                        InterNode("infiniband", 8, 25.0, 5.0, "rail-optimized")),
    # DGX H100: NVLink 4, 18 links, 900 GB/s bidirectional = 450 GB/s per direction (DGX H100 datasheet).
    # Efficiency 0.824 = NCCL tuning.cc's 18 links x 20.6 GB/s = 370.8 GB/s (nccl-tests: ~370 GB/s busbw ring,
    # ~480 GB/s NVLS). NVSwitch gen 3 has NVLink SHARP (NVLS). 8 x ConnectX-7 NDR 400 Gb/s, one per GPU.
    # Two nodes over the 8 NICs: 400-450 GB/s all_reduce busbw at 8 GB (Saturn Cloud, "Validating Multi-Node GPU
    # Clusters with NCCL Tests": H100 SXM, NVLink + IB NDR).
    "dgx-h100": Cluster("dgx-h100", 1, 8, GPUS["h100"],
                        IntraNode("nvswitch", 450.0, 0.6, efficiency=0.824, nvls=True), NDR_IB),
    # The same nodes on 400 GbE RoCE (ConnectX-7 in Ethernet mode, 50 GB/s per NIC; Meta's RoCE clusters, Gangidi
    # et al., "RDMA over Ethernet for Distributed AI Training at Meta Scale", SIGCOMM 2024). Latency and
    # efficiency: no published figure found; InfiniBand's values are used.
    "dgx-h100-roce": Cluster("dgx-h100-roce", 1, 8, GPUS["h100"],
                             IntraNode("nvswitch", 450.0, 0.6, efficiency=0.824, nvls=True),
                             InterNode("ethernet", 8, 50.0, 5.0, "rail-optimized")),
    # HGX H200: the same NVLink 4 baseboard and NDR network as DGX H100, with H200 GPUs.
    "hgx-h200": Cluster("hgx-h200", 1, 8, GPUS["h200"],
                        IntraNode("nvswitch", 450.0, 0.6, efficiency=0.824, nvls=True), NDR_IB),
    # HGX H800 (DeepSeek-V3's cluster, arXiv 2412.19437 sec. 3.1): H100 compute with NVLink cut to 400 GB/s
    # bidirectional = 200 GB/s per direction (NVIDIA H800 SXM5 datasheet); efficiency 0.8 = the 160 GB/s the
    # paper reports NVLink reaching (sec. 3.2.2), beside 50 GB/s InfiniBand per GPU (8 x 400 Gb/s NICs).
    "hgx-h800": Cluster("hgx-h800", 1, 8, GPUSpec("h800", tflops=989.0, hbm_GBps=3350.0, memory_GiB=80.0,
                                                  compute="h800", fp8_tflops=1979.0, fp32_tflops=67.0),
                        IntraNode("nvswitch", 200.0, 0.6, efficiency=0.8), NDR_IB),   # NVLS: not documented for H800
    # DGX B200: 8 x B200 on NVLink 5 (2 NVLink Switch chips), 8 x ConnectX-7 400 Gb/s (DGX B200 datasheet).
    # Measured nccl-tests busbw: no published figure found.
    "dgx-b200": Cluster("dgx-b200", 1, 8, GPUS["b200"], NVLINK5, NDR_IB),
    # GB200 NVL72: 72 GPUs in one NVLink 5 domain (18 compute trays, 9 NVLink Switch trays), one ConnectX-7
    # 400 Gb/s per GPU (NVIDIA GB200 NVL72 datasheet); a "node" here is the rack. `--nodes N` = N racks over
    # InfiniBand. NVLS at 72 GPUs: the measured ceiling above.
    "gb200-nvl72": Cluster("gb200-nvl72", 1, 72, GPUS["gb200"], NVLINK5_NVL72,
                           InterNode("infiniband", 72, 50.0, 5.0, "rail-optimized")),
    # Racks of GB200 NVL72 on 400 GbE RoCE (Spectrum-X); latency and efficiency: no published figure found.
    "gb200-nvl72-roce": Cluster("gb200-nvl72-roce", 1, 72, GPUS["gb200"], NVLINK5_NVL72,
                                InterNode("ethernet", 72, 50.0, 5.0, "rail-optimized")),
    # 8 x L40S on PCIe 4 x16 (~32 GB/s per direction, PCI-SIG), no NVLink; NCCL tuning.cc PCIe per-hop
    # latency ~1 us (LL). One 200 GbE NIC per 4 GPUs (25 GB/s), fat-tree.
    "pcie-8gpu": Cluster("pcie-8gpu", 1, 8, GPUS["l40s"],
                         IntraNode("pcie", 32.0, 1.0, efficiency=0.8),
                         InterNode("ethernet", 2, 25.0, 10.0, "fat-tree")),
    # N CPU ranks on this machine talking through Gloo over loopback TCP. Measured here: all_reduce of 64 MiB
    # ~50 ms with 2 ranks (1.34 GB/s), 1 MiB ~1 ms (../shared/REFERENCES.md). `distlab calibrate` refines it.
    "localhost-cpu": Cluster("localhost-cpu", 1, 2, GPUS["cpu"],
                             IntraNode("loopback", 1.34, 100.0), None),
}

# Interference on GPUs: Lee et al., "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed
# Deep Learning: Performance and Power Implications", arXiv 2507.03114 (2025): GPT and LLaMA training on 4 x A100,
# 4 x H100, MI250 and MI210: compute overlapped with communication runs 18.9% slower on average (40.0% at most)
# than alone. Their average over GPUs and models; B200, GB200 and L40S were not measured: the same value.
GPU_INTERFERENCE = 1.189
PRESETS = {name: c if c.gpu.arch == "cpu" else replace(c, interference=GPU_INTERFERENCE)
           for name, c in PRESETS.items()}


# --- loading -----------------------------------------------------------------------------------------------
def load_cluster(name_or_path: str, nodes: int | None = None) -> Cluster:
    """A preset name or a YAML file; ``nodes`` overrides the node count."""
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
                      d.get("comm_cpu_s", 0.0), d.get("comm_cpu_s_per_byte", 0.0))
    return _validated(cluster, where)


def _construct(cls, kwargs: dict, where: str):
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(str(e), where) from None


def _positive(value, where: str, integer: bool = False, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if integer:
        ok = ok and isinstance(value, int)
    if not ok or (value < 0 if allow_zero else value <= 0) or value == float("inf"):
        what = "a whole number" if integer else "a number"
        raise ConfigError(f"{value!r} must be {what} {'>= 0' if allow_zero else '> 0'}", where)
    if value > 1e9 or 0 < value < 1e-6:
        raise ConfigError(f"{value!r} is out of range: use a value between 1e-06 and 1e+09", where)


def _check_interference(value, where: str, none: str = "compute does not slow while a collective runs") -> None:
    if not (_is_number(value) and 1 <= value <= 100):
        raise ConfigError(f"{value!r} must be a factor >= 1 (1 = {none}; at most 100)", where)


def _check_comm_cpu(c: Cluster, where: str) -> None:
    """comm_cpu_s and comm_cpu_s_per_byte: numbers >= 0 (below 1 s and 1 s per byte), only with cpu_cores."""
    for key in ("comm_cpu_s", "comm_cpu_s_per_byte"):
        value = getattr(c, key)
        if not (_is_number(value) and 0 <= value < 1):
            raise ConfigError(f"{value!r} must be a number of seconds >= 0 and < 1 (0 = no CPU work)", f"{where}: {key}")
    if (c.comm_cpu_s or c.comm_cpu_s_per_byte) and c.cpu_cores is None:
        raise ConfigError("a collective's CPU work needs the cores it shares: set cpu_cores too; allowed without "
                          "cpu_cores: comm_cpu_s 0 and comm_cpu_s_per_byte 0", f"{where}: comm_cpu_s")


def _validated(c: Cluster, where: str) -> Cluster:
    _positive(c.nodes, f"{where}: nodes", integer=True)
    _positive(c.gpus_per_node, f"{where}: gpus_per_node", integer=True)
    if c.gpus_per_node > MAX_GPUS_PER_NODE:
        raise ConfigError(f"{c.gpus_per_node} GPUs in one node is more than the simulator takes (at most "
                          f"{MAX_GPUS_PER_NODE}; more GPUs: more nodes)", f"{where}: gpus_per_node")
    if c.nodes * c.gpus_per_node > MAX_RANKS:
        raise ConfigError(f"{c.nodes} nodes x {c.gpus_per_node} GPUs is more than the simulator takes "
                          f"(at most {MAX_RANKS} ranks)", where)
    if c.cpu_cores is not None:
        _positive(c.cpu_cores, f"{where}: cpu_cores")
    _check_interference(c.interference, f"{where}: interference")
    _check_interference(c.comm_interference, f"{where}: comm_interference",
                        "a collective does not slow while compute runs")
    if not (_is_number(c.compute_jitter) and 0 <= c.compute_jitter <= 1):
        raise ConfigError(f"{c.compute_jitter!r} must be seconds between 0 and 1 (0 = ranks compute alike)",
                          f"{where}: compute_jitter")
    _check_comm_cpu(c, where)
    for key in ("tflops", "hbm_GBps", "memory_GiB", "mfu"):
        _positive(getattr(c.gpu, key), f"{where}: gpu.{key}")
    _check_compute_model(c.gpu, f"{where}: gpu")
    if c.gpu.arch not in GPU_ARCHS:
        raise ConfigError(f"unknown arch {c.gpu.arch!r}; allowed: {', '.join(GPU_ARCHS)}", f"{where}: gpu.arch")
    if c.intra_node.kind not in INTRA_KINDS:
        raise ConfigError(f"unknown kind {c.intra_node.kind!r}; allowed: {', '.join(INTRA_KINDS)}",
                          f"{where}: intra_node.kind")
    _positive(c.intra_node.bandwidth_GBps, f"{where}: intra_node.bandwidth_GBps")
    _positive(c.intra_node.latency_us, f"{where}: intra_node.latency_us", allow_zero=True)
    _positive(c.intra_node.efficiency, f"{where}: intra_node.efficiency")
    if c.intra_node.efficiency > 1:
        raise ConfigError("efficiency must be in (0, 1]", f"{where}: intra_node.efficiency")
    if c.intra_node.nvls_busbw_GBps is not None:
        _positive(c.intra_node.nvls_busbw_GBps, f"{where}: intra_node.nvls_busbw_GBps")
    inter = c.inter_node
    if inter is None:
        if c.nodes > 1:
            raise ConfigError("more than one node needs an inter_node network", f"{where}: inter_node")
        return c
    if inter.kind not in INTER_KINDS:
        raise ConfigError(f"unknown kind {inter.kind!r}; allowed: {', '.join(INTER_KINDS)}",
                          f"{where}: inter_node.kind")
    if inter.fabric not in FABRICS:
        raise ConfigError(f"unknown fabric {inter.fabric!r}; allowed: {', '.join(FABRICS)}",
                          f"{where}: inter_node.fabric")
    _positive(inter.nics_per_node, f"{where}: inter_node.nics_per_node", integer=True)
    _positive(inter.bandwidth_GBps, f"{where}: inter_node.bandwidth_GBps")
    _positive(inter.latency_us, f"{where}: inter_node.latency_us", allow_zero=True)
    _positive(inter.efficiency, f"{where}: inter_node.efficiency")
    if inter.efficiency > 1:
        raise ConfigError("efficiency must be in (0, 1]", f"{where}: inter_node.efficiency")
    if not _is_number(inter.oversubscription) or not 1 <= inter.oversubscription <= 1e6:
        raise ConfigError(f"{inter.oversubscription!r} must be a number >= 1 (1 = non-blocking) and at most 1e6",
                          f"{where}: inter_node.oversubscription")
    leaf = inter.nodes_per_leaf
    if isinstance(leaf, bool) or not isinstance(leaf, int) or not 0 <= leaf <= MAX_RANKS:
        raise ConfigError(f"{leaf!r} must be a whole number of nodes >= 0 (0 = no leaf switches)",
                          f"{where}: inter_node.nodes_per_leaf")
    return c


def _check_compute_model(gpu: GPUSpec, where: str) -> None:
    """gemm_efficiency: (flops, fraction) pairs, flops > 0 strictly increasing, fraction in (0, 1];
    attention_efficiency in (0, 1]; launch_s >= 0; compute a kernel model of sim/compute/gpus.py; fp8_tflops and
    fp32_tflops > 0; sustained in (0, 1]; elementwise_passes in [0, 1000)."""
    curve = gpu.gemm_efficiency
    if curve is not None:
        ok = isinstance(curve, tuple) and len(curve) >= 1 and all(
            isinstance(p, tuple) and len(p) == 2 and all(_is_number(x) for x in p) for p in curve)
        if not ok or any(f <= 0 or not 0 < e <= 1 for f, e in curve) or any(
                a[0] >= b[0] for a, b in zip(curve, curve[1:])):
            raise ConfigError(f"{curve!r} must be a list of [flops, fraction] pairs, flops > 0 increasing, "
                              "fraction in (0, 1]", f"{where}.gemm_efficiency")
    a = gpu.attention_efficiency
    if a is not None and (not _is_number(a) or not 0 < a <= 1):
        raise ConfigError(f"{a!r} must be a number in (0, 1]", f"{where}.attention_efficiency")
    if not _is_number(gpu.launch_s) or not 0 <= gpu.launch_s < 1:
        raise ConfigError(f"{gpu.launch_s!r} must be a number of seconds in [0, 1)", f"{where}.launch_s")
    from distlab.sim.compute.gpus import KERNEL_MODELS
    if gpu.compute is not None and gpu.compute not in KERNEL_MODELS:
        raise ConfigError(f"unknown kernel model {gpu.compute!r}; allowed: {', '.join(KERNEL_MODELS)} (or leave it "
                          "out: a flat roofline at mfu)", f"{where}.compute")
    for key in ("fp8_tflops", "fp32_tflops"):
        v = getattr(gpu, key)
        if v is not None:
            _positive(v, f"{where}.{key}")
    s = gpu.sustained
    if s is not None and (not _is_number(s) or not 0 < s <= 1):
        raise ConfigError(f"{s!r} must be a number in (0, 1] (the fraction of the kernel rates a job sustains)",
                          f"{where}.sustained")
    e = gpu.elementwise_passes
    if e is not None and (not _is_number(e) or not 0 <= e < 1000):
        raise ConfigError(f"{e!r} must be a number in [0, 1000) (HBM passes over a block's activations)",
                          f"{where}.elementwise_passes")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")
