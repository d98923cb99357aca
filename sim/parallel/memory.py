"""Memory per GPU of any layout: the one model every command reports (issue 39.2). `distlab simulate` of every
workload and composition, `distlab plan` (its estimate and --confirm), `distlab reproduce` and `distlab memory`
all call :func:`memory_per_gpu`; the lessons' widgets call those. ``memory_section(result)``: the rows every
simulate report prints; ``estimate(model, world, zero)``: DDP or ZeRO 1-3 on ``world`` ranks (`distlab memory`).

    from distlab.sim.mesh import Mesh
    from distlab.sim.models import preset
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.parallel.memory import memory_per_gpu
    from distlab.sim.parallel.parallelize import Parallelisms
    m = memory_per_gpu(preset("llama3-8b", micro_batch=2), Mesh({"dp_shard": 8}), Parallelisms(fsdp=FSDPOptions()))
    sum(m["breakdown_bytes"].values()) / 2**30       # params, grads, optimizer, unsharded params, activations

The rule, term by term, on the fullest rank of the pipeline (every rank when there is none):

  params, grads, optimizer  the rank's stages' parameters as TP leaves them (sim/parallel/tp/rules.py local
      shapes), each padded on dim 0 to a multiple of the FSDP2 group (dp_shard x cp; HSDP: dp_shard only) and
      split over it as the ZeRO stage says (Rajbhandari et al. 2019, arXiv 1910.02054, sec. 5: ZeRO-1 the
      optimizer, ZeRO-2 also the gradients, ZeRO-3 also the parameters; DDP none). Bytes per element:
      ZeRO's 2 + 2 + 12 for 16-bit parameters (fp32 master, m, v), 4 + 4 + 8 for fp32; FSDP2 (ZeRO-3) keeps
      fp32 shards of params and grads and AdamW's m, v: 4 + 4 + 8 (torch.distributed.fsdp.MixedPrecisionPolicy:
      "the optimizer step uses the sharded parameter in the original dtype"; sim/parallel/fsdp/memory.py
      ``precision``).
  unsharded params  ZeRO-3 over more than one rank: the units FSDP2 has all-gathered, in param_dtype. With
      ``reshard_after_forward`` true the root (embedding, final norm, head: FSDP2 keeps the root gathered) and
      two blocks (the one computing and the one prefetched, ``prefetch`` 1); false (torchtitan's default
      inside a pipeline) every unit of the rank stays gathered from its forward to its backward.
  unsharded grads  micro-batches > 1 with sharded gradients (ZeRO-2/3) in a pipeline (pp > 1), or without one
      with ``sync_each_microbatch: false``: FSDP2 skips the reduce-scatter until the last micro-batch
      (``set_requires_gradient_sync(False)``, as torch.distributed.pipelining's stage does for FSDPModule,
      torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``) and accumulates the rank's unsharded
      gradients in reduce_dtype (param_dtype when none). Gradient accumulation without a pipeline by default
      (torchtitan's train loop: trainer.py ``train_step`` calls ``forward_backward_step`` per micro-batch and
      never disables the sync) reduce-scatters every micro-batch: the sharded gradients accumulate, nothing
      unsharded is kept (sim/parallel/fsdp/stage.py).
  activations  the model family's (sim/models/activations.py: Korthikanti et al. 2022, arXiv 2205.05198,
      counted per op as torch's autograd saves them, at this tp, sequence and loss parallelism, cp, recompute
      and offload), walked over the rank's schedule: each F adds its stage's saved bytes (embedding, blocks,
      head and loss alike), each B or I (input gradient) frees them, and while a backward runs the layer it is
      in holds its transient bytes (a recomputed block's forward, the loss's fp32 logits' gradient). The most
      bytes alive is the peak: without a pipeline (one F and one B per micro-batch) exactly the model's
      one-micro-batch peak; 1F1B keeps min(m, p - r) micro-batches in flight on rank r, GPipe m (Narayanan et
      al. 2021, arXiv 2104.04473, sec. 2.2), interleaved its chunks' counts; the zero-bubble schedules free at
      I (their W keeps only the linears' inputs, which Qi et al. 2023, arXiv 2401.10241 sec. 3, count as
      within 1F1B's peak: not counted).
  ring buffers  CP: one layer's ring buffers at a time (sim/parallel/cp/memory.py: all-gather cp + 1 K/V
      blocks or all-to-all 2, plus 2 fp32 dK/dV accumulators).
  host (not on the GPU)  offload: the blocks' saved activations in host memory (torch's save_on_cpu).
"""
from __future__ import annotations

