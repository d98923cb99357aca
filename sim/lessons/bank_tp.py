"""Lesson 09 (DeviceMesh and DTensor): tables, a figure and the exercises, computed from the simulator's TP plans
(sim/parallel/tp/: plan.py, rules.py, memory.py, compose.py), never typed in. No torch here: the real run is
runtime/parallel/tp/lesson.py."""
from __future__ import annotations

import math

from distlab.sim.lessons.checker import Exercise
from distlab.sim.lessons.helpers import Figure, Table
from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt, preset
from distlab.sim.parallel.tp.memory import activation_bytes_per_layer
from distlab.sim.parallel.tp.plan import TPOptions, collective_sequence, tp_plan
from distlab.sim.parallel.tp.rules import local_shape, placement

# The lesson's model: the Llama-style model of tests/test_tp_runtime.py (GQA, SwiGLU), tiny enough for 2 CPU ranks.
LESSON_MODEL = gpt(layers=2, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=2, dtype="float32",
                   arch="llama", ffn_hidden=64)
PLACEMENT_NAMES = {"shard": "Shard({})", "replicate": "Replicate()"}


def placement_name(param_name: str) -> str:
    pl = placement(param_name)
    return PLACEMENT_NAMES[pl[0]].format(*pl[1:])


def placements_table(model=LESSON_MODEL, tp: int = 2, layers: tuple[str, ...] = ("embed", "h.0", "head")) -> Table:
    """Every parameter of ``layers``: global shape, placement on the tp mesh dimension, local shape per rank."""
    rows = [[q.name, "x".join(map(str, q.shape)), placement_name(q.name), "x".join(map(str, local_shape(q, tp)))]
            for L in model.layers if L.name in layers for q in L.params]
    return Table(["parameter", "global shape", "placement", f"local shape (tp {tp})"], rows,
                 f"{model.name}: parameters under torchtitan's plan")


# The three plans of the lesson (sim/lessons/tp_diagram.py draws them): TPOptions keywords.
PLANS = ({"sequence_parallel": False}, {"sequence_parallel": False, "prepare_input": True},
         {"sequence_parallel": True})


def sequence(model=LESSON_MODEL, tp: int = 2, sequence_parallel: bool = True, prepare_input: bool = False) -> list:
    """(kind, bytes, dtype, group, phase) of each collective of rank 0's step (sim/parallel/tp/plan.py)."""
    return collective_sequence(tp_plan(model, Mesh({"tp": tp}), TPOptions(sequence_parallel=sequence_parallel,
                                                                          prepare_input=prepare_input)))


def collective_counts(model=LESSON_MODEL, tp: int = 2, sequence_parallel: bool = True,
                      prepare_input: bool = False) -> dict:
    """{(phase, kind, bytes of one call): calls} of one rank's step."""
    out: dict = {}
    for kind, nbytes, _, _, phase in sequence(model, tp, sequence_parallel, prepare_input):
        out[(phase, kind, nbytes)] = out.get((phase, kind, nbytes), 0) + 1
    return out


def kind_counts(model=LESSON_MODEL, tp: int = 2, sequence_parallel: bool = True, prepare_input: bool = False) -> dict:
    """{kind: calls} of one rank's step."""
    out: dict = {}
    for (_, kind, _), n in collective_counts(model, tp, sequence_parallel, prepare_input).items():
        out[kind] = out.get(kind, 0) + n
    return out


def per_block(model, tp: int, sequence_parallel: bool, phase: str, kind: str, prepare_input: bool = False) -> int:
    """Collectives of ``kind`` in ``phase`` per transformer block: the plan's count for ``model`` less that for
    the same model with one block fewer."""
    c = {k: v for k, v in model.config.items() if k in ("hidden", "heads", "kv_heads", "seq_len", "vocab",
                                                         "micro_batch", "dtype", "arch", "ffn_hidden")}
    n = model.config["layers"]
    count = [sum(v for (ph, kd, _), v in collective_counts(gpt(layers=k, **c), tp, sequence_parallel,
                                                           prepare_input).items()
                 if (ph, kd) == (phase, kind)) for k in (n - 1, n)]
    return count[1] - count[0]


