"""Tensor parallelism plans: per rank, the compute and the collectives torch 2.13 issues for one training step of
a transformer parallelized by ``parallelize_module`` with torchtitan's Llama plan (TP + SP) or the plain
Megatron-style plan (TP) (the plans: runtime/parallel/tp/run.py; shards: sim/parallel/tp/rules.py). Checked against the
collectives real DTensor issues on gloo ranks (tests/test_tp_runtime.py). With t = tp, b·s·h·e bytes = X:

TP + SP (sequence_parallel: true), forward: embedding RowwiseParallel -> Partial redistributed to Shard(1):
reduce_scatter(X); per block: PrepareModuleInput Shard(1) -> Replicate before attention: all_gather(X); o
RowwiseParallel Partial -> Shard(1): reduce_scatter(X); the same around the MLP; lm_head ColwiseParallel input
Shard(1) -> Replicate: all_gather(X), output Shard(-1) -> Replicate: all_gather(b·s·V·e) (not with loss
parallel, which instead all-reduces 3 float32 b·s vectors in the loss: max, sum of exp, target logit).
Backward: each redistribution's adjoint in reverse (all_gather <-> reduce_scatter; the output all_gather's
adjoint is a local slice): reduce_scatter(X) at lm_head, per block (reversed) all_gather, reduce_scatter,
all_gather, reduce_scatter, then all_gather(X) at the embedding. Optimizer: the norms' gradients are
Partial(sum); AdamW reads each gradient 3 times (``lerp_(grad)``, ``addcmul_(grad, grad)``) and every read of a
Partial DTensor all-reduces it: 3 all_reduces per norm parameter, in parameter order.
Plain TP, forward: all_reduce(X) after the embedding and after every o and down projection; all_gather of the
logits. Backward: every ColwiseParallel input is its own ``from_local(Replicate)`` whose adjoint all-reduces the
Partial input gradient: one all_reduce(X) per column-parallel linear (q, k, v: 3; fused qkv: 1; gate, up: 2;
fc: 1; lm_head: 1); the embedding's is free. Norm parameters are plain tensors: no optimizer collectives.
With ``prepare_input`` (torchtitan's wrapping of attention and feed_forward in PrepareModuleInput, here with
Replicate -> Replicate and use_local_output=False) each part's input is one DTensor that q, k, v (gate, up) all
read: backward sums their Partial gradients into it and all-reduces once per part, Megatron's f: 2 per block.

Compute per rank (Megatron-LM, Narayanan et al. 2021, arXiv 2104.04473): the linears' FLOPs and attention's
4·b·s²·h divide by t; the head's 2·b·s·h·V by t; backward = 2 x forward; recompute adds the forward (full) or
attention's 4·b·s²·h/t (selective; Korthikanti et al. 2022, arXiv 2205.05198 sec. 5). Norms and the embedding
are memory-bound (bytes). Collectives run on stream ``tp``; compute waits for each (they sit on the critical
path: each result is the next op's input).

Host overhead: every op on a DTensor goes through DTensor's Python dispatch (sharding propagation, placement
checks, redistribution) before its local op runs, and a TP layer adds ``parallelize_module``'s hooks and the
``from_local``/``redistribute``/``to_local`` autograd functions around each collective (torch 2.13:
torch/distributed/tensor/_dispatch.py ``OpDispatcher.dispatch``, tensor/parallel/style.py, tensor/_redistribute.py).
Each Compute op carries ``launches`` = the DTensor ops it dispatches (DTENSOR_OPS, counted on torch 2.13 with a
TorchDispatchMode: runtime/parallel/tp/capture.py CollectiveCapture, checked in tests/test_tp_runtime.py), and costs launches
x ``launch_s`` on top of its roofline time: t = launches·launch_s + roofline. runtime/parallel/tp/calibrate.py measures
``launch_s`` on one block of the model under the same plan as CPU time: (parallel block - unparallelized block -
its collectives' functional issue, which the fitted collective times hold) / the block's DTensor ops, so the hooks
and redistribution count in the proportion a block has them (~3x an elementwise DTensor op's own cost); AdamW's
elementwise ops are charged the same (an over-estimate: ~20 us each measured against ~35-45 us). On CPU ranks the
compute ops, host work included, share the node's ``cpu_cores`` (sim/kernel/cores.py), as the ranks' Python threads do.
"""
from __future__ import annotations

