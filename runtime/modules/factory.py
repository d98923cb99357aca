"""Your own model: ``--model pkg.module:factory`` (or ``model: {factory: pkg.module:factory, seq_len: ...}``).

    distlab memory --model mypkg.models:tiny --seq-len 512 --micro-batch 2

The factory's module is imported (installed, or on PYTHONPATH: the current folder is never added) and the
factory called with no arguments under ``torch.device("meta")`` and stdin at /dev/null, so parameters take no
memory; it returns an ``nn.Module``, or
``(module, example_input)``. Without an example the input is token ids of shape (micro_batch, seq_len) over the
first ``nn.Embedding``'s vocabulary. One training step is traced on the meta device (nothing is computed):
  layers       each element of the first ``nn.ModuleList`` is a block (named by its path, e.g. ``layers.3``:
               an FSDP unit, a pipeline layer, what activation checkpointing wraps); the parameters before the
               blocks are the layer ``embed``, those after them ``head`` (registration order, shared ones once,
               frozen ones skipped, as DDP's reducer takes them)
  FLOPs        ``torch.utils.flop_counter.FlopCounterMode``: each block's forward and backward; the rest of the
               model's FLOPs are the head's (an embedding lookup has none)
  activations  ``torch.autograd.graph.saved_tensors_hooks``: each saved storage once, charged to the layer that
               was running (before the first block: embed; after the last: head, loss included); each block's
               input bytes (what full recomputation keeps) and output bytes (what a pipeline stage sends)
  loss         cross-entropy on fp32 logits when the output's last dimension is the vocabulary, else the sum
Such a model works with DDP, FSDP, pipelines and `distlab memory` (recompute none or full, offload); tensor,
context and expert parallelism rewrite a transformer's modules by name and need a structured model (a preset,
a config.json or ``{kind: gpt}``), so they refuse it in one line. A factory runs only when the command line asks
for it (``--model``, or ``--allow-code`` for one a data file names: sim/models/spec.py); one that exits, reads
stdin or returns something else is one line, exit 2.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from distlab.sim.errors import ConfigError
from distlab.sim.models.activations import RECOMPUTE, attach
from distlab.sim.models.core import Layer, Model, Param

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
               torch.float64: "float64"}
DEFAULTS = {"seq_len": 2048, "micro_batch": 1}


def load(spec: dict, where: str = "model") -> Model:
    """The Model of ``{factory: "pkg.module:fn", seq_len, micro_batch, dtype, recompute, offload, name}``."""
    text = spec["factory"]
    opts = {**DEFAULTS, **{k: v for k, v in spec.items() if k in ("seq_len", "micro_batch") and v is not None}}
    for k in ("seq_len", "micro_batch"):
        if not isinstance(opts[k], int) or isinstance(opts[k], bool) or opts[k] < 1:
            raise ConfigError(f"{opts[k]!r} must be a whole number >= 1", f"{where}.{k}")
    recompute, offload = spec.get("recompute") or "none", bool(spec.get("offload", False))
    if recompute not in RECOMPUTE:
        raise ConfigError(f"unknown recompute {recompute!r}; allowed: {', '.join(RECOMPUTE)}", f"{where}.recompute")
    module, example = build(text, where)
    dtype = spec.get("dtype")
    if dtype is not None:
        names = {v: k for k, v in DTYPE_NAMES.items()}
        if dtype not in names:
            raise ConfigError(f"unknown dtype {dtype!r}; allowed: {', '.join(names)}", f"{where}.dtype")
        module = module.to(names[dtype])
    model = trace(module, example, opts["seq_len"], opts["micro_batch"], spec.get("name") or text, where)
    model.config.update(factory=text, seq_len=opts["seq_len"], micro_batch=opts["micro_batch"])
    if recompute != "none":
        model.config["recompute"] = recompute
    if offload:
        model.config["offload"] = True
    return attach(model)


def build(text: str, where: str = "model"):
    """(module on the meta device, example input or None) from ``pkg.module:fn``."""
    modname, colon, fname = text.partition(":")
    if not colon or not modname or not fname.isidentifier():
        raise ConfigError(f"{text!r}: write pkg.module:factory (a module and a function in it)", where)
    with no_stdin():                           # the current folder is never put on sys.path (issue 41)
        try:
            mod = importlib.import_module(modname)
        except BaseException as e:             # noqa: BLE001 - the user's module: any error is theirs, exit too
            if isinstance(e, KeyboardInterrupt):
                raise
            raise ConfigError(f"cannot import {modname}: {_said(e)}", where) from None
        fn = getattr(mod, fname, None)
        if not callable(fn):
            raise ConfigError(f"{modname} has no function {fname!r}", where)
        try:
            with torch.device("meta"):
                out = fn()
        except BaseException as e:             # noqa: BLE001 - sys.exit() and input() end in one line too
            if isinstance(e, KeyboardInterrupt):
                raise
            raise ConfigError(f"{text} raised {_said(e)}", where) from None
    module, example = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
    if not isinstance(module, nn.Module):
        raise ConfigError(f"{text} returned {type(module).__name__}, not a model; allowed: an nn.Module or "
                          "(module, example_input)", where)
    return module.to("meta"), example


def _said(e: BaseException) -> str:
    """``Type: message`` on one line; SystemExit and EOFError (stdin is closed) say what they mean."""
    if isinstance(e, SystemExit):
        return f"SystemExit({e.code!r}): a factory must return a model, not exit"
    if isinstance(e, EOFError):
        return "EOFError: it read from stdin, which a factory cannot (stdin is closed while it runs)"
    return f"{type(e).__name__}: {e}".splitlines()[0][:300] if str(e) else type(e).__name__


@contextlib.contextmanager
def no_stdin():
    """The factory's import and call run with stdin at /dev/null (fd 0 and sys.stdin): one that reads it gets
    end-of-file at once instead of waiting on the terminal."""
    saved_fd, saved = os.dup(0) if _fd_open(0) else None, sys.stdin
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.dup2(null, 0, inheritable=False)
        sys.stdin = open(os.devnull)           # noqa: SIM115 - closed below
        yield
    finally:
        sys.stdin.close()
        sys.stdin = saved
        if saved_fd is not None:
            os.dup2(saved_fd, 0)
            os.close(saved_fd)
        else:
            os.close(0)
        os.close(null)


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def blocks_of(module: nn.Module) -> tuple[str, int]:
    """(path of the first nn.ModuleList with children, its length); ConfigError without one."""
    for name, sub in module.named_modules():
        if isinstance(sub, nn.ModuleList) and len(sub):
            return name, len(sub)
    raise ConfigError(f"{type(module).__name__} has no nn.ModuleList of blocks; the layers of a model are the "
                      "elements of its first nn.ModuleList", "model")


def trace(module: nn.Module, example, seq_len: int, micro_batch: int, name: str, where: str = "model") -> Model:
    """One traced step of ``module`` on the meta device (module docstring)."""
    from torch.utils.flop_counter import FlopCounterMode
    blocks, n = blocks_of(module)
    prefix = blocks + "." if blocks else ""
    named = [(p_name, p) for p_name, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise ConfigError(f"{name} has no trainable parameters", where)

    def group(p_name: str) -> str:
        if p_name.startswith(prefix):
            return prefix + p_name[len(prefix):].split(".")[0]
        return "embed" if seen_block[0] is None else "head"
    seen_block = [None]
    order: list[tuple[str, list]] = []
    for p_name, p in named:
        g = group(p_name)
        if g.startswith(prefix):
            seen_block[0] = g
        if not order or order[-1][0] != g:
            order.append((g, []))
        order[-1][1].append(Param(p_name, tuple(p.shape), DTYPE_NAMES.get(p.dtype, "float32")))
    vocab = next((m.num_embeddings for m in module.modules() if isinstance(m, nn.Embedding)), None)
    if example is None:
        if vocab is None:
            raise ConfigError(f"{name} has no nn.Embedding to draw token ids from; return (module, example_input) "
                              "from the factory", where)
        example = torch.zeros(micro_batch, seq_len, dtype=torch.long, device="meta")
    inputs = tuple(x.to("meta") for x in (example if isinstance(example, tuple) else (example,)))
    block_mods = dict(module.named_modules())[blocks]
    params = {p.untyped_storage()._cdata for p in module.parameters()}
    current, saved, seen, in_bytes, out_bytes = ["embed"], {}, set(), {}, {}
    hooks = []
    for i, blk in enumerate(block_mods):
        key = f"{prefix}{i}"

        def pre(_m, args, key=key):
            current[0] = key
            t = next((a for a in args if torch.is_tensor(a)), None)
            in_bytes[key] = t.untyped_storage().nbytes() if t is not None else 0
        hooks.append(blk.register_forward_pre_hook(pre))
    for i, blk in enumerate(block_mods):
        def post(_m, _args, out, key=f"{prefix}{i}"):
            t = out[0] if isinstance(out, (tuple, list)) else out
            out_bytes[key] = t.untyped_storage().nbytes() if torch.is_tensor(t) else 0
        hooks.append(blk.register_forward_hook(post))
    hooks.append(block_mods[n - 1].register_forward_hook(lambda *_: current.__setitem__(0, "head")))

    def pack(t):
        sid = t.untyped_storage()._cdata
        if sid not in params and sid not in seen:
            seen.add(sid)
            saved[current[0]] = saved.get(current[0], 0) + t.untyped_storage().nbytes()
        return t

    def loss_of(out):
        out = out[0] if isinstance(out, (tuple, list)) else out
        if vocab is not None and out.shape[-1] == vocab:
            target = torch.zeros(out.shape[:-1], dtype=torch.long, device="meta")
            return F.cross_entropy(out.float().flatten(0, -2), target.flatten())
        return out.float().sum()
    root = type(module).__name__
    try:
        with FlopCounterMode(display=False) as fwd:
            with torch.no_grad():
                module(*inputs)
        current[0] = "embed"
        with FlopCounterMode(display=False) as both:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = loss_of(module(*inputs))
            loss.backward()
    except Exception as e:                     # noqa: BLE001
        raise ConfigError(f"{name}: one step on the meta device failed: {type(e).__name__}: {e}", where) from None
    finally:
        for h in hooks:
            h.remove()
        module.zero_grad(set_to_none=True)

    def flops(counter, path):
        return float(sum(counter.get_flop_counts().get(f"{root}.{path}" if path else root, {}).values()))
    layers, block_fwd, block_all = [], 0.0, 0.0
    for g, ps in order:
        if g.startswith(prefix):
            f, a = flops(fwd, g), flops(both, g)
            block_fwd, block_all = block_fwd + f, block_all + a
            layers.append(Layer(g, ps, fwd_flops=f, bwd_flops=a - f))
        else:
            layers.append(Layer(g, ps))
    rest_fwd, rest_all = flops(fwd, "") - block_fwd, flops(both, "") - block_all
    tail = next((L for L in reversed(layers) if not L.name.startswith(prefix)), None)
    if tail is not None:
        tail.fwd_flops, tail.bwd_flops = rest_fwd, rest_all - rest_fwd
    dtype = layers[0].params[0].dtype
    out_bytes["embed"] = in_bytes.get(f"{prefix}0", 0)       # what the embedding hands the first block
    config = {"kind": "extracted", "dtype": dtype, "saved_bytes": [float(saved.get(L.name, 0)) for L in layers],
              "input_bytes": [float(in_bytes.get(L.name, 0)) for L in layers],
              "output_bytes": [float(out_bytes.get(L.name, 0)) for L in layers]}
    if vocab is not None:
        config["vocab"] = vocab
    return Model(name, layers, config)
