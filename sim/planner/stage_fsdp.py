"""FSDP2 / HSDP inside pipeline stages in the planner's fast estimate: what each pipeline rank's all-gathers,
reduce-scatters, HSDP all-reduces and AdamW cost, read off the builder's own program.

    terms = StageTerms(estimator)
    first, gather, reduce, optimizer = terms.terms(layout, pipeline_rank)     # seconds

The ops are the composition's (sim/parallel/parallelize.py, FSDP2 in each stage: sim/parallel/fsdp/stage.py),
built for the pipeline ranks only (``only``) on a small mesh: the same pp, tp and stages, FSDP2's shard group
of 2 and 4 ranks, as HSDP with 2 replicas (FSDP2 is the same less the replicas' all-reduces). Each op's bytes and FLOPs are a + b / n in the shard group size n, so the
two give them at the real size (sim/planner/flat.py ``_at_size``); a collective is then timed on the real
group of its mesh dimension (dp_shard, or dp_replicate for HSDP's all-reduce) with the simulator's costs
(sim/planner/estimate.py ``CostCache``), a compute op with ``engine.compute_seconds``. What does not depend on
the micro-batches (FSDP2 gathers a stage once and reduces it once per step with reshard_after_forward false,
torchtitan's default with pp) is cached per (tp, pp, schedule shape, split, data-parallel kind).
"""
from __future__ import annotations

from distlab.sim.kernel.engine import compute_seconds
from distlab.sim.mesh import Mesh
from distlab.sim.plan import Collective, Compute


STAGE_MICROBATCHES = 1      # micro-batches of the programs FSDP2's ops are read off


