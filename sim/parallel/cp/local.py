"""What one rank of a cp group runs (step 3 of sim/parallel/parallelize.py): its options, its share of the
sequence and of the model's work, and a block's compute cut around its ring attention.

    model = cp_local_model(llama, cp=4)     # s = S/4 tokens per rank; attention's core left to the ring
    ring_block(ops, ring, Compute("fwd h.0", flops=...), "fwd", "h.0")

Per rank, with s = S/cp local tokens: the linears' FLOPs are 2·b·s·(weights) (each rank runs its own tokens),
backward 2 x forward; attention's core is the ring (sim/parallel/cp/ring.py). Norms, embedding and loss:
memory-bound bytes of the local tokens. The ring's merge of partial outputs (a few element-wise ops on s tokens)
is not counted.
"""
from __future__ import annotations

from dataclasses import dataclass

from distlab.sim.errors import ConfigError
from distlab.sim.models import Layer, Model
from distlab.sim.parallel.cp.ring import METHODS, Ring
from distlab.sim.plan import DTYPE_BYTES, Compute
from distlab.sim.parallel.options import option


@dataclass
class CPOptions:
    """The ``cp:`` section of a scenario; the cp group size comes from the mesh (dimension ``cp``)."""
    rotate_method: str = option("allgather", "how K/V go round the ring (torch's set_rotate_method)",
                                choices=METHODS, what="rotate method")
    load_balance: bool = option(True, "head-tail sharding (2 x cp chunks) so every rank has the same causal work")
    recompute: str = option("none", "full: activation checkpointing of every block (torchtitan's full AC): "
                                    "backward reruns the block's forward, ring included", choices=("none", "full"),
                            what="recompute")
    overlap: bool = option(True, "rotation overlaps attention compute and FSDP2 runs on its own streams; false: "
                                 "every collective is waited for at once")

    def validate(self, where: str = "cp") -> "CPOptions":
        return self


def check_cp(model, cp: int, load_balance: bool, where: str = "mesh.cp") -> None:
    """The sequence must split into cp shards (2 x cp chunks with load balancing)."""
    s = model.config["seq_len"]
    parts = 2 * cp if load_balance else cp
    if s % parts:
        what = f"2 x cp = {parts} chunks (load-balanced causal sharding)" if load_balance else f"cp = {cp} shards"
        allowed = [d for d in range(1, min(s, 64) + 1) if s % ((2 * d) if load_balance else d) == 0]
        hint = " (torch would silently stop balancing; say load_balance: false)" if load_balance else ""
        raise ConfigError(f"seq_len {s} does not split into {what}{hint}; allowed cp: "
                          f"{', '.join(map(str, allowed))}", where)


def cp_local_model(model, cp: int, recompute: str | None = None) -> Model:
    """``model`` as one cp rank runs it: s = S/cp tokens; attention's core FLOPs removed (the ring does them);
    the activations of its model family at cp (sim/models/activations.py: ring attention keeps no s x s scores;
    ``recompute`` None = the model's own)."""
    from distlab.sim.models.activations import local_layers
    c = model.config
    b, S, h = c["micro_batch"], c["seq_len"], c["hidden"]
    layers = []
    for L in model.layers:
        core = 4.0 * b * S * S * h if L.name.startswith("h.") else 0.0
        layers.append(Layer(L.name, list(L.params), fwd_flops=(L.fwd_flops - core) / cp, ready=L.ready))
    return Model(model.name, local_layers(model, layers, cp=cp, recompute=recompute), {**c, "seq_len": S // cp})


def ring_block(out: list, ring: Ring, op: Compute, kind: str, layer: str, recompute: bool = False):
    """A block's compute split around its ring attention: forward the first half of the block's linears
    and bytes (norm1, q/k/v), the ring, the rest (o, norm2, MLP); backward the reverse, after rerunning the
    forward (half the backward's FLOPs, ring included) when ``recompute``."""
    half = Compute(f"{kind} {layer}", flops=op.flops / 2, bytes=op.bytes / 2, stream=op.stream, dtype=op.dtype)
    rest = Compute(f"{kind} {layer} (after attention)" if kind == "fwd" else f"{kind} {layer} (before attention)",
                   flops=op.flops / 2, bytes=op.bytes / 2, stream=op.stream, dtype=op.dtype)
    if kind == "fwd":
        out.append(half)
        ring.forward(f"{layer}.attn")
        out.append(rest)
    else:
        if recompute:
            redo = Compute(f"recompute {layer}", flops=op.flops / 4, bytes=op.bytes / 4, stream=op.stream,
                           dtype=op.dtype)
            out.append(redo)
            ring.forward(f"{layer}.attn", "recompute")
            out.append(redo)
        out.append(rest)
        ring.backward(f"{layer}.attn")
        out.append(half)