def plan_label(options: dict) -> str:
    from distlab.sim.lessons.tp_diagram import plan_name
    return plan_name(options["sequence_parallel"], options.get("prepare_input", False))


def collectives_table(model=LESSON_MODEL, tp: int = 2, plans=PLANS[:2]) -> Table:
    """Per phase, kind and size, the calls of one rank's step under each of ``plans`` (TPOptions keywords)."""
    counts = [collective_counts(model, tp, **o) for o in plans]
    rows = [[ph, kind, f"{b} B", *(c.get((ph, kind, b), "-") for c in counts)]
            for ph, kind, b in sorted(set().union(*counts))]
    return Table(["phase", "collective", "bytes per call", *(plan_label(o) for o in plans)], rows,
                 f"{model.name}, tp {tp}: one rank's step (calls)")


def wire_bytes(kind: str, nbytes: int, n: int) -> float:
    """Bytes one rank sends for a ring collective of ``nbytes`` (nccl-tests' size: the all_reduce buffer, the
    all_gather output, the reduce_scatter input) on ``n`` ranks (sim/collectives ring_cost's factor)."""
    from distlab.sim.collectives import ring_cost
    return ring_cost(kind, n)[1] * nbytes


def bytes_table(model=LESSON_MODEL, tp: int = 2, plans=PLANS) -> Table:
    """Per plan and kind: the buffers' bytes (what a collective is called with) and the bytes one rank sends on a
    ring: an all_reduce sends 2(n-1)/n of its buffer, an all_gather or reduce_scatter (n-1)/n. (No call counts:
    lesson 09 asks for them later.)"""
    rows = []
    for o in plans:
        totals: dict = {}
        for (_, kind, b), n in collective_counts(model, tp, **o).items():
            buf, wire = totals.get(kind, (0, 0.0))
            totals[kind] = (buf + n * b, wire + n * wire_bytes(kind, b, tp))
        for kind, (buf, wire) in sorted(totals.items()):
            rows.append([plan_label(o), kind, f"{buf / 1024:.1f}", f"{wire / 1024:.1f}"])
        rows.append([plan_label(o), "all", f"{sum(t[0] for t in totals.values()) / 1024:.1f}",
                     f"{sum(t[1] for t in totals.values()) / 1024:.1f}"])
    return Table(["plan", "collective", "buffers KiB", "sent per rank KiB"], rows,
                 f"{model.name}, tp {tp}: one rank's step")


def plot_tp_bytes(model=LESSON_MODEL, tp: int = 2) -> Figure:
    """Bytes one rank sends in one step per kind of collective (ring: sim/collectives), plain TP against TP + SP."""
    labels, values = [], []
    for sp, tag in ((False, "TP"), (True, "TP+SP")):
        totals: dict = {}
        for (_, kind, b), n in collective_counts(model, tp, sp).items():
            totals[kind] = totals.get(kind, 0) + n * wire_bytes(kind, b, tp)
        for kind, b in sorted(totals.items()):
            labels.append(f"{tag}\n{kind}")
            values.append(b / 1024)
    f = Figure(7.5, 3.8)
    f.ax.bar(labels, values, color=["#e6550d" if "SP" in lab else "#3182bd" for lab in labels])
    f.ax.set_ylabel("KiB sent per rank and step (ring)")
    f.ax.set_title(f"{model.name}, tp {tp}: all-reduces become reduce-scatters + all-gathers")
    return f