from functools import lru_cache

from distlab.sim.dtypes import DTYPE_BYTES

PARTS = ("params", "grads", "optimizer", "unsharded params", "unsharded grads", "activations")


def memory_per_gpu(model, mesh, par, cache: dict | None = None, recompute: str | None = None,
                   offload: bool | None = None) -> dict:
    """{"pipeline_rank": the fullest rank's pp index, "breakdown_bytes": {part: bytes on the GPU},
    "host_bytes": offloaded activations} of ``model`` on ``mesh`` with ``par`` (a Parallelisms; module
    docstring). ``cache``: a dict kept between calls on the same model (the planner's many layouts);
    ``recompute``, ``offload``: instead of the layout's and the model's (None: theirs)."""
    from distlab.sim.parallel.fsdp.memory import precision
    from distlab.sim.parallel.fsdp.units import padded_numel
    from distlab.sim.parallel.tp.rules import local_shape
    cache = {} if cache is None else cache
    c = model.config or {}
    dims = dict(zip(mesh.names, mesh.shape))
    size = {d: dims.get(d, 1) for d in ("pp", "dp_shard", "cp", "tp")}
    tp, cp = size["tp"], size["cp"]
    fsdp = par.fsdp
    S = size["dp_shard"] * cp if fsdp is not None else 1
    zero = fsdp.zero if fsdp is not None else 0
    dtype = c.get("dtype") or (model.params[0].dtype if model.params else "float32")
    pdt = getattr(fsdp, "param_dtype", None) or dtype
    p, g, k = precision(pdt, fsdp2=zero == 3)
    key = ("numel", tp, S)
    if key not in cache:
        cache[key] = [sum(padded_numel(local_shape(q, tp), S) for q in L.params) for L in model.layers]
    numel = cache[key]
    acts = _activations(model, par, tp, cp, cache, recompute, offload)
    ranges, placement, schedule, m = _stages(model, mesh, par, cache)
    key = ("walks", id(acts), id(ranges), id(schedule))   # layouts differing only in dp share these; the value
    if key not in cache:                                  # holds the objects, so their ids stay theirs
        cache[key] = (acts, ranges, schedule, _walks(schedule, ranges, acts, cache), acts.host_bytes)
    walks, host = cache[key][3:]
    key = ("ranks", id(numel), id(ranges), placement, _gather_key(fsdp, S))   # numel, ranges: held by the cache
    if key not in cache:                  # per rank: its elements and those FSDP2 holds gathered
        mine = [[i for s, r in zip(placement, ranges) if s == q for i in r] for q in range(len(schedule))]
        cache[key] = [(sum(numel[i] for i in layers), _gathered(model, layers, numel, fsdp, S)) for layers in mine]
    unsharded_grads = zero >= 2 and S > 1 and m > 1 and (len(ranges) > 1 or not fsdp.sync_each_microbatch)
    ring = (_ring(c, cp, tp, getattr(par.cp, "rotate_method", "allgather")),) if cp > 1 else ()
    gathered_bytes = DTYPE_BYTES[pdt]
    grad_bytes = DTYPE_BYTES[getattr(fsdp, "reduce_dtype", None) or pdt] if unsharded_grads else 0
    best, most = None, None
    for q, (full, gathered) in enumerate(cache[key]):      # the parts in PARTS' order (+ ring), summed as a dict
        shard = full // S                                     # of them would be: the fullest rank's kept
        parts = ((shard if zero == 3 else full) * p, (shard if zero >= 2 else full) * g,
                 (shard if zero >= 1 else full) * k, gathered * gathered_bytes,
                 full * grad_bytes if unsharded_grads else 0, walks[q]) + ring
        total = sum(parts)
        if best is None or total > most:
            best, most = (q, parts), total
    parts = {k: v for k, v in zip(PARTS + ("ring buffers",), best[1])
             if v or k in ("params", "grads", "optimizer", "activations")}
    return {"pipeline_rank": best[0], "breakdown_bytes": parts, "host_bytes": host}


