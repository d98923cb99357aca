"""Lesson 09's diagram of one Llama block under tensor parallelism: every module with its weight's placement,
every edge with the activation's placement on the tp mesh dimension, and every collective with the torch
construct it comes from, for three plans.

    >>> [s.forward for s in block_flow(sequence_parallel=False) if s.kind == "collective" and s.forward]
    ['all_reduce', 'all_reduce']
    >>> plot_block(sequence_parallel=True)          # a Figure, shown inline in Jupyter     # doctest: +SKIP

The plans (torch 2.13, torch/distributed/tensor/parallel/style.py; runtime/parallel/tp/run.py builds the same):

- **plain TP, per module**: q, k, v, gate, up ``ColwiseParallel()``; o, down ``RowwiseParallel()``. Each
  ColwiseParallel wraps its plain-tensor input with its own ``DTensor.from_local(..., Replicate())``; backward,
  each from_local's ``_FromTorchTensor.backward`` (tensor/_api.py) turns the Partial input gradient into
  Replicate: one all_reduce per column-parallel linear. Row-parallel outputs are Partial, all-reduced forward
  (output_layouts=Replicate()).
- **plain TP, prepared inputs**: the same, plus attention and the MLP wrapped in
  ``PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Replicate())`` (use_local_output=False),
  as torchtitan's ``apply_tp`` wraps them: one from_local per part, whose backward all-reduces the sum of the
  linears' Partial gradients once: Megatron's f operator (Shoeybi et al. 2019, arXiv 1909.08053, Fig. 3).
- **TP + SP** (torchtitan's plan; Korthikanti et al. 2022, arXiv 2205.05198): the residual stream and the norms
  ``Shard(1)`` (``SequenceParallel()``); PrepareModuleInput ``Shard(1) -> Replicate()`` all-gathers forward
  (reduce-scatters backward); the row-parallel outputs ``Partial -> Shard(1)`` reduce-scatter forward
  (all-gather backward).

``block_flow`` derives the steps from the plan's options and the model's structure (separate or fused qkv,
SwiGLU or GeLU MLP); tests/test_lessons_lib.py checks its collectives against the simulator's TP plan
(sim/parallel/tp/plan.py), which tests/test_tp_runtime.py checks against what torch issues.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

from distlab.sim.lessons.helpers import Figure


@dataclass(frozen=True)
class Step:
    """One step of the flow: a module (``label``, its weights' placement in ``detail``), or a collective
    (``forward``/``backward`` kinds, ``calls`` of each in backward, ``source``: the construct that issues it).
    ``placement``: the activation's placement on the edge after this step."""
    kind: str                     # "module" or "collective"
    label: str
    placement: str
    detail: str = ""
    forward: str | None = None
    backward: str | None = None
    calls: int = 1
    source: str = ""


def plan_name(sequence_parallel: bool, prepare_input: bool = False) -> str:
    if sequence_parallel:
        return "TP + SP (torchtitan)"
    return "plain TP, prepared inputs" if prepare_input else "plain TP, per module"


def block_flow(sequence_parallel: bool, prepare_input: bool = False, qkv: str = "separate",
               mlp: str = "swiglu") -> list[Step]:
    """The steps of one block's attention half then MLP half (module docstring)."""
    stream = "Shard(1)" if sequence_parallel else "Replicate()"
    col = {"attn": ["q, k, v"] if qkv == "fused" else ["q", "k", "v"],
           "mlp": ["gate", "up"] if mlp == "swiglu" else ["fc"]}
    names = {"attn": ("norm1", "SDPA", "o"), "mlp": ("norm2", "SiLU(gate)·up" if mlp == "swiglu" else "GeLU",
                                                     "down")}
    steps = []
    for part in ("attn", "mlp"):
        norm, middle, row = names[part]
        steps.append(Step("module", norm, stream, "SequenceParallel()" if sequence_parallel else
                          "replicated, plain tensor"))
        linears = ", ".join(col[part])
        if sequence_parallel:
            steps.append(Step("collective", f"{part} input", "Replicate()", forward="all_gather",
                              backward="reduce_scatter", source="PrepareModuleInput(Shard(1) -> Replicate())"))
        elif prepare_input:
            steps.append(Step("collective", f"{part} input", "Replicate()", backward="all_reduce",
                              source="PrepareModuleInput(Replicate()): one from_local, its backward"))
        else:
            steps.append(Step("collective", f"{part} input", "Replicate()", backward="all_reduce",
                              calls=len(col[part]), source=f"each ColwiseParallel's from_local ({linears})"))
        steps.append(Step("module", linears, "Shard(-1)", "ColwiseParallel: W Shard(0)"))
        steps.append(Step("module", middle, "Shard(-1)", "local heads" if part == "attn" else "local columns"))
        steps.append(Step("module", row, "Partial()", "RowwiseParallel: W Shard(1)"))
        if sequence_parallel:
            steps.append(Step("collective", f"{part} output", "Shard(1)", forward="reduce_scatter",
                              backward="all_gather", source="RowwiseParallel(output_layouts=Shard(1))"))
        else:
            steps.append(Step("collective", f"{part} output", "Replicate()", forward="all_reduce",
                              source="RowwiseParallel(output_layouts=Replicate())"))
    return steps


def block_collectives(steps: list[Step], phase: str) -> list[str]:
    """The collective kinds of one block in issue order: forward in flow order, backward in reverse."""
    if phase == "forward":
        return [s.forward for s in steps if s.kind == "collective" and s.forward]
    return [s.backward for s in reversed(steps) if s.kind == "collective" and s.backward
            for _ in range(s.calls)]


COLOURS = {"Replicate()": "#3182bd", "Shard(1)": "#31a354", "Shard(-1)": "#756bb1", "Partial()": "#e6550d"}


def plot_block(sequence_parallel: bool | None = None, prepare_input: bool = False) -> Figure:
    """The flow of one block, left to right, for one plan (or the three plans, one row each, when
    ``sequence_parallel`` is None): modules as boxes, each edge coloured and labelled with its placement,
    collectives as red markers with their forward / backward kinds and their source."""
    plans = [(False, False), (False, True), (True, False)] if sequence_parallel is None else \
        [(sequence_parallel, prepare_input)]
    f = Figure(16, 2.9 * len(plans))
    ax = f.ax
    for row, (sp, prep) in enumerate(plans):
        y = -row * 3.0
        steps = block_flow(sp, prep)
        ax.text(-0.6, y + 1.05, plan_name(sp, prep), fontsize=10, weight="bold", ha="left")
        x, previous = 0.0, "Shard(1)" if sp else "Replicate()"
        for s in steps:
            colour = COLOURS.get(previous, "#555555")
            ax.plot([x - 0.55, x - 0.05], [y, y], color=colour, lw=3)
            ax.text(x - 0.3, y - 0.22, previous, fontsize=6, color=colour, ha="center", va="top", rotation=0)
            if s.kind == "module":
                ax.text(x + 0.4, y, s.label, fontsize=8, ha="center", va="center",
                        bbox=dict(boxstyle="round,pad=0.3", fc="#f2f2f2", ec="#888888"))
                ax.text(x + 0.4, y - 0.55, textwrap.fill(s.detail, 18, break_long_words=False), fontsize=6, ha="center", va="top",
                        color="#444444")
                x += 1.45
            else:
                ax.scatter([x + 0.15], [y], marker="D", s=60, color="#b3261e", zorder=3)
                what = [f"fwd {s.forward}" if s.forward else "fwd -",
                        f"bwd {s.backward}" + (f" x{s.calls}" if s.calls > 1 else "") if s.backward else "bwd -"]
                ax.text(x + 0.15, y + 0.3, "\n".join(what), fontsize=6.5, ha="center", va="bottom",
                        color="#b3261e")
                ax.text(x + 0.15, y - 0.55, textwrap.fill(s.source, 28, break_long_words=False), fontsize=5.5, ha="center", va="top",
                        color="#7a1d16")
                x += 1.2
            previous = s.placement
        ax.plot([x - 0.55, x - 0.05], [y, y], color=COLOURS.get(previous, "#555555"), lw=3)
        ax.text(x - 0.3, y - 0.22, previous, fontsize=6, color=COLOURS.get(previous), ha="center", va="top")
    ax.set_xlim(-0.8, x + 0.2)
    ax.set_ylim(-3.0 * (len(plans) - 1) - 1.3, 1.5)
    ax.axis("off")
    ax.set_title("one Llama block under tensor parallelism: placements on every edge (tp dimension), "
                 "collectives where they come from", fontsize=10)
    return f
