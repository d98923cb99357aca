"""How tensor parallelism shards a transformer's parameters: the placements torch 2.13's ParallelStyles give
them (torch/distributed/tensor/parallel/style.py) under torchtitan's Llama plan, and the local shard shapes.

  ColwiseParallel (q, k, v or fused qkv, gate, up, fc, lm_head): weight Shard(0) (output features), bias Shard(0)
  RowwiseParallel (o, down, proj): weight Shard(1) (input features), bias Replicate
  RowwiseParallel on the embedding (vocabulary-parallel): weight Shard(0) (vocabulary rows)
  norms, learned positions: Replicate (under SequenceParallel their gradients come out Partial(sum): computed
  from this rank's sequence shard only, all-reduced when the optimizer reads them).
Shard(d) splits dimension d into tp equal pieces; the plan requires tp to divide it (heads, kv_heads, the FFN
width and the vocabulary), so every rank holds ``shape[d] / tp``.
"""
from __future__ import annotations

import math
from functools import lru_cache

from distlab.sim.errors import ConfigError
from distlab.sim.models import Layer, Model, Param

COLWISE = ("attn.q", "attn.k", "attn.v", "attn.qkv", "mlp.gate", "mlp.up", "mlp.fc", "lm_head")
ROWWISE = ("attn.o", "mlp.down", "mlp.proj")


def module_of(param_name: str) -> str:
    """``h.3.attn.q.weight`` -> ``attn.q``; ``embed.tok.weight`` -> ``embed.tok``."""
    parts = param_name.split(".")
    if parts[0] == "h":
        parts = parts[2:]
    return ".".join(parts[:-1])


def placement(param_name: str) -> tuple:
    """("shard", dim) or ("replicate",) of one parameter."""
    mod, leaf = module_of(param_name), param_name.rsplit(".", 1)[-1]
    if mod in COLWISE or mod == "embed.tok":
        return ("shard", 0)
    if mod in ROWWISE:
        return ("shard", 1) if leaf == "weight" else ("replicate",)
    return ("replicate",)


@lru_cache(maxsize=1 << 16)
def local_shape(param, tp: int) -> tuple[int, ...]:
    """The shape of ``param``'s shard on one of ``tp`` ranks (DTensor ``to_local().shape``). Cached (a Param is
    immutable): the planner asks for every parameter of every layout's tp."""
    pl = placement(param.name)
    if pl[0] == "replicate" or tp == 1:
        return tuple(param.shape)
    d = pl[1]
    return tuple(n // tp if i == d else n for i, n in enumerate(param.shape))


def local_numel(model, tp: int) -> int:
    return sum(math.prod(local_shape(p, tp)) for p in model.params)


def partial_grad_params(model, sequence_parallel: bool) -> list:
    """Replicated parameters whose gradient is Partial(sum) under SequenceParallel (norm weights and biases)."""
    if not sequence_parallel:
        return []
    return [p for p in model.params if "norm" in module_of(p.name)]


def check_divides(model, tp: int, where: str = "mesh.tp", sequence_parallel: bool = False) -> None:
    """ConfigError unless ``tp`` divides every dimension the plan shards: heads, kv_heads, FFN width, vocabulary
    (and, with sequence parallelism, the sequence length)."""
    c = model.config
    if c.get("kind") != "gpt":
        raise ConfigError(f"tensor parallelism needs a transformer model (a preset or {{arch: ...}}); got kind "
                          f"{c.get('kind')!r}", where)
    dims = {"heads": c["heads"], "kv_heads": c["kv_heads"], "ffn_hidden": c["ffn_hidden"], "vocab": c["vocab"]}
    if sequence_parallel:
        dims["seq_len"] = c["seq_len"]
    g = math.gcd(*dims.values())
    allowed = ", ".join(str(d) for d in range(1, g + 1) if g % d == 0)
    for key, n in dims.items():
        if n % tp:
            raise ConfigError(f"tp {tp} does not divide {key} {n} (tensor parallelism splits it across the tp "
                              f"ranks); allowed tp for this model: {allowed}", where)


def tp_local_model(model, tp: int, opts=None) -> Model:
    """``model`` with every parameter at its TP-local shape and compute divided by tp (what FSDP2 shards), and
    the activations one rank keeps (sim/models/activations.py) under ``opts``' (TPOptions) sequence and loss
    parallelism and recompute (without ``opts``: plain TP, the model's own recompute)."""
    from distlab.sim.models.activations import local_layers
    layers = [Layer(L.name, [Param(q.name, local_shape(q, tp), q.dtype) for q in L.params],
                    fwd_flops=L.fwd_flops / tp, bwd_flops=L.bwd_flops / tp, ready=L.ready) for L in model.layers]
    if (model.config or {}).get("kind") in ("gpt", "moe"):
        layers = local_layers(model, layers, tp=tp, sequence_parallel=bool(opts and opts.sequence_parallel),
                              loss_parallel=bool(opts and opts.loss_parallel),
                              recompute=opts.recompute if opts else None)
    return Model(model.name, layers, dict(model.config))