def _gather_key(fsdp, S: int) -> tuple:
    """What :func:`_gathered` reads of the FSDP2 options."""
    if fsdp is None or fsdp.zero != 3 or S == 1:
        return ()
    return (fsdp.reshard_after_forward is False, fsdp.prefetch)


def recompute_of(model, par) -> str:
    """The recompute in force: the tp section's, else the cp section's, else the model's (sim/parallel/layers.py)."""
    from distlab.sim.models.activations import effective_recompute
    own = getattr(par.tp, "recompute", "none") if par.tp is not None else "none"
    if par.cp is not None and own == "none":
        own = par.cp.recompute
    return effective_recompute(model, own)


def _activations(model, par, tp: int, cp: int, cache: dict, recompute: str | None, offload: bool | None):
    from distlab.sim.models.activations import activations
    sp = par.tp is not None and par.tp.sequence_parallel and tp > 1
    lp = par.tp is not None and par.tp.loss_parallel and tp > 1
    key = ("acts", recompute or recompute_of(model, par), offload, tp, sp, cp, lp)
    if key not in cache:
        cache[key] = activations(model, key[1], offload, tp, sp, cp, lp)
    return cache[key]


ONE_STAGE = None                  # without a pipeline: F (one micro-batch alive), then B (set below)


def _stages(model, mesh, par, cache: dict) -> tuple:
    """(layer ranges of each stage, rank of each stage, each rank's walk states (:func:`_states`),
    micro-batches): one stage, one F and one B without a pipeline."""
    if par.pipeline is None:
        key = ("one stage", len(model.layers))
        if key not in cache:
            cache[key] = [range(len(model.layers))]
        return cache[key], (0,), ONE_STAGE, 1
    from distlab.sim.parallel.pipeline.plan import stage_ranges
    spec = par.pipeline if not hasattr(par.pipeline, "spec") else par.pipeline.spec(mesh, model)
    pp, v = spec.stages, spec.virtual_stages
    key = ("ranges", pp * v, tuple(spec.split or ()))
    if key not in cache:
        cache[key] = stage_ranges(model, pp * v, spec.split)
    placement, states = _states(spec.schedule, pp, spec.microbatches, v)
    return cache[key], placement, states, spec.microbatches


@lru_cache(maxsize=1024)
def _states(schedule: str, pp: int, m: int, v: int) -> tuple:
    """(rank of each stage, per rank the distinct moments of its schedule walk worth a peak): each moment is
    ((stage, micro-batches alive) of each stage with some, the stage whose backward runs or -1 after a
    forward); a moment another
    within a run of forwards (the last counts) or of one stage's backwards (the first counts) is dropped.
    Depends on the schedule only, so the planner's thousands of layouts walk each schedule once."""
    from distlab.sim.parallel.pipeline import schedules as Sch
    placement = tuple(Sch.stage_to_rank(schedule, pp, v))
    out = []
    for actions in Sch.built(schedule, pp, m, v):
        mine = sorted({a.stage for a in actions})          # the rank's own stages: only theirs are alive here
        slot = {t: k for k, t in enumerate(mine)}
        live, seen = [0] * len(mine), set()
        kinds = [a.kind for a in actions] + [""]
        for j, a in enumerate(actions):
            if a.kind == "F":
                live[slot[a.stage]] += 1
                if kinds[j + 1] != "F":          # a run of forwards peaks at its end
                    seen.add((tuple(live), -1))
            elif a.kind in ("B", "I"):
                live[slot[a.stage]] -= 1
                before = actions[j - 1] if j else None
                if before is None or before.kind not in ("B", "I") or before.stage != a.stage:
                    seen.add((tuple(live), a.stage))   # peaks at its start
        out.append(_moments(mine, seen))
    return placement, tuple(out)


def _moments(mine: list, seen) -> tuple:
    """A rank's moments as arrays: (its stages, micro-batches alive per moment and stage (k x stages), per moment
    the slot of the stage whose backward runs (len(mine) after a forward: nothing))."""
    import numpy as np
    rows = sorted(seen, key=lambda x: (x[1], x[0]))
    counts = np.array([c for c, _ in rows], dtype=np.float64).reshape(len(rows), len(mine))
    back = np.array([mine.index(b) if b >= 0 else len(mine) for _, b in rows], dtype=np.intp)
    return tuple(mine), counts, back


ONE_STAGE = (_moments([0], {((1,), -1), ((0,), 0)}),)


