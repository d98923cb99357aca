"""The preset clusters and GPUs (``distlab simulate --cluster dgx-h100``): every number from a datasheet or a
cited measurement, named where it is used.

Example: ``PRESETS["dgx-h100"].world_size`` is 8; ``load_cluster("dgx-h100", nodes=4)`` gives 32 GPUs.
"""
from __future__ import annotations

from dataclasses import replace

from distlab.sim.cluster.specs import Cluster, GPUSpec, InterNode, IntraNode

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
# Held to the same log size by size (docs/accuracy.md): 586, 681, 758 GB/s at 512 MiB, 1 GiB, 2 GiB, where the
# preset gives 805-818 (+37%, +19%, +8%): the ceiling is right, the ramp to it over 72 ranks is slower than the
# model's (not corrected: a ramp, not a bandwidth number; the published log has no size below 512 MiB).

PRESETS = {
    # DGX A100: 8 x A100 SXM, NVSwitch gen 2 = NVLink 3, 12 links, 600 GB/s bidirectional = 300 GB/s per
    # direction (NVIDIA DGX A100 datasheet). Efficiency 0.8 = NCCL tuning.cc's 12 links x 20 GB/s = 240 GB/s;
    # nccl-tests shows ~232 GB/s all_reduce busbw on 8 x A100. 8 x ConnectX-6 HDR 200 Gb/s = 25 GB/s per NIC.
    # Held to a real log (tests/data/nccl_tests, benchmarks/ingest_accuracy.py, docs/accuracy.md): 8 x A100-SXM4-80GB,
    # nccl-tests 2.19.4, NCCL 2.19.3, one process driving 8 GPUs (-g 8), 8 B-128 MiB: measured busbw 27 GB/s at
    # 1 MiB, 108 at 16 MiB, 181 at 128 MiB; this preset gives 51, 169, 227 (+47% mean in 1-128 MiB). Not corrected:
    # the log's time beyond S x 2(n-1)/n at the 232 GB/s plateau grows from 59 us at 1 MiB to 147 at 16 MiB and
    # 283 at 128 MiB. NCCL's own model has no such term for a one-node ring: its latency is constant (ring Simple
    # 8.4 + 14 x 3.4 = 56 us, the 1 MiB figure), its mid-size corrections are for trees (treeCorrectionFactor)
    # and for rings across nodes (ncclTopoGetAlgoTime's "plateau effect": latency x 1.9, NCCL 2.8), and it drops
    # channels only while nBytes < nChannels x nThreads x threadThreshold (~1 MiB here, enqueue.cc). The likeliest
    # cause, not measured here, is each channel's pipeline of chunks filling; no cited constant models it. The log
    # (-g 8: one thread launching on 8 GPUs) stops at 128 MiB, before the plateau. Calibrate for DDP buckets.
    "dgx-a100": Cluster("dgx-a100", 1, 8, GPUS["a100"],
                        IntraNode("nvswitch", 300.0, 0.6, efficiency=0.8),
                        InterNode("infiniband", 8, 25.0, 5.0, "rail-optimized")),
    # DGX H100: NVLink 4, 18 links, 900 GB/s bidirectional = 450 GB/s per direction (DGX H100 datasheet).
    # Efficiency 0.824 = NCCL tuning.cc's 18 links x 20.6 GB/s = 370.8 GB/s (nccl-tests: ~370 GB/s busbw ring,
    # ~480 GB/s NVLS). NVSwitch gen 3 has NVLink SHARP (NVLS). 8 x ConnectX-7 NDR 400 Gb/s, one per GPU.
    # Two nodes over the 8 NICs: 400-450 GB/s all_reduce busbw at 8 GB (Saturn Cloud, "Validating Multi-Node GPU
    # Clusters with NCCL Tests": H100 SXM, NVLink + IB NDR).
    # Held to real logs (docs/accuracy.md): 2 x 8 H100 on Oracle Cloud BM.GPU.H100.8 (RoCE, NCCL 2.21.5) measures
    # 446-465 GB/s busbw at 1-16 GiB, this preset 480-493 (+6%). Logs of other systems sized onto it miss by far
    # more and are not corrections: Google Cloud A3 Mega (8 x 200 Gb/s GPUDirect-TCPXO NICs, half of NDR's 400)
    # reaches 339 at 8 GiB (+45%), 2 nodes x 4 H100 with an unnamed network 236 (+31%). In 1-128 MiB both logs
    # are 2-9x below the preset: the LL cap NCCL applies across 2 nodes (39 GB/s) and its tree correction
    # (treeCorrectionFactor), both now in sim/collectives/protocols.py, close part of it (mean error A3 Mega
    # 347% -> 272%, 2 x 4 211% -> 201%); the rest is not in NCCL's tuner model either (its only other mid-size
    # term, the ring plateau latency x 1.9, is tens of us): the pipeline ramp (as for dgx-a100) on networks
    # that are not this preset's; each log's own fit reproduces it.
    "dgx-h100": Cluster("dgx-h100", 1, 8, GPUS["h100"],
                        IntraNode("nvswitch", 450.0, 0.6, efficiency=0.824, nvls=True), NDR_IB),
    # The same nodes on 400 GbE RoCE (ConnectX-7 in Ethernet mode, 50 GB/s per NIC; Meta's RoCE clusters, Gangidi
    # et al., "RDMA over Ethernet for Distributed AI Training at Meta Scale", SIGCOMM 2024). Latency and
    # efficiency: no published figure found; InfiniBand's values are used.
    "dgx-h100-roce": Cluster("dgx-h100-roce", 1, 8, GPUS["h100"],
                             IntraNode("nvswitch", 450.0, 0.6, efficiency=0.824, nvls=True),
                             InterNode("ethernet", 8, 50.0, 5.0, "rail-optimized")),
    # HGX H200: the same NVLink 4 baseboard and NDR network as DGX H100, with H200 GPUs.
    # Held to a real log (docs/accuracy.md): 2 x 8 H200 on Nebius measure 447-478 GB/s all_reduce busbw at 1-16 GiB,
    # this preset 480-493 (+5%).
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
    # GB200 NVL72 as built (NVIDIA GB200 NVL72 datasheet and "NVIDIA GB200 NVL72" technical brief): 18 compute
    # trays, each 2 Grace CPUs + 4 Blackwell GPUs, and 9 NVLink Switch trays joining the 72 GPUs in one NVLink 5
    # domain; each tray's 4 ConnectX-7 400 Gb/s NICs (one per GPU) reach InfiniBand. A job takes compute trays
    # (`--nodes N` = N trays, `--world-size` a multiple of 4; specs.py Cluster.with_trays): NVLink reaches every
    # GPU of its domain, InfiniBand joins domains. The preset as named: one whole rack (18 trays). NVLS at 72
    # GPUs: the measured ceiling above.
    "gb200-nvl72": Cluster("gb200-nvl72", 1, 72, GPUS["gb200"], NVLINK5_NVL72,
                           InterNode("infiniband", 72, 50.0, 5.0, "rail-optimized"), tray_gpus=4, domain_trays=18),
    # Racks of GB200 NVL72 on 400 GbE RoCE (Spectrum-X); latency and efficiency: no published figure found.
    "gb200-nvl72-roce": Cluster("gb200-nvl72-roce", 1, 72, GPUS["gb200"], NVLINK5_NVL72,
                                InterNode("ethernet", 72, 50.0, 5.0, "rail-optimized"), tray_gpus=4,
                                domain_trays=18),
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
