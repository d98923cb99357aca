"""Lesson 06's later sections: mixed precision and FP8 under FSDP2, and the batch above which each strategy's
communication hides behind its compute. Tables, the figure and the exercises, from the simulator's FSDP plans
(sim/parallel/fsdp/plan.py) and the cluster presets (sim/cluster/presets.py); no torch.

Mixed precision (torch 2.13, torch/distributed/fsdp/_fully_shard/_fsdp_api.py ``MixedPrecisionPolicy``): FSDP2
all-gathers in ``param_dtype`` and reduce-scatters gradients in ``reduce_dtype`` (None: param_dtype); the sharded
fp32 parameters stay the optimizer's master weights. FP8 all-gather (torchao float8 training,
``Float8LinearConfig(enable_fsdp_float8_all_gather=True)``): the Linear weights are cast to float8_e4m3fn before
the all-gather, one byte per value; the simulator's ``param_dtype: float8_e4m3fn`` casts every parameter
(norms and embeddings too: llama-7b's embedding and head are 3.9% of its parameters), and it does not model
FP8 GEMMs (the compute is unchanged).

When communication hides (Austin et al., "How to Scale Your Model", the training chapter; lesson 06 section
6): per step a GPU computes 6·Ψ·T FLOPs for its T tokens (Kaplan et al. 2020) at F FLOP/s and sends, in 16 bits
on a ring, about 2·2Ψ bytes (DDP: one all-reduce, overlapped with the backward's 4·Ψ·T) or 3·2Ψ bytes (ZeRO-3:
two all-gathers and a reduce-scatter, overlapped with all 6·Ψ·T) at W bytes/s: both hide when T >= F / W.
Megatron TP, per layer and token: 3 x 2·12·h²/t FLOPs (forward and backward) against 4 all-reduces of 2·h bytes
(2 forward, 2 backward), each sending 2(t-1)/t of it: the ratio does not depend on T, and the communication
could hide only if h >= 2·(t-1)·F / (9·W) and only if overlapped (async TP's collective matmuls); torch's plans,
and the simulator's, run TP's collectives in the critical path (``tp_hiding_hidden``).

One process group, one collective at a time (docs/communicators.md, sim/kernel/communicators.py): FSDP2 issues
all-gathers and reduce-scatters on separate CUDA streams but on one process group, one NCCL communicator, which
runs its collectives one after another; torch 2.13's ``FSDPModule.set_separate_reduce_scatter_group()``
(torch/distributed/fsdp/_fully_shard/_fully_shard.py) gives the reduce-scatters a group of their own. The
step both ways comes from sim/scenario/what_if.py.
"""
from __future__ import annotations

from functools import lru_cache

from distlab.sim.lessons.checker import Exercise
from distlab.sim.lessons.helpers import Figure, Table

GiB = 2**30
MODEL = "llama-7b"
WORLD = 8
# What the precision table simulates: 4 of llama-7b's 32 blocks (and its embedding and head), 8x cheaper; the
# policies compare the same way. The hiding sweep runs the whole model (its root unit, which cannot hide, is then
# a small share).
SIM_MODEL = {"preset": MODEL, "layers": 4}
POLICIES = (("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16"), ("float8_e4m3fn", "float32"))


@lru_cache(maxsize=16)
def fsdp_bytes(param_dtype: str, reduce_dtype: str, model: str = MODEL, world: int = WORLD) -> dict:
    """GiB one GPU sends per step under FSDP2 (ZeRO-3, reshard after forward), ring collectives, by kind."""
    from distlab.sim.collectives import ring_cost
    from distlab.sim.models import model_from_spec
    from distlab.sim.parallel.fsdp.plan import build_fsdp
    from distlab.sim.plan import Collective
    plan = build_fsdp(model_from_spec(model), world, {"param_dtype": param_dtype, "reduce_dtype": reduce_dtype})
    out: dict = {}
    for o in plan.ranks[0]:
        if isinstance(o, Collective):
            out[o.op] = out.get(o.op, 0.0) + ring_cost(o.op, world)[1] * o.bytes / GiB
    out["total"] = sum(out.values())
    return out


