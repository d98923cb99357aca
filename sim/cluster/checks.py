"""The limits of a cluster spec and the checks a cluster passes before it is simulated: every number positive
and in range, every kind one the simulator models. A bad value is one ConfigError naming its key.

Example: ``validated(replace(PRESETS["dgx-h100"], nodes=0), "--nodes")`` raises
``ConfigError("0 must be a whole number > 0", "--nodes: nodes")``.

The functions take any object with a Cluster's fields (sim/cluster/specs.py): the spec imports these checks,
so they cannot import the spec.
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError

MAX_RANKS = 262144           # a bound, so that a typo cannot exhaust memory: 2^18, twice today's largest training
#                              clusters (100,000+ GPUs); a step on 131,072 GPUs simulates in seconds where its ranks
#                              fall into a few classes (benchmarks/reproduce_speed.py)
# GPUs in one node's fabric: the presets' largest is 72 (gb200-nvl72). A typo such as 65536 made one node's ring so
# long that a single all_reduce simulated for minutes; 1024 leaves room for any NVLink or PCIe node.
MAX_GPUS_PER_NODE = 1024
INTRA_KINDS = ("nvswitch", "nvlink-mesh", "pcie", "loopback")
INTER_KINDS = ("infiniband", "ethernet")
FABRICS = ("rail-optimized", "fat-tree")
GPU_ARCHS = ("ampere", "hopper", "blackwell", "cpu")   # NCCL's tuning rows (sim.collectives.protocols)


def nodes_bound(cluster) -> tuple[int, str]:
    """The most nodes a job may take on ``cluster`` (MAX_RANKS over a node's GPUs; on GB200 NVL72 a node is a
    compute tray of 4, sim/cluster/load.py) and their unit for a range error: ``(32768, "nodes of 8 GPUs")``."""
    per = cluster.tray_gpus or cluster.gpus_per_node
    return MAX_RANKS // per, f"{'trays' if cluster.tray_gpus else 'nodes'} of {per} GPUs"


def _positive(value, where: str, integer: bool = False, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if integer:
        ok = ok and isinstance(value, int)
    if not ok or (value < 0 if allow_zero else value <= 0) or value == float("inf"):
        what = "a whole number" if integer else "a number"
        raise ConfigError(f"{value!r} must be {what} {'>= 0' if allow_zero else '> 0'}", where)
    if value > 1e9 or 0 < value < 1e-6:
        allowed = "a whole number up to 1,000,000,000" if integer else "a number from 0.000001 to 1,000,000,000"
        raise ConfigError(f"{value!r} is out of range; allowed: {allowed}", where)


def _check_interference(value, where: str, none: str = "compute does not slow while a collective runs") -> None:
    if not (_is_number(value) and 1 <= value <= 100):
        raise ConfigError(f"{value!r} must be a factor >= 1 (1 = {none}; at most 100)", where)


def _check_comm_cpu(c, where: str) -> None:
    """comm_cpu_s and comm_cpu_s_per_byte: numbers >= 0 (below 1 s and 1 s per byte), only with cpu_cores."""
    for key in ("comm_cpu_s", "comm_cpu_s_per_byte"):
        value = getattr(c, key)
        if not (_is_number(value) and 0 <= value < 1):
            raise ConfigError(f"{value!r} must be a number of seconds >= 0 and < 1 (0 = no CPU work)", f"{where}: {key}")
    if (c.comm_cpu_s or c.comm_cpu_s_per_byte) and c.cpu_cores is None:
        raise ConfigError("a collective's CPU work needs the cores it shares: set cpu_cores too; allowed without "
                          "cpu_cores: comm_cpu_s 0 and comm_cpu_s_per_byte 0", f"{where}: comm_cpu_s")


def validated(c, where: str):
    """``c`` (a Cluster) when every field is allowed, else ConfigError naming the first bad key."""
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
    _check_trays(c, where)
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


def _check_trays(c, where: str) -> None:
    """tray_gpus and domain_trays: both 0 (no trays) or whole numbers >= 1, and the nodes whole trays (or one GPU)."""
    for key in ("tray_gpus", "domain_trays"):
        v = getattr(c, key)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_GPUS_PER_NODE:
            raise ConfigError(f"{v!r} must be a whole number >= 0 (0 = no trays) and at most {MAX_GPUS_PER_NODE}",
                              f"{where}: {key}")
    if bool(c.tray_gpus) != bool(c.domain_trays):
        raise ConfigError("tray_gpus and domain_trays go together (GPUs per tray, trays per NVLink domain); "
                          "allowed: both set or both 0", f"{where}: tray_gpus")
    single = c.nodes == 1 and c.gpus_per_node == 1                 # one GPU: its kernels alone
    if c.tray_gpus and not single and (c.gpus_per_node % c.tray_gpus
                                       or c.gpus_per_node > c.tray_gpus * c.domain_trays):
        raise ConfigError(f"a node of {c.gpus_per_node} GPUs is not whole trays of {c.tray_gpus} inside one "
                          f"NVLink domain of {c.domain_trays} trays", f"{where}: gpus_per_node")


def _check_compute_model(gpu, where: str) -> None:
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
