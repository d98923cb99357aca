"""FSDP2 / ZeRO inside pipeline stages: step 5 of sim/parallel/parallelize.py when the mesh has pp.

    fsdp = StageFSDP(shard_model, mesh, dp_mesh, FSDPOptions(reshard_after_forward=False), ranges, units)
    fsdp.forward(layers, action, rank)      # a pipeline action's ops: all-gathers where needed, the layers
    fsdp.reduce(layers, stage, rank)        # after the stage's last backward: reduce-scatters
    fsdp.optimizer(layers, rank)            # AdamW on the rank's shards (ZeRO-1/2: then all-gather them)

torchtitan (pipeline_llama, then parallelize_llama on each stage's module) calls ``fully_shard`` on every block
of a stage and on the stage's module (the root: the embedding on the first stage, the final norm and the head on
the last), with ``reshard_after_forward=False`` when pp is on ("do not reshard after forward to avoid
per-microbatch all-gathers"; its default policy). torch 2.13's pipelining runs every backward chunk with
``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)`` (stage.py
``backward_maybe_with_nosync``) and, after the stage's last backward, ``perform_reduce_grad``: ``post_backward``
of every FSDP parameter group in the order FSDP2 found them (``_state_ctx.all_states``: the root, then the blocks
in forward order), each reduce-scattering its accumulated gradient (TP's Partial(sum) norm gradients all-reduced
over tp first), then resharding. So per rank and step:

- forward: a unit is all-gathered before its first forward (the root when the stage's forward starts, each block
  before its layers); with ``reshard_after_forward`` true a block is freed after each forward and all-gathered
  again before every forward and every backward (backward prefetching the next block, ``backward_prefetch``);
  after a backward a unit stays gathered (no reshard after backward until the last);
- after the stage's last backward: per unit with parameters, in all_states order, its Partial(sum) gradients
  all-reduced over tp, its gradient reduce-scattered over dp_shard (accumulated over the micro-batches: once),
  HSDP's all-reduce over dp_replicate;
- one stage and no pipeline (pp 1: gradient accumulation as torchtitan's train loop runs it, trainer.py
  ``train_step``, one ``forward_backward_step`` per micro-batch, gradient sync never disabled): FSDP2's default,
  every micro-batch's backward reduce-scatters its gradients (``reduce`` after each B; the sharded gradients
  accumulate) and reshards; ``sync_each_microbatch: false`` is the pipelining's no-sync above;
- AdamW once every stage of the rank has reduced, on the rank's shards (DTensor ops when TP is on).
Multi-stage schedules (interleaved, looped BFS, DualPipeV) run on torch's ``_PipelineScheduleRuntime``, whose
lowering (``_add_unshard_reshard``, at most 3 stages active) unshards every FSDP module of a stage with explicit
UNSHARD actions ahead of its compute: the rank's stages (up to 3) are all gathered before its first action, and
``reshard_after_forward`` must be false there (a stage must stay unsharded between its actions).
ZeRO-1/2 inside stages (Megatron-LM's distributed optimizer with pipelining, Narayanan et al. 2021; Rajbhandari
et al. 2019): parameters replicated, so no all-gather before compute; gradients reduce-scattered after the
stage's last backward; the updated shards all-gathered after the optimizer.
Bytes as FSDP2 counts them (sim/parallel/fsdp/plan.py): the unit padded to a multiple of the shard group.
Streams: all-gathers on ``ag`` (each after the compute two units before it, FSDP2's one-unit prefetch),
reduce-scatters on ``rs``, HSDP all-reduces on ``ar``; ``overlap: false`` puts everything on the compute stream
in issue order (FSDP2 on CPU with gloo).
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.fsdp.plan import ADAM_BYTES, ADAM_FLOPS, model_dtype
from distlab.sim.parallel.fsdp.units import BLOCK, Unit
from distlab.sim.plan import DTYPE_BYTES, Collective, Compute, Record, Wait


def stage_units(model, layers) -> list[Unit]:
    """A stage's FSDP2 units: its root (the layers that are not blocks) first, then each block."""
    root = Unit("root", [], [])
    blocks = []
    for i in layers:
        L = model.layers[i]
        if BLOCK.match(L.name):
            blocks.append(Unit(L.name, list(L.params), [i]))
        else:
            root.params += L.params
            root.layers.append(i)
    return [root] + blocks


