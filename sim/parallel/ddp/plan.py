"""The plan of one DDP training step (PyTorch DistributedDataParallel, Li et al. 2020, arXiv 2006.15704).

Every rank runs the same program. On the ``compute`` stream: forward layer by layer, backward in reverse;
after the layer whose backward completes bucket k, ``Record("ready k")``. On the ``comm`` stream, for each
bucket in index order: ``Wait("ready k")`` then the bucket's all-reduce, which is exactly the Reducer's launch
rule (all its gradients ready and every lower bucket launched; NCCL and Gloo run them in order). After the
last bucket, the compute stream waits for the comm stream and runs the optimizer step.

Mixed precision: ``autocast="bfloat16"`` (or float16) is ``torch.autocast(device_type="cuda", dtype=...)`` around
the forward, as most DDP training scripts run (nanoGPT's train.py, torchtune): parameters, gradients, the
all-reduced buckets and Adam stay in the parameters' dtype (float32); the matmuls run in the autocast dtype, on
the tensor cores. Activations are still counted in the parameters' dtype (sim/models/activations.py has no
autocast layout): an upper bound, since autocast saves the linears' inputs in 16 bits.

Gradient accumulation: the first ``grad_accum - 1`` micro-batches run under ``no_sync()`` (no all-reduce).
``compress="fp16"`` / ``"bf16"``: torch's ``fp16_compress_hook`` / ``bf16_compress_hook``
(ddp_comm_hooks/default_hooks.py) all-reduce 2-byte values. Compute: a transformer's layers run their kernels
(sim/parallel/layers.py ``kernel_layers``: TP's segments on one rank, GEMMs by shape, FlashAttention,
memory-bound norms; an MoE model's block program), as under every other builder; other models' ops carry FLOPs
and HBM bytes (roofline on the cluster's GPU): forward reads the layer's parameters and writes its activations,
backward reads both and writes gradients. Optimizer: Adam reads p, g, m, v and writes p, m, v (7 x param bytes at
fp32), SGD reads p, g and writes p (3 x).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from distlab.sim.parallel.ddp.buckets import bucket_launch_times, ddp_buckets
from distlab.sim.parallel.layers import drain, kernel_layers
from distlab.sim.dtypes import compute_dtype
from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
from distlab.sim.models import Model
from distlab.sim.plan import ALGORITHMS, Collective, Compute, Plan, Record, Wait
from distlab.sim.parallel.options import option

OPTIMIZERS = {"adam": 7, "sgd": 3, "none": 0}


COMPRESS = {"fp16": "float16", "bf16": "bfloat16"}   # torch's compress hooks: the dtype they all-reduce
AUTOCAST = ("bfloat16", "float16")                   # torch.autocast dtypes on CUDA (torch.amp)

@dataclass
class DDPOptions:
    """The ``ddp:`` section of a scenario (and `distlab simulate` DDP flags)."""
    bucket_cap_mb: float | None = option(None, "DDP bucket_cap_mb in MiB (none = PyTorch's 25, first bucket 1)")
    iteration: int = option(1, "0 = the first step (one bucket); 1 = steady state, rebuilt buckets")
    grad_accum: int = option(1, "micro-batches per step, all but the last under no_sync()")
    compress: str | None = option(None, "fp16/bf16_compress_hook: all-reduce 2-byte values",
                                  choices=tuple(COMPRESS), what="compression")
    algorithm: str = option("auto", "all-reduce algorithm", choices=ALGORITHMS, what="algorithm", flag="--algo")
    optimizer: str = option("adam", "optimizer step after the all-reduces", choices=tuple(OPTIMIZERS),
                            what="optimizer")
    autocast: str | None = option(None, "torch.autocast dtype of the forward's matmuls (none = the parameters')",
                                  choices=AUTOCAST, what="autocast dtype")

    @classmethod
    def from_dict(cls, d: dict, where: str = "parallelism") -> "DDPOptions":
        allowed = [f.name for f in fields(cls)]
        for k in d:
            if k not in allowed:
                raise ConfigError(f"unknown key {k!r}; allowed: kind, {', '.join(allowed)}", where)
        return cls(**d).validate(where)

    def validate(self, where: str = "parallelism") -> "DDPOptions":
        cap = self.bucket_cap_mb
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
            raise ConfigError(f"{cap!r} must be a number of MiB > 0 (PyTorch's default: 25)",
                              f"{where}.bucket_cap_mb")
        for key in ("iteration", "grad_accum"):
            v = getattr(self, key)
            low = 0 if key == "iteration" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"{v!r} must be a whole number >= {low}", f"{where}.{key}")
        if self.grad_accum > 1024:
            raise ConfigError(f"{self.grad_accum} is more micro-batches than the simulator takes (at most 1024)",
                              f"{where}.grad_accum")
        if self.compress is not None and self.compress not in COMPRESS:
            raise ConfigError(f"unknown compression {self.compress!r}; allowed: fp16, bf16 (or none)",
                              f"{where}.compress")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"unknown algorithm {self.algorithm!r}; allowed: {', '.join(ALGORITHMS)}",
                              f"{where}.algorithm")
        if not isinstance(self.optimizer, str) or self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {self.optimizer!r}; allowed: {', '.join(OPTIMIZERS)}",
                              f"{where}.optimizer")
        if self.autocast is not None and self.autocast not in AUTOCAST:
            raise ConfigError(f"unknown autocast dtype {self.autocast!r}; allowed: {', '.join(AUTOCAST)} (or none)",
                              f"{where}.autocast")
        return self


def ddp_plan(model: Model, world: int | Mesh, opts: DDPOptions | None = None) -> tuple[Plan, dict]:
    """(Plan, info): info["buckets"] describes each bucket (bytes, params, names, the layer completing it).
    ``world``: a number of ranks (all on one data-parallel dimension) or a Mesh whose ``dp`` groups all-reduce
    the gradients (a group of the whole world is written as None, the plan format's "everyone")."""
    opts = (opts or DDPOptions()).validate()
    mesh = world if isinstance(world, Mesh) else Mesh({"dp": world})
    buckets = ddp_buckets(model, opts.bucket_cap_mb, opts.iteration)
    param_layer = model.param_layer()
    names = [p.name for p in model.params]
    # the backward order is layers last to first: a bucket is complete after the earliest-run backward
    # that finishes all its params, i.e. the lowest layer index among them
    done_after = [min(param_layer[i] for i in b.params) for b in buckets]
    ops, ready_index, coll_index = [], {}, {}
    dtype = opts.autocast or compute_dtype(model)     # no autocast: the parameters' dtype (TF32 off: FP32 peak)
    kernels = kernel_layers(model, 0, dtype)    # each layer's kernels (no collectives: the same on every rank)

    def layer_op(op, name: str, kind: str):
        if kernels is None:
            ops.append(op)
        else:
            (kernels.forward if kind == "fwd" else kernels.backward)(op, name)
            ops.extend(drain(kernels))

    for micro in range(opts.grad_accum):
        last = micro == opts.grad_accum - 1
        tag = f" (micro {micro})" if opts.grad_accum > 1 else ""
        for layer in model.layers:
            act = layer.activation_bytes + layer.transient_bytes    # written and read whether kept or recomputed
            layer_op(Compute(f"fwd {layer.name}{tag}", flops=layer.fwd_flops, bytes=layer.param_bytes + act,
                             dtype=dtype), layer.name, "fwd")
        for li in range(len(model.layers) - 1, -1, -1):
            layer = model.layers[li]
            act = layer.activation_bytes + layer.transient_bytes
            layer_op(Compute(f"bwd {layer.name}{tag}", flops=layer.bwd_flops + layer.recompute_flops,
                             bytes=2 * layer.param_bytes + act, dtype=dtype), layer.name, "bwd")
            if last:
                for k, d in enumerate(done_after):
                    if d == li:
                        ready_index[k] = len(ops)
                        ops.append(Record(f"ready {k}"))
    for k, b in enumerate(buckets):
        numel = sum(model.params[i].numel for i in b.params)
        nbytes, dtype = (2 * numel, COMPRESS[opts.compress]) if opts.compress else (b.bytes, b.dtype)
        coll_index[k] = len(ops) + 1
        ops += [Wait(f"ready {k}"), Collective("all_reduce", nbytes, dtype=dtype, algorithm=opts.algorithm,
                                               name=f"bucket {k}")]
    if buckets:
        ops += [Record("reduced", stream="comm"), Wait("reduced", stream="compute")]
    if OPTIMIZERS[opts.optimizer]:
        ops.append(Compute("optimizer step", bytes=OPTIMIZERS[opts.optimizer] * model.param_bytes))
    info = {
        "builder": "ddp", "model": model.summary(), "options": _options(opts),
        "buckets": [{"index": k, "bytes": b.bytes, "params": len(b.params), "dtype": b.dtype,
                     "first": names[b.params[0]], "last": names[b.params[-1]],
                     "ready_after": model.layers[done_after[k]].name, "record_op": ready_index[k],
                     "op": coll_index[k]} for k, b in enumerate(buckets)],
    }
    plan = Plan([_with_group(ops, mesh.group_of(r, "dp"), mesh.world_size) for r in range(mesh.world_size)],
                name=f"ddp {model.name}",
                meta={"builder": "ddp", "model": model.name, "options": _options(opts)})
    return plan.validate(), info


def _options(opts: DDPOptions) -> dict:
    """The options a plan records: without autocast when it is off (plans from before it are byte-identical)."""
    return {k: v for k, v in asdict(opts).items() if k != "autocast" or v is not None}


def _with_group(ops: list, group: tuple, world: int) -> list:
    """``ops`` with every collective on ``group`` (None when it is the whole world)."""
    if len(group) == world:
        return list(ops)
    return [replace(o, group=group) if isinstance(o, Collective) else o for o in ops]


def bucket_rows(trace, info: dict, rank: int = 0) -> list[dict]:
    """Per bucket: bytes, params, ready (its Record), launch by DDP's rule (``ddp_launch_s``,
    sim.ddp.buckets.bucket_launch_times), launch (data starts moving), end."""
    by_index = {o.index: o for o in trace.for_rank(rank)}
    rows = []
    for b in info["buckets"]:
        o, r = by_index.get(b["op"]), by_index.get(b["record_op"])
        rows.append({**b, "ready_s": None if r is None else r.end,
                     "launch_s": None if o is None else (o.start if o.launch is None else o.launch),
                     "end_s": None if o is None else o.end})
    for row, t in zip(rows, bucket_launch_times([r["ready_s"] for r in rows])):
        row["ddp_launch_s"] = t
    return rows
