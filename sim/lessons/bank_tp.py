"""Lesson 09 (DeviceMesh and DTensor): tables, a figure and the exercises, computed from the simulator's TP plans
(sim/parallel/tp/: plan.py, rules.py, memory.py, compose.py), never typed in. No torch here: the real run is
runtime/tp/lesson.py."""
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


def collective_counts(model=LESSON_MODEL, tp: int = 2, sequence_parallel: bool = True) -> dict:
    """{(phase, kind, bytes of one call): calls} of one rank's step (sim/parallel/tp/plan.py)."""
    out: dict = {}
    for kind, nbytes, _, _, phase in collective_sequence(tp_plan(model, Mesh({"tp": tp}),
                                                                 TPOptions(sequence_parallel=sequence_parallel))):
        out[(phase, kind, nbytes)] = out.get((phase, kind, nbytes), 0) + 1
    return out


def kind_counts(model=LESSON_MODEL, tp: int = 2, sequence_parallel: bool = True) -> dict:
    """{kind: calls} of one rank's step."""
    out: dict = {}
    for (_, kind, _), n in collective_counts(model, tp, sequence_parallel).items():
        out[kind] = out.get(kind, 0) + n
    return out


def per_block(model, tp: int, sequence_parallel: bool, phase: str, kind: str) -> int:
    """Collectives of ``kind`` in ``phase`` per transformer block: the plan's count for ``model`` less that for
    the same model with one block fewer."""
    c = {k: v for k, v in model.config.items() if k in ("hidden", "heads", "kv_heads", "seq_len", "vocab",
                                                         "micro_batch", "dtype", "arch", "ffn_hidden")}
    n = model.config["layers"]
    count = [sum(v for (ph, kd, _), v in collective_counts(gpt(layers=k, **c), tp, sequence_parallel).items()
                 if (ph, kd) == (phase, kind)) for k in (n - 1, n)]
    return count[1] - count[0]


def collectives_table(model=LESSON_MODEL, tp: int = 2) -> Table:
    """Per phase, kind and size, the calls of one rank's step, plain TP beside TP + SP."""
    plain, sp = collective_counts(model, tp, False), collective_counts(model, tp, True)
    rows = [[ph, kind, f"{b} B", plain.get((ph, kind, b), "-"), sp.get((ph, kind, b), "-")]
            for ph, kind, b in sorted(set(plain) | set(sp))]
    return Table(["phase", "collective", "bytes per call", "plain TP", "TP + SP"], rows,
                 f"{model.name}, tp {tp}: one rank's step (calls)")


def plot_tp_bytes(model=LESSON_MODEL, tp: int = 2) -> Figure:
    """Bytes each kind of collective moves in one step, plain TP against TP + SP."""
    labels, values = [], []
    for sp, tag in ((False, "TP"), (True, "TP+SP")):
        totals: dict = {}
        for (_, kind, b), n in collective_counts(model, tp, sp).items():
            totals[kind] = totals.get(kind, 0) + n * b
        for kind, b in sorted(totals.items()):
            labels.append(f"{tag}\n{kind}")
            values.append(b / 1024)
    f = Figure(7.5, 3.8)
    f.ax.bar(labels, values, color=["#e6550d" if "SP" in lab else "#3182bd" for lab in labels])
    f.ax.set_ylabel("KiB per rank and step")
    f.ax.set_title(f"{model.name}, tp {tp}: all-reduces become reduce-scatters + all-gathers")
    return f


def commdebug_table(real: dict, model=LESSON_MODEL) -> Table:
    """Per variant of a real run (runtime/tp/lesson.py) and kind: the plan's calls against CommDebugMode's
    count, and whether the captured sequence (kind, bytes, dtype, group, phase) equals the plan's."""
    rows = []
    for v in real["variants"]:
        sp = v["sequence_parallel"]
        want = kind_counts(model, real["world_size"], sp)
        plan = collective_sequence(tp_plan(model, Mesh({"tp": real["world_size"]}),
                                           TPOptions(sequence_parallel=sp)))
        for kind in sorted(set(want) | set(v["comm_debug"])):
            rows.append(["TP + SP" if sp else "plain TP", kind, want.get(kind, 0), v["comm_debug"].get(kind, 0),
                         "yes" if [tuple(c) for c in v["sequence"]] == plan else "NO"])
    return Table(["plan", "collective", "simulated calls", "CommDebugMode calls", "same sequence, bytes, dtypes"],
                 rows, f"one training step on {real['world_size']} real gloo ranks")


def mesh_table(dims: dict) -> Table:
    """Each rank's coordinates and its group along each dimension of ``dims`` (sim/mesh.py, row-major)."""
    mesh = Mesh(dims)
    rows = [[r, tuple(mesh.coords(r).values()), *(mesh.group_of(r, d) for d in dims)]
            for r in range(mesh.world_size)]
    return Table(["rank", "coordinates", *(f"{d} group" for d in dims)], rows, f"mesh {dims}")


