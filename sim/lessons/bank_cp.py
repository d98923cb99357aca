"""Lesson 10, long-context half: context parallelism (sim/parallel/cp/). The helpers the notebook calls and its exercises;
expected values come from the library (sim/parallel/cp/ring.py, sim/parallel/cp/memory.py), so they match what the lesson runs."""
from __future__ import annotations

from distlab.sim.lessons.checker import Exercise

GiB, MiB = 2**30, 2**20
LONG = {"preset": "llama3-8b", "seq_len": 131072, "micro_batch": 1}       # the lesson's running example


def long_model(seq_len: int = 131072):
    from distlab.sim.models import model_from_spec
    return model_from_spec({**LONG, "seq_len": seq_len})


def activations_GiB(cp: int, seq_len: int = 131072) -> float:
    """Activation memory per GPU of Llama 3 8B on one sequence, no recompute (sim/parallel/cp/memory.py)."""
    from distlab.sim.parallel.cp.memory import cp_memory
    return cp_memory(long_model(seq_len), cp, cp)["activations"] / GiB


def gpt_formula_GiB(seq_len: int = 131072) -> float:
    """What Korthikanti et al.'s GPT formula (34·s·b·h per block, no s x s term) plus bf16 logits would say for
    Llama 3 8B: the usual wrong answer of lesson 10's first exercise (sim/lessons/activation_bytes.py)."""
    from distlab.sim.lessons.activation_bytes import gpt_formula_bytes
    c = long_model(seq_len).config
    block = gpt_formula_bytes(seq_len, 1, c["hidden"], c["heads"], recompute="selective")
    return (c["layers"] * block + seq_len * c["vocab"] * 2) / GiB


def memory_rows(cps=(1, 2, 4, 8, 16), seq_len: int = 131072) -> list[list]:
    """[cp, tokens per GPU, activations GiB, ring buffers GiB, static GiB] per cp."""
    from distlab.sim.parallel.cp.memory import cp_memory
    out = []
    for cp in cps:
        m = cp_memory(long_model(seq_len), cp, cp)
        out.append([cp, seq_len // cp, round(m["activations"] / GiB, 1), round(m.get("ring buffers", 0) / GiB, 2),
                    round((m["params"] + m["grads"] + m["optimizer"]) / GiB, 1)])
    return out


