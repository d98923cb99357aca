"""The runs file of `distlab reproduce`: published training runs as data (sim/reproduce/runs.yaml is shipped).

Every run names its source and the figure it reports; loading checks each run and raises ConfigError naming
the run and the key (a layout whose product is not the GPU count, an unknown GPU or cluster, a missing reported
figure, ...). ``generations`` holds the compute model's fitted constants per GPU generation (sim/compute.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from distlab.sim.errors import ConfigError

DEFAULT_PATH = os.path.join(os.path.dirname(__file__), "runs.yaml")
FIGURES = ("tflops_per_gpu", "mfu", "tokens_per_s", "iteration_s")
LAYOUT_KEYS = ("tp", "pp", "virtual_stages", "dp", "cp", "zero")
RUN_KEYS = ("name", "source", "model", "gpu", "cluster", "gpus", "layout", "global_batch", "micro_batch",
            "precision", "recompute", "attention", "schedule", "flops", "reported", "assumed")
FLOPS_FORMULAS = ("megatron-eq3", "6nd")
SCHEDULES = ("1f1b", "interleaved", "gpipe")   # sim/parallel/pipeline/schedules.py names


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
    attention: str = "flash"           # flash (FlashAttention, causal half skipped) | unfused (full score matrix)
    schedule: str = "1f1b"
    flops: str = "megatron-eq3"
    reported: dict = field(default_factory=dict)
    assumed: list = field(default_factory=list)

    @property
    def figure(self) -> tuple[str, float]:
        """(name, value) of the reported figure."""
        key = next(k for k in FIGURES if k in self.reported)
        return key, float(self.reported[key])

    @property
    def microbatches(self) -> int:
        """Micro-batches per pipeline and step: global batch / (dp x micro-batch)."""
        return self.global_batch // (self.layout["dp"] * self.micro_batch)


@dataclass
class Generation:
    """Fitted constants of the GEMM efficiency curve of one GPU generation (sim/compute.py saturating_curve)."""
    peak_fraction: float
    half_flops: float
    fitted_on: list


def load_runs(path: str | None = None) -> tuple[list[Run], dict[str, Generation]]:
    """The runs and generations of ``path`` (default: the shipped runs.yaml), checked."""
    from distlab.sim.io import load_yaml
    path = path or DEFAULT_PATH
    d = load_yaml(path)
    if not isinstance(d, dict) or not isinstance(d.get("runs"), list):
        raise ConfigError("a runs file is a mapping with a list 'runs' (and optional 'generations')", path)
    gens = {}
    for arch, g in (d.get("generations") or {}).items():
        where = f"{path}: generations.{arch}"
        if not isinstance(g, dict) or not {"peak_fraction", "half_flops"} <= set(g):
            raise ConfigError("needs peak_fraction and half_flops", where)
        pf, hf = g["peak_fraction"], g["half_flops"]
        if not _num(pf) or not 0 < pf <= 1 or not _num(hf) or hf <= 0:
            raise ConfigError(f"peak_fraction {pf!r} must be in (0, 1] and half_flops {hf!r} > 0", where)
        gens[str(arch)] = Generation(float(pf), float(hf), list(g.get("fitted_on") or []))
    runs = [_run(r, i, path) for i, r in enumerate(d["runs"])]
    names = [r.name for r in runs]
    for n in names:
        if names.count(n) > 1:
            raise ConfigError(f"run name {n!r} appears twice", f"{path}: runs")
    for arch, g in gens.items():
        for n in g.fitted_on:
            if n not in names:
                raise ConfigError(f"fitted_on names {n!r}, not a run of this file", f"{path}: generations.{arch}")
        if len(g.fitted_on) > 2:
            raise ConfigError("at most two rows may be fitted on", f"{path}: generations.{arch}.fitted_on")
    return runs, gens


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
    if PRESETS[r["cluster"]].gpu.name != r["gpu"]:
        raise ConfigError(f"cluster {r['cluster']!r} has {PRESETS[r['cluster']].gpu.name} GPUs, not {r['gpu']}",
                          f"{label}.gpu")
    for k in ("gpus", "global_batch", "micro_batch"):
        if not _whole(r[k]):
            raise ConfigError(f"{r[k]!r} must be a whole number >= 1", f"{label}.{k}")
    layout = r["layout"]
    if not isinstance(layout, dict):
        raise ConfigError(f"must be a mapping with keys {', '.join(LAYOUT_KEYS)}", f"{label}.layout")
    layout = {"tp": 1, "pp": 1, "virtual_stages": 1, "dp": 1, "cp": 1, "zero": 0, **layout}
    for k, v in layout.items():
        if k not in LAYOUT_KEYS:
            raise ConfigError(f"unknown key {k!r}; allowed: {', '.join(LAYOUT_KEYS)}", f"{label}.layout.{k}")
        if not (_whole(v) or (k == "zero" and v in (0, 1, 2, 3))):
            raise ConfigError(f"{v!r} must be a whole number >= 1", f"{label}.layout.{k}")
    product = layout["tp"] * layout["pp"] * layout["dp"] * layout["cp"]
    if product != r["gpus"]:
        raise ConfigError(f"tp {layout['tp']} x pp {layout['pp']} x dp {layout['dp']} x cp {layout['cp']} = "
                          f"{product}, not the {r['gpus']} GPUs of the run", f"{label}.layout")
    if layout["cp"] != 1 or layout["zero"] != 0:
        raise ConfigError("context parallelism and ZeRO/FSDP runs are not simulated yet; allowed: cp 1, zero 0",
                          f"{label}.layout")
    if r["global_batch"] % (layout["dp"] * r["micro_batch"]):
        raise ConfigError(f"global_batch {r['global_batch']} is not a multiple of dp {layout['dp']} x micro_batch "
                          f"{r['micro_batch']}", f"{label}.global_batch")
    reported = r["reported"]
    if not isinstance(reported, dict) or not any(k in reported for k in FIGURES):
        raise ConfigError(f"no reported figure; allowed: one of {', '.join(FIGURES)}", f"{label}.reported")
    for k, v in reported.items():
        if k not in FIGURES or not _num(v) or v <= 0:
            raise ConfigError(f"{k}: {v!r} must be a number > 0; allowed keys: {', '.join(FIGURES)}",
                              f"{label}.reported.{k}")
    for k, allowed in (("recompute", ("none", "selective", "full")), ("attention", ("flash", "unfused")),
                       ("schedule", SCHEDULES), ("flops", FLOPS_FORMULAS),
                       ("precision", ("bfloat16", "float16"))):
        if k in r and r[k] not in allowed:
            raise ConfigError(f"unknown {k} {r[k]!r}; allowed: {', '.join(allowed)}", f"{label}.{k}")
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
    model_from_spec({**spec, "micro_batch": r["micro_batch"]}, f"{label}.model")
    return Run(**{**r, "name": str(r["name"]), "source": str(r["source"]), "layout": layout,
                  "assumed": list(r.get("assumed") or [])})
