"""What a parallelism needs to know about a network: ``Param``, ``Layer`` and ``Model``.

    from distlab.sim.models.core import Layer, Model, Param
    m = Model("tiny", [Layer("layers.0", [Param("layers.0.weight", (8, 4))], fwd_flops=64.0)])
    m.num_params, m.layers[0].bwd_flops        # 32, 128.0 (backward = 2 x forward by default)

A ``Model`` is its parameters in registration order (``nn.Module.parameters()`` order: DDP buckets and FSDP
units are built from it) grouped into layers, each with its forward FLOPs, backward FLOPs (default 2x forward:
one matmul for the input gradient, one for the weight gradient; Megatron-LM, Narayanan et al. 2021, arXiv
2104.04473, sec. 5.1) and what it keeps for backward. The activation fields of a layer come from the model
family's function in sim/models/activations.py (the same bytes for every parallelism and `distlab memory`):
``activation_bytes`` is what stays on the GPU from its forward to its backward, ``transient_bytes`` what its
backward holds on top of that (the recomputed forward with activation checkpointing, the copy brought back with
offloading), ``recompute_flops`` the forward FLOPs its backward reruns (hardware FLOPs, not model FLOPs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from distlab.sim.dtypes import DTYPE_BYTES

MAX_LAYERS = 4096            # a bound on model size, so a typo cannot exhaust memory


@dataclass(frozen=True)
class Param:
    """One parameter tensor, e.g. ``Param("h.0.attn.qkv.weight", (2304, 768))`` (torch layout: out, in)."""
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass
class Layer:
    """A unit of compute owning some parameters; its gradients are ready when its backward ends."""
    name: str
    params: list[Param] = field(default_factory=list)
    fwd_flops: float = 0.0
    bwd_flops: float | None = None        # None = 2 x fwd_flops
    activation_bytes: float = 0.0         # kept on the GPU from its forward until its backward
    ready: tuple[int, ...] | None = None  # params (local indices) in gradient-ready order; None = reversed
    transient_bytes: float = 0            # held only while its backward runs (recomputed forward, offload copy)
    recompute_flops: float = 0.0          # forward FLOPs its backward reruns (activation checkpointing)

    def __post_init__(self):
        if self.bwd_flops is None:
            self.bwd_flops = 2.0 * self.fwd_flops

    @property
    def param_bytes(self) -> int:
        return sum(p.bytes for p in self.params)


@dataclass
class Model:
    """Layers in forward order; ``params`` in registration order (layer by layer)."""
    name: str
    layers: list[Layer]
    config: dict = field(default_factory=dict)    # the builder's arguments, for reports and the runtime
    ready: list[int] | None = None                # measured gradient-ready order (global indices), if known

    @property
    def params(self) -> list[Param]:
        return [p for layer in self.layers for p in layer.params]

    @property
    def num_params(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def param_bytes(self) -> int:
        return sum(p.bytes for p in self.params)

    @property
    def fwd_flops(self) -> float:
        return sum(layer.fwd_flops for layer in self.layers)

    @property
    def bwd_flops(self) -> float:
        return sum(layer.bwd_flops for layer in self.layers)

    def param_layer(self) -> list[int]:
        """For each parameter (registration order), the index of its layer."""
        return [i for i, layer in enumerate(self.layers) for _ in layer.params]

    def ready_order(self) -> list[int]:
        """Parameter indices in the order their gradients become ready: layers last to first, and in a
        layer ``Layer.ready`` (autograd's order) or reversed registration order."""
        if self.ready is not None:
            return list(self.ready)
        order, start = [], len(self.params)
        for layer in reversed(self.layers):
            start -= len(layer.params)
            local = layer.ready if layer.ready is not None else range(len(layer.params) - 1, -1, -1)
            order += [start + i for i in local]
        return order

    def summary(self) -> str:
        """One line; a GPT counts its transformer blocks as blocks (GPT-2 small: 12, plus embedding and head)."""
        if (self.config or {}).get("kind") == "gpt":
            blocks = self.config["layers"]
            shape = f"{blocks} blocks + embedding, head"
        else:
            shape = f"{len(self.layers)} layers"
        return (f"{self.name}: {self.num_params / 1e6:.1f}M params, {self.param_bytes / 2**20:.1f} MiB, "
                f"{shape}, {self.fwd_flops / 1e9:.3g} GFLOP forward")


def whole(v, key: str, where: str = "model", low: int = 1) -> int:
    """``v`` if it is a whole number >= ``low``, else a ConfigError naming ``where.key``."""
    from distlab.sim.errors import ConfigError
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ConfigError(f"{v!r} must be a whole number >= {low}", f"{where}.{key}")
    return v
