"""FSDP2 units: ``fully_shard`` on every transformer block, then on the root; and FSDP2's padded shard sizes."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

BLOCK = re.compile(r"^(.*\.)?\d+$")          # h.0, layers.3: one fully_shard unit each


@dataclass
class Unit:
    """One ``fully_shard`` unit: its parameters and the model layers (indices) it owns."""
    name: str
    params: list
    layers: list[int]

    def numel(self, shard: int = 1) -> int:
        """Elements after padding each parameter's dim 0 to a multiple of ``shard``."""
        return sum(padded_numel(p.shape, shard) for p in self.params)


def padded_numel(shape, shard: int) -> int:
    return _padded_numel(tuple(shape) or (1,), shard)


@lru_cache(maxsize=1 << 14)
def _padded_numel(shape: tuple, shard: int) -> int:
    """Cached: a model has few distinct shapes, asked for again by every unit, stage and layout."""
    return math.ceil(shape[0] / shard) * shard * math.prod(shape[1:])


def units_of(model) -> list[Unit]:
    """Root first (layers that are not blocks), then one unit per block layer, in forward order."""
    root = Unit("root", [], [])
    blocks = []
    for i, layer in enumerate(model.layers):
        if BLOCK.match(layer.name):
            blocks.append(Unit(layer.name, list(layer.params), [i]))
        else:
            root.params += layer.params
            root.layers.append(i)
    return [root] + blocks




def model_dtype(model) -> str:
    return model.params[0].dtype if model.params else "float32"