def float8_linear_share(model: str = MODEL) -> float:
    """The share of ``model``'s parameters torchao's FP8 all-gather casts: the weights of the blocks' Linears,
    which ``convert_to_float8_training`` swaps for Float8Linear (torchtitan's float8 converter skips the output
    head; the embedding and the norms are no Linear)."""
    from distlab.sim.models import model_from_spec
    m = model_from_spec(model)
    total = linear = 0
    for layer in m.layers:
        for prm in layer.params:
            n = 1
            for d in prm.shape:
                n *= d
            total += n
            if layer.name.startswith("h.") and len(prm.shape) == 2 and prm.name.endswith(".weight"):
                linear += n
    return linear / total


def torchao_fp8_bytes(model: str = MODEL, world: int = WORLD) -> dict:
    """GiB one GPU sends per step with torchao's FP8 all-gather (Float8Linear weights in 1 byte, everything else
    in bf16) and an fp32 reduce-scatter: the bf16 policy's all-gathers with the Linear share at half the bytes
    (the scales' one small all-reduce per step left out)."""
    b = fsdp_bytes("bfloat16", "float32", model, world)
    ag = b["all_gather"] * (1 - float8_linear_share(model) / 2)
    return {"all_gather": ag, "reduce_scatter": b["reduce_scatter"], "total": ag + b["reduce_scatter"]}


def precision_table(model: str = MODEL, world: int = WORLD) -> Table:
    """Per MixedPrecisionPolicy: GiB one GPU sends per step, all-gathers and reduce-scatters."""
    rows = []
    for p, r in POLICIES:
        b = fsdp_bytes(p, r, model, world)
        label = p + (" (every parameter: the simulator's)" if p.startswith("float8") else "")
        rows.append([label, r, f"{b.get('all_gather', 0):.2f}", f"{b.get('reduce_scatter', 0):.2f}", f"{b['total']:.2f}"])
    b = torchao_fp8_bytes(model, world)
    rows.append(["torchao FP8 all-gather (Linear weights only)", "float32", f"{b['all_gather']:.2f}",
                 f"{b['reduce_scatter']:.2f}", f"{b['total']:.2f}"])
    return Table(["param_dtype (all-gather)", "reduce_dtype (reduce-scatter)", "all-gather GiB", "reduce-scatter GiB",
                  "total GiB"], rows, f"{model} on {world} GPUs, FSDP2, one GPU's bytes per step (ring)")


