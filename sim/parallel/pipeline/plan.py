"""Plan builder ``pipeline``: p stages (x v virtual stages) over m microbatches, optionally replicated d times.

Rank layout from the mesh (sim/mesh.py): a rank's pipeline rank is its ``pp`` coordinate, its peers are its
``pp`` group, and the replicas of its stage are its ``dp`` group (``build_plan`` uses the mesh {dp: d, pp: p}:
global rank = replica x p + pipeline rank). Each rank runs its schedule's actions (schedules.py)
in order on its ``compute`` stream. Between stages on different ranks the boundary tensor moves as Send/Recv:
after ``F`` of stage s its output (activation) goes to stage s+1; after ``B``/``I`` of stage s the gradient of
its input goes to stage s-1. Sends run on a stream per peer (``send>peer``), after the action that produced the
data. Receives, as torch posts them (``recv="auto"``): GPipe and 1F1B receive on demand, on the compute stream
right before the action that needs the data (``_wait_batch_p2p``); the multi-stage schedules' lowering
(``_add_send_recv``) posts each receive when its send is issued, modelled as a stream per peer (``recv<peer``)
receiving in the sender's order, the compute stream Waiting for the one it needs (``recv="early"``). A pair
whose receiver needs the messages in another order than they are sent is always received early.
With d > 1 replicas each stage's gradients are all-reduced over its d copies on the ``comm`` stream right after
the stage's last backward (B or W) action. A model with tied embeddings (GPT-2) then all-reduces the embedding
gradient between the first and the last stage's ranks (tied.py).

Costs per microbatch: F = sum of the stage's layers' forward FLOPs, B = backward FLOPs (default 2 x F,
2104.04473). For I/W schedules (Zero Bubble 2401.10241 assumes T_F = T_B = T_W) per layer
W = min(B, 2·weight_grad_fraction·F) and I = B - W: with 0.5, W = F (the weight-gradient matmul), and a first
layer, which needs no input gradient, has I = 0. ``seconds={(stage, kind): s}`` bypasses the roofline.
A transformer (or MoE) model's actions run its layers' kernels instead (sim/parallel/layers.py ``kernel_actions``,
as every builder prices them): F and B the layers' GEMMs, attention calls and memory-bound kernels, I the
input-gradient GEMMs with the attention backward, W the weight-gradient GEMMs (weight_grad_fraction unused);
each op named after its action ("0F1 fwd h.0.attn"; sim/parallel/pipeline/metrics.py joins them).

DualPipeV's forward/backward pairs that torch marks OVERLAP_F_B (meta ``overlap_f_b``, "F;B" per rank) run as
torch 2.13's runtime runs them without a custom overlap function: the pair starts once both inputs have
arrived, F then B on the compute stream, then F's send and B's send (``_add_send_recv``). The compute of the
two is not overlapped (torch does not; DeepSeek's DualPipe overlaps their communication with compute: the
expert-parallel plan does, through ``action_ops``, sim/parallel/ep/plan.py and sim/parallel/pipeline/dualpipe.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
from distlab.sim.parallel.pipeline import schedules as S
from distlab.sim.parallel.pipeline.tied import tied_embedding, tied_embedding_ops
from distlab.sim.plan import DTYPE_BYTES, Collective, Compute, Plan, Recv, Record, Send, Wait
from distlab.sim.parallel.options import option


@dataclass
class PipelineSpec:
    schedule: str = "1f1b"
    stages: int = 2                  # p: pipeline ranks
    microbatches: int = 4            # m
    virtual_stages: int = 1          # v: model chunks per rank (interleaved; 2 for zbv)
    data_parallel: int = 1           # d: replicated pipelines
    split: list[int] | None = None   # layers per stage (p*v numbers, stage order); None = even
    weight_grad_fraction: float = 0.5
    recv: str = "auto"               # auto | on-demand | early (see the module docstring)

    @classmethod
    def from_dict(cls, d: dict, where: str = "parallelism") -> "PipelineSpec":
        allowed = set(cls.__dataclass_fields__)
        d = {k: v for k, v in dict(d).items() if k != "kind"}
        for k in d:
            if k not in allowed:
                raise ConfigError(f"unknown key {k!r}; allowed: kind, {', '.join(sorted(allowed))}", where)
        return cls(**d)

    def check(self) -> "PipelineSpec":
        self.schedule = S.check(self.schedule, self.stages, self.microbatches, self.virtual_stages)
        for key, limit in (("microbatches", 4096), ("stages", 1024), ("virtual_stages", 64)):
            if getattr(self, key) > limit:
                raise ConfigError(f"{getattr(self, key)} is more than the simulator takes (at most {limit})", key)
        if not isinstance(self.data_parallel, int) or isinstance(self.data_parallel, bool) or self.data_parallel < 1:
            raise ConfigError(f"data_parallel must be a whole number >= 1, got {self.data_parallel!r}",
                              "data_parallel")
        wf = self.weight_grad_fraction
        if isinstance(wf, bool) or not isinstance(wf, (int, float)) or not 0 <= wf <= 1:
            raise ConfigError(f"weight_grad_fraction must be in [0, 1], got {self.weight_grad_fraction!r}",
                              "weight_grad_fraction")
        if self.recv not in ("auto", "on-demand", "early"):
            raise ConfigError(f"recv must be auto, on-demand or early, got {self.recv!r}", "recv")
        return self

    @property
    def world_size(self) -> int:
        return self.stages * self.data_parallel


@dataclass
class PipelineOptions:
    """The ``pipeline:`` section of a scenario; stages and replicas come from the mesh (pp, dp)."""
    schedule: str = option(PipelineSpec.schedule, f"pipeline schedule: {', '.join(S.SCHEDULES)}")
    microbatches: int | None = option(None, "microbatches per step (m); none = 2 x pp x virtual_stages "
                                            "(default_microbatches)")
    virtual_stages: int = option(PipelineSpec.virtual_stages, "model chunks per rank (v; 2 for zbv, dualpipev)")
    split: list[int] | None = option(PipelineSpec.split, "layers (transformer blocks) per stage, p x v numbers in "
                                                         "stage order (none = even, or see stage_less_layers)")
    stage_less_layers: list[int] | None = option(None, "[first, last]: the first and last stage hold that many "
                                                       "blocks fewer, torchtitan's pipeline_parallel_first/last_stage_"
                                                       "less_layers (sim/parallel/pipeline/split.py); none = even "
                                                       "when p x v divides a transformer's blocks, else [1, 1]")
    weight_grad_fraction: float = option(PipelineSpec.weight_grad_fraction,
                                         "W = min(B, 2 x fraction x F) per layer for I/W schedules")
    recv: str = option(PipelineSpec.recv, "when receives are posted", choices=("auto", "on-demand", "early"),
                       what="recv mode")

    def spec(self, mesh: Mesh, model=None) -> PipelineSpec:
        """The PipelineSpec on ``mesh``: stages = its pp size, data_parallel = its dp size (1 without dp); with a
        transformer ``model``, blocks per stage by sim/parallel/pipeline/split.py."""
        dp = mesh.size("dp") if "dp" in mesh else 1
        split = self.split
        if model is not None and ((model.config or {}).get("kind") == "gpt" or self.stage_less_layers is not None):
            from distlab.sim.parallel.pipeline.split import stage_split
            blocks = model.config["layers"] if model.config.get("kind") == "gpt" else len(model.layers)
            split = stage_split(blocks, mesh.size("pp") * self.virtual_stages, self.split, self.stage_less_layers)
        m = self.microbatches or default_microbatches(mesh.size("pp"), self.virtual_stages)
        return PipelineSpec(self.schedule, mesh.size("pp"), m, self.virtual_stages, dp,
                            split, self.weight_grad_fraction, self.recv)


def default_microbatches(pp: int, virtual_stages: int = 1) -> int:
    """Micro-batches per step when a scenario gives none: 2 x pp x virtual_stages. 1F1B's bubble is
    (p - 1) / (m + p - 1) of the step (Narayanan et al. 2021, arXiv 2104.04473 sec. 2.2): m = p idles the ranks
    about half the time at large p, m = 2p about a third; an interleaved schedule divides the bubble by v with m
    a multiple of p. A scenario that knows its global batch says m (global batch / (micro_batch x dp))."""
    return 2 * pp * virtual_stages


def with_default_microbatches(opts, mesh: Mesh):
    """``opts`` (PipelineOptions, or a composition's Parallelisms with a ``pipeline``) with microbatches None
    replaced by default_microbatches on ``mesh``; anything else as it is."""
    from dataclasses import replace
    if isinstance(opts, PipelineOptions) and opts.microbatches is None:
        return replace(opts, microbatches=default_microbatches(mesh.size("pp") if "pp" in mesh else 1,
                                                               opts.virtual_stages))
    pipe = getattr(opts, "pipeline", None)
    if isinstance(pipe, PipelineOptions) and pipe.microbatches is None:
        return replace(opts, pipeline=with_default_microbatches(pipe, mesh))
    return opts


def split_layers(n_layers: int, n_stages: int, split: list[int] | None = None, what: str = "layers",
                 empty_ends: bool = False) -> list[range]:
    """Layer index ranges of each stage: ``split`` if given, else n_layers / n_stages each. ``empty_ends``: the
    first and last stage may hold no layer (they hold the embedding and the head: Llama 3's interleaved schedule,
    arXiv 2407.21783 sec. 3.3.2, "the first model chunk on the first stage has only the embedding, and the last
    model chunk on the last stage has only output projection and loss calculation")."""
    if split is None:
        if n_layers % n_stages:
            raise ConfigError(f"{n_layers} {what} do not split evenly into {n_stages} stages (stages x "
                              f"virtual_stages); give 'split' or use a divisor of {n_layers}", "split")
        split = [n_layers // n_stages] * n_stages
    if (not isinstance(split, list) or len(split) != n_stages
            or any(not isinstance(k, int) or k < (0 if empty_ends and i in (0, n_stages - 1) else 1)
                   for i, k in enumerate(split)) or sum(split) != n_layers):
        ends = " (the first and last may be 0: embedding or head only)" if empty_ends else ""
        raise ConfigError(f"split {split} must be {n_stages} whole numbers >= 1{ends} summing to {n_layers} {what}",
                          "split")
    out, start = [], 0
    for k in split:
        out.append(range(start, start + k))
        start += k
    return out


def stage_ranges(model, n_stages: int, split: list[int] | None = None) -> list[range]:
    """Layers of each stage. A GPT's transformer blocks are split; its embedding joins the first stage and its
    head the last (Megatron-LM places them so)."""
    names = [layer.name for layer in model.layers]
    lo = 1 if names and names[0] == "embed" else 0
    hi = 1 if len(names) > lo and names[-1] == "head" else 0
    ranges = split_layers(len(names) - lo - hi, n_stages, split, "transformer layers" if lo or hi else "layers",
                          empty_ends=bool(lo and hi and n_stages > 1))
    ranges = [range(r.start + lo, r.stop + lo) for r in ranges]
    ranges[0] = range(0, ranges[0].stop)
    ranges[-1] = range(ranges[-1].start, len(names))
    return ranges


def boundary_bytes(model, layer: int) -> int:
    """Bytes of one microbatch's output of ``layer`` (the tensor sent to the next stage): b·s·h for a transformer
    (gpt, moe), the traced output of a model from an nn.Module, the layer's activation (its output) for an MLP."""
    cfg = model.config or {}
    if cfg.get("kind") in ("gpt", "moe"):
        return int(cfg["micro_batch"] * cfg["seq_len"] * cfg["hidden"] * DTYPE_BYTES[cfg.get("dtype", "float32")])
    if cfg.get("kind") == "extracted":                  # traced from an nn.Module (runtime/modules/factory.py)
        return int(cfg["output_bytes"][layer])
    return int(model.layers[layer].activation_bytes)


def build_plan(model, spec: PipelineSpec, seconds: dict | None = None, name: str | None = None,
               p2p_bytes: int | None = None, overhead: float = 0.0) -> Plan:
    """The plan for one training step of ``model`` (sim.models.Model; layers in forward order) under ``spec``,
    on the mesh {dp: data_parallel, pp: stages}. See :func:`pipeline_plan`."""
    mesh = Mesh({"dp": spec.data_parallel, "pp": spec.stages}, "pipeline")
    return pipeline_plan(model, mesh, spec, seconds, name, p2p_bytes, overhead)


def pipeline_plan(model, mesh: Mesh, spec: PipelineSpec, seconds: dict | None = None, name: str | None = None,
                  p2p_bytes: int | None = None, overhead: float = 0.0, action_ops=None, grad_ops=None,
                  only: list[int] | None = None) -> Plan:
    """The plan on ``mesh`` (dimension ``pp`` of size spec.stages, optionally ``dp`` of spec.data_parallel).
    ``p2p_bytes`` overrides the boundary tensor size (0 with a zero-latency fabric = free p2p). ``overhead``
    seconds of the runtime's own work follow each action on the compute stream, before its send (an op named
    "runtime": busy for the core, idle for the pipeline, as a measured timeline shows it). ``only``: build just
    these ranks' programs (a plan of them, in that order, not validated: sim/kernel/relabel.py renames them).
    Hooks for parallelisms inside a stage (expert parallelism, sim/parallel/ep/plan.py): ``action_ops(action, global
    rank, overlapped B or None)`` -> the ops of an action instead of its one Compute (for an OVERLAP_F_B pair it
    is called at the F with its B, and the B adds nothing more); ``grad_ops(stage, global rank)`` -> the
    gradient synchronisation after a stage's last backward instead of the all_reduce over dp."""
    spec.check()
    p, m, v, D = spec.stages, spec.microbatches, spec.virtual_stages, spec.data_parallel
    if mesh.size("pp") != p or (mesh.size("dp") if "dp" in mesh else 1) != D:
        raise ConfigError(f"mesh {mesh.as_dict()} does not match stages {p} x data_parallel {D}", "mesh")
    n_stages = p * v
    ranges = stage_ranges(model, n_stages, spec.split)
    placement = S.stage_to_rank(spec.schedule, p, v)
    actions = S.build(spec.schedule, p, m, v)
    dtype = (model.config or {}).get("dtype", "float32")
    out_bytes = [boundary_bytes(model, r[-1]) if p2p_bytes is None else int(p2p_bytes) for r in ranges]
    L, wf = model.layers, spec.weight_grad_fraction
    fwd = [sum(L[i].fwd_flops for i in r) for r in ranges]
    bwd = [sum(L[i].bwd_flops + L[i].recompute_flops for i in r) for r in ranges]
    wgt = [sum(min(L[i].bwd_flops, 2 * wf * L[i].fwd_flops) for i in r) for r in ranges]
    flops = {"F": fwd, "B": bwd, "I": [b - w for b, w in zip(bwd, wgt)], "W": wgt}

    if action_ops is None and seconds is None:         # a transformer's actions run their layers' kernels
        from distlab.sim.parallel.layers import kernel_actions
        action_ops = kernel_actions(model, ranges, dtype)

    def compute(a: S.Action) -> Compute:
        if seconds is not None:
            if (a.stage, a.kind) not in seconds:
                raise ConfigError(f"no time given for stage {a.stage} kind {a.kind}", "seconds")
            return Compute(name=str(a), seconds=float(seconds[a.stage, a.kind]))
        return Compute(name=str(a), flops=float(flops[a.kind][a.stage]), dtype=dtype)

    def message(a: S.Action):
        """(peer stage, message name, bytes) that action ``a`` sends, or None."""
        if a.kind == "F" and a.stage + 1 < n_stages:
            return a.stage + 1, f"act {a.stage}>{a.stage + 1} mb{a.mb}", out_bytes[a.stage]
        if a.kind in ("B", "I") and a.stage > 0:
            return a.stage - 1, f"grad {a.stage}>{a.stage - 1} mb{a.mb}", out_bytes[a.stage - 1]
        return None

    def needs(a: S.Action):
        """The message action ``a`` must receive first (sender stage, name), or None."""
        if a.kind == "F" and a.stage > 0:
            return a.stage - 1, f"act {a.stage - 1}>{a.stage} mb{a.mb}"
        if a.kind in ("B", "I") and a.stage + 1 < n_stages:
            return a.stage + 1, f"grad {a.stage + 1}>{a.stage} mb{a.mb}"
        return None

    # messages per (src pipeline rank, dst pipeline rank), in the sender's order
    pair_msgs: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for r, acts in enumerate(actions):
        for a in acts:
            msg = message(a)
            if msg and placement[msg[0]] != r:
                pair_msgs.setdefault((r, placement[msg[0]]), []).append((msg[1], msg[2]))
    recv_order: dict[tuple[int, int], list[str]] = {}
    for r, acts in enumerate(actions):
        for a in acts:
            need = needs(a)
            if need and placement[need[0]] != r:
                recv_order.setdefault((placement[need[0]], r), []).append(need[1])
    on_demand = spec.recv == "on-demand" or (spec.recv == "auto" and spec.schedule in ("gpipe", "1f1b"))
    early = {pair for pair, msgs in pair_msgs.items() if not on_demand or [n for n, _ in msgs] != recv_order[pair]}
    tied = tied_embedding(model, placement)          # GPT-2's tied head: first <-> last stage (tied.py)
    last_backward = {}
    for acts in actions:
        for i, a in enumerate(acts):
            if a.kind in ("B", "W"):
                last_backward[a.stage] = i

    pairs = S.overlap_pairs(spec.schedule, p, m, v)
    pair_f = [dict(rank) for rank in pairs]                     # F -> its overlapped B
    pair_b = [{b for _, b in rank} for rank in pairs]

    def receive(a: S.Action, r: int, peers) -> list:
        """Ops on the compute stream that get action ``a``'s input from another rank."""
        need = needs(a)
        if not need or placement[need[0]] == r:
            return []
        src = placement[need[0]]
        if (src, r) in early:
            return [Wait(f"recv {need[1]}", stream="compute")]
        return [Recv(peers[src], out_bytes[min(a.stage, need[0])], dtype, need[1], stream="compute")]

    def send(a: S.Action, r: int, peers) -> list:
        """Ops that send action ``a``'s output to another rank once it is computed."""
        msg = message(a)
        if not msg or placement[msg[0]] == r:
            return []
        peer = peers[placement[msg[0]]]
        return [Record(f"done {a}", stream="compute"), Wait(f"done {a}", stream=f"send>{peer}"),
                Send(peer, msg[2], dtype, msg[1], stream=f"send>{peer}")]

    ranks = []
    for g in range(mesh.world_size) if only is None else only:
        r, peers = mesh.coords(g)["pp"], mesh.group_of(g, "pp")     # pipeline rank, global rank of each
        replicas = mesh.group_of(g, "dp") if "dp" in mesh else (g,)
        acts, ops = actions[r], []
        for (src, dst), msgs in pair_msgs.items():
            if dst == r and (src, dst) in early:
                for msg_name, nbytes in msgs:
                    ops += [Recv(peers[src], nbytes, dtype, msg_name, stream=f"recv<{peers[src]}"),
                            Record(f"recv {msg_name}", stream=f"recv<{peers[src]}")]
        held: list = []              # an overlapped pair's F sends after its B (torch's _add_send_recv)
        for i, a in enumerate(acts):
            if a not in pair_b[r]:   # a pair waits for both its inputs before its F starts
                for b in ([a, pair_f[r][a]] if a in pair_f[r] else [a]):
                    ops += receive(b, r, peers)
            if action_ops is None:
                ops.append(compute(a))
            elif a not in pair_b[r]:
                ops += action_ops(a, g, pair_f[r].get(a))
            if overhead:
                ops.append(Compute(name="runtime", seconds=float(overhead)))
            sends = send(a, r, peers)
            if a in pair_f[r]:
                held = sends
            else:
                ops += held + sends
                held = []
            if grad_ops is not None and last_backward.get(a.stage) == i:
                ops += grad_ops(a.stage, g)
            elif len(replicas) > 1 and last_backward.get(a.stage) == i:
                nbytes = sum(model.layers[j].param_bytes for j in ranges[a.stage])
                ops += [Record(f"grads {a.stage}", stream="compute"), Wait(f"grads {a.stage}", stream="comm"),
                        Collective("all_reduce", int(nbytes), dtype, replicas,
                                   name=f"grad all_reduce stage {a.stage}")]
        ranks.append(ops + tied_embedding_ops(tied, r, peers))
    meta = {"pipeline": {**asdict(spec),
                         "stage_to_rank": placement,
                         "layers_per_stage": [len(r) for r in ranges],
                         "activation_bytes": [sum(model.layers[i].activation_bytes for i in r) for r in ranges],
                         "boundary_bytes": out_bytes,
                         "param_bytes": [sum(model.layers[i].param_bytes for i in r) for r in ranges]}}
    if any(pairs):               # DualPipeV only: other schedules' plans stay byte-identical
        meta["pipeline"]["overlap_f_b"] = [[f"{f};{b}" for f, b in rank] for rank in pairs]
    plan_name = name or (f"pipeline-{spec.schedule}-p{p}-m{m}" + (f"-v{v}" if v > 1 else "")
                         + (f"-d{D}" if D > 1 else ""))
    plan = Plan(ranks, name=plan_name, meta=meta)
    return plan if only is not None else plan.validate()