from dataclasses import dataclass

from distlab.sim.errors import ConfigError
from distlab.sim.models import structure
from distlab.sim.plan import DTYPE_BYTES, Collective, Compute, Plan, Record, Wait
from distlab.sim.parallel.tp.rules import check_divides, local_shape, module_of, partial_grad_params, placement
from distlab.sim.parallel.options import option

ADAM_BYTES = 28      # per local element: read param, grad, m, v (fp32) and write param, m, v
ADAM_FLOPS = 12
ADAMW_GRAD_READS = 3     # torch.optim._single_tensor_adamw / _multi_tensor_adamw: lerp_(grad), addcmul_(grad, grad)
# DTensor ops dispatched per transformer block (split evenly between its attention and MLP halves), by the
# embedding, and by the final norm, head and loss together (given to the head), forward and backward, with
# sequence parallelism (True) or without (False); AdamW: per DTensor parameter (weight decay mul_, lerp_, mul_,
# addcmul_, sqrt, div, add_, addcdiv_: _single_tensor_adamw, as DTensor parameters get). Counted on torch 2.13
# (the ends apart: runtime/parallel/tp/ends.py, which also measures their host work beyond launch_s per op).
DTENSOR_OPS = {True: {"block fwd": 42, "block bwd": 102, "embed fwd": 1, "embed bwd": 2, "head fwd": 11,
                      "head bwd": 27},
               False: {"block fwd": 28, "block bwd": 63, "embed fwd": 1, "embed bwd": 2, "head fwd": 4,
                       "head bwd": 9}}
# plain TP with prepare_input: the linears' backward runs on the DTensor input (3 more ops per block)
DTENSOR_OPS["prepare_input"] = {**DTENSOR_OPS[False], "block bwd": 66}
ADAMW_DTENSOR_OPS = 8