def _walks(schedule, ranges, acts, cache: dict) -> list:
    """The most activation bytes alive on each rank of ``schedule`` (per rank its :func:`_moments`; module
    docstring), every rank's moments in one product: the ranks' rows side by side over all the stages (a rank's
    zeros elsewhere), then the largest of each rank's rows."""
    import numpy as np
    key = ("stash", id(acts), id(ranges))      # both held by the cache for as long as it lives
    if key not in cache:
        layers = acts.layers
        stash = [sum(layers[i].saved for i in r) for r in ranges]
        inside = []                               # backward at layer i: the stage's saved 0..i + i's transient
        for r in ranges:
            prefix, top = 0.0, 0.0
            for i in r:
                prefix += layers[i].saved
                top = max(top, prefix + layers[i].transient)
            inside.append(top)
        cache[key] = (np.array(stash), np.array(inside + [0.0]))   # 0 after a forward: nothing runs backward
    stash, inside = cache[key]
    side = ("side by side", id(schedule))      # the value holds the schedule: its id stays its own
    if side not in cache:
        cache[side] = (schedule, _side_by_side(schedule, len(ranges)))
    counts, back, starts = cache[side][1]
    return (np.maximum.reduceat(counts @ stash + inside[back], starts)).tolist()


def _side_by_side(schedule: tuple, stages: int) -> tuple:
    """(every rank's moments' micro-batches alive over all ``stages``, the stage whose backward runs (``stages``
    after a forward), the first row of each rank) of a schedule's :func:`_moments`."""
    import numpy as np
    counts, back, starts = [], [], []
    for mine, c, b in schedule:
        full = np.zeros((len(c), stages))
        full[:, list(mine)] = c
        starts.append(sum(len(x) for x in counts))
        counts.append(full)
        back.append(np.append(np.array(mine, dtype=np.intp), stages)[b])
    return np.concatenate(counts), np.concatenate(back), np.array(starts, dtype=np.intp)


def _gathered(model, layers: list, numel: list, fsdp, S: int) -> int:
    """Elements FSDP2 holds all-gathered at once on a rank with ``layers`` (module docstring)."""
    from distlab.sim.models.families import BLOCK
    if fsdp is None or fsdp.zero != 3 or S == 1:
        return 0
    if fsdp.reshard_after_forward is False:
        return sum(numel[i] for i in layers)
    root = sum(numel[i] for i in layers if not BLOCK.match(model.layers[i].name))
    blocks = sorted((numel[i] for i in layers if BLOCK.match(model.layers[i].name)), reverse=True)
    return root + sum(blocks[:1 + fsdp.prefetch])


def _ring(c: dict, cp: int, tp: int, rotate_method: str) -> float:
    from distlab.sim.parallel.cp.ring import ACCUM_BYTES
    b, s, h, e = c["micro_batch"], c["seq_len"] // cp, c["hidden"] // tp, DTYPE_BYTES[c["dtype"]]
    B, G = 2 * b * s * h * e, 2 * b * s * h * ACCUM_BYTES
    return ((cp + 1) * B if rotate_method == "allgather" else 2 * B) + 2 * G


def as_parallelisms(mesh, opts):
    """A workload's options as the Parallelisms its builder composes (sim/workloads/: ddp, fsdp, tp with its
    dp_shard / dp / pp dimensions, cp in torchtitan's layout, pipeline with dp replicas); a Parallelisms as is."""
    from distlab.sim.parallel.cp.local import CPOptions
    from distlab.sim.parallel.ddp.plan import DDPOptions
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.parallel.parallelize import Parallelisms
    from distlab.sim.parallel.pipeline.plan import PipelineOptions, PipelineSpec
    from distlab.sim.parallel.tp.plan import TPOptions
    size = lambda d: mesh.size(d) if d in mesh else 1  # noqa: E731
    if isinstance(opts, Parallelisms):
        return opts
    if isinstance(opts, DDPOptions):
        return Parallelisms(ddp=opts)
    if isinstance(opts, FSDPOptions):
        return Parallelisms(fsdp=opts)
    if isinstance(opts, PipelineOptions):
        return Parallelisms(pipeline=opts, ddp=DDPOptions() if size("dp") > 1 else None)
    if isinstance(opts, CPOptions):          # sim/parallel/cp/plan.py cp_plan
        return Parallelisms(cp=opts, fsdp=FSDPOptions(overlap=opts.overlap),
                            tp=TPOptions(sequence_parallel=True) if size("tp") > 1 else None)
    if isinstance(opts, TPOptions):          # sim/workloads/tp.py build
        sharded = "dp_shard" in mesh or "dp_replicate" in mesh
        piped = size("pp") > 1 or "pp" in mesh and opts.microbatches > 1
        spec = PipelineSpec(schedule=opts.schedule, stages=size("pp"), microbatches=opts.microbatches,
                            data_parallel=size("dp"), virtual_stages=opts.virtual_stages, split=opts.split) \
            if piped else None
        return Parallelisms(pipeline=spec, tp=opts, fsdp=FSDPOptions(reshard_after_forward=size("pp") == 1)
                            if sharded else None, ddp=DDPOptions() if size("dp") > 1 else None)
    raise TypeError(f"no memory model for options {type(opts).__name__}")