class StageTerms:
    """Per pipeline rank: (first unit's gather, all gathers, all reduces, optimizer) seconds of a layout."""

    def __init__(self, est):
        self.est, self._ops, self._terms = est, {}, {}
        self._local: dict = {}            # tp -> the TP-local model FSDP2 shards
        self._seconds: dict = {}          # a Compute op's fields but its name and stream -> its seconds

    def terms(self, L, r: int) -> tuple[float, float, float, float]:
        key = (L.tp, L.pp, L.virtual_stages, L.split, L.dp_kind, L.dp, L.dp_shard, r)
        if key not in self._terms:
            self._terms[key] = self._time(L, r)
        return self._terms[key]

    def _time(self, L, r: int) -> tuple:
        from distlab.sim.planner.flat import _at_size
        real = L.shard
        sizes = [real] if real in (2, 4) else [2, 4]
        progs = [self._program(L, n)[r] for n in sizes]          # FSDP2's ops only (kept so by _program)
        try:
            if len(progs) > 1 and len(progs[0]) != len(progs[1]):
                raise ValueError("programs at two shard sizes differ in length")
            ops = progs[0] if len(sizes) == 1 else [_at_size(a, b, sizes, real) for a, b in zip(*progs)]
        except ValueError:                # not affine (e.g. a unit's padding changes its ops): build it as it is
            ops = self._program(L, real)[r]
        mesh = Mesh(L.mesh())
        rank = r * (L.world_size // L.pp)
        shard = mesh.group_of(rank, "dp_shard")
        replicas = mesh.group_of(rank, "dp_replicate") if "dp_replicate" in mesh.names else (rank,)
        costs = self.est.costs
        first = gather = reduce = opt = 0.0
        gathers = copies = 0                 # the first unit: its copy-in, all-gather and copy-out
        for op in ops:
            if isinstance(op, Compute):
                t = self._compute_seconds(op)
                if op.name == "optimizer":
                    opt += t
                elif op.name.startswith(("copy-in grads", "copy-out grads")):
                    reduce += t
                elif op.name.startswith(("copy-in", "copy-out")):
                    gather += t
                    if op.name.startswith("copy-in"):
                        first += t if gathers == 0 else 0.0
                    else:
                        copies += 1
                        first += t if copies == 1 else 0.0
            elif isinstance(op, Collective) and op.stream in ("ag", "rs", "ar"):
                if op.stream == "ar" and L.dp_kind != "hsdp":
                    continue
                group = replicas if op.stream == "ar" else shard
                t = costs.collective(op.op, int(op.bytes), tuple(group), op.algorithm)
                if op.op == "all_gather":
                    gathers += 1
                    first += t if gathers == 1 else 0.0
                    gather += t
                else:
                    reduce += t
        return first, gather, reduce, opt

    def _compute_seconds(self, op) -> float:
        """``engine.compute_seconds`` of a Compute op, once per op less its name and stream (which it does not
        read): every block's copies are the same op under another name."""
        key = tuple(v for k, v in op.__dict__.items() if k not in ("name", "stream"))
        t = self._seconds.get(key)
        if t is None:
            t = self._seconds[key] = compute_seconds(op, self.est.cluster)
        return t

    def _program(self, L, shard: int) -> list:
        """The pipeline ranks' ops (one list per pp rank) with FSDP2 over ``shard`` ranks (HSDP: 2 replicas)."""
        key = (L.tp, L.pp, L.virtual_stages, L.split, shard)      # what FSDP2's units and groups follow; pp 1:
        # gradient accumulation, resharded after forward and reduced in every micro-batch's backward (one's ops)
        if key not in self._ops:
            from distlab.sim.parallel.fsdp.plan import FSDPOptions
            from distlab.sim.parallel.parallelize import choose, parallelize
            from distlab.sim.parallel.pipeline.plan import PipelineOptions
            # FSDP2 is HSDP less its all-reduces. TP's segments are left out (they change no FSDP2 op): the stages
            # shard the TP-local model (sim/parallel/tp/rules.py tp_local_model), as parallelize's FSDP2 step does
            mesh = Mesh({"pp": L.pp, "dp_replicate": 2, "dp_shard": shard})
            from distlab.sim.parallel.tp.rules import tp_local_model
            if L.tp not in self._local:
                self._local[L.tp] = tp_local_model(self.est.model(1), L.tp) if L.tp > 1 else self.est.model(1)
            model = self._local[L.tp]
            # the fewest micro-batches that build the stages: one, GPipe or interleaved (FSDP2 gathers and reduces a
            # stage once whatever their number, in the same order: tests/test_planner.py checks the FSDP2 ops of
            # one micro-batch against one per stage)
            v = L.virtual_stages
            pipe = PipelineOptions(schedule="gpipe" if v == 1 else "interleaved", microbatches=STAGE_MICROBATCHES,
                                   virtual_stages=v, split=list(L.split) if L.split else None)
            par = choose(mesh, {"pipeline": pipe, "fsdp": FSDPOptions(reshard_after_forward=L.pp == 1)})
            per = mesh.world_size // L.pp
            plan = parallelize(model, mesh, par, only=[q * per for q in range(L.pp)])
            self._ops[key] = [[op for op in ops if _fsdp_op(op)] for ops in plan.ranks]
            # AdamW on DTensors (the layout's scenario has a tp section, tp 1 included): torch's per-op launches
            # per parameter, as sim/parallel/pipeline/stages.py charges them
            from dataclasses import replace
            from distlab.sim.parallel.tp.plan import ADAMW_DTENSOR_OPS
            n = len(self.est.model(1).params)
            for ops in self._ops[key]:
                for i, op in enumerate(ops):
                    if op.name == "optimizer":
                        ops[i] = replace(op, launches=ADAMW_DTENSOR_OPS * n)
        return self._ops[key]



def _fsdp_op(op) -> bool:
    """FSDP2's own ops: its copies, all-gathers, reduce-scatters, HSDP all-reduces and AdamW."""
    if isinstance(op, Compute):
        return op.name == "optimizer" or op.name.startswith(("copy-in", "copy-out"))
    return isinstance(op, Collective) and op.stream in ("ag", "rs", "ar")
