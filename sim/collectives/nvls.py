"""NVLS: all-reduce inside the NVSwitch (NVLink SHARP, NVSwitch gen 3+, Hopper and later; NCCL >= 2.17).

Each GPU pushes its data into the switch, which reduces it and multicasts the result back (multimem loads and
stores). Per GPU the egress and the ingress each carry (n+1)/n·S (its whole buffer for the reduction plus its
own slice of the result). Two pipeline stages (up, down; common.pipeline) in k = num_chunks(S) chunks:
    t = B + h·α + (k+1)/k · (n+1)/n · S·β / e,   h = 1 if k = 1 else 2 (the fill steps that use an up-link)
B = 25 us, NCCL's NVLS latency paid once per call (tuning.cc:161, :425); e = nvlsEfficiency (Hopper 0.85,
Blackwell 0.74; tuning.cc:139-144), the protocols module applies both. α: the NVLink hop (on the GPU's up-link).
One node only: across nodes NCCL runs NVLS only with CollNet (tuning.cc:504-506); use nvls_tree there.
"""
from __future__ import annotations

from distlab.sim.collectives.common import num_chunks, pipeline
from distlab.sim.errors import ConfigError
from distlab.sim.kernel.network import SWITCH

NAME, NCCL_NAME = "nvls", "NVLS"
PROTOCOLS = ("Simple",)
NCCL_AUTO = True           # `auto` may pick it on NCCL clusters
OPS = ("all_reduce",)


def check_switch(ctx, name: str) -> None:
    c = ctx.cluster
    if c.intra_node.kind != "nvswitch" or not c.intra_node.nvls:
        raise ConfigError(f"{name} needs an NVSwitch with in-switch reduction (NVLink SHARP); cluster {c.name!r} "
                          "has none; allowed there: ring, tree, hierarchical", "algorithm")


def check(ctx, group) -> None:
    check_switch(ctx, NAME)
    if len(ctx.nodes_of(group)) > 1:
        raise ConfigError("nvls runs inside one node; across nodes use nvls_tree, hierarchical or ring", "algorithm")


def steps(ctx, op, group, nbytes, root):
    n = len(group)
    if n == 1:
        return
    g = tuple(sorted(group))
    moved = (n + 1) / n * nbytes
    stages = [[(r, SWITCH, moved) for r in g], [(SWITCH, r, moved) for r in g]]
    yield from pipeline(ctx, ("nvls", g), stages, num_chunks(nbytes), nbytes)