def kv_MiB(cp: int, seq_len: int = 131072, heads_in_ring: int | None = None) -> float:
    """One K/V rotation's buffer, cat(k, v) of the local tokens, bf16 (sim/parallel/cp/ring.py; torchtitan repeats the
    GQA heads, so the ring carries all 32 unless ``heads_in_ring`` says otherwise)."""
    c = long_model(seq_len).config
    h = c["hidden"] if heads_in_ring is None else heads_in_ring * c["hidden"] // c["heads"]
    return 2 * (seq_len // cp) * h * 2 / MiB


def attention_work(cp: int, load_balance: bool) -> list[float]:
    """Per rank, its attention work over the ring steps in units of one causal s x s block (torch's
    _is_causal_behavior; sim/parallel/cp/ring.py step_kind/step_flops)."""
    from distlab.sim.parallel.cp.ring import step_flops, step_kind
    return [sum(step_flops(step_kind(j, cp, i, load_balance), 1, 1, 1) for i in range(cp)) / 2.0
            for j in range(cp)]


def ring_trace(cp: int = 8, method: str = "alltoall", direction: str = "forward", cluster: str = "dgx-h100"):
    """One layer's ring attention of the running example on ``cp`` GPUs of ``cluster``, simulated."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.parallel.cp.ring import Ring
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.plan import Plan
    c = long_model().config
    ranks = []
    for r in range(cp):
        ops: list = []
        getattr(Ring(ops, r, tuple(range(cp)), 1, c["seq_len"] // cp, c["hidden"], "bfloat16", 2, method),
                direction)("attn")
        ranks.append(ops)
    return simulate(Plan(ranks, name=f"ring-{method}-cp{cp}").validate(), load_cluster(cluster).with_world_size(cp))


def ring_rows(cp: int = 8) -> list[list]:
    """[what, ms] of one layer on dgx-h100: a ring step's forward compute, a K/V permute, the forward ring."""
    trace = ring_trace(cp)
    r0 = [o for o in trace.ops if o.rank == 0]
    step = next(o for o in r0 if o.kind == "compute")
    send = next(o for o in r0 if o.kind == "send")
    return [["one ring step (attention compute)", round((step.end - step.start) * 1e3, 3)],
            ["one K/V permute", round((send.end - send.start) * 1e3, 3)],
            [f"forward ring, {cp} steps", round(trace.makespan * 1e3, 3)]]


def ring_margin(cp: int = 8) -> float:
    """One ring step's attention compute over one K/V permute, simulated: above 1 the rotation hides."""
    rows = dict(ring_rows(cp))
    return rows["one ring step (attention compute)"] / rows["one K/V permute"]


EXERCISES = (
    Exercise("10-activations-cp1", "Llama 3 8B on one 131072-token sequence, no activation recompute: how many "
             "GiB of activations does one GPU hold at its peak without CP (cp 1)? Within 5%.", "GiB",
             lambda: activations_GiB(1), tolerance=0.05,
             traps=lambda: {gpt_formula_GiB(): "that is GPT's formula (s·b·h·34 per block plus the logits); a "
                                               "Llama block keeps other tensors: add up the table's"},
             hint="add the bytes per token of one block (the table above: Llama's own tensors, not GPT's "
                  "s·b·h·34), times 131072 tokens and 32 blocks; then the head's kept tensors, and at the peak "
                  "what its backward holds on top (the table's last row), also per token",
             why="hundreds of GiB against 80 on an H100: the sequence itself does not fit. The logits alone (fp32 "
                 "log-softmax kept, bf16 and fp32 copies during the head's backward) are a fifth of it. Recompute "
                 "alone keeps the block inputs, still s·h·2 bytes per block; CP divides every token-proportional "
                 "term by cp."),
    Exercise("10-kv-MiB", "Same model, cp 8: how many MiB does one rank send per K/V rotation (bf16, torchtitan "
             "repeats the 8 K/V heads to all 32 before attention)?", "MiB", lambda: kv_MiB(8),
             traps=lambda: {kv_MiB(8, heads_in_ring=8): "that is with 8 K/V heads: torchtitan's repeat_kv runs "
                                                        "before SDPA, so the ring carries 32"},
             hint="cat(k, v): 2 x local tokens x hidden x 2 bytes, local tokens = 131072 / 8",
             why="256 MiB per step, cp - 1 steps per layer forward: the ring moves the whole K/V of the sequence "
                 "through every GPU, once forward and again backward (with fp32 dK/dV on top)."),
    Exercise("10-lb-speedup", "cp 8, causal attention. Without load balancing rank 7 holds the last tokens and "
             "attends to everything before. How many times more attention work does it do than any rank with "
             "head-tail balancing?", "x", lambda: max(attention_work(8, False)) / max(attention_work(8, True)),
             hint="count causal halves: step 0 is one, a full block two, a skipped block none; balanced, every "
                  "step is one",
             why="(2·cp - 1) / cp = 15/8: the unbalanced ring waits for its last rank; head-tail chunks (rank j "
                 "holds chunks j and 2·cp-1-j) give everyone the same work, which is why torch balances by "
                 "default when the sequence splits into 2 x cp chunks."),
    Exercise("10-ring-margin", "Llama 3 8B at 128K on one dgx-h100 node, cp 8: how many times longer is one ring "
             "step's attention compute than one K/V permute (above 1, the rotation hides behind it)? Within 25%.",
             "x", ring_margin, tolerance=0.25,
             hint="the permute: one rank's K/V buffer (the previous exercise) over NVLink's 450 GB/s; a balanced "
                  "step: half of a block of s = 16384 local tokens, 2·b·s²·h FLOPs forward, at the H100's dense "
                  "bf16 rate (989 TFLOP/s at peak; how much of it attention reaches is sim/compute/'s model)",
             why="the compute grows with s², the bytes with s: at long context the ring hides; at short context "
                 "or across nodes (50 GB/s per GPU) it may not, which is why CP groups stay inside a node when "
                 "they can."),
)