def activation_table(name: str = "llama3-8b", seq_len: int = 8192, tp: int = 8) -> Table:
    """One layer's activation memory (Korthikanti et al. 2022 Table 2) with bf16 activations, b = 1."""
    c = preset(name).config
    rows = []
    for what, t, sp, rc in (("no parallelism", 1, False, "none"), ("TP", tp, False, "none"),
                            ("TP + SP", tp, True, "none"), ("TP + SP + selective", tp, True, "selective")):
        b = activation_bytes_per_layer(seq_len, 1, c["hidden"], c["heads"], t, sp, rc)
        rows.append([what, t, f"{b / 2**30:.3f} GiB"])
    return Table(["layout", "tp", "per layer"], rows, f"{name}, s = {seq_len}, b = 1: activations kept for backward")


def _k_shard_MiB() -> float:
    q = next(p for p in preset("llama3-8b").params if p.name == "h.0.attn.k.weight")
    return math.prod(local_shape(q, 8)) * 2 / 2**20


def _sp_layer_GiB() -> float:
    c = preset("llama3-8b").config
    return activation_bytes_per_layer(8192, 1, c["hidden"], c["heads"], 8, True, "none") / 2**30


EXERCISES = (
    Exercise("09-k-shard", "Llama 3 8B's k projection maps 4096 features to 8 KV heads x 128 = 1024; "
             "ColwiseParallel shards its weight (1024 x 4096) with Shard(0) over tp 8. One rank's shard in bf16, "
             "in MiB?", "MiB", _k_shard_MiB, tolerance=0.01,
             hint="Shard(0) splits the output features (rows): 1024 / 8 rows of 4096, 2 bytes each",
             why="128 x 4096 x 2 B = 1 MiB: each rank holds one KV head's projection."),
    Exercise("09-fwd-allreduce", "Plain (Megatron) TP, forward: how many all-reduces does one transformer block "
             "issue?", "count", lambda: per_block(LESSON_MODEL, 2, False, "forward", "all_reduce"), tolerance=0,
             hint="a column-parallel linear needs no communication; a row-parallel one leaves partial sums",
             why="one after attention's o (row-parallel) and one after the MLP's down: Megatron's g operator."),
    Exercise("09-bwd-allreduce", "Same plain TP, backward, with separate q, k, v and a SwiGLU MLP (gate, up): "
             "how many all-reduces per block does torch issue?", "count",
             lambda: per_block(LESSON_MODEL, 2, False, "backward", "all_reduce"), tolerance=0,
             hint="Megatron's f operator all-reduces the input gradient once per column-parallel input; here "
                  "every ColwiseParallel module converts its own input",
             why="5: ColwiseParallel makes its input Replicate with its own from_local, whose backward all-reduces "
                 "the partial gradient: q, k, v, gate and up each (torch/distributed/tensor/parallel/style.py). "
                 "Megatron's fused qkv and fc1 give 2."),
    Exercise("09-sp-memory", "Llama 3 8B, s = 8192, b = 1, bf16, tp 8 with sequence parallelism, no "
             "recomputation: activation memory one layer keeps for backward, in GiB (Korthikanti et al. 2022, "
             "Table 2)?", "GiB", _sp_layer_GiB, tolerance=0.02,
             hint="s·b·h·(34/t + 5·a·s/(h·t)) bytes for 16-bit activations",
             why="the 5·a·s/h attention term dominates at s = 8192; selective recomputation drops it."),
    Exercise("09-step-calls", "The lesson's 2-block model, TP + SP on 2 ranks, one training step with AdamW: how "
             "many collectives does each rank issue in all (forward, backward and optimizer)?", "count",
             lambda: len(collective_sequence(tp_plan(LESSON_MODEL, Mesh({"tp": 2}), TPOptions()))), tolerance=0,
             hint="per block 2 all-gathers and 2 reduce-scatters each way, the embedding and head, and the norms' "
                  "Partial gradients: AdamW reads each gradient 3 times",
             why="the optimizer adds 3 all-reduces per norm parameter: a SequenceParallel norm's gradient is "
                 "Partial(sum), and every read of a Partial DTensor all-reduces it."),
    Exercise("09-tp-peer", "A 2 x 2 mesh with dimensions (dp_shard, tp), ranks laid out row-major: which rank "
             "shares rank 3's tp group?", "count", lambda: [r for r in Mesh({"dp_shard": 2, "tp": 2}).group_of(3, "tp")
                                                             if r != 3][0], tolerance=0,
             hint="the last dimension varies fastest", why="coordinates (1, 1): its tp group is (2, 3)."),
)