@lru_cache(maxsize=16)
def precision_step(param_dtype: str, reduce_dtype: str, nodes: int = 2, micro_batch: int = 1) -> dict:
    """The simulated step of ``SIM_MODEL`` under FSDP2 on ``nodes`` dgx-h100 with that policy: its summary."""
    from distlab.sim.lessons.training import scenario, simulate
    d = scenario(SIM_MODEL, "fsdp", cluster="dgx-h100", nodes=nodes, micro_batch=micro_batch, zero=3,
                 param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    return simulate(d)["summary"]


def precision_sim_table(nodes: int = 2) -> Table:
    rows = []
    for p, r in POLICIES:
        s = precision_step(p, r, nodes)
        rows.append([p, r, f"{s['step_s'] * 1e3:.1f}", f"{s['comm_s'] * 1e3:.1f}", f"{s['exposed_comm_s'] * 1e3:.1f}"])
    return Table(["param_dtype", "reduce_dtype", "step ms", "communication ms", "exposed ms"], rows,
                 f"4 blocks of {MODEL}, FSDP2 on {nodes} x dgx-h100, micro-batch 1, simulated (FP8: the all-gathers "
                 "and GEMMs at the FP8 rate, tensorwise casts included: sim/compute/kernels.py)")


# -- when does communication hide -------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def ring_busbw_GBps(cluster: str = "dgx-h100", nodes: int = 2) -> float:
    """W: the busbw a 1 GiB ring all_gather reaches on ``nodes`` nodes of ``cluster``, simulated. With one NIC per
    GPU NCCL runs a ring per rail, so a ring across DGX nodes reaches about the NICs of a whole node (lesson 03),
    not one NIC's 50 GB/s."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.lessons.helpers import simulate_sweep
    return simulate_sweep("all_gather", [GiB], load_cluster(cluster, nodes), "ring")[0]["busbw_GBps"]


def peak_TFLOPs(cluster: str = "dgx-h100") -> float:
    from distlab.sim.cluster import PRESETS
    return PRESETS[cluster].gpu.tflops


def hiding_tokens(cluster: str = "dgx-h100", nodes: int = 2) -> float:
    """Tokens per GPU per step above which DDP's and ZeRO-3's communication hides behind compute: F / W, F the
    GPU's dense bf16 FLOP/s (sim/cluster/presets.py, datasheet peak), W :func:`ring_busbw_GBps` (module docstring)."""
    return peak_TFLOPs(cluster) * 1e12 / (ring_busbw_GBps(cluster, nodes) * 1e9)


def tp_hiding_hidden(t: int = 8, cluster: str = "dgx-h100") -> float:
    """Hidden size above which Megatron TP's all-reduces could hide behind its GEMMs inside a node (if they were
    overlapped, as async TP's collective matmuls do): per layer and token, compute 3 x 2·12·h²/t FLOPs against
    4 all-reduces of 2·h bytes sending 2(t-1)/t each at the node's busbw W: 72·h²/(t·F) >= 16·h·(t-1)/(t·W),
    h >= 2·(t-1)·F / (9·W)."""
    return 2 * (t - 1) * peak_TFLOPs(cluster) * 1e12 / (9 * ring_busbw_GBps(cluster, 1) * 1e9)


CLUSTERS = ("dgx-h100", "pcie-8gpu")


def ratio_table(clusters=CLUSTERS) -> Table:
    rows = []
    for c in clusters:
        rows += [[c, f"DDP / ZeRO-3 on {n} node{'s' * (n > 1)}", f"W = {ring_busbw_GBps(c, n):.0f} GB/s",
                  f"T >= {hiding_tokens(c, n):,.0f} tokens per GPU"] for n in (1, 2)]
        rows.append([c, "TP 8 inside a node, if overlapped", f"W = {ring_busbw_GBps(c, 1):.0f} GB/s",
                     f"h >= {tp_hiding_hidden(8, c):,.0f}"])
    return Table(["cluster", "strategy", "ring busbw (simulated)", "communication hides when"], rows,
                 "datasheet FLOP/s over the ring's bytes/s")


SWEEP_MB = (1, 4, 16)


@lru_cache(maxsize=4)
def hiding_sweep(cluster: str = "dgx-h100", nodes: int = 1) -> list[dict]:
    """Simulated ``MODEL`` under FSDP2 (bf16 params and reduction) on ``nodes`` nodes of ``cluster`` over the
    micro-batch: tokens per GPU, compute, communication and exposed communication per step."""
    from distlab.sim.lessons.training import scenario, simulate
    rows = []
    for mb in SWEEP_MB:
        d = scenario(MODEL, "fsdp", cluster=cluster, nodes=nodes, micro_batch=mb, zero=3,
                     param_dtype="bfloat16", reduce_dtype="bfloat16")
        r = simulate(d)
        s = r["summary"]
        rows.append({"micro_batch": mb, "tokens": mb * r["model"].config["seq_len"], "compute_s": s["compute_s"],
                     "comm_s": s["comm_s"], "exposed_s": s["exposed_comm_s"]})
    return rows


def plot_hiding(clusters=CLUSTERS, nodes: int = 1) -> Figure:
    """Exposed communication over tokens per GPU per step, one line per cluster, F / W dashed."""
    f = Figure(7.0, 3.8)
    for c, colour in zip(clusters, ("#3182bd", "#e6550d")):
        rows = hiding_sweep(c, nodes)
        x = [r["tokens"] for r in rows]
        f.ax.plot(x, [100 * r["exposed_s"] / r["comm_s"] for r in rows], marker="o", color=colour,
                  label=f"{c}: exposed / all communication")
        f.ax.axvline(hiding_tokens(c, nodes), color=colour, ls="--", lw=1, label=f"{c}: F / W")
    f.ax.set_xscale("log", base=2)
    f.ax.set_xlabel("tokens per GPU per step")
    f.ax.set_ylabel("% of the communication exposed")
    f.ax.set_title(f"{MODEL}, FSDP2 on {nodes} node{'s' * (nodes > 1)} (simulated)")
    f.ax.legend(fontsize=7)
    return f


# -- one process group, one collective at a time ----------------------------------------------------------------
GROUP_CASES = {   # FSDP2 as scenarios/fsdp-llama-7b.yaml (bf16 all-gathers, fp32 reduce-scatters), 4 of its blocks
    "llama-7b, 4 blocks, 2 nodes": {"model": SIM_MODEL, "cluster": "dgx-h100", "nodes": 2},
    "hidden 1024, 128 tokens, 8 nodes": {"model": {**SIM_MODEL, "hidden": 1024, "heads": 8, "seq_len": 128},
                                         "cluster": "dgx-h100", "nodes": 8},
}
FIRST_CASE = next(iter(GROUP_CASES))


def _group_scenario(case: str):
    """The typed Scenario of ``case`` (sim/scenario/spec.py), parsed once."""
    from distlab.sim import scenario as sc
    c = GROUP_CASES[case]
    return sc.from_dict({"model": dict(c["model"]), "cluster": c["cluster"], "nodes": c["nodes"],
                         "fsdp": {"zero": 3, "param_dtype": "bfloat16", "reduce_dtype": "float32"}}, case)


@lru_cache(maxsize=4)
def group_what_if(case: str = FIRST_CASE) -> tuple:
    """The step of ``case`` with the reduce-scatters on the shard group and on their own (what_if.py's rows)."""
    from distlab.sim.scenario.what_if import reduce_scatter_group_what_if
    return tuple(reduce_scatter_group_what_if(_group_scenario(case)))


def separate_group_change_pct(case: str = FIRST_CASE) -> float:
    one, own = group_what_if(case)
    return 100 * (own["step_s"] / one["step_s"] - 1)


def separate_group_verdict(case: str = FIRST_CASE) -> str:
    """faster / same / slower: the step with the reduce-scatters on their own group, 1% either way."""
    change = separate_group_change_pct(case)
    return "faster" if change < -1 else "slower" if change > 1 else "same"


def group_table() -> Table:
    rows = []
    for case in GROUP_CASES:
        one = group_what_if(case)[0]
        for r in group_what_if(case):
            rows.append([case, "own group" if r["separate_reduce_scatter_group"] else "shard group (default)",
                         f"{r['step_s'] * 1e3:.2f}", f"{100 * (r['step_s'] / one['step_s'] - 1):+.1f}%",
                         f"{r['ag_rs_overlap_s'] * 1e3:.2f}", f"{r['reduce_scatter_s'] * 1e3:.2f}"])
    return Table(["FSDP2 on dgx-h100", "reduce-scatters on", "step ms", "step change", "AG/RS overlap ms",
                  "reduce-scatters ms"], rows, "rank 0's backward all-gathers and reduce-scatters, simulated "
                 "(sim/scenario/what_if.py)")


EXERCISES = (
    Exercise("06-mp-bytes", f"{MODEL} on {WORLD} GPUs, FSDP2 with MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
             "reduce_dtype=torch.float32), resharding after forward: how many GiB does one GPU send per step "
             "(ring collectives)?", "GiB", lambda: fsdp_bytes("bfloat16", "float32")["total"], tolerance=0.012,
             traps=lambda: {fsdp_bytes("bfloat16", "bfloat16")["total"]: "that reduce-scatters in bf16; "
                                                                         "reduce_dtype is float32"},
             hint="two all-gathers of the parameters in param_dtype (forward, and again in backward: all but the "
                  "root unit, which stays unsharded after forward) and one reduce-scatter of the gradients in "
                  "reduce_dtype, each sending (n-1)/n of the full size",
             why="the fp32 reduction costs as much as both bf16 all-gathers together: reduce in bf16 (or "
                 "all-gather in FP8) where the loss curve allows it."),
    Exercise("06-fp8-bytes", "The same step with torchao's FP8 all-gather (the blocks' Linear weights as "
             "float8_e4m3fn, 1 byte each; the embedding, the norms and the output head stay bf16) and the fp32 "
             "reduction: how many GiB does one GPU send per step?", "GiB",
             lambda: torchao_fp8_bytes()["total"], tolerance=0.01,
             traps=lambda: {fsdp_bytes("float8_e4m3fn", "float32")["total"]: "that casts every parameter; torchao "
                                                                                "casts only Float8Linear weights"},
             hint="only the all-gathers change, and only for the Linear weights of the blocks (about 96% of "
                  "llama-7b): one byte each instead of two",
             why="the all-gathers almost halve, the reduce-scatter stays: FP8 all-gather saves nearly a quarter of "
                 "the bytes here, and nearly half with a bf16 reduction."),
    Exercise("06-hide-tokens", "FSDP2 on one pcie-8gpu node (8 L40S: 362 TFLOP/s dense bf16 each; over PCIe a "
             "ring all-gather reaches a busbw of about 25 GB/s): above how many tokens per GPU per step does the "
             "communication hide behind the compute? Within 10%.", "count",
             lambda: hiding_tokens("pcie-8gpu", 1), tolerance=0.10,
             hint="per step 6·Ψ·T FLOPs against about 3 x 2Ψ bytes sent (two all-gathers and a reduce-scatter "
                  "in 16 bits, at the ring's busbw): equate the two times",
             why="T = F / W, whatever the model: seven 2048-token sequences per GPU per step here. On DGX H100s "
                 "the ring runs one channel per rail, 8 NICs per node, and the same threshold is a few thousand "
                 "tokens: one sequence already hides most of it."),
    Exercise("06-one-group", "FSDP2 issues a block's reduce-scatter on one CUDA stream and the next block's "
             "all-gather on another, both on the shard group (llama-7b, 4 blocks, 2 DGX H100 nodes, NCCL). For how "
             "many ms per step do rank 0's backward all-gathers and reduce-scatters move data at the same time?",
             "ms", lambda: group_what_if()[0]["ag_rs_overlap_s"] * 1e3, tolerance=0, abs_tolerance=0.005,
             hint="a process group is an NCCL communicator; ProcessGroupNCCL enqueues every collective of a "
                  "communicator on that communicator's own internal stream, whatever stream issued it",
             why="none: the streams only order the host's work; the communicator's internal stream runs its "
                 "collectives in issue order, so the reduce-scatter waits for the all-gather before it "
                 "(ProcessGroupNCCL's ncclStreams_ and syncStream; set_separate_reduce_scatter_group's docstring: "
                 "'one NCCL communicator, which processes one collective at a time')."),
    Exercise("06-separate-rs", "The same step with set_separate_reduce_scatter_group() (torch 2.13): the "
             "reduce-scatters get a process group of their own and may overlap the backward all-gathers. Is the "
             "simulated step faster (by more than 1%), the same (within 1%) or slower (by more than 1%)?",
             "choice", lambda: separate_group_verdict(), choices=("faster", "same", "slower"),
             hint="the overlap is not free: two collectives at once share the same links; and how much of the "
                  "communication was exposed to begin with?",
             why="the reduce-scatters overlap the all-gathers but take longer, sharing the links, and the next "
                 "block's all-gather arrives no earlier, while the communication hid behind the compute already: "
                 "the second communicator pays where the collectives are latency-bound, as with small blocks on "
                 "many nodes."),
)