def commdebug_table(real: dict, model=LESSON_MODEL) -> Table:
    """Per variant of a real run (runtime/parallel/tp/lesson.py) and kind: the plan's calls against CommDebugMode's
    count, and whether the captured sequence (kind, bytes, dtype, group, phase) equals the plan's."""
    rows = []
    for v in real["variants"]:
        o = {"sequence_parallel": v["sequence_parallel"], "prepare_input": v.get("prepare_input", False)}
        want = kind_counts(model, real["world_size"], **o)
        plan = sequence(model, real["world_size"], **o)
        for kind in sorted(set(want) | set(v["comm_debug"])):
            rows.append([plan_label(o), kind, want.get(kind, 0), v["comm_debug"].get(kind, 0),
                         "yes" if [tuple(c) for c in v["sequence"]] == plan else "NO"])
    return Table(["plan", "collective", "simulated calls", "CommDebugMode calls", "same sequence, bytes, dtypes"],
                 rows, f"one training step on {real['world_size']} real gloo ranks")


def mesh_table(dims: dict) -> Table:
    """Each rank's coordinates and its group along each dimension of ``dims`` (sim/mesh.py, row-major)."""
    mesh = Mesh(dims)
    rows = [[r, tuple(mesh.coords(r).values()), *(mesh.group_of(r, d) for d in dims)]
            for r in range(mesh.world_size)]
    return Table(["rank", "coordinates", *(f"{d} group" for d in dims)], rows, f"mesh {dims}")


# Korthikanti et al. 2022 (arXiv 2205.05198) count a GPT layer: GeLU MLP of 4h, multi-head attention whose s x s
# scores, softmax output and dropout mask are stored, dropout after attention and MLP. Their Table 3 runs GPT-3
# 175B: 96 heads, hidden 12288, 96 layers, sequence 2048 (Brown et al. 2020, arXiv 2005.14165, Table 2.1).
GPT3_175B = {"name": "GPT-3 175B", "hidden": 12288, "heads": 96, "seq_len": 2048}


def activation_table(shape: dict = GPT3_175B, tp: int = 8) -> Table:
    """One GPT layer's activation memory (Korthikanti et al. 2022 Table 2) with 16-bit activations, b = 1."""
    rows = []
    for what, t, sp, rc in (("no parallelism", 1, False, "none"), ("TP", tp, False, "none"),
                            ("TP + SP", tp, True, "none"), ("TP + SP + selective", tp, True, "selective")):
        b = activation_bytes_per_layer(shape["seq_len"], 1, shape["hidden"], shape["heads"], t, sp, rc)
        rows.append([what, t, f"{b / 2**30:.3f} GiB"])
    return Table(["layout", "tp", "per layer"], rows,
                 f"{shape['name']}, s = {shape['seq_len']}, b = 1: activations kept for backward "
                 "(Korthikanti et al. 2022, Table 2)")


def _k_shard_MiB() -> float:
    q = next(p for p in preset("llama3-8b").params if p.name == "h.0.attn.k.weight")
    return math.prod(local_shape(q, 8)) * 2 / 2**20


def _sp_layer_GiB() -> float:
    g = GPT3_175B
    return activation_bytes_per_layer(g["seq_len"], 1, g["hidden"], g["heads"], 8, True, "none") / 2**30