class StageFSDP:
    """FSDP2 or ZeRO-1/2 on the pipeline stages of every rank (module docstring). ``model``: the model FSDP2
    shards (TP-local, cp-local); ``dp_mesh``: the mesh whose dp_shard (and dp_replicate) groups it shards and
    replicates over; ``ranges``: the layers of each stage; ``partial``: unit -> its Partial(sum) parameters."""

    def __init__(self, model, dp_mesh, opts, ranges: list, partial: dict, tp_params: int | None,
                 where: str = "fsdp"):
        opts.validate(where)
        if not isinstance(opts.reshard_after_forward, bool):
            raise ConfigError(f"reshard_after_forward {opts.reshard_after_forward} (a group size) is not built inside "
                              "a pipeline; allowed: true or false", f"{where}.reshard_after_forward")
        self.model, self.dp_mesh, self.o, self.partial = model, dp_mesh, opts, partial
        self.units = [stage_units(model, r) for r in ranges]
        self.S = dp_mesh.size("dp_shard") if "dp_shard" in dp_mesh else 1
        self.pdt = opts.param_dtype or model_dtype(model)
        self.rdt = opts.reduce_dtype or self.pdt
        self.tp_params = tp_params          # AdamW's DTensor parameters (TP on), else None
        self.gathered: dict = {}            # (rank, stage) -> unit names gathered now
        self.events: dict = {}              # rank -> events named so far (names are per rank)
        self._numels: dict = {}             # id(unit) -> its padded elements (the units are fixed from here on)
        self._param_bytes: dict = {}        # layer index -> its parameters' bytes (every action asks again)
        self.pending: dict = {}             # (rank, unit name) -> the event of its prefetched all-gather
        # one stage, no pipeline around it (gradient accumulation, as torchtitan's train loop runs it): FSDP2's
        # default reduce-scatters each micro-batch's gradients in its backward (``reduce`` after every B)
        self.each_microbatch = len(ranges) == 1 and opts.sync_each_microbatch

    def _numel(self, u: Unit) -> int:
        """``u.numel(S)``, counted once per unit (every action and reduction asks again)."""
        n = self._numels.get(id(u))
        if n is None:
            n = self._numels[id(u)] = u.numel(self.S)
        return n

    def _layer_param_bytes(self, i: int) -> int:
        n = self._param_bytes.get(i)
        if n is None:
            n = self._param_bytes[i] = self.model.layers[i].param_bytes
        return n

    def _size(self, u: Unit) -> int:
        return self._numel(u) * DTYPE_BYTES[self.pdt]

    def _event(self, rank: int, what: str) -> str:
        n = self.events[rank] = self.events.get(rank, 0) + 1
        return f"fsdp{n} {what}"

    def _op(self, layers, op, stream: str):
        """``op`` on ``stream`` (the compute stream without overlap)."""
        if not self.o.overlap:
            op = type(op)(**{**op.__dict__, "stream": "compute"})
        elif stream != "compute":
            op = type(op)(**{**op.__dict__, "stream": stream})
        layers.keep(op)

    def _sync(self, layers, rank: int, src: str, dst: str, what: str):
        """``dst`` waits for what ``src`` has issued so far (nothing without overlap)."""
        if self.o.overlap:
            e = self._event(rank, what)
            layers.keep(Record(e, src))
            layers.keep(Wait(e, dst))

    def _gather(self, layers, u: Unit, rank: int, tag: str, defer: bool = False):
        """Copy-in and all-gather on ``ag``, then (unless ``defer``: a prefetch, finished by :meth:`_finish` when
        the unit is used) the compute stream's wait and copy-out."""
        S, size = self.S, self._size(u)
        if S == 1 or not u.params:
            return
        group = self.dp_mesh.group_of(rank, "dp_shard")
        self._sync(layers, rank, "compute", "ag", f"before all_gather {u.name}")
        self._op(layers, Compute(f"copy-in {u.name}", bytes=2 * size // S), "ag")
        self._op(layers, Collective("all_gather", size, self.pdt, group, name=f"all_gather {u.name} {tag}"), "ag")
        if not defer:
            self._sync(layers, rank, "ag", "compute", f"all_gather {u.name}")
            self._op(layers, Compute(f"copy-out {u.name}", bytes=2 * size), "compute")
        elif self.o.overlap:
            e = self._event(rank, f"all_gather {u.name}")
            layers.keep(Record(e, "ag"))
            self.pending[rank, u.name] = e
        else:
            self.pending[rank, u.name] = None

    def _finish(self, layers, u: Unit, rank: int):
        """A prefetched unit used: the compute stream waits for its all-gather, then copies it out."""
        if (rank, u.name) in self.pending:
            e = self.pending.pop((rank, u.name))
            if e is not None:
                layers.keep(Wait(e, "compute"))
            self._op(layers, Compute(f"copy-out {u.name}", bytes=2 * self._size(u)), "compute")

    def _ensure(self, layers, u: Unit, rank: int, stage: int, tag: str, prefetch: bool = False):
        """``u`` gathered for use now (a prefetched one finished), or with ``prefetch`` issued ahead: only
        without a pipeline (``each_microbatch``), where FSDP2's all-gathers run ahead of the compute."""
        held = self.gathered.setdefault((rank, stage), set())
        if self.o.zero == 3 and u.name not in held:
            self._gather(layers, u, rank, tag, defer=prefetch and self.each_microbatch)
            held.add(u.name)
        if not prefetch:
            self._finish(layers, u, rank)

    def unshard(self, layers, stages: list[int], rank: int):
        """torch's multi-stage runtime (_PipelineScheduleRuntime, ``_add_unshard_reshard``: up to 3 stages
        active) unshards every FSDP module of the rank's next stages before its first action: all their units
        all-gathered there, in the order the rank first runs them (root first within a stage)."""
        for stage in stages:
            for u in self.units[stage]:
                self._ensure(layers, u, rank, stage, "forward")

    def forward(self, layers, stage: int, rank: int):
        """A forward action: the root gathered at the stage's start, each block before its layers."""
        units = self.units[stage]
        root, blocks = units[0], {u.layers[0]: u for u in units[1:]}
        self._ensure(layers, root, rank, stage, "forward")
        order = sorted(root.layers + list(blocks))
        ahead = [i for i in order if i in blocks]
        # without a pipeline FSDP2's forward all-gathers run ahead of the compute (``prefetch`` blocks ahead, as
        # sim/parallel/fsdp/plan.py); inside a pipeline's stages each block is gathered when reached
        depth = self.o.prefetch if self.each_microbatch else 0
        for i in order:
            L = self.model.layers[i]
            if i in blocks:
                k = ahead.index(i)
                for j in ahead[k:k + 1 + depth]:
                    self._ensure(layers, blocks[j], rank, stage, "forward", prefetch=True)
                self._ensure(layers, blocks[i], rank, stage, "forward")
            layers.forward(Compute(f"fwd {L.name}", flops=L.fwd_flops,
                                   bytes=L.activation_bytes + L.transient_bytes + self._layer_param_bytes(i),
                                   dtype=self.pdt),
                           L.name)
            if i in blocks and self.o.reshard_after_forward:
                self.gathered[rank, stage].discard(blocks[i].name)

    def backward(self, layers, stage: int, rank: int):
        """A backward action: the layers in reverse, each block gathered first (prefetching the next
        ``backward_prefetch`` blocks); nothing resharded after."""
        units = self.units[stage]
        root, blocks = units[0], {u.layers[0]: u for u in units[1:]}
        order = sorted(root.layers + list(blocks), reverse=True)
        ahead = [i for i in order if i in blocks]
        for i in order:
            L = self.model.layers[i]
            if i in blocks:
                k = ahead.index(i)
                for j in ahead[k:k + 1 + self.o.backward_prefetch]:
                    self._ensure(layers, blocks[j], rank, stage, "backward", prefetch=self.each_microbatch)
                self._ensure(layers, blocks[i], rank, stage, "backward")
            else:
                self._ensure(layers, root, rank, stage, "backward")
            layers.backward(Compute(f"bwd {L.name}", flops=L.bwd_flops + L.recompute_flops,
                                    bytes=2 * (L.activation_bytes + L.transient_bytes) + self._layer_param_bytes(i),
                                    dtype=self.pdt), L.name)
            if self.each_microbatch and i in blocks:    # its post-backward: reduce-scatter, reshard
                self._reduce_unit(layers, blocks[i], rank)
        if self.each_microbatch:          # the root's post-backward ends the backward
            self._reduce_unit(layers, root, rank)
        if len(self.units) == 1:          # no pipeline: FSDP2 reshards after backward (its default; the
            self.gathered.pop((rank, stage), None)      # pipelining's set_reshard_after_backward(False) aside)

    def reduce(self, layers, stage: int, rank: int) -> list:
        """After the stage's last backward: per unit, TP's Partial gradients, the reduce-scatter, HSDP's
        all-reduce (module docstring)."""
        for u in self.units[stage]:
            self._reduce_unit(layers, u, rank)
        self.gathered.pop((rank, stage), None)
        out = list(layers.ops)
        del layers.ops[:]
        return out

    def _reduce_unit(self, layers, u: Unit, rank: int) -> None:
        """One unit's gradient sync: TP's Partial gradients, the reduce-scatter, HSDP's all-reduce."""
        if not u.params:
            return
        S, rdt, pdt = self.S, self.rdt, self.pdt
        shard = self.dp_mesh.group_of(rank, "dp_shard") if "dp_shard" in self.dp_mesh else (rank,)
        replicas = self.dp_mesh.group_of(rank, "dp_replicate") if "dp_replicate" in self.dp_mesh else None
        partial = set(self.partial.get(u.name, []))       # this stage's unit: its root holds only its layers
        layers.partial_grads([q.name for q in u.params if q.name in partial], 1, "backward")
        if S > 1:
            self._op(layers, Compute(f"copy-in grads {u.name}",
                                     bytes=self._numel(u) * (DTYPE_BYTES[pdt] + DTYPE_BYTES[rdt])), "compute")
            self._sync(layers, rank, "compute", "rs", f"grads {u.name}")
            self._op(layers, Collective("reduce_scatter", self._numel(u) * DTYPE_BYTES[rdt], rdt, shard,
                                        name=f"reduce_scatter {u.name}"), "rs")
            self._op(layers, Compute(f"copy-out grads {u.name}",
                                     bytes=2 * self._numel(u) // S * DTYPE_BYTES[rdt]), "rs")
        if replicas is not None:
            self._sync(layers, rank, "rs", "ar", f"shard {u.name}")
            self._op(layers, Collective("all_reduce", self._numel(u) // S * DTYPE_BYTES[rdt], rdt, replicas,
                                        name=f"all_reduce {u.name} backward"), "ar")

    def optimizer(self, layers, rank: int, stages: list[int]) -> list:
        """AdamW on the shards of the rank's ``stages`` once their gradients are reduced; ZeRO-1/2 all-gather the
        updated shards."""
        for src in ("rs", "ar"):
            self._sync(layers, rank, src, "compute", f"reduced on {src}")
        n = sum(self._numel(u) for s in stages for u in self.units[s]) // self.S
        from distlab.sim.parallel.tp.plan import ADAMW_DTENSOR_OPS
        launches = None if self.tp_params is None else ADAMW_DTENSOR_OPS * self.tp_params
        layers.keep(Compute("optimizer", flops=ADAM_FLOPS * n, bytes=ADAM_BYTES * n, launches=launches))
        if self.o.zero < 3:
            for s in stages:
                for u in self.units[s]:
                    self._gather(layers, u, rank, "update")
        out = list(layers.ops)
        del layers.ops[:]
        return out
