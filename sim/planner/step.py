"""The fast estimate of one layout (sim/planner/estimate.py says how terms combine) and its memory per GPU.

Memory per GPU is the simulator's own (sim/parallel/memory.py ``memory_per_gpu``, the one model of every command,
for the scenario `plan --confirm` runs), checked against the GPU's memory with the same headroom rule as
`distlab simulate` (sim/parallel/fsdp/memory.py ``fits``).
"""
from __future__ import annotations

from dataclasses import replace

from distlab.sim.kernel.engine import compute_seconds
from distlab.sim.models import model_from_spec
from distlab.sim.parallel.pipeline.plan import boundary_bytes, stage_ranges
from distlab.sim.plan import Collective, Compute
from distlab.sim.planner.estimate import CostCache, Estimate, op_seconds
from distlab.sim.planner.schedule import built_schedule, compiled_schedule, run_stages
from distlab.sim.planner.flat import FlatEstimator
from distlab.sim.planner.stage_fsdp import StageTerms
from distlab.sim.planner.stage_cp import CPStages
from distlab.sim.planner.layouts import Layout
from distlab.sim.parallel.tp.plan import Segments, TPOptions, _Program



class Estimator:
    """Estimates layouts of one model (a scenario ``model:`` mapping) on one cluster; caches what layouts share."""

    def __init__(self, model_spec: dict, cluster):
        self.spec, self.cluster, self.costs = dict(model_spec), cluster, CostCache(cluster)
        self._models: dict[int, object] = {}
        self._layers: dict[tuple, tuple] = {}
        self.flat = FlatEstimator(self)
        self.fsdp = StageTerms(self)
        self.cp_stages = CPStages(self)
        self._walks: dict = {}            # layout -> its schedule walk, from bound() to estimate()
        self._memory_cache: dict = {}     # micro-batch -> sim/parallel/memory.py's cache for that model
        self._meshes: dict = {}           # a layout's mesh dimensions -> its Mesh

    def model(self, micro_batch: int):
        if micro_batch not in self._models:
            self._models[micro_batch] = model_from_spec({**self.spec, "micro_batch": micro_batch}, "model")
        return self._models[micro_batch]

    def options(self, L: Layout) -> TPOptions:
        return TPOptions(sequence_parallel=L.sequence_parallel and L.tp > 1, loss_parallel=L.loss_parallel,
                         recompute=L.recompute, schedule=L.schedule, microbatches=L.microbatches,
                         virtual_stages=L.virtual_stages, split=list(L.split) if L.split else None)

    # -- memory ------------------------------------------------------------------------------------------
    def memory(self, L: Layout) -> dict:
        """Bytes per GPU by part, as `distlab simulate` reports them for the scenario `plan --confirm` runs
        (``L.scenario``): sim/parallel/memory.py ``memory_per_gpu``, the one model of every command."""
        from distlab.sim.parallel.memory import memory_per_gpu
        model = self.model(L.micro_batch)
        mesh, par = self.parallelisms(L)
        return dict(memory_per_gpu(model, mesh, par, self._memory_cache.setdefault(L.micro_batch, {}))
                    ["breakdown_bytes"])

    def parallelisms(self, L: Layout) -> tuple:
        """(Mesh, Parallelisms) of the scenario ``L.scenario`` writes, as its builder composes them."""
        from distlab.sim.mesh import Mesh
        from distlab.sim.parallel.cp.local import CPOptions
        from distlab.sim.parallel.fsdp.plan import FSDPOptions
        from distlab.sim.parallel.memory import as_parallelisms
        from distlab.sim.parallel.parallelize import Parallelisms
        from distlab.sim.parallel.pipeline.plan import PipelineOptions
        dims = tuple(L.mesh().items())
        mesh = self._meshes.get(dims)
        if mesh is None:                  # a few hundred meshes for tens of thousands of layouts
            mesh = self._meshes[dims] = Mesh(dict(dims))
        if L.composed:
            pipe = PipelineOptions(schedule=L.schedule, microbatches=L.microbatches,
                                   virtual_stages=L.virtual_stages, split=list(L.split) if L.split else None)
            sp = L.sequence_parallel and L.tp > 1
            tp = TPOptions(sequence_parallel=sp) if L.cp > 1 else TPOptions(
                sequence_parallel=sp, loss_parallel=L.loss_parallel, recompute=L.recompute)
            return mesh, Parallelisms(pipeline=pipe, tp=tp, fsdp=FSDPOptions(reshard_after_forward=L.pp == 1),
                                      cp=CPOptions(recompute=L.recompute) if L.cp > 1 else None)
        if L.cp > 1:
            return mesh, as_parallelisms(mesh, CPOptions(recompute=L.recompute))
        return mesh, as_parallelisms(mesh, self.options(L))

    def _stages(self, L: Layout) -> tuple:
        """(parameter share of each stage, blocks of each stage) as sim/workloads/tp.py computes them."""
        key = ("stages", L.tp, L.pp * L.virtual_stages, L.split)
        if key not in self._layers:
            from distlab.sim.workloads.tp import layer_numels
            model = self.model(1)
            if ("numel", L.tp) not in self._layers:
                self._layers["numel", L.tp] = layer_numels(model, L.tp)
            numel = self._layers["numel", L.tp]
            ranges = stage_ranges(model, L.pp * L.virtual_stages, list(L.split) if L.split else None)
            self._layers[key] = ([sum(numel[i] for i in r) / sum(numel) for r in ranges],
                                 tuple(sum(1 for i in r if model.layers[i].name.startswith("h.")) for r in ranges))
        return self._layers[key]

    # -- time --------------------------------------------------------------------------------------------
    def layer_times(self, L: Layout, name: str) -> tuple:
        """(forward compute, forward TP comm, backward compute, backward TP comm) of one layer, one micro-batch
        (every transformer block costs the same: timed once, as block h.0)."""
        name = "h.0" if name.startswith("h.") else name
        key = (L.micro_batch, L.tp, L.sequence_parallel and L.tp > 1, L.loss_parallel, L.recompute, name)
        if key not in self._layers:
            model = self.model(L.micro_batch)
            out = []
            for phase in ("forward", "backward"):
                p = _Program(tuple(range(L.tp)), model.config["dtype"])
                getattr(Segments(model, self.options(L), p), phase)(name)
                comp = sum(op_seconds(op, self.cluster, self.costs) for op in p.ops if isinstance(op, Compute))
                comm = sum(op_seconds(op, self.cluster, self.costs) for op in p.ops if isinstance(op, Collective))
                out += [comp, comm]
            self._layers[key] = tuple(out)
        return self._layers[key]

    def estimate(self, L: Layout) -> Estimate:
        if L.pipelined and L.cp > 1:          # a ring inside the stages: the composition's own program
            return self.cp_stages.estimate(L)
        if L.composed and L.pp == 1:          # FSDP2 gradient accumulation, no pipeline
            return self._accumulated(L)
        return self._pipeline(L) if L.pipelined else self._flat(L)

    def _accumulated(self, L: Layout) -> Estimate:
        """FSDP2 gradient accumulation without a pipeline (sim/parallel/fsdp/stage.py: torchtitan's train loop,
        each micro-batch's forward and backward as FSDP2 runs one step, its units gathered again and its
        gradients reduce-scattered in its backward): the one-micro-batch step m times, AdamW once."""
        one = self._flat(replace(L, microbatches=1))
        opt, m = self.fsdp.terms(L, 0)[3], L.microbatches
        step = m * (one.step_s - opt) + opt
        ranges, stage = self._stage_times(L)        # the layers' compute and TP communication, as a pipeline's
        names = [layer.name for layer in self.model(L.micro_batch).layers]
        compute, tp_comm = m * stage[0][2], m * stage[0][3]
        recompute = m * self._recompute_s(L, ranges[0], names)
        return Estimate(step, {"compute_s": compute - recompute, "recompute_s": recompute, "tp_comm_s": tp_comm,
                               "dp_comm_exposed_s": max(step - compute - tp_comm, 0.0),
                               "dp_comm_total_s": m * one.terms.get("dp_comm_total_s", 0.0), "bubble_and_p2p_s": 0.0})

    def bound(self, L: Layout) -> float:
        """A lower bound of ``estimate(L).step_s``, cheap: a pipeline's schedule walked with its stages' compute
        and TP communication (what the estimate adds after it, FSDP2's and DDP's gradient traffic and AdamW,
        only lengthens the step); without a pipeline, the layers' compute (the estimate runs the same ops, no
        faster); with CP (the ring attention's compute is not a layer's), the blocks' weight GEMMs, 6 FLOPs per
        parameter and token shared by the GPUs (Kaplan et al. 2020, sec. 2.1), at the GPU's datasheet peak
        (no kernel runs faster); 0 for a mixture of experts (a token runs only some experts)."""
        if L.cp > 1:
            model = self.model(1)
            if model.config.get("kind") != "gpt":
                return 0.0
            weights = sum(q.numel for layer in model.layers if layer.name.startswith("h.") for q in layer.params)
            tokens = L.dp * L.micro_batch * L.microbatches * model.config["seq_len"]
            return 6.0 * weights * tokens / (L.world_size * self.cluster.gpu.tflops * 1e12)
        if L.pipelined:
            walk = self._walks[L] = self._walk(L)
            return max(walk[-1])
        names = [layer.name for layer in self.model(L.micro_batch).layers]
        return sum(t[0] + t[2] for t in (self.layer_times(L, n) for n in names))

    def _walk(self, L: Layout) -> tuple:
        """(stage ranges, per stage (F, B, compute, TP comm), last backward per stage, end per rank) of the
        schedule walked with the stages' forward and backward (sim/planner/schedule.py). Cached by what it reads
        of the layout (layouts that differ only in their data parallelism share it); read-only."""
        key = ("walk", L.micro_batch, L.tp, L.sequence_parallel and L.tp > 1, L.loss_parallel, L.recompute,
               L.schedule, L.pp, L.microbatches, L.virtual_stages, L.split)
        if key not in self._layers:
            self._layers[key] = self._walked(L)
        return self._layers[key]

    def _stage_times(self, L: Layout) -> tuple:
        """(stage ranges, per stage (F, B, compute, TP comm)): the same for every schedule and micro-batch count."""
        key = ("stage times", L.micro_batch, L.tp, L.sequence_parallel and L.tp > 1, L.loss_parallel, L.recompute,
               L.pp * L.virtual_stages, L.split)
        if key not in self._layers:
            model = self.model(L.micro_batch)
            names = [layer.name for layer in model.layers]
            ranges = stage_ranges(model, L.pp * L.virtual_stages, list(L.split) if L.split else None)
            stage = []                        # per stage: F, B, and their compute / TP parts
            for r in ranges:
                t = [self.layer_times(L, names[i]) for i in r]
                fc, fm, bc, bm = (sum(x[k] for x in t) for k in range(4))
                stage.append((fc + fm, bc + bm, fc + bc, fm + bm))
            self._layers[key] = tuple(ranges), tuple(stage)
        return self._layers[key]

    def _walked(self, L: Layout) -> tuple:
        model = self.model(L.micro_batch)
        p, v = L.pp, L.virtual_stages
        ranges, stage = self._stage_times(L)
        comp = compiled_schedule(L.schedule, p, L.microbatches, v)
        msg = boundary_bytes(model, 0) // (L.tp if L.sequence_parallel and L.tp > 1 else 1)
        hops = [self.costs.p2p(a * L.tp, b * L.tp, int(msg)) for a, b in comp.links]
        last_b, ends = run_stages(comp, [t for f, b, _, _ in stage for t in (f, b)], hops)
        return ranges, stage, tuple(last_b), tuple(ends)

    def _pipeline(self, L: Layout) -> Estimate:
        names = [layer.name for layer in self.model(L.micro_batch).layers]
        p, v = L.pp, L.virtual_stages
        ranges, stage, last_b, ends = self._walks.pop(L, None) or self._walk(L)
        step, dp_exposed = max(ends), 0.0
        if L.composed:
            step, dp_exposed = self._sharded_ends(L, ranges, stage, last_b, ends)
        elif L.dp > 1:                    # per rank, its stages' all-reduces in turn on the comm stream
            for r in range(p):
                free = 0.0
                for s in sorted(range(r, p * v, p), key=lambda s: last_b[s]):
                    nbytes = self._stage_grad_bytes(ranges[s], L.tp)
                    group = tuple(r * L.tp + k * p * L.tp for k in range(L.dp))
                    free = max(free, last_b[s]) + self.costs.collective("all_reduce", nbytes, group)
                if free > step:
                    dp_exposed, step = free - max(ends), free
        load = [sum(stage[s][0] + stage[s][1] for s in range(r, p * v, p)) for r in range(p)]
        busy = max(range(p), key=load.__getitem__)
        m, mine = L.microbatches, range(busy, p * v, p)
        compute = m * sum(stage[s][2] for s in mine)
        tp_comm = m * sum(stage[s][3] for s in mine)
        recompute = m * sum(self._recompute_s(L, ranges[s], names) for s in mine)
        bubble = step - dp_exposed - compute - tp_comm
        return Estimate(step, {"compute_s": compute - recompute, "recompute_s": recompute, "tp_comm_s": tp_comm,
                               "dp_comm_exposed_s": dp_exposed, "bubble_and_p2p_s": max(bubble, 0.0)})

    def _sharded_ends(self, L: Layout, ranges, stage, last_b, ends) -> tuple[float, float]:
        """(step, exposed FSDP2 seconds) of FSDP2 / HSDP inside the stages (sim/parallel/fsdp/stage.py): per
        rank, its first unit's all-gather before its first forward (the others prefetched behind the forward of
        the first micro-batch, exposed only beyond it), each stage's reduce-scatters (and HSDP all-reduces) in
        turn after its last backward, then AdamW on the shards."""
        p, v = L.pp, L.virtual_stages
        step = 0.0
        for r in range(p):
            first, gather, reduce, opt = self.fsdp.terms(L, r)
            mine = list(range(r, p * v, p))
            f0 = stage[mine[0]][0]
            if v > 1:                     # torch's multi-stage runtime unshards the rank's stages up front
                delay = gather
            else:                         # compute slowed while the prefetched gathers run (the engine's rule)
                hidden = min(gather - first, f0)
                delay = first + max(0.0, gather - first - f0) + hidden * (self.cluster.interference - 1)
            share = {s: len(ranges[s]) for s in mine}
            free = 0.0
            for s in sorted(mine, key=lambda s: last_b[s]):
                free = max(free, last_b[s] + delay) + reduce * share[s] / sum(share.values())
            step = max(step, max(free, ends[r] + delay) + opt)
        return step, max(0.0, step - max(ends))

    def _stage_grad_bytes(self, r, tp: int) -> int:
        """Bytes of the TP-local gradients of the stage's layers ``r``: what the pipeline builder all-reduces over
        dp (sim/parallel/pipeline/plan.py on sim/parallel/tp/compose.py's TP-local model; parameters do not depend on the batch)."""
        from distlab.sim.parallel.tp.compose import tp_local_model
        if ("local", tp) not in self._layers:
            self._layers["local", tp] = [L.param_bytes for L in tp_local_model(self.model(1), tp).layers]
        return int(sum(self._layers["local", tp][i] for i in r))

    def _recompute_s(self, L: Layout, layers, names) -> float:
        """Seconds of recomputed forward work in one micro-batch's backward of these layers."""
        if L.recompute == "none":
            return 0.0
        plain = replace(L, recompute="none")
        return sum(self.layer_times(L, names[i])[2] - self.layer_times(plain, names[i])[2] for i in layers)

    def _flat(self, L: Layout) -> Estimate:
        """No pipeline: rank 0's program run stream by stream (sim/planner/flat.py)."""
        step, part = self.flat.estimate(L)
        exposed = max(0.0, step - part["compute"] - part["tp"] - part["cp_exposed"])
        return Estimate(step, {"compute_s": part["compute"] - part["recompute"], "recompute_s": part["recompute"],
                               "tp_comm_s": part["tp"], "cp_comm_exposed_s": part["cp_exposed"],
                               "dp_comm_exposed_s": exposed, "dp_comm_total_s": part["dp"] + part["rep"],
                               "bubble_and_p2p_s": 0.0})

    def recompute_by_name(self, L: Layout) -> dict:
        """Backward op name -> seconds of recomputed forward in it (zero without recomputation)."""
        if L.recompute == "none":
            return {}
        key = ("redo", L.micro_batch, L.tp, L.sequence_parallel, L.loss_parallel, L.recompute)
        if key in self._layers:
            return self._layers[key]
        model = self.model(L.micro_batch)
        plain = Layout(**{**L.to_dict(), "recompute": "none", "split": L.split})
        out = {}
        redo, base = self._segment_ops(L, "h.0"), self._segment_ops(plain, "h.0")
        for a, b in zip(redo, base):
            if isinstance(a, Compute) and a.name.startswith("bwd "):
                extra = compute_seconds(a, self.cluster) - compute_seconds(b, self.cluster)
                for i in range(model.config["layers"]):
                    out[a.name.replace("h.0", f"h.{i}", 1)] = extra
        self._layers[key] = out
        return out

    def _segment_ops(self, L: Layout, name: str) -> list:
        model = self.model(L.micro_batch)
        p = _Program(tuple(range(L.tp)), model.config["dtype"])
        Segments(model, self.options(L), p).backward(name)
        return p.ops