def memory_of_result(result) -> dict:
    """{"pipeline_rank", "breakdown_bytes", "host_bytes"} of a built scenario (sim/parallel/memory.py)."""
    return memory_per_gpu(result.model, result.mesh, as_parallelisms(result.mesh, result.options))


def memory_section(result) -> dict:
    """Rows (each part in GiB, the total, whether it fits with the allocator's headroom), warnings and json."""
    from distlab.sim.parallel.fsdp.memory import breakdown_line, fit_text, fits
    mem = memory_of_result(result)
    parts = mem["breakdown_bytes"]
    total, gpu = sum(parts.values()), result.cluster.gpu.memory_GiB
    ok = fits(total, gpu)
    size = lambda v: f"{v / 1e9:.3f} GB = {v / 2**30:.3f} GiB"  # noqa: E731
    rows = [[f"memory per GPU: {k}", size(v)] for k, v in parts.items() if v or k in
            ("params", "grads", "optimizer", "activations")]
    piped = "pp" in result.mesh and result.mesh.size("pp") > 1
    where = f"total; pipeline rank {mem['pipeline_rank']}" if piped else "total"
    rows += [[f"peak memory per GPU ({where})", size(total)]]
    if mem["host_bytes"]:
        rows.append(["host memory per GPU (offloaded activations)", size(mem["host_bytes"])])
    rows.append(["fits the GPU", fit_text(total, gpu)])
    return {"rows": rows, "warnings": [] if ok else ["does not fit: " + breakdown_line(parts, total, gpu)],
            "json": {**mem, "total_bytes": total, "fits": ok, "gpu_memory_GiB": gpu,
                     "model": "sim/parallel/memory.py memory_per_gpu"}}


def estimate(model, world: int, zero: int, shard_size: int | None = None, dtype: str | None = None,
             reshard_after_forward: bool = True, prefetch: int = 1) -> dict:
    """Bytes per GPU by part of DDP (``zero`` 0) or FSDP2 / ZeRO ``zero`` on ``world`` ranks (HSDP: shard groups
    of ``shard_size``; ``dtype``: FSDP2's param_dtype): sim/parallel/memory.py ``memory_per_gpu``, the one model
    `distlab simulate` of that layout reports."""
    from distlab.sim.errors import ConfigError
    from distlab.sim.mesh import Mesh
    from distlab.sim.parallel.ddp.plan import DDPOptions
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.parallel.parallelize import Parallelisms
    if zero not in (0, 1, 2, 3) or isinstance(zero, bool):
        raise ConfigError(f"unknown ZeRO stage {zero!r}; allowed: 0 (DDP), 1, 2, 3", "zero")
    S = shard_size or world
    if S < 1 or world % S:
        raise ConfigError(f"shard group size {S} must divide the world size {world}", "shard_size")
    if zero == 0:
        mesh, par = Mesh({"dp": world}), Parallelisms(ddp=DDPOptions())
    else:
        mesh = Mesh({"dp_replicate": world // S, "dp_shard": S} if S < world else {"dp_shard": world})
        par = Parallelisms(fsdp=FSDPOptions(zero=zero, reshard_after_forward=reshard_after_forward,
                                            prefetch=prefetch, param_dtype=dtype))
    return {**dict.fromkeys(PARTS, 0), **memory_per_gpu(model, mesh, par)["breakdown_bytes"]}