@dataclass
class TPOptions:
    """The ``tp:`` section of a scenario; the tp group size comes from the mesh (dimension ``tp``)."""
    sequence_parallel: bool = option(True, "shard norms and the residual stream on the sequence (torchtitan's "
                                           "plan); false: plain Megatron TP with all-reduces")
    loss_parallel: bool = option(False, "keep the logits sharded on the vocabulary and compute the loss in "
                                        "parallel (torch's loss_parallel)")
    prepare_input: bool = option(False, "plain TP: give attention and the MLP one DTensor input each "
                                        "(PrepareModuleInput, use_local_output=False, as torchtitan wraps them): "
                                        "one backward all-reduce per part instead of one per column-parallel linear",
                                 flag="--tp-prepare-input")
    recompute: str = option("none", "activation recomputation for the memory report and backward compute "
                                    "(without a tp section: the model's, for every parallelism)",
                            choices=("none", "selective", "full"), what="recompute")
    schedule: str = option("1f1b", "pipeline schedule when the mesh has pp (PP x TP, sim/parallel/tp/pipeline.py)",
                           choices=("gpipe", "1f1b", "interleaved"), what="pipeline schedule")
    microbatches: int = option(4, "micro-batches per step when the mesh has pp")
    virtual_stages: int = option(1, "model chunks per pipeline rank (interleaved)")
    split: list[int] | None = option(None, "transformer blocks per pipeline stage, pp x virtual_stages numbers "
                                           "(none = even)")
    comm_overlap: bool = option(False, "Megatron-LM's TP communication overlap (async TP): all-gathers and "
                                       "reduce-scatters as P2P ring steps pipelined with the GEMMs (sequence "
                                       "parallel only; sim/parallel/tp/overlap.py)", flag="--tp-comm-overlap")

    def validate(self, where: str = "tp") -> "TPOptions":
        for key in ("microbatches", "virtual_stages"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{getattr(self, key)} must be a whole number >= 1", f"{where}.{key}")
        return self


class _Program:
    """One rank's ops; collectives on stream ``tp`` with compute waiting for them."""

    def __init__(self, group: tuple, dtype: str):
        self.ops, self.group, self.dtype, self.n = [], group, dtype, 0

    def compute(self, name: str, flops: float = 0.0, nbytes: float = 0.0, gemms: tuple = (), attention=None,
                attention_pass: str = "forward", launches: int = 0, chunks: int = 1):
        """A compute op; ``gemms``/``attention`` name its kernels for sim/compute.py; ``launches`` the DTensor
        ops it dispatches (the op's whole overhead when the group shards, tp > 1; with tp = 1, None: one
        launch per kernel, sim/compute.py)."""
        self.ops.append(Compute(name, flops=flops, bytes=nbytes, gemms=gemms, attention=attention,
                                attention_pass=attention_pass, dtype=self.dtype, chunks=chunks,
                                launches=launches if len(self.group) > 1 else None))

    def coll(self, op: str, nbytes: int, name: str, dtype: str | None = None):
        if len(self.group) == 1:
            return
        self.n += 1
        self.ops += [Record(f"c{self.n}", "compute"), Wait(f"c{self.n}", "tp"),
                     Collective(op, int(nbytes), dtype or self.dtype, self.group, name=f"tp {op} {name}", stream="tp"),
                     Record(f"t{self.n}", "tp"), Wait(f"t{self.n}", "compute")]


PHASES = {"fwd": "forward", "bwd": "backward", "optimizer": "optimizer", "forward": "forward", "backward": "backward"}


def collective_sequence(plan: Plan, rank: int = 0) -> list[tuple]:
    """(kind, bytes, dtype, group, phase) of each collective of ``rank`` in issue order: what
    runtime/parallel/tp/run.py's capture is compared with."""
    return [(o.op, o.bytes, o.dtype, plan.group_of(o), PHASES[o.name.rsplit(" ", 1)[-1]])
            for o in plan.ranks[rank] if isinstance(o, Collective)]


def shapes_of(model, tp: int) -> dict:
    """FLOPs and bytes of one block's parts and of the head, per rank (see the module docstring)."""
    c, st = model.config, structure(model)
    b, s, h, V = c["micro_batch"], c["seq_len"], c["hidden"], c["vocab"]
    e = DTYPE_BYTES[c["dtype"]]
    block = model.layers[1].params if len(model.layers) > 2 else []
    attn = sum(p.numel for p in block if ".attn." in p.name and len(p.shape) == 2)
    mlp = sum(p.numel for p in block if ".mlp." in p.name and len(p.shape) == 2)
    return {"X": b * s * h * e, "tokens": b * s, "e": e, "logits": b * s * V * e,
            "attn_flops": (2.0 * b * s * attn + 4.0 * b * s * s * h) / tp, "attn_bytes": attn * e / tp,
            "core_flops": 4.0 * b * s * s * h / tp, "mlp_flops": 2.0 * b * s * mlp / tp, "mlp_bytes": mlp * e / tp,
            "head_flops": 2.0 * b * s * h * V / tp, "head_bytes": h * V * e / tp,
            "col_attn": 1 if st["qkv"] == "fused" else 3, "col_mlp": 2 if st["mlp"] == "swiglu" else 1,
            **gemm_shapes(model, tp)}


def gemm_shapes(model, tp: int) -> dict:
    """Per rank, the (M, N, K) of each forward GEMM of a block's attention and MLP and of the head (M = b·s tokens:
    under sequence parallelism the all-gathered input; column-parallel N and row-parallel K divided by tp), and the
    FlashAttention call (b, heads / tp, s, head_dim) (sim/compute.py times them)."""
    c, st = model.config, structure(model)
    b, s, h, V, heads = c["micro_batch"], c["seq_len"], c["hidden"], c["vocab"], c["heads"]
    T, d, ffn = b * s, h // heads, c["ffn_hidden"]
    kv = c["kv_heads"] * d
    qkv = (((T, (h + 2 * kv) // tp, h),) if st["qkv"] == "fused"
           else ((T, h // tp, h), (T, max(1, kv // tp), h), (T, max(1, kv // tp), h)))
    up = ((T, ffn // tp, h),) * (2 if st["mlp"] == "swiglu" else 1)
    return {"attn_gemms": qkv + ((T, h, h // tp),), "mlp_gemms": up + ((T, h, ffn // tp),),
            "head_gemms": ((T, V // tp, h),), "core": (b, heads // tp, s, d)}


def backward_gemms(gemms: tuple) -> tuple:
    """The backward of each forward GEMM (M, N, K): input gradient (M, K, N) and weight gradient (K, N, M)."""
    return tuple(g for M, N, K in gemms for g in ((M, K, N), (K, N, M)))


def tp_plan(model, mesh, opts: TPOptions, name: str | None = None, where: str = "tp", make_segments=None) -> Plan:
    """The plan of one step (forward, backward, AdamW) on ``mesh`` (dimension ``tp``; other dimensions hold
    replicas that this builder does not synchronize). ``make_segments(model, opts, program, rank)``: each rank's
    segments (sim/parallel/layers.py ``segments``: Megatron's overlap with ``comm_overlap``); default Segments."""
    if opts.comm_overlap and make_segments is None:
        raise ConfigError("comm_overlap: build it with sim/parallel/parallelize.py (it chooses the overlapped "
                          "segments)", f"{where}.comm_overlap")
    if "tp" not in mesh:
        raise ConfigError(f"the tp section needs mesh dimension 'tp'; this mesh has {', '.join(mesh.names)}",
                          f"{where}: mesh")
    tp = mesh.size("tp")
    check_divides(model, tp, "mesh.tp", opts.sequence_parallel)
    progs = [_program(model, mesh.group_of(r, "tp"), opts, r, make_segments) for r in range(mesh.world_size)]
    local = sum(_numel(local_shape(p, tp)) for p in model.params)
    meta = {"builder": "tp", "model": model.name, "tp": tp, "sequence_parallel": opts.sequence_parallel,
            "loss_parallel": opts.loss_parallel, "recompute": opts.recompute, "local_params": local}
    mode = "tp-sp" if opts.sequence_parallel else "tp"
    return Plan([p.ops for p in progs], name=name or f"{mode}{tp}-{model.name}", meta=meta).validate()


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _program(model, group: tuple, o: TPOptions, rank: int | None = None, make_segments=None) -> _Program:
    p = _Program(group, model.config["dtype"])
    seg = (make_segments or (lambda m, o, p, r: Segments(m, o, p)))(model, o, p, group[0] if rank is None else rank)
    for layer in model.layers:
        seg.forward(layer.name)
    for layer in reversed(model.layers):
        seg.backward(layer.name)
    seg.partial_grads([q.name for q in partial_grad_params(model, o.sequence_parallel)], ADAMW_GRAD_READS,
                      "optimizer")
    n = sum(_numel(local_shape(q, len(group))) for q in model.params)
    dtensors = sum(1 for q in model.params if placement(q.name)[0] == "shard"
                   or o.sequence_parallel and "norm" in module_of(q.name))      # SequenceParallel norms too
    p.compute("optimizer", flops=ADAM_FLOPS * n, nbytes=ADAM_BYTES * n, launches=ADAMW_DTENSOR_OPS * dtensors)
    return p


class Segments:
    """The ops of one layer (``embed``, ``h.{i}``, ``head``) forward or backward, appended to a _Program: the
    pieces tp_plan strings together and FSDP2 x TP (sim/parallel/tp/compose.py) splices into FSDP2's program."""

    def __init__(self, model, o: TPOptions, p: _Program):
        self.model, self.o, self.p = model, o, p
        tp, sp = len(p.group), o.sequence_parallel
        self.k, self.sp = shapes_of(model, tp), sp
        self.norm = 2 * self.k["X"] / (tp if sp else 1)     # a norm reads and writes the (sharded) stream
        self.redo_attn = {"none": 0.0, "selective": self.k["core_flops"], "full": self.k["attn_flops"]}[o.recompute]
        self.redo_mlp = self.k["mlp_flops"] if o.recompute == "full" else 0.0
        self.dt = DTENSOR_OPS["prepare_input" if o.prepare_input and not sp else sp]

    def forward(self, name: str):
        p, k, sp, X, V = self.p, self.k, self.sp, self.k["X"], self.model.config["vocab"]
        if name == "embed":
            p.compute("fwd embed", nbytes=X, launches=self.dt["embed fwd"])
            p.coll("reduce_scatter" if sp else "all_reduce", X, "embed fwd")
        elif name == "head":
            p.compute("fwd norm_f", nbytes=self.norm)
            if sp:
                p.coll("all_gather", X, "lm_head input fwd")
            p.compute("fwd lm_head", k["head_flops"], k["head_bytes"], k["head_gemms"], launches=self.dt["head fwd"])
            if self.o.loss_parallel:
                p.compute("fwd loss", nbytes=k["tokens"] * 4 * V / len(p.group))
                for what in ("max", "sum exp", "target logit"):
                    p.coll("all_reduce", k["tokens"] * 4, f"loss {what} fwd", "float32")
            else:
                p.coll("all_gather", k["logits"], "lm_head output fwd")
                p.compute("fwd loss", nbytes=k["tokens"] * 4 * V)
        else:
            for part, norm in (("attn", "norm1"), ("mlp", "norm2")):
                p.compute(f"fwd {name}.{norm}", nbytes=self.norm)
                if sp:
                    p.coll("all_gather", X, f"{name}.{part} input fwd")
                p.compute(f"fwd {name}.{part}", k[f"{part}_flops"], k[f"{part}_bytes"], k[f"{part}_gemms"],
                          k["core"] if part == "attn" else None, launches=self._half("fwd", part))
                p.coll("reduce_scatter" if sp else "all_reduce", X, f"{name}.{part} output fwd")

    def backward(self, name: str):
        p, k, sp, X = self.p, self.k, self.sp, self.k["X"]
        if name == "embed":
            if sp:
                p.coll("all_gather", X, "embed bwd")
            p.compute("bwd embed", nbytes=X, launches=self.dt["embed bwd"])
        elif name == "head":
            p.compute("bwd lm_head", 2 * k["head_flops"], k["head_bytes"], backward_gemms(k["head_gemms"]),
                      launches=self.dt["head bwd"])
            p.coll("reduce_scatter" if sp else "all_reduce", X, "lm_head input bwd")
            p.compute("bwd norm_f", nbytes=self.norm)
        else:
            for part, norm, redo in (("mlp", "norm2", self.redo_mlp), ("attn", "norm1", self.redo_attn)):
                if sp:
                    p.coll("all_gather", X, f"{name}.{part} output bwd")
                full = self.o.recompute == "full"
                p.compute(f"bwd {name}.{part}", 2 * k[f"{part}_flops"] + redo, k[f"{part}_bytes"],
                          (k[f"{part}_gemms"] if full else ()) + backward_gemms(k[f"{part}_gemms"]),
                          k["core"] if part == "attn" else None,
                          "recompute+backward" if self.o.recompute != "none" else "backward",
                          launches=self._half("bwd", part))
                for _ in range(1 if sp or self.o.prepare_input else k[f"col_{part}"]):
                    p.coll("reduce_scatter" if sp else "all_reduce", X, f"{name}.{part} input bwd")
                p.compute(f"bwd {name}.{norm}", nbytes=self.norm)

    def _half(self, phase: str, part: str) -> int:
        n = self.dt[f"block {phase}"]
        return n // 2 if part == "attn" else n - n // 2

    def partial_grads(self, names: list[str], reads: int, phase: str):
        """All-reduce the Partial(sum) gradients of parameters ``names``, ``reads`` times each."""
        by_name = {q.name: q for q in self.model.params}
        for n in names:
            for _ in range(reads):
                self.p.coll("all_reduce", by_name[n].bytes, f"{n} grad {phase}")
