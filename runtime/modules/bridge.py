"""Bridge between sim models and torch: extract a ``sim.models.Model`` from any ``nn.Module``, and build a
real ``nn.Module`` from a model description (runtime/modules/transformer.py), so the simulator and real DDP train the
same network. A ``pkg.module:factory`` model (``--model``) is traced by runtime/modules/factory.py, which this module
registers with sim/models/spec.py when it is imported.

Extraction: parameters in ``named_parameters()`` order (shared ones once, frozen ones skipped, as DDP's
``_build_params_for_reducer``), grouped into layers by owning module; forward and backward FLOPs per layer
counted by ``torch.utils.flop_counter.FlopCounterMode``; the gradient-ready order recorded with
``register_post_accumulate_grad_hook`` during one backward (the order DDP's Reducer sees).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from distlab.runtime.modules.transformer import GPT, MLP, Block, RMSNormBias  # noqa: F401  (the modules, re-exported)
from distlab.sim.models import Layer, Model, Param

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "float64": torch.float64}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


# --- nn.Module -> Model ------------------------------------------------------------------------------------
def extract(module: nn.Module, example_input, name: str | None = None, loss_fn=None) -> Model:
    """A sim Model of ``module`` run on ``example_input`` (a tensor or tuple of tensors)."""
    from torch.utils.flop_counter import FlopCounterMode
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    loss_fn = loss_fn or (lambda out: out.float().sum())
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    index = {id(p): i for i, (_, p) in enumerate(named)}
    owner = [n.rpartition(".")[0] for n, _ in named]
    root = type(module).__name__

    acts: dict[str, int] = {}
    hooks = []
    for mname, sub in module.named_modules():
        if mname in set(owner):
            def hook(_m, _i, out, mname=mname):
                t = out[0] if isinstance(out, (tuple, list)) else out
                if torch.is_tensor(t):
                    acts[mname] = acts.get(mname, 0) + t.numel() * t.element_size()
            hooks.append(sub.register_forward_hook(hook))
    ready: list[int] = []
    for _, p in named:
        hooks.append(p.register_post_accumulate_grad_hook(lambda p: ready.append(index[id(p)])))
    try:
        with FlopCounterMode(display=False) as fwd_counter:
            with torch.no_grad():
                module(*inputs)
        acts.clear()
        with FlopCounterMode(display=False) as all_counter:
            loss_fn(module(*inputs)).backward()
    finally:
        for h in hooks:
            h.remove()
        module.zero_grad(set_to_none=True)

    def flops(counter, mname):
        key = f"{root}.{mname}" if mname else root
        return float(sum(counter.get_flop_counts().get(key, {}).values()))

    layers: list[Layer] = []
    for i, (pname, p) in enumerate(named):
        if not layers or layers[-1].name != owner[i] or i and owner[i - 1] != owner[i]:
            f = flops(fwd_counter, owner[i])
            layers.append(Layer(owner[i] or root, [], fwd_flops=f, bwd_flops=flops(all_counter, owner[i]) - f,
                                activation_bytes=acts.get(owner[i], 0)))
        layers[-1].params.append(Param(pname, tuple(p.shape), DTYPE_NAMES.get(p.dtype, "float32")))
    model = Model(name or root, layers, {"kind": "extracted"})
    model.ready = ready if len(ready) == len(named) else None
    return model


# --- Model -> nn.Module ------------------------------------------------------------------------------------
def build_module(model: Model) -> nn.Module:
    """A real module with exactly ``model.params`` (names, shapes, registration order)."""
    c = model.config
    dtype = TORCH_DTYPES[c.get("dtype", "float32")]
    if c.get("kind") == "mlp":
        module = MLP(c["widths"], c.get("bias", True), dtype)
    elif c.get("kind") == "gpt":
        module = GPT(c, dtype)
    else:
        raise ValueError(f"cannot build a module for model kind {c.get('kind')!r} (mlp and gpt only)")
    got = [(n, tuple(p.shape)) for n, p in module.named_parameters()]
    want = [(p.name, p.shape) for p in model.params]
    assert got == want, f"module does not match the description: {got[:3]} vs {want[:3]}"
    return module


def example_input(model: Model, batch: int | None = None):
    """An input batch for ``build_module(model)``."""
    c = model.config
    if c.get("kind") == "mlp":
        return torch.randn(batch or c.get("batch", 32), c["widths"][0], dtype=TORCH_DTYPES[c.get("dtype", "float32")])
    return torch.randint(0, c["vocab"], (batch or c.get("micro_batch", 1), c["seq_len"]))


def _register_factory_loader() -> None:
    from distlab.runtime.modules.factory import load
    from distlab.sim.models.spec import set_factory_loader
    set_factory_loader(load)


_register_factory_loader()
