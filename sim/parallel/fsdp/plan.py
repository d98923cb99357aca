"""FSDP2 / ZeRO plans: the all-gathers and reduce-scatters around every unit, in the order FSDP2 issues them.

Units (``fully_shard`` on every transformer block, then on the root): one per block layer (``h.3``, ``layers.3``),
plus the root holding everything else (embedding, final norm, head). Per step, FSDP2 (torch 2.13) issues:
forward: AG(root), AG(block 0), ..., AG(block L-1); backward, for each block in reverse: AG (only if resharded
after forward; prefetched one unit ahead) then RS once its gradients are ready; RS(root) last; HSDP adds an
all-reduce of each reduce-scattered shard across replicas. The root is resharded only when asked
(``root_reshard_after_forward``: ``fully_shard(root, reshard_after_forward=True)``): then it is gathered again
first in backward. Checked against real ``fully_shard`` on gloo (tests/test_fsdp_runtime.py,
tests/test_fsdp_options_runtime.py; ../shared/REFERENCES.md).

Process groups (sim/kernel/communicators.py): the all-gathers and reduce-scatters run on the dp_shard group, one
communicator, so they run one at a time in issue order (NCCL), a backward all-gather waiting for the
reduce-scatter issued before it; ``separate_reduce_scatter_group`` (torch 2.13
``FSDPModule.set_separate_reduce_scatter_group``) puts the reduce-scatters on a second group over the same ranks
(name "fsdp_reduce_scatter", as FSDP2's ``group_desc``), so they overlap the all-gathers; HSDP's all-reduces run
on the dp_replicate group (another communicator: they overlap both).

Timing (streams "compute", "ag", "rs", "ar" as FSDP2's CUDA streams): forward AG(k) may start once unit
k-prefetch-1 has computed (FSDP2 frees a unit before gathering two ahead); backward AG of segment t is issued
when segment t-backward_prefetch starts; before a unit's gradient copy-in, compute waits for the RS issued
``reduce_scatter_max_input_buffers`` (K, default 1) units before (FSDP2 keeps K RS input buffers in flight,
``FSDPModule.set_reduce_scatter_max_input_buffers``, torch 2.13 _fsdp_param_group.py post_backward); with
K > 1 each unit's gradient buffer stays allocated until that reclaim (or the optimizer), K buffers at most
(K = 1: until its RS ends, the plan's accounting before the option). Copies are memory-bound Compute ops:
AG copy-in 2·shard, copy-out 2·unit, RS copy-in unit·(param + reduce bytes), RS copy-out 2·shard.
``overlap: false`` puts everything on one stream in issue order, as FSDP2 runs on CPU with gloo (every call
blocks).
Bytes follow nccl-tests: AG = the gathered unit, RS = the full unit. Each parameter's dim 0 is padded to a
multiple of the shard group size S before sharding: padded = ceil(d0 / S)·S·prod(rest).
ZeRO stages (Rajbhandari et al. 2019, arXiv 1910.02054): 3 = FSDP; 2 = replicated params, gradients
reduce-scattered per unit during backward, optimizer on the shard, updated params all-gathered after the step;
1 = the same collectives, but all gradients are reduce-scattered after backward (full gradients are kept).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from distlab.sim.errors import ConfigError
from distlab.sim.dtypes import REDUCE_DTYPES, TRAINING_DTYPES
from distlab.sim.parallel.fsdp.memory import static_bytes
from distlab.sim.parallel.fsdp.units import BLOCK, Unit, model_dtype, padded_numel, units_of  # noqa: F401 (re-exported)
from distlab.sim.mesh import Mesh
from distlab.sim.plan import DTYPE_BYTES, Collective, Compute, Plan, Record, Wait
from distlab.sim.parallel.options import option
ADAM_BYTES = 28      # per shard element: read param, grad, m, v (fp32) and write param, m, v
ADAM_FLOPS = 12      # per element, roughly (two moments, bias corrections, update)


@dataclass
class FSDPOptions:
    """The ``fsdp:`` section of a scenario. The shard and replicate groups come from the mesh (dp_shard,
    dp_replicate), not from here."""
    zero: int = option(3, "ZeRO stage: 3 = FSDP (params, grads, optimizer sharded), 2 = grads and optimizer, "
                          "1 = optimizer", choices=(1, 2, 3), what="ZeRO stage")
    reshard_after_forward: bool | int = option(True, "blocks: true frees them after forward, false keeps them, "
                                                     "an int reshards to groups of that many ranks")
    prefetch: int = option(1, "forward all-gathers issued ahead of the unit computing")
    backward_prefetch: int = option(1, "backward all-gathers issued ahead")
    param_dtype: str | None = option(None, "MixedPrecisionPolicy param_dtype: the dtype gathered and computed in "
                                           "(none = the model's)", choices=TRAINING_DTYPES, what="dtype")
    reduce_dtype: str | None = option(None, "MixedPrecisionPolicy reduce_dtype (none = param_dtype)",
                                      choices=REDUCE_DTYPES, what="dtype")
    overlap: bool = option(True, "false: one stream, as FSDP2 runs on CPU with gloo (every call blocks)")
    root_reshard_after_forward: bool = option(False, "true: the root freed after forward, gathered again for "
                                                     "backward (FSDP2's default: kept)")
    separate_reduce_scatter_group: bool = option(False, "true: set_separate_reduce_scatter_group() (torch 2.13): "
                                                        "reduce-scatters on a process group of their own, so they "
                                                        "overlap the all-gathers (one more communicator); false: "
                                                        "one group, one collective at a time")
    reduce_scatter_max_input_buffers: int = option(1, "set_reduce_scatter_max_input_buffers(K) (torch 2.13): "
                                                      "reduce-scatter inputs in flight; compute waits for the "
                                                      "reduce-scatter K units back, K gradient buffers held")
    sync_each_microbatch: bool = option(True, "accumulation: sync every micro-batch (true) or the last",
                                        flag="--grad-sync")

    def validate(self, where: str = "parallelism") -> "FSDPOptions":
        """Checks that need no world size (the others: :func:`parse_config`)."""
        if self.zero not in (1, 2, 3) or isinstance(self.zero, bool):
            raise ConfigError(f"unknown ZeRO stage {self.zero!r}; allowed: 1, 2, 3", f"{where}.zero")
        for key in ("prefetch", "backward_prefetch"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{v!r} must be a whole number >= 0", f"{where}.{key}")
        k = self.reduce_scatter_max_input_buffers
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ConfigError(f"{k!r} must be a whole number >= 1", f"{where}.reduce_scatter_max_input_buffers")
        for key, allowed in (("param_dtype", TRAINING_DTYPES), ("reduce_dtype", REDUCE_DTYPES)):
            v = getattr(self, key)
            if v is not None and v not in allowed:
                raise ConfigError(f"{v!r} is not a training dtype; allowed: {', '.join(allowed)}", f"{where}.{key}")
        if not isinstance(self.reshard_after_forward, (bool, int)):
            raise ConfigError(f"{self.reshard_after_forward!r} must be true, false or a group size",
                              f"{where}.reshard_after_forward")
        for key in ("overlap", "root_reshard_after_forward", "separate_reduce_scatter_group", "sync_each_microbatch"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"{getattr(self, key)!r} must be true or false", f"{where}.{key}")
        return self


@dataclass
class FSDPConfig(FSDPOptions):
    """FSDPOptions plus the shard group size (HSDP: shard within groups of this many ranks; None = world)."""
    shard_size: int | None = None


KEYS = ("zero", "reshard_after_forward", "prefetch", "backward_prefetch", "param_dtype", "reduce_dtype",
        "shard_size", "overlap", "root_reshard_after_forward", "separate_reduce_scatter_group",
        "reduce_scatter_max_input_buffers", "sync_each_microbatch")
RS_GROUP = "fsdp_reduce_scatter"     # FSDP2's group_desc of the separate reduce-scatter group (torch 2.13)


def parse_config(opts: dict, world: int, where: str = "parallelism") -> FSDPConfig:
    """Validate the builder options; every bad value is a ConfigError naming the key."""
    for k in opts:
        if k not in KEYS:
            raise ConfigError(f"unknown key {k!r} for fsdp; allowed: {', '.join(KEYS)}", where)
    c = FSDPConfig(**opts).validate(where)
    S = world if c.shard_size is None else c.shard_size
    if not isinstance(S, int) or isinstance(S, bool) or S < 1 or world % S:
        raise ConfigError(f"shard group size {S!r} must divide the world size {world}", f"{where}.shard_size")
    c.shard_size = S
    r = c.reshard_after_forward
    if not isinstance(r, bool):
        if r < 1 or S % r:
            raise ConfigError(f"{r} must be a divisor of the shard group size {S}", f"{where}.reshard_after_forward")
        c.reshard_after_forward = False if r == 1 else (True if r == S else r)   # as FSDP2 normalises it
    return c


class _Program:
    """One rank's ops in issue order, and the memory effects of each (op index, start|end, bytes, category)."""

    def __init__(self, overlap: bool):
        self.ops, self.mem, self.overlap = [], [], overlap

    def add(self, op, start=(), end=()) -> int:
        if not self.overlap and hasattr(op, "stream"):
            op = type(op)(**{**op.__dict__, "stream": "compute"})
        i = len(self.ops)
        self.ops.append(op)
        self.mem += [[i, "start", d, c] for d, c in start] + [[i, "end", d, c] for d, c in end]
        return i

    def record(self, event: str, stream: str):
        if self.overlap:
            self.ops.append(Record(event, stream))

    def wait(self, event: str, stream: str):
        if self.overlap:
            self.ops.append(Wait(event, stream))


