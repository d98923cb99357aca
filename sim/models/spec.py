"""One place that turns what a user writes into a Model: every command's ``--model`` and every ``model:`` key.

    from distlab.sim.models.spec import model_from_spec, spec_from_text
    model_from_spec(spec_from_text("llama3.1-8b"))                    # a preset
    model_from_spec({"hf_config": "path/to/config.json", "seq_len": 2048})   # a Hugging Face config, offline
    model_from_spec({"factory": "mypkg.models:tiny", "seq_len": 512})     # your nn.Module (needs torch)

Forms (docs/models.md lists them with every key):
  NAME                       a preset (sim/models/presets.py; deepseek-v3 in sim/models/moe.py)
  PATH.json or a folder      a Hugging Face config.json (sim/models/hf.py): Llama, Mistral, Qwen2, Mixtral,
                             DeepSeek-V3, GPT-2
  pkg.module:factory         a function returning an nn.Module (built on the meta device), traced once by the
                             runtime (runtime/modules/bridge.py ``from_factory``): that needs torch, so sim never does
                             it itself; the runtime registers the tracer here (``set_factory_loader``)
  {preset|hf_config|factory: ..., KEY: VALUE}   one of those with overrides (seq_len, micro_batch, dtype,
                             recompute, offload, any builder argument of its kind)
  {kind: gpt|moe|mlp, ...}   builder arguments written out ({arch: ...} alone means kind gpt)
"""
from __future__ import annotations

import inspect
import os
from dataclasses import fields

from distlab.sim.errors import ConfigError
from distlab.sim.models.core import Model
from distlab.sim.models.dense import gpt, mlp
from distlab.sim.models.presets import preset_names, preset_spec

GPT_KEYS = tuple(k for k in inspect.signature(gpt).parameters if k != "name")
MLP_KEYS = ("widths", "batch", "dtype", "bias")
FORMS = ("preset", "hf_config", "factory", "kind")
FACTORY_KEYS = ("seq_len", "micro_batch", "dtype", "recompute", "offload")
KINDS: dict = {}          # kind -> (builder(spec, where) -> Model, its preset names): kinds defined elsewhere
_FACTORY: dict = {}       # "loader": (spec, where) -> Model, set by the runtime (runtime/modules/bridge.py)
# Data files never run code: while the distlab command runs (runtime/cli.py), a ``factory:`` is imported and called
# only when the command line asks for it, by --model itself or --allow-code; the Python API is the caller's code.
CODE_POLICY: dict = {"command": False, "allow_code": False, "flagged": set()}


def set_code_policy(command: bool, allow_code: bool = False) -> None:
    """Start (``command``) or end a command's policy: factories from --model only, or any with --allow-code."""
    CODE_POLICY.update(command=command, allow_code=allow_code, flagged=set())


def check_factory_allowed(text: str, where: str) -> None:
    """ConfigError for a factory a data file names, unless the command line allowed it (CODE_POLICY)."""
    if CODE_POLICY["command"] and not CODE_POLICY["allow_code"] and text not in CODE_POLICY["flagged"]:
        raise ConfigError(f"factory {str(text)[:200]!r} would import and run Python code, and a data file never "
                          "runs code; give it as --model on the command line, or add --allow-code if you trust "
                          "this file", where)


def set_factory_loader(loader) -> None:
    """Register the function that builds a Model from ``{factory: "pkg.module:fn", ...}`` (the runtime's)."""
    _FACTORY["loader"] = loader


def moe_keys() -> tuple:
    from distlab.sim.models.moe import MoEConfig
    return tuple(f.name for f in fields(MoEConfig))


