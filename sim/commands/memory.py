"""`distlab memory`: per-GPU memory of DDP and ZeRO 1/2/3 (FSDP) for a model, world size and stage, or of any
scenario (--scenario): sim/parallel/memory.py, the one model `distlab simulate`, `plan` and `reproduce` print."""
from __future__ import annotations

from distlab.sim.cli import add_output_arguments, note, print_json, print_table, say
from distlab.sim.errors import ConfigError

NAME = "memory"
HELP = ("Per-GPU memory of data-parallel training: params, grads, Adam state (ZeRO 1910.02054) for DDP and "
        "ZeRO 1/2/3 (FSDP), plus unsharded units and activations; flags what does not fit.")
LABELS = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}
MAX_RANKS = 2**20          # more ranks than any cluster built (the largest announced: a few 10^5 GPUs)
ABSURD_BYTES = 2**50       # 1 PiB per GPU: ~3,600x the largest GPU memory (288 GB); an input mistake, not a plan


def add_arguments(p) -> None:
    p.add_argument("--model", default="llama-7b", help="a preset (e.g. llama3.1-8b, qwen2.5-7b, mixtral-8x7b; "
                                                        "docs/models.md lists them), a Hugging Face config.json "
                                                        "(or its folder), or pkg.module:factory (default llama-7b)")
    p.add_argument("--world-size", "--world", dest="world", type=int, default=8,
                   help="data-parallel ranks (default 8)")
    p.add_argument("--zero", default="3", help="stage: 0 or ddp, 1, 2, 3 (default 3 = FSDP)")
    p.add_argument("--shard-size", type=int, help="HSDP: shard within groups of this many ranks (default: world)")
    p.add_argument("--micro-batch", type=int, help="sequences per rank (activations scale with it)")
    p.add_argument("--seq-len", type=int, help="sequence length (default: the preset's)")
    p.add_argument("--dtype", help="parameter dtype: bfloat16 = mixed-precision Adam 2+2+12 bytes/param, "
                                   "float32 = 4+4+8 (default: the preset's)")
    p.add_argument("--recompute", choices=("none", "selective", "full"),
                   help="activation recomputation of the transformer blocks (default: the model's, none)")
    p.add_argument("--offload", nargs="?", const=True, type=_blocks, metavar="N",
                   help="keep the blocks' saved activations in host memory (N: the first N blocks only)")
    p.add_argument("--no-reshard", action="store_true", help="ZeRO-3: reshard_after_forward=False")
    p.add_argument("--gpu", default="h100", help="GPU whose memory to check against (a preset name or GiB; "
                                                 "default h100, 80 GiB)")
    p.add_argument("--scenario", help="a scenario YAML (any layout: its mesh, model, sections): the per-GPU "
                                      "memory `distlab simulate` prints for it (sim/parallel/memory.py); the "
                                      "other options are then ignored")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    add_output_arguments(p, verbose=False)


def _blocks(text: str) -> int:
    """``--offload N``: a whole number of blocks (checked against the model's when it is built)."""
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not a number of blocks; use --offload or --offload N", "--offload") from None


def _stage(text: str) -> int:
    t = str(text).strip().lower()
    if t in ("ddp", "0", "1", "2", "3"):
        return 0 if t == "ddp" else int(t)
    raise ConfigError(f"unknown stage {text!r}; allowed: 0 (ddp), 1, 2, 3", "--zero")


def _gpu_GiB(text: str) -> tuple[str, float]:
    from distlab.sim.cluster import GPUS
    if text in GPUS:
        return text, GPUS[text].memory_GiB
    try:
        v = float(text)
    except ValueError:
        raise ConfigError(f"unknown GPU {text!r}; presets: {', '.join(GPUS)}, or a size in GiB", "--gpu") from None
    if v <= 0:
        raise ConfigError(f"{text!r} must be > 0 GiB", "--gpu")
    return f"{v:g} GiB", v