def dp_shard_nodes(dims: dict, gpus_per_node: int = 8, rank: int = 0) -> int:
    """Nodes the ranks of ``rank``'s dp_shard group sit on (row-major mesh, ranks numbered node by node)."""
    return len({r // gpus_per_node for r in Mesh(dims).group_of(rank, "dp_shard")})


EXERCISES = (
    Exercise("09-k-shard", "Llama 3 8B's k projection maps 4096 features to 8 KV heads x 128 = 1024; "
             "ColwiseParallel shards its weight (1024 x 4096) with Shard(0) over tp 8. One rank's shard in bf16, "
             "in MiB?", "MiB", _k_shard_MiB, tolerance=0.01,
             hint="Shard(0) splits the output features (rows): 1024 / 8 rows of 4096, 2 bytes each",
             why="128 x 4096 x 2 B: each rank holds one KV head's projection."),
    Exercise("09-fwd-allreduce", "Plain (Megatron) TP, forward: how many all-reduces does one transformer block "
             "issue?", "count", lambda: per_block(LESSON_MODEL, 2, False, "forward", "all_reduce"), tolerance=0,
             hint="a column-parallel linear needs no communication; a row-parallel one leaves partial sums",
             why="one after attention's o (row-parallel) and one after the MLP's down: Megatron's g operator."),
    Exercise("09-bwd-allreduce", "Same plain TP, backward, with separate q, k, v and a SwiGLU MLP (gate, up), each "
             "given its own ColwiseParallel() and nothing else: how many all-reduces per block does torch issue?",
             "count", lambda: per_block(LESSON_MODEL, 2, False, "backward", "all_reduce"), tolerance=0,
             hint="the input gradient of a column-parallel linear is a partial sum; ask who turns the plain-tensor "
                  "input into a DTensor, and how often",
             why="ColwiseParallel makes its plain-tensor input Replicate with its own from_local, whose backward "
                 "(_FromTorchTensor.backward, torch/distributed/tensor/_api.py) all-reduces the partial gradient: "
                 "q, k, v, gate and up, each on its own (torch/distributed/tensor/parallel/style.py)."),
    Exercise("09-bwd-prepared", "The same plain TP, but attention and the MLP are each wrapped in "
             "PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Replicate(), "
             "use_local_output=False), as torchtitan's apply_tp wraps them: how many all-reduces per block "
             "backward?", "count",
             lambda: per_block(LESSON_MODEL, 2, False, "backward", "all_reduce", prepare_input=True), tolerance=0,
             hint="q, k and v now receive one DTensor, not plain tensors: their Partial input gradients add up on "
                  "it before anything is redistributed",
             why="one per part: the wrapper's from_local is the only conversion, and its backward all-reduces the "
                 "sum of the linears' gradients once. That is Megatron's f operator; the count is a property of "
                 "the plan, not of parallelize_module."),
    Exercise("09-sp-memory", "GPT-3 175B (hidden 12288, 96 heads), s = 2048, b = 1, 16-bit activations, tp 8 with "
             "sequence parallelism, no recomputation: activation memory one layer keeps for backward, in GiB "
             "(Korthikanti et al. 2022, Table 2)?", "GiB", _sp_layer_GiB, tolerance=0.02,
             hint="s·b·h·(34/t + 5·a·s/(h·t)) bytes for 16-bit activations",
             why="the 5·a·s/h term (per score the softmax output, 2 bytes, the dropout mask, 1, and the dropout "
                 "output, 2; the raw QKᵀ scores are not kept) is twice the rest here; selective recomputation "
                 "drops it, and FlashAttention never stores it."),
    Exercise("09-step-calls", "The lesson's 2-block model, TP + SP on 2 ranks, one training step with AdamW: how "
             "many collectives does each rank issue in all (forward, backward and optimizer)?", "count",
             lambda: len(sequence(LESSON_MODEL, 2, True)), tolerance=0,
             hint="per block an all-gather and a reduce-scatter around attention and around the MLP, each way; "
                  "the embedding and the head; and the norms: a SequenceParallel norm's weight gradient is "
                  "Partial, and AdamW reads each gradient 3 times",
             why="the optimizer adds 3 all-reduces per norm parameter: a SequenceParallel norm's gradient is "
                 "Partial(sum), and every read of a Partial DTensor all-reduces it."),
    Exercise("09-dp-nodes", "64 GPUs on 8-GPU nodes (ranks numbered node by node), mesh (dp_shard 8, tp 8) laid "
             "out row-major: over how many different nodes are the ranks of one dp_shard group spread?", "count",
             lambda: dp_shard_nodes({"dp_shard": 8, "tp": 8}), tolerance=0,
             hint="the last mesh dimension varies fastest: a tp group is 8 consecutive ranks",
             why="one rank per node: rank 0's dp_shard group is 0, 8, 16, ..., 56. TP's per-layer collectives stay "
                 "on NVLink; FSDP's all-gathers and reduce-scatters cross the network, once per unit."),
)