def spec_from_text(text: str, where: str = "--model") -> dict:
    """The spec of a ``--model`` argument: a preset name, a config.json path (or a folder holding one), or
    ``pkg.module:factory``."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("give a preset name, a config.json path or pkg.module:factory", where)
    text = text.strip()
    if text.endswith(".json") or os.sep in text or "/" in text or os.path.isdir(text):
        return {"hf_config": text}
    if ":" in text:
        if where == "--model":                    # the flag itself: the user asked for this code
            CODE_POLICY["flagged"].add(text)
        return {"factory": text}
    return {"preset": text}


def model_from_spec(spec, where: str = "model") -> Model:
    """The Model of any form above (a Model is returned as it is); every bad key is a ConfigError at ``where``."""
    if isinstance(spec, Model):
        return spec
    if isinstance(spec, str):
        spec = {"preset": spec}
    if not isinstance(spec, dict):
        raise ConfigError(f"must be a preset name ({', '.join(preset_names())}) or a mapping", where)
    spec = dict(spec)
    other = _other_kind(spec)
    if other is not None:
        return other(spec, where)
    forms = [k for k in ("preset", "hf_config", "factory") if k in spec]
    if len(forms) > 1:
        raise ConfigError(f"give one of {', '.join(forms)}, not several", where)
    name = spec.pop("name", None)
    if "preset" in spec:
        base = spec.pop("preset")
        if not isinstance(base, str) or base not in preset_names():
            raise ConfigError(f"unknown model preset {base!r}; allowed: {', '.join(preset_names())}, a "
                              "config.json path or pkg.module:factory",
                              f"{where}.preset" if spec and not where.startswith("--") else where)
        return _build({**preset_spec(base), **_kinded(spec)}, name or base, where)
    if "hf_config" in spec:
        from distlab.sim.models.hf import config_path, spec_from_file
        path = spec.pop("hf_config")
        if not isinstance(path, str):
            raise ConfigError(f"{path!r} must be the path of a config.json", f"{where}.hf_config")
        file = config_path(path)          # named after its folder (a model's folder holds its config.json)
        stem = os.path.basename(os.path.dirname(os.path.abspath(file))) \
            if os.path.basename(file) == "config.json" else os.path.splitext(os.path.basename(path))[0]
        try:
            config = spec_from_file(path)
        except ConfigError as e:            # --model /no/such: named as typed, then the file's problem
            if where.startswith("--"):
                raise ConfigError(str(e), where) from None
            raise
        return _build({**config, **_kinded(spec)}, name or stem, where)
    if "factory" in spec:
        for k in spec:
            if k not in ("factory",) + FACTORY_KEYS:
                raise ConfigError(f"unknown key {k!r} for a factory model; allowed: factory, name, "
                                  f"{', '.join(FACTORY_KEYS)}", where)
        check_factory_allowed(spec["factory"], where)
        if "loader" not in _FACTORY:
            raise ConfigError("pkg.module:factory models are traced with torch by the runtime: run them through "
                              "the distlab command, or import distlab.runtime.modules.bridge first", where)
        return _FACTORY["loader"]({**spec, "name": name}, where)
    kind = spec.pop("kind", "gpt" if "arch" in spec else None)
    if kind not in ("gpt", "mlp", "moe"):
        raise ConfigError(f"needs 'preset' ({', '.join(preset_names())}), 'hf_config', 'factory' or 'kind' "
                          f"(gpt, moe, mlp); got kind {kind!r}", where)
    return _build({"kind": kind, **spec}, name, where)


def _kinded(overrides: dict) -> dict:
    if "kind" in overrides:
        raise ConfigError("the preset or config sets the kind; allowed: overrides of its keys", "kind")
    return overrides


def _build(spec: dict, name: str | None, where: str) -> Model:
    kind = spec.pop("kind")
    if kind == "gpt":
        _check_keys(spec, GPT_KEYS, where)
        return _call(gpt, {**spec, **({"name": name} if name else {})}, where)
    if kind == "moe":
        from distlab.sim.models.moe import from_spec
        _check_keys(spec, moe_keys(), where)
        return from_spec({**spec, **({"name": name} if name else {})}, where)
    _check_keys(spec, MLP_KEYS, where)
    widths = spec.pop("widths", None)
    if not isinstance(widths, list):
        raise ConfigError("widths must be a list of layer widths, e.g. [1024, 1024, 1024]", f"{where}.widths")
    return _call(lambda **kw: mlp(*widths, **kw), {**spec, **({"name": name} if name else {})}, where)


def _other_kind(spec: dict):
    """The builder of a kind registered in KINDS that ``spec`` names by kind or preset, else None."""
    for kind, (builder, presets) in KINDS.items():
        if spec.get("kind") == kind or spec.get("preset") in presets:
            return builder
    return None


def _check_keys(d: dict, allowed: tuple, where: str) -> None:
    for k in d:
        if k not in allowed:
            raise ConfigError(f"unknown key {k!r}; allowed: {', '.join(('name',) + tuple(allowed))}", where)


def _call(fn, kwargs: dict, where: str) -> Model:
    try:
        return fn(**kwargs)
    except TypeError as e:
        raise ConfigError(str(e), where) from None


def preset(name: str, **overrides) -> Model:
    """A preset by name (any of ``preset_names()``) with overrides of its builder's arguments."""
    return model_from_spec({"preset": name, **overrides}, "model")