def run(args) -> int:
    if getattr(args, "scenario", None):
        return _scenario(args)
    from distlab.sim.models import model_from_spec, spec_from_text
    from distlab.sim.models.activations import activations
    from distlab.sim.parallel.fsdp.memory import HEADROOM_FRACTION, fit_word, fits, headroom_GiB
    from distlab.sim.parallel.memory import estimate
    zero = _stage(args.zero)
    if not 1 <= args.world <= MAX_RANKS:
        raise ConfigError(f"{args.world} must be a whole number from 1 to {MAX_RANKS} (2^20)", "--world-size")
    gpu, gib = _gpu_GiB(args.gpu)
    from distlab.sim.cli import check_whole
    from distlab.sim.dtypes import TRAINING_DTYPES
    check_whole(args.micro_batch, "--micro-batch", 1, 2**20, "sequences")
    check_whole(args.seq_len, "--seq-len", 1, 2**24, "tokens")
    if args.dtype is not None and args.dtype not in TRAINING_DTYPES:
        raise ConfigError(f"{args.dtype!r} is not a training dtype; allowed: {', '.join(TRAINING_DTYPES)}", "--dtype")
    spec = spec_from_text(args.model, "--model")
    for key in ("micro_batch", "seq_len", "dtype", "recompute"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    if args.offload:
        spec["offload"] = args.offload
    model = model_from_spec(spec, "--model")
    acts = activations(model)
    stages = {z: estimate(model, args.world, z, args.shard_size, reshard_after_forward=not args.no_reshard)
              for z in (0, 1, 2, 3)}
    for z, parts in stages.items():
        parts["total"] = sum(parts.values())
        parts["fits"] = fits(parts["total"], gib)
    refuse_absurd(stages, args)
    sel = stages[zero]
    if args.json:
        print_json({"model": model.summary(), "num_params": model.num_params, "world_size": args.world,
                    "inputs": {k: model.config.get(k) for k in ("micro_batch", "seq_len", "dtype")
                               if (model.config or {}).get(k) is not None},
                    "headroom_GiB": headroom_GiB(gib),
                    "shard_size": args.shard_size or args.world, "zero": zero, "gpu": gpu, "gpu_memory_GiB": gib,
                    "stages": [stage_json(z, v, z == zero) for z, v in stages.items()],
                    "activations": acts.as_json()})
        return 0
    G = lambda n: f"{n / 2**30:.2f}"  # noqa: E731
    say(f"model: {model.summary()}", indent="  ")
    say(f"world: {args.world} ranks" + (f", HSDP shard groups of {args.shard_size}" if args.shard_size else "")
        + f"; GPU: {gpu} ({gib:g} GiB)", indent="  ")
    say("inputs: " + ", ".join(f"{k} {v}" for k, v in inputs_of(model).items()), indent="  ")
    cols = ["stage", "params", "grads", "optimizer", "unsharded", "activations", "total GiB", "fits"]
    rows = [[LABELS[z] + (" <" if z == zero else ""), G(v["params"]), G(v["grads"]), G(v["optimizer"]),
             G(v["unsharded params"]), G(v["activations"]), G(v["total"]), fit_word(v["total"], gib)]
            for z, v in stages.items()]
    print_table("per-GPU memory (GiB): static ZeRO terms + unsharded units in flight + activations", cols, rows)
    note(f"fits: the tensors' bytes against the GPU's memory; tight: within the {headroom_GiB(gib):g} GiB "
         f"({HEADROOM_FRACTION:.0%}) kept for the CUDA context and the caching allocator's fragmentation, an "
         "out-of-memory risk (sim/parallel/fsdp/memory.py HEADROOM_FRACTION)")
    print_activations(acts)
    if not sel["fits"]:
        say(f"warning: {LABELS[zero]} does not fit in {gib:g} GiB: " + ", ".join(
            f"{k} {G(v)} GiB" for k, v in sel.items() if k not in ("total", "fits") and v), indent="  ")
    return 0


def inputs_of(model) -> dict:
    """What the activations scale with, as the model was built: micro-batch, sequence length, dtype, recompute."""
    c = model.config or {}
    out = {"micro_batch": c.get("micro_batch", c.get("batch")), "seq_len": c.get("seq_len"),
           "dtype": c.get("dtype") or (model.params[0].dtype if model.params else None),
           "recompute": c.get("recompute") or "none"}
    return {k: (f"{v:,}" if isinstance(v, int) else v) for k, v in out.items() if v is not None}


def print_activations(acts) -> None:
    """The activations' peak and what one transformer block keeps, largest first (sim/models/activations.py)."""
    G = lambda n: f"{n / 2**30:.2f}"  # noqa: E731
    print(f"activations of one micro-batch: peak {G(acts.peak_bytes)} GiB (recompute {acts.recompute}"
          + (f"; {G(acts.host_bytes)} GiB offloaded to host" if acts.offload else "") + ")")
    block = next((x for x in acts.layers if x.name not in ("embed", "head")), None)
    if block is not None and block.terms:
        where = "on the host" if acts.offload else "on the GPU"
        rows = [[k, f"{v / 2**20:.1f}"] for k, v in sorted(block.terms.items(), key=lambda kv: -kv[1])[:6]]
        print_table(f"one block keeps {G(block.saved + block.host)} GiB {where} (largest terms)", ["term", "MiB"],
                    rows)


def refuse_absurd(stages: dict, args) -> None:
    """A per-GPU total over ABSURD_BYTES is an input mistake: refused in one line, naming the term and the
    inputs behind it, rather than printed as a 20-digit number of GiB."""
    for z, parts in stages.items():
        if parts["total"] > ABSURD_BYTES:
            term = max((k for k in parts if k not in ("total", "fits")), key=lambda k: parts[k])
            flag = blamed_flag(term, args)     # its value first, the line within 100 columns
            value = getattr(args, flag[2:].replace("-", "_"), None)
            raise ConfigError(("" if value is None else f"{value}: ") + f"{parts['total'] / 2**50:.3g} PiB per GPU, "
                              f"{'DDP' if z == 0 else f'ZeRO-{z}'} {term} most; allowed: < 1 PiB", flag)


def blamed_flag(term: str, args) -> str:
    """The flag the user typed that made ``term`` absurd: for activations --seq-len or --micro-batch, whichever
    was given (both: the one further above 1 x the preset's 8192 tokens, i.e. the larger of seq_len / 8192 and
    micro_batch); else --world-size for a huge world, else --model."""
    if term == "activations":
        seq, micro = getattr(args, "seq_len", None), getattr(args, "micro_batch", None)
        if seq is not None and (micro is None or seq / 8192 >= micro):
            return "--seq-len"
        if micro is not None:
            return "--micro-batch"
    return "--model"


def stage_json(zero: int, parts: dict, selected: bool) -> dict:
    """One stage's row of ``memory --json``: each term in bytes (``<term>_bytes``), the total, fits."""
    terms = {f"{k.replace(' ', '_')}_bytes": v for k, v in parts.items() if k not in ("total", "fits")}
    return {"stage": LABELS[zero], "zero": zero, "selected": selected, **terms, "total_bytes": parts["total"],
            "fits": parts["fits"]}


def _scenario(args) -> int:
    """``--scenario``: the memory per GPU of any scenario's layout, as `distlab simulate` of it prints it
    (sim/parallel/memory.py), without building its plan."""
    from types import SimpleNamespace
    from distlab.sim import scenario as sc
    from distlab.sim.parallel.memory import memory_section
    _, _, model, cluster, mesh, opts = sc.parts(args.scenario, args.scenario)
    mem = memory_section(SimpleNamespace(model=model, mesh=mesh, options=opts, cluster=cluster))
    from distlab.sim.parallel.memory import as_parallelisms, recompute_of
    inputs = {**inputs_of(model), "recompute": recompute_of(model, as_parallelisms(mesh, opts))}
    if args.json:
        print_json({"model": model.summary(), "world_size": mesh.world_size,
                    "mesh": mesh.as_dict(), "inputs": inputs, **mem["json"]})
        return 0
    say(f"model: {model.summary()}", indent="  ")
    dims = ", ".join(f"{k}={v}" for k, v in mesh.as_dict().items())
    say(f"mesh: {dims} ({mesh.world_size} ranks); GPU: {cluster.gpu.name}", indent="  ")
    say("inputs: " + ", ".join(f"{k} {v}" for k, v in inputs.items()), indent="  ")
    print_table("per-GPU memory (1 GiB = 2^30 bytes)", ["term", "size"], mem["rows"])
    for w in mem["warnings"]:
        say(f"warning: {w}", indent="  ")
    return 0
