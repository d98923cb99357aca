"""The runs file of `distlab reproduce`: published training runs as data (sim/reproduce/runs.yaml is shipped).

    >>> from distlab.sim.reproduce.runs import load_runs
    >>> runs, fitted = load_runs()
    >>> runs[0].name, runs[0].figure
    ('megatron-1.7b', ('tflops_per_gpu', 137.0))

Every run names its source (paper or file, table, row) and the figure it reports; keys the source leaves unsaid
are listed in ``assumed``. Loading checks each run and raises ConfigError naming the run and the key: a layout
whose product is not the GPU count, an unknown GPU or cluster, float8 or an FP8 recipe (``fp8_recipe``,
sim/compute/fp8.py) on a GPU without FP8 tensor cores, MXFP8 before Blackwell, a GB200 job that is not whole
compute trays, Megatron's vocabulary padding (``make_vocab_size_divisible_by``) not a whole number, a split
that does not add up, a missing figure, ``ep`` (experts sharded over the data-parallel ranks) on a dense model or
not dividing dp, an HSDP ``dp_shard`` not dividing dp or without zero 2-3. What a run used that the simulator
cannot express yet is not an error: ``not_expressible(run)`` names it and `distlab reproduce` lists the row as such. The compute model's fitted
constants live in sim/compute/fitted.py (one model for every command); ``load_runs`` returns them beside the runs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from distlab.sim.errors import ConfigError

DEFAULT_PATH = os.path.join(os.path.dirname(__file__), "runs.yaml")
FIGURES = ("tflops_per_gpu", "mfu", "tokens_per_s", "tokens_per_s_per_gpu", "iteration_s")
LAYOUT_KEYS = ("tp", "pp", "virtual_stages", "dp", "cp", "zero", "split", "ep", "dp_shard")
RUN_KEYS = ("name", "source", "model", "gpu", "cluster", "gpus", "layout", "global_batch", "micro_batch",
            "precision", "recompute", "attention", "schedule", "flops", "reported", "assumed", "sequence_parallel",
            "overlap_grad_reduce", "tp_comm_overlap", "compile", "not_expressible", "make_vocab_size_divisible_by",
            "fp8_recipe")
FLOPS_FORMULAS = ("megatron-eq3", "megatron-core-0.8", "6nd", "palm")
SCHEDULES = ("1f1b", "interleaved", "gpipe")   # sim/parallel/pipeline/schedules.py names
PRECISIONS = ("bfloat16", "float16", "float8")  # float8: bf16 with float8 linears (torchao / Transformer Engine)
RECOMPUTES = ("none", "selective", "full", "op")   # op: torchtitan's per-op SAC (sim/reproduce/plans.py)
ATTENTIONS = ("flash", "flash2", "unfused")        # flash2: PyTorch SDPA's FlashAttention-2 (sim/compute/kernels.py)
CHOICES = (("recompute", RECOMPUTES), ("attention", ATTENTIONS),
           ("schedule", SCHEDULES), ("flops", FLOPS_FORMULAS), ("precision", PRECISIONS))


@dataclass
class Run:
    name: str
    source: str
    model: dict
    gpu: str
    cluster: str
    gpus: int
    layout: dict
    global_batch: int
    micro_batch: int
    precision: str = "bfloat16"
    recompute: str = "none"
    attention: str = "flash"           # flash (FlashAttention, causal half skipped) | flash2 (SDPA's) | unfused
    schedule: str = "1f1b"
    flops: str = "megatron-eq3"
    reported: dict = field(default_factory=dict)
    assumed: list = field(default_factory=list)
    sequence_parallel: bool = False
    overlap_grad_reduce: bool = False  # dp gradient reduction overlapped with the backward (torch DDP, Megatron's flag)
    tp_comm_overlap: bool = False      # Megatron's --tp-comm-overlap
    compile: bool = False              # torch.compile
    not_expressible: str | None = None  # what the source ran that no key here expresses
    make_vocab_size_divisible_by: int | None = None   # Megatron's flag (its default 128): vocab padded (module doc)
    fp8_recipe: str | None = None      # with precision float8: how the linears ran it (sim/compute/fp8.py)

    @property
    def figure(self) -> tuple[str, float]:
        """(name, value) of the reported figure compared with the prediction (the first of FIGURES given)."""
        key = next(k for k in FIGURES if k in self.reported)
        return key, float(self.reported[key])

    @property
    def microbatches(self) -> int:
        """Micro-batches per pipeline (or per step: gradient accumulation) = global batch / (dp x micro-batch)."""
        return self.global_batch // (self.layout["dp"] * self.micro_batch)

    @property
    def padded_vocab(self) -> int | None:
        """The vocabulary as the run built it: Megatron pads it to a multiple of make_vocab_size_divisible_by x tp
        (megatron/training/tokenizer/tokenizer.py ``_vocab_size_with_padding``: ``multiple =
        args.make_vocab_size_divisible_by * args.tensor_model_parallel_size``, rounded up), so GPT-3's 50,257 at
        tp 4 becomes 50,688; None where the run's model spec names no vocab or the run sets no padding."""
        vocab = self.model.get("vocab") if isinstance(self.model, dict) else None
        if vocab is None or not self.make_vocab_size_divisible_by:
            return vocab
        multiple = self.make_vocab_size_divisible_by * self.layout["tp"]
        return -(-vocab // multiple) * multiple

    @property
    def model_spec(self) -> dict:
        """The run's model spec with the vocabulary as the run built it (``padded_vocab``)."""
        return {**self.model, "vocab": self.padded_vocab} if self.padded_vocab is not None else dict(self.model)

    @property
    def table(self) -> str:
        """The source without its row: what the accuracy summary groups by."""
        return self.source.split(", row")[0]


def not_expressible(run: Run) -> str | None:
    """Why the simulator cannot run what ``run`` ran yet, or None."""
    L = run.layout
    if run.not_expressible:
        return run.not_expressible
    if L["cp"] > 1:
        return ("context parallelism inside a published PP x FSDP2 x TP layout: reproduce builds PP x FSDP2 x TP "
                "(sim/reproduce/scenario.py) without a cp mesh dimension yet")
    from distlab.sim.reproduce.scenario import is_moe
    if is_moe(run):                          # the EP builder (sim/parallel/ep/plan.py): pp x dp x ep
        if L["tp"] > 1:
            return ("tensor parallelism in a MoE run (Megatron's expert tensor parallelism): the EP builder "
                    "composes pp x dp x ep only")
        if L["zero"] >= 2:
            return "experts under FSDP2 / ZeRO-2 or 3: the EP builder shards with ZeRO-1 only"
        if L["pp"] > 1 and L["virtual_stages"] != (2 if run.schedule == "interleaved" else 1):
            return (f"{run.schedule} with {L['virtual_stages']} stages per rank in a MoE run: the EP builder runs 1 "
                    "(1f1b, gpipe) or 2 (interleaved)")
        from distlab.sim.reproduce.scenario import EP_MAX_OPS, ep_plan_ops
        if ep_plan_ops(run) > EP_MAX_OPS:
            return (f"an EP plan of about {ep_plan_ops(run):,} ops: EP plans are built rank by rank, without the "
                    f"symmetry classes of dense plans (at most {EP_MAX_OPS:,}, about a minute)")
    return None


def load_runs(path: str | None = None):
    """The runs of ``path`` (default: the shipped runs.yaml), checked, and the compute model's fitted constants
    per generation (sim/compute/fitted.py)."""
    from distlab.sim.compute.fitted import FITTED
    from distlab.sim.io import load_yaml
    path = path or DEFAULT_PATH
    d = load_yaml(path)
    if not isinstance(d, dict) or not isinstance(d.get("runs"), list) or set(d) - {"runs"}:
        raise ConfigError("a runs file is a mapping with one key, a list 'runs' (the compute model's fitted "
                          "constants live in sim/compute/fitted.py)", path)
    runs = [_run(r, i, path) for i, r in enumerate(d["runs"])]
    names = [r.name for r in runs]
    for n in names:
        if names.count(n) > 1:
            raise ConfigError(f"run name {n!r} appears twice", f"{path}: runs")
    return runs, dict(FITTED)


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _run(r, i: int, path: str) -> Run:
    from distlab.sim.cluster import GPUS, PRESETS
    if not isinstance(r, dict):
        raise ConfigError("a run is a mapping", f"{path}: runs[{i}]")
    label = f"{path}: run {r.get('name', i)!r}"
    for k in r:
        if k not in RUN_KEYS:
            raise ConfigError(f"unknown key {k!r}; allowed: {', '.join(RUN_KEYS)}", f"{label}.{k}")
    for k in ("name", "source", "model", "gpu", "cluster", "gpus", "layout", "global_batch", "micro_batch",
              "reported"):
        if k not in r:
            raise ConfigError(f"missing key {k!r}", f"{label}.{k}")
    if r["gpu"] not in GPUS:
        raise ConfigError(f"unknown gpu {r['gpu']!r}; allowed: {', '.join(GPUS)}", f"{label}.gpu")
    if r["cluster"] not in PRESETS:
        raise ConfigError(f"unknown cluster {r['cluster']!r}; allowed: {', '.join(PRESETS)}", f"{label}.cluster")
    gpu = PRESETS[r["cluster"]].gpu
    if gpu.name != r["gpu"]:
        raise ConfigError(f"cluster {r['cluster']!r} has {gpu.name} GPUs, not {r['gpu']}", f"{label}.gpu")
    for k in ("gpus", "global_batch", "micro_batch"):
        if not _whole(r[k]):
            raise ConfigError(f"{r[k]!r} must be a whole number >= 1", f"{label}.{k}")
    tray = PRESETS[r["cluster"]].tray_gpus
    if tray and r["gpus"] % tray:
        raise ConfigError(f"{r['gpus']} GPUs are not whole compute trays of {tray} {gpu.name.upper()}; allowed: a "
                          f"multiple of {tray}", f"{label}.gpus")
    for k, allowed in CHOICES:
        if k in r and r[k] not in allowed:
            raise ConfigError(f"unknown {k} {r[k]!r}; allowed: {', '.join(allowed)}", f"{label}.{k}")
    if r.get("precision") == "float8" and not gpu.fp8_tflops:
        raise ConfigError(f"float8 needs FP8 tensor cores and {gpu.name} has none; allowed on {gpu.name}: bfloat16, "
                          "float16", f"{label}.precision")
    if "fp8_recipe" in r:
        from distlab.sim.compute.fp8 import check_recipe
        check_recipe(r["fp8_recipe"], gpu, f"{label}.fp8_recipe")
        if r.get("precision") != "float8":
            raise ConfigError(f"fp8_recipe {r['fp8_recipe']} goes with precision float8, not "
                              f"{r.get('precision', 'bfloat16')}; allowed: precision float8, or no fp8_recipe",
                              f"{label}.fp8_recipe")
    for k in ("sequence_parallel", "overlap_grad_reduce", "tp_comm_overlap", "compile"):
        if k in r and not isinstance(r[k], bool):
            raise ConfigError(f"{r[k]!r} must be true or false", f"{label}.{k}")
    v = r.get("make_vocab_size_divisible_by")
    if v is not None and not _whole(v):
        raise ConfigError(f"{v!r} must be a whole number >= 1 (Megatron's default: 128)",
                          f"{label}.make_vocab_size_divisible_by")
    if "not_expressible" in r and not isinstance(r["not_expressible"], str):
        raise ConfigError("must be the reason, a sentence", f"{label}.not_expressible")
    layout = _layout(r, label)
    if r["global_batch"] % (layout["dp"] * r["micro_batch"]):
        raise ConfigError(f"global_batch {r['global_batch']} is not a multiple of dp {layout['dp']} x micro_batch "
                          f"{r['micro_batch']}", f"{label}.global_batch")
    _check_reported(r["reported"], label)
    if isinstance(r["model"], str):
        from distlab.sim.models import spec_from_text
        r = {**r, "model": spec_from_text(r["model"], f"{label}.model")}
    if not isinstance(r["model"], dict):
        raise ConfigError("must be a model spec (docs/models.md): a preset, a config.json path or a mapping of "
                          "builder arguments (arch, layers, hidden, ...)", f"{label}.model")
    spec = dict(r["model"])                                     # checked here, as a scenario's model is
    if not any(k in spec for k in ("kind", "preset", "hf_config", "factory")):
        spec["kind"] = "gpt"
    from distlab.sim.models import model_from_spec
    model = model_from_spec({**spec, "micro_batch": r["micro_batch"]}, f"{label}.model")
    if r.get("make_vocab_size_divisible_by") and "vocab" not in r["model"]:      # a preset: pad its vocabulary
        r = {**r, "model": {**r["model"], "vocab": model.config["vocab"]}}
    _check_split(layout, {"layers": (model.config or {}).get("layers")}, label)
    if layout["ep"] > 1 and (model.config or {}).get("kind") != "moe":        # EP on a dense model
        from distlab.sim.models.presets import moe_presets
        raise ConfigError(f"ep {layout['ep']} on a dense model; allowed: ep 1, or MoE ({', '.join(moe_presets())})",
                          f"{label}.layout.ep")
    return Run(**{**r, "name": str(r["name"]), "source": str(r["source"]), "layout": layout,
                  "assumed": list(r.get("assumed") or [])})


def _layout(r: dict, label: str) -> dict:
    layout = r["layout"]
    if not isinstance(layout, dict):
        raise ConfigError(f"must be a mapping with keys {', '.join(LAYOUT_KEYS)}", f"{label}.layout")
    layout = {"tp": 1, "pp": 1, "virtual_stages": 1, "dp": 1, "cp": 1, "zero": 0, "split": None, "ep": 1,
              "dp_shard": None, **layout}
    for k, v in layout.items():
        if k not in LAYOUT_KEYS:
            raise ConfigError(f"unknown key {k!r}; allowed: {', '.join(LAYOUT_KEYS)}", f"{label}.layout.{k}")
        if k == "split":
            if v is not None and not (isinstance(v, list) and v and all(_whole(x) or x == 0 for x in v)):
                raise ConfigError(f"{v!r} must be a list of transformer blocks per stage (whole numbers; 0 only "
                                  "for a first or last stage holding just the embedding or the head)",
                                  f"{label}.layout.split")
        elif not (_whole(v) or (k == "zero" and v in (0, 1, 2, 3)) or (k == "dp_shard" and v is None)):
            raise ConfigError(f"{v!r} must be a whole number >= 1" + (" (zero: 0 to 3)" if k == "zero" else ""),
                              f"{label}.layout.{k}")
    product = layout["tp"] * layout["pp"] * layout["dp"] * layout["cp"]
    if product != r["gpus"]:
        raise ConfigError(f"tp {layout['tp']} x pp {layout['pp']} x dp {layout['dp']} x cp {layout['cp']} = "
                          f"{product}, not the {r['gpus']} GPUs of the run", f"{label}.layout")
    shard = layout["dp_shard"]               # HSDP: FSDP2 over dp_shard ranks, replicated dp / dp_shard times
    if shard is not None and (layout["dp"] % shard or layout["zero"] < 2):
        raise ConfigError(f"dp_shard {shard} must divide dp {layout['dp']} under zero 2 or 3 (HSDP); allowed: a "
                          "divisor of dp with zero 3, or no dp_shard", f"{label}.layout.dp_shard")
    if layout["dp"] % layout["ep"]:          # experts sharded over data-parallel ranks (Megatron, torchtitan)
        raise ConfigError(f"ep {layout['ep']} must divide dp {layout['dp']}; allowed: a divisor of dp",
                          f"{label}.layout.ep")
    return layout


def _check_split(layout: dict, model: dict, label: str) -> None:
    split, stages = layout["split"], layout["pp"] * layout["virtual_stages"]
    if split is None:
        return
    if len(split) != stages or sum(split) != model.get("layers"):
        raise ConfigError(f"split {split} must give each of the {stages} stages its blocks, {model.get('layers')} "
                          "in all", f"{label}.layout.split")


def _check_reported(reported, label: str) -> None:
    if not isinstance(reported, dict) or not any(k in reported for k in FIGURES):
        raise ConfigError(f"no reported figure; allowed: one of {', '.join(FIGURES)}", f"{label}.reported")
    for k, v in reported.items():
        if k not in FIGURES or not _num(v) or v <= 0:
            raise ConfigError(f"{k}: {v!r} must be a number > 0; allowed keys: {', '.join(FIGURES)}",
                              f"{label}.reported.{k}")
