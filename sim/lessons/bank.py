"""The exercises of lessons 01-08. Expected values come from the library, so they match what the lessons run."""
from __future__ import annotations

from functools import lru_cache

from distlab.sim.lessons.checker import Exercise

MiB = 2**20


def _ring(op: str, n: int, nbytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """The α-β ring model: steps x α + factor x S / B (sim.collectives.ring_cost)."""
    from distlab.sim.collectives import ring_cost
    steps, factor = ring_cost(op, n)
    return steps * alpha_s + factor * nbytes / bandwidth_Bps


def _ring_steps(op: str, n: int) -> int:
    from distlab.sim.collectives import ring_cost
    return ring_cost(op, n)[0]


def _simulated_ms(op: str, nbytes: int, cluster: str, nodes: int, algorithm: str = "auto") -> float:
    from distlab.sim.cluster import load_cluster
    from distlab.sim.kernel.engine import simulate_collective
    trace, _ = simulate_collective(op, nbytes, load_cluster(cluster, nodes), algorithm)
    return trace.makespan * 1e3


def _auto_algorithm(op: str, nbytes: int, cluster: str, nodes: int) -> str:
    from distlab.sim.cluster import load_cluster
    from distlab.sim.kernel.engine import simulate_collective
    return simulate_collective(op, nbytes, load_cluster(cluster, nodes), "auto")[1]


def _simulated(op: str, nbytes: int, cluster: str, nodes: int, algorithm: str, protocol: str) -> tuple[float, float]:
    """(time in µs, busbw in GB/s) of one simulated collective with ``protocol`` forced."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.kernel.engine import simulate_collective
    c = load_cluster(cluster, nodes)
    trace, _ = simulate_collective(op, nbytes, c, algorithm, protocol=protocol)
    return trace.makespan * 1e6, _busbw(op, c.world_size, nbytes, trace.makespan)


def _ll_share() -> float:
    """LL's busbw over Simple's (%) for a 1 GiB ring all_reduce on one dgx-h100 node, simulated."""
    ll, simple = (_simulated("all_reduce", 2**30, "dgx-h100", 1, "ring", p)[1] for p in ("LL", "Simple"))
    return 100 * ll / simple


def _busbw(op: str, n: int, nbytes: float, seconds: float) -> float:
    from distlab.sim.collectives import metrics
    return metrics(op, n, nbytes, seconds)["busbw_GBps"]


def _one_nic_slowdown(nbytes: int = 2**30, nodes: int = 2) -> float:
    """Lesson 03: a ring all_reduce on ``nodes`` dgx-h100 with one NIC per node over the same with 8, simulated."""
    from dataclasses import replace

    from distlab.sim.cluster import load_cluster
    from distlab.sim.kernel.engine import simulate_collective
    base = load_cluster("dgx-h100", nodes=nodes)
    one = replace(base, inter_node=replace(base.inter_node, nics_per_node=1))
    return (simulate_collective("all_reduce", nbytes, one, "ring")[0].makespan /
            simulate_collective("all_reduce", nbytes, base, "ring")[0].makespan)


def _oversubscribed(over: float, nbytes: int = 256 * MiB, nodes: int = 4) -> float:
    """Lesson 03: a ring all_reduce on ``nodes`` dgx-h100 on a fat-tree of ``over``:1, simulated (s)."""
    from dataclasses import replace

    from distlab.sim.cluster import load_cluster
    from distlab.sim.kernel.engine import simulate_collective
    base = load_cluster("dgx-h100", nodes=nodes)
    c = replace(base, inter_node=replace(base.inter_node, fabric="fat-tree", oversubscription=over))
    return simulate_collective("all_reduce", nbytes, c, "ring")[0].makespan


def _preset(name: str):
    from distlab.sim.cluster import PRESETS
    return PRESETS[name]


def _ddp_buckets(model, cap=None):
    from distlab.sim.parallel.ddp.buckets import ddp_buckets
    from distlab.sim.models import model_from_spec
    return ddp_buckets(model_from_spec(model), cap)


def _ddp_sim(**options):
    """lesson 05's scenario: gpt2-medium, micro-batch 4, 2 x dgx-h100, DDP with ``options``."""
    from distlab.sim.lessons.training import scenario, simulate
    return simulate(scenario("gpt2-medium", "ddp", nodes=2, micro_batch=4, **options))


LESSON05_CAPS = (1, 5, 10, 25, 50, 100, 400)


@lru_cache(maxsize=1)
def _fastest_cap() -> str:
    from distlab.sim.lessons.training import fastest, scenario, sweep
    rows = sweep(scenario("gpt2-medium", "ddp", nodes=2, micro_batch=4), "bucket_cap_mb", LESSON05_CAPS)
    return str(fastest(rows, "bucket_cap_mb"))


def _collectives(plan, op: str) -> int:
    from distlab.sim.plan import Collective
    return sum(isinstance(o, Collective) and o.op == op for o in plan.ranks[0])


def _zero_GiB(model: str, world: int, zero: int) -> float:
    from distlab.sim.lessons.training import zero_bytes
    return zero_bytes(model, world, zero)["total"] / 2**30


def _comm_ratio(model: str, world: int) -> float:
    from distlab.sim.lessons.training import comm_per_step
    return comm_per_step(model, world, 3) / comm_per_step(model, world, 0)


def _fsdp_gathers(reshard_after_forward) -> int:
    from distlab.sim.parallel.fsdp.plan import build_fsdp
    from distlab.sim.lessons.training import CPU_FSDP_MODEL
    from distlab.sim.models import model_from_spec
    return _collectives(build_fsdp(model_from_spec(CPU_FSDP_MODEL), 2,
                                   {"reshard_after_forward": reshard_after_forward}), "all_gather")


def _pipe(schedule: str, p: int, m: int, v: int = 1, activation_bytes: float = 1.0):
    """Lesson 07: metrics of ``schedule`` with uniform stages (F = 1 ms, B = 2 ms, I = W = 1 ms), free p2p."""
    from distlab.sim.lessons.pipelines import pipeline_metrics
    return pipeline_metrics(schedule, p, m, v, activation_bytes=activation_bytes)


def _saved_GiB(p: int, m: int, per_mb_MiB: float) -> float:
    """Rank 0's peak activations under GPipe minus under 1F1B, in GiB."""
    gpipe, one = (_pipe(s, p, m, activation_bytes=per_mb_MiB * MiB).peak_rank_memory[0] for s in ("gpipe", "1f1b"))
    return (gpipe - one) / 2**30


EXERCISES = (
    # --- 01 processes and collectives ---------------------------------------------------------------------
    Exercise("01-world-size", "torchrun --nnodes 2 --nproc-per-node 4 train.py starts how many ranks (WORLD_SIZE)?",
             "count", lambda: 2 * 4, tolerance=0, why="WORLD_SIZE = nodes x processes per node."),
    Exercise("01-local-rank", "In that job (2 nodes x 4 processes), the process with RANK=6 has which LOCAL_RANK?",
             "count", lambda: 6 % 4, tolerance=0, hint="ranks are numbered node by node: node 0 has 0..3",
             why="LOCAL_RANK = RANK mod processes per node: it picks the GPU on the node (cuda:2)."),
    Exercise("01-all-reduce-sum", "4 ranks each hold torch.tensor([rank + 1.0]). After dist.all_reduce (SUM), "
             "what does rank 3 hold?", "count", lambda: sum(r + 1 for r in range(4)), tolerance=0,
             hint="every rank ends with the sum over all ranks", why="1 + 2 + 3 + 4, on every rank."),
    Exercise("01-ring-steps", "Your ring all-reduce on 4 ranks: how many send/recv steps does each rank make?",
             "count", lambda: _ring_steps("all_reduce", 4),
             tolerance=0, hint="a reduce-scatter pass then an all-gather pass, each n-1 steps",
             why="2(n-1): n-1 to reduce-scatter, n-1 to all-gather."),
    Exercise("01-ring-bytes", "In a ring all-reduce of a 64 MiB tensor on 8 GPUs, how much data does each GPU "
             "send in all?", "MiB", lambda: 2 * 7 / 8 * 64, hint="2(n-1) steps, each of S/n",
             why="2(n-1)/n x S: independent of n for large n, which is why the ring is bandwidth-optimal."),
    # --- 02 what a collective costs -----------------------------------------------------------------------
    Exercise("02-alpha-beta", "α-β model, ring all_reduce of 256 MiB on 8 GPUs with α = 5 µs per step and "
             "B = 100 GB/s per link: how long does it take?", "ms",
             lambda: _ring("all_reduce", 8, 256 * MiB, 5e-6, 100e9) * 1e3,
             hint="t = 2(n-1)·α + 2(n-1)/n · S/B, and 256 MiB = 256 x 2^20 bytes",
             why="at this size the bandwidth term (4.70 ms) dwarfs the latency term (0.07 ms)."),
    Exercise("02-busbw", "nccl-tests reports all_reduce of 1 GiB on 8 GPUs in 5.8 ms. What is the busbw?",
             "GB/s", lambda: _busbw("all_reduce", 8, 2**30, 5.8e-3),
             hint="algbw = S / t, busbw = algbw x 2(n-1)/n, GB = 10^9 bytes",
             why="busbw compares with the link's bandwidth whatever n is: 324 of NVLink 4's 450 GB/s (72%), for "
                 "algorithms where every byte crosses a link (not in-switch NVLS)."),
    Exercise("02-simple-floor", "Forced to the Simple protocol (NCCL_PROTO=Simple), how long does an 8 B ring "
             "all_reduce take on one dgx-h100 node (8 GPUs)?", "us",
             lambda: _simulated("all_reduce", 8, "dgx-h100", 1, "ring", "Simple")[0], tolerance=0.05,
             traps=lambda: {15.0: "that is LL's floor: 6.6 + 14 x 0.6 µs; use Simple's base and hop latencies"},
             hint="once per call the base latency, then 2(n-1) = 14 hops: Ring/Simple base 8.4 µs, NVLink hop 3.4 µs "
                  "(tuning.cc:150-165)",
             why="8.4 + 14 x 3.4 = 56 µs, almost 4x LL's 15 µs: Simple synchronises every step with a fence and a "
                 "flag, LL's flags travel inside the data. Bytes do not matter at 8 B; only the latencies do."),
    Exercise("02-ll-busbw", "Forced to LL (NCCL_PROTO=LL), a ring all_reduce of 1 GiB on one dgx-h100 node: what "
             "share of Simple's busbw does it reach, in %?", "%", _ll_share, tolerance=0.05,
             traps=lambda: {50.0: "half: right about the flags, but NCCL also caps LL's bus bandwidth"},
             hint="LL sends 4 data bytes per 8-byte line (half of Simple's ~370 GB/s), and NCCL caps LL at llMaxBw "
                  "of bus bandwidth, 141 GB/s on one Hopper node (src/graph/tuning.cc, llMaxBws and its use in "
                  "ncclTopoTuneModel)",
             why="min(370 / 2, 141) = 141 of 370 GB/s: LL stops paying off after a few MiB, where its lower "
                 "latency no longer makes up for the bandwidth; NCCL's tuner moves on to LL128, then Simple."),
    Exercise("02-small-message", "For an 8 B all_reduce on one dgx-h100 node, which algorithm does the "
             "simulator's auto choose?", "choice", lambda: _auto_algorithm("all_reduce", 8, "dgx-h100", 1),
             choices=("ring", "tree", "hierarchical", "nvls"),
             hint="for tiny messages only α counts: the least latency wins (NCCL's tuning model)",
             why="NCCL's model: ring LL 6.6 + 14 x 0.6 = 15.0 µs; tree LL (chains inside a node) 15.2 µs; "
                 "NVLS 25 µs once per call (tuning.cc:149-175, :414-428). NCCL builds its trees across nodes and "
                 "chains the GPUs inside one (2((g-1)·intra + log2(nNodes)·inter)), and so does the simulator: on one "
                 "node the tree is no shorter than the ring."),
    # --- 03 topologies ------------------------------------------------------------------------------------
    Exercise("03-nic", "A DGX H100 has 8 GPUs and one 400 Gb/s NDR NIC per GPU. What bandwidth per direction "
             "does the whole node have across nodes, in GB/s?", "GB/s",
             lambda: _preset("dgx-h100").gpus_per_node * _preset("dgx-h100").inter_node.bandwidth_GBps,
             traps=lambda: {_preset("dgx-h100").inter_node.bandwidth_GBps: "that is one NIC's; the node has 8"},
             hint="network speeds are in bits per second; 8 bits = 1 byte",
             why="8 NICs of 50 GB/s. Inside the node each GPU alone has NVLink 4's 450 GB/s per direction: one "
                 "GPU's NIC is far narrower than its NVLink, which is what the next exercise measures."),
    Exercise("03-two-nodes", "Predict, before simulating: a ring all_reduce of 1 GiB on 2 dgx-h100 nodes (16 GPUs, "
             "8 rails). How long does it take? Within 25%.", "ms",
             lambda: _simulated_ms("all_reduce", 2**30, "dgx-h100", 2, "ring"), tolerance=0.25,
             hint="t ≈ 2(n-1)/n · (S/8) / 50 GB/s: 8 rings, one per rail, each carrying S/8 through its own "
                  "50 GB/s NIC (NVLink inside the node is faster, so the NICs set the pace)",
             why="8 rings, one per NIC rail: each NIC carries 1/8 of the data, so crossing nodes costs little here."),
    Exercise("03-one-nic", "Predict before simulating: the same ring all_reduce of 1 GiB on 2 dgx-h100 nodes, "
             "but each node with one 50 GB/s NIC instead of 8 (nics_per_node=1). How many times longer than with "
             "8 NICs? Within 1.5%.", "x", _one_nic_slowdown, tolerance=0.015,
             traps=lambda: {_preset("dgx-h100").intra_node.bandwidth_GBps /
                            _preset("dgx-h100").inter_node.bandwidth_GBps:
                            "that is NVLink's line rate over the NIC's; with 8 NICs the ring ran at NVLink's "
                            "effective speed (its 2-node time is the 1-node time above), not at 450 GB/s",
                            8.0: "8x if the 8 NICs had set the pace; the ring ran at NVLink's effective "
                                 "~370 GB/s, a little below their 400 GB/s: compare the printed times",
                            1.0: "a ring does cross nodes the same number of times, but all 8 rings now share "
                                 "one NIC"},
             hint="the 8 rings, one per rail, now all cross through the one NIC: it carries 2(n-1)/n x 1 GiB at "
                  "50 GB/s. Divide by the 8-NIC time printed above",
             why="one NIC carries all 8 rings: 1.875 x 1 GiB / 50 GB/s = 40 ms against the 5.2 ms of 8 NICs, about "
                 "7.8x. Not 9x (450 / 50): with 8 NICs (400 GB/s) the ring was held by NVLink's effective ~370 "
                 "GB/s, so the 2-node time above equals the 1-node time."),
    Exercise("03-all-to-all", "Predict, before simulating: an all_to_all of 1 GiB on 8 dgx-h100 nodes (64 GPUs, "
             "one 50 GB/s NIC per GPU). What busbw does it reach? Within 5%.", "GB/s",
             lambda: _simulated("all_to_all", 2**30, "dgx-h100", 8, "direct", "auto")[1], tolerance=0.05,
             traps=lambda: {369.0: "that is one node, inside NVLink; across nodes the NICs carry most of it"},
             hint="each GPU sends (n-g)/n of its buffer to other nodes, all through its own NIC; busbw = algbw x "
                  "(n-1)/n (nccl-tests)",
             why="busbw = 50 x (n-1)/(n-g) = 50 x 63/56 = 56 GB/s: the NIC's speed, not NVLink's. Every rank talks "
                 "to every other, so rails do not help: all-to-all (MoE) is NIC-bound across nodes."),
    Exercise("03-oversubscription", "Predict before the bars: a ring all_reduce of 256 MiB on 4 dgx-h100 nodes. On a "
             "fat-tree with 4:1 oversubscription instead of a non-blocking one (1:1), how many times longer does "
             "it take?", "x", lambda: _oversubscribed(4) / _oversubscribed(1), tolerance=0.05,
             traps=lambda: {4.0: "the NIC part slows by 4; the ring's steps inside each node (NVLink) do not"},
             hint="at 4:1 every node's uplink carries a quarter of what its NICs can send; the ring's hops inside a "
                  "node stay on NVLink: only the part that crosses the spine slows",
             why="less than 4x: the inter-node part of the ring slows by 4 and the rest does not. Rail-optimized "
                 "fabrics keep rings off the spine altogether."),
    # --- 04 validate on your machine ----------------------------------------------------------------------
    Exercise("04-error", "The simulator predicts 12 ms and you measure 10 ms. What is the error?", "%",
             lambda: (12 - 10) / 10 * 100, hint="error = (predicted - measured) / measured",
             why="positive: the model is pessimistic here."),
    Exercise("04-predict", "A calibration fitted α = 150 µs per step and B = 1.2 GB/s for all_gather on 4 ranks. "
             "Predict an all_gather of 8 MiB (the gathered output) on 4 ranks.", "ms",
             lambda: _ring("all_gather", 4, 8 * MiB, 150e-6, 1.2e9) * 1e3,
             hint="all_gather: (n-1) steps and (n-1)/n x S bytes",
             why="the same formula the calibrated simulator uses (runtime/measure/fit.py predict)."),
    # --- 05 DDP ----------------------------------------------------------------------------------------------
    Exercise("05-first-bucket", "6 x Linear(1024, 1024) in fp32 (mlp widths [1024] * 7), bucket_cap_mb left at "
             "its default: how big is the first bucket DDP builds after iteration 0?", "MiB",
             lambda: _ddp_buckets({"kind": "mlp", "widths": [1024] * 7})[0].bytes / MiB, tolerance=0.0002,
             traps=lambda: {4.0: "that is the weight alone; its layer's bias arrived first, in the same bucket",
                            1.0: "that is the cap; a bucket closes only once a tensor crosses it"},
             hint="gradients arrive last layer first (its bias, then its weight); the first bucket's 1 MiB cap is "
                  "a threshold, so the tensor that crosses it stays in the bucket",
             why="the last layer's bias (4 KiB) and weight (4 MiB): the weight joins the bucket it arrives in and "
                 "closes it; a tensor is never split."),
    Exercise("05-buckets", "Predict: gpt2-medium (fp32, 355M parameters, ~1.3 GiB of gradients) with "
             "bucket_cap_mb=100: how many buckets after iteration 0? Within 2.", "count",
             lambda: len(_ddp_buckets("gpt2-medium", 100)), tolerance=0, abs_tolerance=2,
             traps=lambda: {len(_ddp_buckets("gpt2-medium")): "that is the count with the default cap (25 MiB "
                                                               "and a 1 MiB first bucket), not with 100"},
             hint="gradient bytes / cap, rounded; a cap is a threshold (a bucket closes once it reaches the cap, "
                  "with the tensor that crossed it), and an explicit cap applies to the first bucket too",
             why="about 1.3 GiB of gradients in buckets of at least 100 MiB; the last one holds what is left."),
    Exercise("05-exposed", "Simulated gpt2-medium, micro-batch 4, 2 x dgx-h100, default cap: how much "
             "communication is exposed (not hidden behind backward)? Within 10%.", "ms",
             lambda: _ddp_sim()["summary"]["exposed_comm_s"] * 1e3, tolerance=0.10,
             hint="when backward ends, the buckets before the last two have finished behind it; the embedding's "
                  "backward is microseconds, so the last two buckets are ready together and both all-reduces "
                  "remain: lesson 03's two-node ring, t ≈ 2(n-1)/n · (S/8) / 50 GB/s with n = 16 (8 rings, one per "
                  "NIC rail) and S the two buckets' bytes",
             why="the last bucket holds the first layers' gradients, the embedding among them, so it is both the "
                 "last ready and the largest; the bucket before it is ready only microseconds earlier (the "
                 "embedding's backward is short), so its all-reduce is exposed too and the last one launches "
                 "after it (launches are in order). The table shows it: their ready, launch and end times."),
    Exercise("05-best-cap", "In the simulated sweep of bucket_cap_mb (1, 5, 10, 25, 50, 100, 400) for that "
             "scenario, which cap gives the shortest step?", "choice", _fastest_cap,
             choices=tuple(str(c) for c in LESSON05_CAPS),
             hint="small caps pay α per bucket, huge caps start communicating too late",
             why="the bottom of the U: few enough buckets to keep α small, enough of them to overlap backward."),
    Exercise("05-no-sync", "gpt2-medium scenario with grad_accum=4 (3 micro-batches under no_sync, default "
             "cap): how many all-reduces does one optimizer step make?", "count",
             lambda: _collectives(_ddp_sim(grad_accum=4)["plan"], "all_reduce"), tolerance=0,
             hint="no_sync() skips the all-reduce; gradients keep accumulating locally",
             why="one all-reduce per bucket, only on the last micro-batch: 4x less communication per sample."),
    # --- 06 FSDP and ZeRO ------------------------------------------------------------------------------------
    Exercise("06-zero3-memory", "llama-7b (Ψ = 6.74e9 parameters, bf16 params, Adam) on 64 GPUs with ZeRO-3 / "
             "FSDP: how much do params, grads and optimizer state take per GPU?", "GiB",
             lambda: _zero_GiB("llama-7b", 64, 3),
             hint="(2 + 2 + 12) bytes x Ψ / N, and GiB = 2^30 bytes",
             why="16 bytes per parameter split 64 ways: 7B params fit where DDP needs 100 GiB per GPU."),
    Exercise("06-zero1-memory", "The same llama-7b (Ψ = 6.74e9) on 64 GPUs with ZeRO-1 (only the optimizer state "
             "sharded)?", "GiB",
             lambda: _zero_GiB("llama-7b", 64, 1), hint="2Ψ params + 2Ψ grads + 12Ψ / N, in GiB",
             why="the replicated 16-bit params and grads (4 bytes per parameter) now dominate."),
    Exercise("06-comm-ratio", "llama-7b on 8 GPUs: how many times the bytes of DDP does one GPU send per step "
             "under ZeRO-3?", "x", lambda: _comm_ratio("llama-7b", 8), tolerance=0.03,
             hint="DDP: one all-reduce (2 passes); ZeRO-3: all-gather forward, all-gather backward, reduce-scatter",
             why="1.5x in the ZeRO paper; a bit less here because the root unit keeps its parameters after forward "
                 "(FSDP2's reshard_after_forward=None: True for blocks, False for the root)."),
    Exercise("06-all-gathers", "The small Llama of section 5 (4 blocks + root), each block wrapped with "
             "fully_shard(block, reshard_after_forward=True) and the root with fully_shard(model) at its default "
             "(as runtime/parallel/fsdp/run.py does): how many all-gathers per step on each rank?", "count",
             lambda: _fsdp_gathers(True), tolerance=0,
             hint="every unit is gathered in forward; resharded units are gathered again in backward; the root, "
                  "left at None, is not resharded after forward",
             why="5 in forward (root + 4 blocks) and 4 in backward: the root left at its default stays unsharded "
                 "until its backward. Set True on the root as well and it follows (torch 2.13: "
                 "auto_reshard_after_forward only when the argument is None): one more. With False only the 5."),
    # --- 07 pipeline parallelism ----------------------------------------------------------------------------
    Exercise("07-bubble", "GPipe with p = 4 stages and m = 8 microbatches, uniform stages, backward = 2 x "
             "forward, free p2p: what fraction of the ranks' time is bubble?", "%",
             lambda: _pipe("gpipe", 4, 8).bubble * 100, abs_tolerance=0.3,
             hint="(p-1)/(m+p-1): each rank idles p-1 forward and p-1 backward slots around m of each",
             why="3/11: only more microbatches (or fewer stages) shrink it."),
    Exercise("07-memory", "p = 4, m = 16; each rank's layers stash 96 MiB of activations per microbatch in "
             "flight. How much less activation memory does rank 0 need at its peak with 1F1B than with GPipe?",
             "GiB", lambda: _saved_GiB(4, 16, 96),
             hint="GPipe holds all m microbatches before the first backward; 1F1B's stage s at most p - s",
             why="(16 - 4) x 96 MiB: 1F1B's memory depends on p, not on m, so m can grow to shrink the bubble."),
    Exercise("07-interleaved", "Interleaved 1F1B with p = 4, m = 8 and v = 2 chunks per rank (same uniform "
             "model, free p2p): what is the bubble?", "%", lambda: _pipe("interleaved", 4, 8, 2).bubble * 100,
             abs_tolerance=0.3, hint="(p-1)/(v·m+p-1): each idle slot is 1/v as long",
             why="3/19, down from 3/11, paid for with v times as many p2p messages."),
    Exercise("07-zbh1", "Forward, input-gradient and weight-gradient backward each 1 ms per stage, p = 4, "
             "m = 8, free p2p: how much shorter is a ZB-H1 step than a 1F1B step?", "ms",
             lambda: (_pipe("1f1b", 4, 8).makespan - _pipe("zbh1", 4, 8).makespan) * 1e3,
             hint="1F1B's cool-down: each rank waits for the gradient coming back, one B = I + W per stage it is "
                  "from the last; ZB-H1 runs only I on that path and fills the waits with its delayed W's: count "
                  "the slots rank 0 idles in each",
             why="the delayed W's fill the cool-down bubble: 33 ms against 27 ms, with the same peak memory."),

)


# --- 08 pitfalls (helpers in sim/lessons/pitfalls.py) ---------------------------------------------------------
def _named_rank() -> str:
    """The rank the static check (and distlab diagnose) names in lesson 08's `if rank != 3` program."""
    import re

    from distlab.sim.check import check_plan
    from distlab.sim.lessons.pitfalls import skip_plan
    return re.search(r"rank (\d+) calls", check_plan(skip_plan())[0]).group(1)


def _pitfalls():
    import distlab.sim.lessons.pitfalls as pitfalls
    return pitfalls


EXERCISES += (
    Exercise("08-duplicates", "4 ranks each build DataLoader(dataset, shuffle=True) without a DistributedSampler. "
             "In one epoch, how many times is each sample processed, over all ranks?", "count", lambda: 4,
             tolerance=0, hint="each rank iterates over the whole dataset",
             why="every rank reads all of it: the global batch holds 4 copies of each sample, and an epoch costs "
                 "4x the compute for the same data."),
    Exercise("08-per-rank", "Predict before the run below: 18 samples, 4 ranks, DistributedSampler "
             "(drop_last=False): how many samples does each rank get per epoch?", "count",
             lambda: _pitfalls().sampler_share(18, 4), tolerance=0,
             hint="the sampler pads the index list to a multiple of the world size",
             why="ceil(18 / 4) = 5: 20 indices, so 2 samples are read twice per epoch (drop_last=True gives 4)."),
    Exercise("08-hang", "Lesson 08's program calls all_reduce(loss) inside `if rank != 3`, then a barrier. "
             "Which rank do distlab check and distlab diagnose name?", "choice", _named_rank,
             choices=("0", "1", "2", "3"), hint="collectives match by order: compare each rank's second call",
             why="rank 3 calls barrier as its collective #1 where ranks 0-2 call all_reduce(4 B). On Gloo all four "
                 "wait until the timeout; on NCCL a barrier is itself an all_reduce of one element, so it can "
                 "silently match the others' all_reduce(loss) and the hang moves later, or never shows. "
                 "TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective's op and shapes and raises at once."),
    Exercise("08-barrier-cost", "Gradient accumulation, 4 ranks, 4 micro-steps of 20 ms, at micro-step m rank "
             "m mod 4 is 3x slower. Simulated: how much longer is the step with a barrier after every "
             "micro-step than without?", "ms", lambda: _pitfalls().barrier_cost_ms(), tolerance=0.03,
             hint="with barriers every micro-step waits for that step's slow rank; without, each rank is slow once",
             why="4 x 60 ms against 3 x 20 + 60 ms: a barrier turns every rank's hiccup into everyone's."),
)
