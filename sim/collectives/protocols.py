"""NCCL's protocols and its tuning model's per-call costs (NCCL 2.30.7, src/graph/tuning.cc, commit 5067397).

NCCL predicts a collective's time as  t = latency(algorithm, protocol) + S / bandwidth(algorithm, protocol)
(tuning.cc:653) and runs the pair with the lowest t (enqueue.cc:2032-2048). The simulator keeps NCCL's latency
terms and turns its bandwidth factors into bytes on the wire, so contention still comes from the network model:
- base latency, paid once per call: baseLatencies[algorithm][protocol] (tuning.cc:150-155), plus the terms that
  NCCL charges per call rather than per step (NVLS: 25 us; PAT: 2.8 us x ranks; tuning.cc:424-434);
- hop latency per step: the route's latency from the cluster spec (what a step costs with LL, the lightest
  protocol), plus hwLatencies[hw][algorithm][protocol] - hwLatencies[hw][Ring][LL] (tuning.cc:157-175), the
  extra handshake a heavier protocol pays per hop, hw = NVLINK, PCI or NET (a step that crosses nodes);
- efficiency e: each flow carries S / e bytes. LL sends 8-byte lines of 4 data bytes and 4 flag bytes (e = 0.5,
  tuning.cc:327), LL128 120 data bytes per 128-byte line (NCCL uses 0.92, tuning.cc:329), Simple moves the data
  as is (1.0). LL is also capped at llMaxBws of bus bandwidth (tuning.cc:178-183, :327): e <= cap / B, with B the
  ring's bus bandwidth as NCCL's tuner takes it (``gpu_bus_GBps``: NVLink on up to 2 nodes, so 2-node LL runs at
  most 39 GB/s of busbw). Trees: x 0.92, LL / 3.8, LL128 x 7/9 on one node (tuning.cc:330-335); PAT x 0.75
  (:337); NVLS x nvlsEfficiency of the GPU generation (Hopper 0.85, Blackwell 0.74; tuning.cc:139-144), capped
  where a fabric's measured NVLS bus bandwidth is lower (IntraNode.nvls_busbw_GBps: GB200 NVL72 at 72 GPUs).
- trees' all_reduce at medium sizes: x treeCorrectionFactor[protocol][log2(S / 64 B)] (NCCL's measured tree
  efficiency, 0.4-1.0 from 64 B to 512 MiB, 1.0 beyond; tuning.cc:623-627, src/tuning/cost_model.cc in 2.29+).
Left out: per-channel caps (perChMax*Bws, they need NCCL's channel search) and the ring's multi-node plateau
factor (tuning.cc:647-650).
CPU clusters (gpu arch "cpu": Gloo) have no protocols: one "Simple" with no base latency and e = 1.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from distlab.sim.errors import ConfigError

PROTOCOLS = ("LL", "LL128", "Simple")
NVLINK, PCI, NET = 0, 1, 2                      # hardware class of a step (network.Pairs.hw)

# tuning.cc:150-155 baseLatencies (us), per algorithm: (LL, LL128, Simple)
BASE_US = {"Tree": (6.8, 14.0, 8.4), "Ring": (6.6, 14.0, 8.4), "NVLS": (0, 0, 0), "NVLSTree": (0, 0, 0),
           "PAT": (8.0, 8.0, 8.0)}
# tuning.cc:157-175 hwLatencies (us), per hardware class and algorithm: (LL, LL128, Simple)
HW_US = {
    NVLINK: {"Tree": (0.6, 1.25, 4.0), "Ring": (0.6, 1.9, 3.4), "NVLS": (0, 0, 25), "NVLSTree": (0, 0, 25),
             "PAT": (0, 0, 4.0)},
    PCI: {"Tree": (1.0, 1.9, 4.0), "Ring": (1.0, 2.5, 5.7), "NVLS": (0, 0, 0), "NVLSTree": (0, 0, 0),
          "PAT": (0, 0, 4.0)},
    NET: {"Tree": (5.0, 8.5, 14), "Ring": (2.7, 4.0, 14.0), "NVLS": (0, 0, 18), "NVLSTree": (0, 0, 20.9),
          "PAT": (0, 0, 14)},
}
# tuning.cc:178-183 llMaxBws (GB/s of bus bandwidth): one node by GPU generation; several nodes (x86 Intel
# row) by node count 2 or >= 3.
LL_MAX_ONE_NODE = {"ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
LL_MAX_NODES = (39.0, 20.4)
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}   # tuning.cc:139-144 (0 before Hopper: no NVLS)
# tuning.cc:623-627 treeCorrectionFactor, per protocol (LL, LL128, Simple), index log2i(bytes >> 6) (64 B .. 512 MiB)
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9))

# NCCL's algorithm whose hop latencies a simulator algorithm's steps pay (None: no per-hop protocol cost)
HOP_ROW = {"ring": "Ring", "tree": "Tree", "hierarchical": "Ring", "direct": "Ring", "nvls": None,
           "nvls_tree": "NVLSTree", "pat": None}


@dataclass(frozen=True)
class ProtocolCost:
    base_s: float                          # once per call
    hop_extra_s: tuple[float, float, float]  # added to each step's route latency, by hw class
    stretch: float                         # bytes on the wire per byte of data (1 / efficiency)


def protocols_for(module, cluster) -> tuple[str, ...]:
    """The protocols ``module`` runs with on ``cluster`` (NVLS, NVLS-tree, PAT: Simple only, tuning.cc:301-303)."""
    return ("Simple",) if cluster.gpu.arch == "cpu" else module.PROTOCOLS


def cost(name: str, proto: str, cluster, n: int, nodes: int, op: str = "", nbytes: float = 0) -> ProtocolCost:
    """The per-call terms of algorithm ``name`` with protocol ``proto`` for a group of n ranks on ``nodes``
    (``op`` and ``nbytes``: a tree all_reduce's medium-size correction)."""
    if cluster.gpu.arch == "cpu":
        return ProtocolCost(0.0, (0.0, 0.0, 0.0), 1.0)
    p = PROTOCOLS.index(proto)
    row = HOP_ROW[name]
    extra = tuple(0.0 if row is None or (name == "nvls_tree" and hw != NET)
                  else max(0.0, HW_US[hw][row][p] - HW_US[hw]["Ring"][0]) * 1e-6 for hw in (NVLINK, PCI, NET))
    e = efficiency(name, p, cluster, nodes, n) * tree_correction(name, p, op, nbytes)
    if name == "nvls" and getattr(cluster.intra_node, "nvls_busbw_GBps", None) and n > 1:
        e = min(e, nvls_ceiling(cluster, n))
    return ProtocolCost(base_latency_us(name, p, n) * 1e-6, extra, 1.0 / e)


def nvls_ceiling(cluster, n: int) -> float:
    """The efficiency at which NVLS's bus bandwidth on ``n`` GPUs equals the fabric's measured ceiling
    (IntraNode.nvls_busbw_GBps): sim/collectives/nvls.py moves (n+1)/n·S per GPU, nccl-tests' busbw is
    2(n-1)/n·S / t, so busbw = 2(n-1)/(n+1) · B · e with B the GPU's NVLink bandwidth."""
    intra = cluster.intra_node
    return intra.nvls_busbw_GBps * (n + 1) / (2 * (n - 1) * intra.bandwidth_GBps * intra.efficiency)


def tree_correction(name: str, p: int, op: str, nbytes: float) -> float:
    """NCCL's treeCorrectionFactor for a tree all_reduce of ``nbytes`` (module docstring), else 1."""
    if name != "tree" or op != "all_reduce" or nbytes < 64:
        return 1.0
    log_size = int(nbytes) >> 6
    log_size = log_size.bit_length() - 1                     # log2i
    return TREE_CORRECTION[p][log_size] if log_size < len(TREE_CORRECTION[p]) else 1.0


def base_latency_us(name: str, p: int, n: int) -> float:
    """Once per call: baseLatencies (tuning.cc:150-155); NVLS and NVLS-tree add the NVLS latency (25 us, NVLINK
    hwLatency, tuning.cc:161, :425, :428); PAT its linear part 2.8 us x n (tuning.cc:431-433)."""
    if name in ("nvls", "nvls_tree"):
        return HW_US[NVLINK]["NVLS"][2]
    if name == "pat":
        return BASE_US["PAT"][p] + 2.8 * n
    return BASE_US["Tree" if name == "tree" else "Ring"][p]


def efficiency(name: str, p: int, cluster, nodes: int, n: int | None = None) -> float:
    """Fraction of the Simple bandwidth the protocol reaches (module docstring; tuning.cc:327-337), for a group of
    ``n`` ranks (default: every GPU of ``nodes`` nodes)."""
    arch = cluster.gpu.arch
    if name in ("nvls", "nvls_tree"):
        return NVLS_EFFICIENCY.get(arch, 0.85)
    if name == "pat":
        return 0.75
    if name == "tree":
        e = (0.92 / 3.8, 0.92 * (7 / 9 if nodes == 1 else 120 / 128), 0.92)[p]
    else:
        e = (0.5, 0.92, 1.0)[p]
    if p == 0:
        cap = LL_MAX_ONE_NODE.get(arch, 141.0) if nodes == 1 else LL_MAX_NODES[0 if nodes == 2 else 1]
        e = min(e, cap / gpu_bus_GBps(cluster, nodes, n))
    return e


def gpu_bus_GBps(cluster, nodes: int, n: int | None = None) -> float:
    """B: the bus bandwidth of the ring whose share the LL cap bounds, as NCCL's tuner takes it (NCCL 2.21-2.30,
    tuning.cc ncclTopoTuneModel: busBw = nChannels x bw, bw = bwIntra on one or two nodes, bwInter beyond, then
    ring LL busBw = min(llMaxBw, busBw x 0.5)): the NVLink (or PCIe) bus bandwidth of a GPU on up to 2 nodes, and
    beyond, the lower of that and the node's NICs together (the ring's channels spread over them, so nChannels x
    bwInter is their sum, not one GPU's share). A communicator of ``n`` ranks on ``nodes`` nodes with fewer ranks
    per node than GPUs (a DP group beside TP) reaches only its ranks' share of the NICs: NCCL's topology search
    for that communicator sees those GPUs and their NICs only."""
    intra = cluster.intra_node
    b = intra.bandwidth_GBps * intra.efficiency
    inter = cluster.inter_node
    if nodes > 2 and inter is not None:
        share = 1.0 if n is None else min(1.0, n / nodes / cluster.gpus_per_node)
        b = min(b, inter.bandwidth_GBps * inter.efficiency * max(1.0, inter.nics_per_node * share))
    return b


def check_protocol(proto: str, where: str = "protocol") -> str:
    if proto != "auto" and proto not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {proto!r}; allowed: auto, {', '.join(PROTOCOLS)}", where)
    return proto


def parse_nccl_list(value: str, allowed: dict, where: str) -> set:
    """NCCL_ALGO / NCCL_PROTO syntax (tuning.cc:36-54), without per-function prefixes: "A,B" enables A and B,
    "^A,B" everything but A and B; names are case-insensitive. ``allowed`` maps NCCL names to ours."""
    text = value.strip()
    negate = text.startswith("^")
    names = [t.strip() for t in text.lstrip("^").split(",") if t.strip()]
    lower = {k.lower(): v for k, v in allowed.items()}
    unknown = [t for t in names if t.lower() not in lower]
    if ";" in text or ":" in text or unknown or not names:
        bad = unknown[0] if unknown else text
        raise ConfigError(f"{bad!r} is not understood; allowed: a comma list (optionally starting with ^) of "
                          f"{', '.join(allowed)}", where)
    chosen = {lower[t.lower()] for t in names}
    return set(allowed.values()) - chosen if negate else chosen


def env_protocols() -> set | None:
    """Protocols NCCL_PROTO allows (None: unset)."""
    value = os.environ.get("NCCL_PROTO")
    return None if not value else parse_nccl_list(value, {p: p for p in PROTOCOLS}, "NCCL_PROTO")


def env_algorithms(nccl_names: dict) -> set | None:
    """Our algorithms NCCL_ALGO allows (None: unset); ``nccl_names`` maps ours to NCCL's."""
    value = os.environ.get("NCCL_ALGO")
    return None if not value else parse_nccl_list(value, {v: k for k, v in nccl_names.items()}, "NCCL_ALGO")