def build_fsdp(model, world: int, opts: dict | None = None, name: str | None = None) -> Plan:
    """The plan of one training step (forward, backward, optimizer) on ``world`` ranks; ``opts`` as FSDPConfig
    (``shard_size`` S: the mesh {dp_replicate: world / S, dp_shard: S})."""
    cfg = parse_config(dict(opts or {}), world)
    mesh = Mesh({"dp_replicate": world // cfg.shard_size, "dp_shard": cfg.shard_size})
    return fsdp_plan(model, mesh, cfg, name)


def fsdp_plan(model, mesh: Mesh, options: FSDPOptions, name: str | None = None, where: str = "fsdp",
              only: list[int] | None = None, kernels: bool = True, cluster=None) -> Plan:
    """The plan on ``mesh``: parameters sharded over its ``dp_shard`` groups, HSDP all-reduces over its
    ``dp_replicate`` groups (when the mesh has that dimension); an int reshard_after_forward r reshards to
    groups of r consecutive ranks of the shard group (FSDP2 views the mesh as (-1, r)). ``only``: just these
    ranks' programs (a plan of them, in that order, not validated: sim/kernel/relabel.py renames them).
    ``kernels``: each layer's op replaced by its kernels (sim/parallel/layers.py ``kernel_layers``; false: the
    plain ops, for sim/parallel/fsdp/step.py to hand to the layer programs of TP and CP). With ``cluster``, where
    the layout allows (sim/kernel/relabel.py fsdp_shifts), one rank per class is built and the others are its
    renamings."""
    if cluster is not None and only is None:
        from distlab.sim.kernel.relabel import fsdp_shifts, relabelled
        shifts = fsdp_shifts(mesh, cluster, options.reshard_after_forward)
        if shifts is not None:
            return relabelled(lambda reps: fsdp_plan(model, mesh, options, name, where, reps, kernels), shifts)
    shard = mesh.size("dp_shard") if "dp_shard" in mesh else 1
    fields = {k: v for k, v in asdict(options).items() if k != "shard_size"}
    cfg = parse_config({**fields, "shard_size": shard}, mesh.world_size, where)
    units = units_of(model)
    pdt = cfg.param_dtype or model_dtype(model)
    rdt = cfg.reduce_dtype or pdt
    raf = cfg.reshard_after_forward
    post_mesh = None if isinstance(raf, bool) else mesh.split("dp_shard", ("dp_shard_out", "reshard"), raf)
    progs = []
    for r in range(mesh.world_size) if only is None else only:
        groups = (_group(mesh, r, "dp_shard"), _group(mesh, r, "dp_replicate"),
                  None if post_mesh is None else post_mesh.group_of(r, "reshard"))
        progs.append(_program(model, units, cfg, groups, pdt, rdt))
    ranks, events = [p.ops for p in progs], progs[0].mem
    if kernels and (model.config or {}).get("kind") in ("gpt", "moe"):
        built = [_with_kernels(model, r, ops, pdt) for r, ops in
                 zip(range(mesh.world_size) if only is None else only, ranks)]
        ranks, spans = [b[0] for b in built], built[0][1]
        events = [[spans[i][0 if edge == "start" else 1], edge, d, c] for i, edge, d, c in events]
    S = cfg.shard_size
    meta = {"builder": "fsdp", "model": model.name, "zero": cfg.zero, "shard_size": S,
            "reshard_after_forward": cfg.reshard_after_forward, "param_dtype": pdt, "reduce_dtype": rdt,
            "units": [[u.name, u.numel(), u.numel(S)] for u in units],
            "memory": {"static": static_bytes(model, mesh.world_size, cfg.zero, S, pdt), "events": events}}
    plan = Plan(ranks, name=name or f"fsdp-zero{cfg.zero}-{model.name}", meta=meta)
    return plan.validate() if only is None else plan


def _with_kernels(model, rank: int, ops: list, pdt: str) -> tuple[list, list]:
    """(the rank's ops with each layer's op replaced by its kernels (sim/parallel/layers.py), AdamW stepping
    DTensors (``fully_shard`` makes every parameter one: sim/parallel/layers.py ``dtensor_optimizer``); per op
    before, the (first, last) index of what replaced it, for the memory events)."""
    from dataclasses import replace
    from distlab.sim.parallel.layers import kernel_layers, through
    from distlab.sim.parallel.tp.plan import ADAMW_DTENSOR_OPS
    n, layers, spans = len(model.params), kernel_layers(model, rank, pdt), []
    for o in ops:
        if isinstance(o, Compute) and o.name == "optimizer":
            o = replace(o, launches=ADAMW_DTENSOR_OPS * n)
        first = len(layers.ops)
        through(layers, [o])
        spans.append((first, len(layers.ops) - 1))
    return layers.ops, spans


def _group(mesh: Mesh, rank: int, dim: str) -> tuple:
    return mesh.group_of(rank, dim) if dim in mesh else (rank,)


def _program(model, units, cfg: FSDPConfig, groups: tuple, pdt: str, rdt: str) -> _Program:
    """One rank's program; ``groups`` = (its shard group, its replica group, its post-forward group or None)."""
    S, z, raf = cfg.shard_size, cfg.zero, cfg.reshard_after_forward
    shard, replicas, post = groups
    p = _Program(cfg.overlap)
    root = units[0]
    size = {u.name: u.numel(S) * DTYPE_BYTES[pdt] for u in units}      # one unsharded unit in param dtype
    root_raf = cfg.root_reshard_after_forward
    resharded = (lambda u: z == 3 and (root_raf if u is root else raf is not False))
    rs_name = RS_GROUP if cfg.separate_reduce_scatter_group else ""

    def gather(u: Unit, group, tag: str) -> bool:
        if S == 1 or not u.params:
            return False
        # resharded to a group (int reshard_after_forward): fully_shard made that unit a DeviceMesh of its own,
        # so its backward all-gathers run on a process group of their own (torch 2.13 _get_post_forward_mesh_info)
        name = f"post_forward {u.name}" if post is not None and group is post else ""
        p.add(Compute(f"copy-in {u.name}", bytes=2 * size[u.name] // len(group), stream="ag"))
        p.add(Collective("all_gather", size[u.name], pdt, group, name=f"all_gather {u.name} {tag}", stream="ag",
                         group_name=name), start=[(size[u.name], "unsharded params")] if z == 3 else ())
        if tag == "update":
            p.add(Compute(f"copy-out {u.name}", bytes=2 * size[u.name], stream="ag"))
        return True

    def copy_out(u: Unit):
        if S > 1 and u.params:
            p.add(Compute(f"copy-out {u.name}", bytes=2 * size[u.name]))

    # forward: the root's layers before the first block (embedding), the blocks, the root's other layers (head)
    first_block = units[1].layers[0] if len(units) > 1 else math.inf
    segs = [(root, [i for i in root.layers if i < first_block])] + [(u, u.layers) for u in units[1:]]
    segs.append((root, [i for i in root.layers if i > first_block]))
    for k, (u, layers) in enumerate(segs[:-1]):
        if z == 3 and u.params:
            if k - cfg.prefetch - 1 >= 0:
                p.wait(f"fwd{k - cfg.prefetch - 1}", "ag")
            gather(u, shard, "forward")
            p.record(f"ag{k}", "ag")
            p.wait(f"ag{k}", "compute")
            copy_out(u)
        last = _forward(p, model, layers, pdt)
        p.record(f"fwd{k}", "compute")
        if resharded(u) and u is not root and last is not None and S > 1:   # reshard; keep 1/raf if int
            keep = [] if post is None else [(size[u.name] // len(post), "unsharded params")]
            p.mem += [[last, "end", -size[u.name], "unsharded params"]] + [[last, "end", d, c] for d, c in keep]
    tail = _forward(p, model, segs[-1][1], pdt)
    if resharded(root) and root.params and S > 1:        # the root's post-forward: after its whole forward
        p.mem.append([len(p.ops) - 1 if tail is None else tail, "end", -size[root.name], "unsharded params"])
    # backward: segments in reverse; a block's all-gather is issued backward_prefetch segments early
    back = list(reversed(segs))
    pending, done, held = [], [], []       # held: (RS event, gradient bytes to free) of RS inputs in flight
    for s, (u, layers) in enumerate(back):
        p.record(f"bwd_start{s}", "compute")
        for t in range(s, len(back)):
            v = back[t][0]
            if resharded(v) and max(t - cfg.backward_prefetch, 0) == s and (v is not root or t == 0):
                p.wait(f"bwd_start{s}", "ag")                  # (the root: once, first, on the whole shard group)
                if gather(v, shard if v is root else post or shard, "backward") and post is not None \
                        and v is not root:
                    p.mem.append([len(p.ops) - 1, "end", -size[v.name] // len(post), "unsharded params"])
                p.record(f"agb{t}", "ag")
        if resharded(u) and (u is not root or s == 0):
            p.wait(f"agb{s}", "compute")
            copy_out(u)
        last = None
        for i in reversed(layers):
            L = model.layers[i]
            grads = [(_numel(L) * DTYPE_BYTES[pdt], "unsharded grads")] if z >= 2 and L.params else []
            redo = [(L.transient_bytes, "activations")] if L.transient_bytes else []  # recomputed/offloaded
            last = p.add(Compute(f"bwd {L.name}", flops=L.bwd_flops + L.recompute_flops,
                                 bytes=2 * (L.activation_bytes + L.transient_bytes) + L.param_bytes, dtype=pdt),
                         start=grads + redo, end=[(-L.activation_bytes - L.transient_bytes, "activations")])
        unit_done = u is not root or s == len(back) - 1
        reclaimed = []         # FSDP2 keeps K RS input buffers in flight: reclaim the oldest before the copy-in
        while z >= 2 and unit_done and u.params and len(held) >= cfg.reduce_scatter_max_input_buffers:
            reclaimed.append(held.pop(0))
        if reclaimed:
            p.wait(reclaimed[-1][0], "compute")               # (its RS and, in stream order, those before it)
        if z >= 2 and unit_done and u.params and S > 1:
            p.add(Compute(f"copy-in grads {u.name}", bytes=u.numel(S) * (DTYPE_BYTES[pdt] + DTYPE_BYTES[rdt])),
                  start=[f for _, fs in reclaimed for f in fs])
        p.record(f"bwd{s}", "compute")
        if z == 3 and unit_done and u.params and S > 1:     # post-backward reshard
            p.mem.append([len(p.ops) - 1 if last is None else last, "end", -size[u.name], "unsharded params"])
        if unit_done and u.params:
            pending.append((u, s))
            if z >= 2:          # K = 1: the buffer's life ends with its RS (as before); K > 1: at its reclaim
                hold = S > 1 and cfg.reduce_scatter_max_input_buffers > 1
                done.append(_reduce(p, u, f"bwd{s}", shard, replicas, rdt, pdt, z, rs_name, hold=hold))
                if S > 1:
                    held.append((f"rs_{u.name}", _grad_free(u, pdt) if hold else []))
    if z == 1:       # ZeRO-1 keeps full gradients and reduce-scatters them all after backward
        done = [_reduce(p, u, f"bwd{len(back) - 1}", shard, replicas, rdt, pdt, z, rs_name) for u, s in pending]
    done.append((None, [f for _, fs in held for f in fs]))     # the buffers still held: freed by the optimizer
    for prefix in ("rs_", "ar_"):      # streams run in order: the last event of each stream covers the rest
        events = [e for e, _ in done if e and e.startswith(prefix)]
        if events:
            p.wait(events[-1], "compute")
    n = sum(u.numel(S) for u in units) // S
    p.add(Compute("optimizer", flops=ADAM_FLOPS * n, bytes=ADAM_BYTES * n), start=[f for _, fs in done for f in fs])
    if z < 3:       # ZeRO 1/2: all-gather the updated parameters
        p.record("opt", "compute")
        p.wait("opt", "ag")
        for u in units:
            gather(u, shard, "update")
    return p


def _numel(layer) -> int:
    return sum(q.numel for q in layer.params)


def _forward(p: _Program, model, layers, dtype: str):
    last = None
    for i in layers:
        L = model.layers[i]
        last = p.add(Compute(f"fwd {L.name}", flops=L.fwd_flops,   # traffic: what it writes, kept or not
                             bytes=L.activation_bytes + L.transient_bytes + L.param_bytes, dtype=dtype),
                     start=[(L.activation_bytes, "activations")])
    return last


def _grad_free(u: Unit, pdt: str) -> list:
    """The memory event freeing unit ``u``'s unsharded gradients (its reduce-scatter input)."""
    return [(-sum(q.numel for q in u.params) * DTYPE_BYTES[pdt], "unsharded grads")]


def _reduce(p: _Program, u: Unit, after: str, shard, replicas, rdt: str, pdt: str, z: int, rs_name: str = "",
            hold: bool = False):
    """RS of unit ``u`` once event ``after`` happened (on process group ``rs_name`` over the shard ranks), then
    the HSDP all-reduce. ``hold``: the gradient buffer outlives the RS (the caller frees it when FSDP2 reclaims
    it). Returns (the event to wait for, or None when nothing was sent; the memory it frees when nothing was
    sent)."""
    S, event = len(shard), None
    free = _grad_free(u, pdt) if z >= 2 and not hold else []
    if S > 1:
        p.wait(after, "rs")
        if z == 1:
            p.add(Compute(f"copy-in grads {u.name}", bytes=u.numel(S) * (DTYPE_BYTES[pdt] + DTYPE_BYTES[rdt]),
                          stream="rs"))
        p.add(Collective("reduce_scatter", u.numel(S) * DTYPE_BYTES[rdt], rdt, shard,
                         name=f"reduce_scatter {u.name}", stream="rs", group_name=rs_name),
              end=free if len(replicas) == 1 else ())
        p.add(Compute(f"copy-out grads {u.name}", bytes=2 * u.numel(S) // S * DTYPE_BYTES[rdt], stream="rs"))
        event = f"rs_{u.name}"
        p.record(event, "rs")
    if len(replicas) > 1:
        p.wait(event or after, "ar")
        p.add(Collective("all_reduce", u.numel(S) // S * DTYPE_BYTES[rdt], rdt, replicas,
                         name=f"all_reduce {u.name}", stream="ar"), end=free)
        event = f"ar_{u.name}"
        p.record(event, "ar")
    return event, ([] if event else free)


def collective_sequence(plan: Plan, rank: int = 0, groups: bool = False) -> list[tuple]:
    """(collective, bytes, dtype[, group]) in issue order: what the runtime capture is compared with."""
    return [(o.op, o.bytes, o.dtype) + ((plan.group_of(o),) if groups else ())
            for o in plan.ranks[rank] if isinstance(o, Collective)]
