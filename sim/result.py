"""One simulated scenario: plan, trace, model, cluster, mesh, step summary and per-workload reports.

``distlab.sim.scenario.simulate`` returns a :class:`Result`; the CLI (`distlab simulate`), the lessons and the
runtime only format it. The step summary rule lives here, once (:func:`step_summary`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from distlab.sim.kernel.spans import overlap, union


def step_summary(trace, rank: int = 0) -> dict:
    """Step, compute, communication (collectives and point-to-point, while data moves) and exposed
    communication seconds of ``rank``; overlap % = hidden / communication. Exposed = communication during which
    the rank computes nothing. Step = the trace's makespan (all ranks)."""
    ops = trace.for_rank(rank)
    compute = union([(o.start, o.end) for o in ops if o.kind == "compute"])
    comm = union([(o.start if o.launch is None else o.launch, o.end) for o in ops
                  if o.kind in ("collective", "send", "recv")])
    t_compute = sum(e - s for s, e in compute)
    t_comm = sum(e - s for s, e in comm)
    hidden = overlap(comm, compute)
    return {"step_s": trace.makespan, "compute_s": t_compute, "comm_s": t_comm, "exposed_comm_s": t_comm - hidden,
            "overlap_pct": 100.0 * hidden / t_comm if t_comm > 0 else 0.0}


BATCH_DIMS = ("dp", "dp_shard", "dp_replicate", "ep")      # mesh dims whose ranks hold different sequences


def sequences_per_step(result) -> int:
    """Sequences (an MLP: samples) one step trains: the micro-batch, times the micro-batches per step (DDP's
    grad_accum, a pipeline's microbatches), times the ranks of the batch dimensions (dp, dp_shard, dp_replicate,
    ep; tp, cp and pp ranks share their sequences)."""
    cfg, opts, mesh = result.model.config or {}, result.options, result.mesh
    micro = cfg.get("micro_batch", cfg.get("batch", 1))
    pipeline = getattr(opts, "pipeline", None)           # a composition's Parallelisms (sim/parallel/parallelize.py)
    if getattr(opts, "grad_accum", None):
        steps = opts.grad_accum
    elif ("pp" in mesh or "ep" in mesh) and getattr(opts, "microbatches", None):     # EP: with or without pp
        steps = opts.microbatches
    elif "pp" in mesh and getattr(pipeline, "microbatches", None):
        steps = pipeline.microbatches
    else:
        steps = 1
    replicas = 1
    for dim in BATCH_DIMS:
        if dim in mesh:
            replicas *= mesh.size(dim)
    return micro * steps * replicas


def throughput(result) -> dict:
    """The step summary's throughput fields (sim/compute/flops.py): model FLOPs per token and their convention,
    MFU and HFU against the bf16 dense peak (and MFU against the peak of the dtype the step computes in), TFLOP/s and tokens/s per GPU; plus ``compute_notes``: what bounds
    the numbers (compute priced without kernel shapes, a generation without fitted constants, an MFU above the
    best published one for the generation)."""
    from distlab.sim.compute.flops import mfu_summary, plausibility
    from distlab.sim.compute.fitted import constants
    from distlab.sim.compute.kernels import kernel_model
    from distlab.sim.plan import Compute
    opts = result.options
    recompute = (getattr(opts, "recompute", None) or getattr(getattr(opts, "tp", None), "recompute", None)
                 or ("full" if getattr(opts, "activation_checkpointing", False) else "none"))
    ops = [o for o in result.plan.ranks[0] if isinstance(o, Compute) and o.seconds is None]
    dtype = compute_dtype_of(ops)
    out = mfu_summary(result.model, sequences_per_step(result), result.summary["step_s"], result.plan.world_size,
                      result.cluster.gpu, recompute, dtype)
    notes, gpu = [], result.cluster.gpu
    km = kernel_model(gpu)
    if km is not None:
        bare = sum(o.flops for o in ops if o.flops and not o.gemms and o.attention is None)
        total = sum(o.flops for o in ops)
        if total and bare / total > 0.5:
            notes.append(f"{100 * bare / total:.0f}% of the FLOPs are in ops without kernel shapes "
                         f"({result.workload.name} builder), priced at the best {dtype} GEMM's rate: an upper "
                         "bound (no attention kernel, no small-GEMM losses)")
        if dtype == "float32" and out["compute_peak_tflops"] != out["mfu_peak_tflops"]:
            notes.append(f"the step computes in float32 (the parameters' dtype, no mixed precision; torch's "
                         f"matmul has TF32 off by default): its GEMMs run on the {out['compute_peak_tflops']:g} "
                         f"TFLOP/s FP32 peak, not the tensor cores' {gpu.tflops:g}; MFU is taken against the bf16 "
                         "dense peak, as published figures are (model dtype bfloat16 or FSDP2's param_dtype for "
                         "the tensor cores)")
        if not constants(km.generation).fitted_on and getattr(gpu, "sustained", None) is None:
            notes.append(f"{km.generation} has no published row fitted (sim/compute/fitted.py): kernel rates are "
                         "micro-benchmarks', an upper bound")
        line = plausibility(out["mfu"], gpu)
        if line and (line.startswith("MFU") or not notes):
            notes.append(line)
    out["compute_notes"] = notes
    return out


def compute_dtype_of(ops) -> str:
    """The dtype of the matmuls of a rank's Compute ops: the one that carries most of their FLOPs."""
    flops: dict = {}
    for o in ops:
        flops[o.dtype] = flops.get(o.dtype, 0.0) + o.flops
    return max(flops, key=flops.get) if flops and max(flops.values()) > 0 else "bfloat16"


@dataclass
class Result:
    """Everything one simulation of a scenario produced. ``workload`` is the registry record
    (sim/workloads), ``options`` its options dataclass, ``info`` what its builder returned beside the plan,
    ``reports`` the workload's report (by workload name): rows, tables, warnings, json."""
    scenario: dict
    workload: object
    options: object
    mesh: object
    model: object
    cluster: object
    plan: object
    info: dict
    trace: object
    summary: dict = field(default_factory=dict)
    reports: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The scenario's name, or one made from what was simulated (follows every override)."""
        return self.scenario.get("name") or self.label

    @property
    def label(self) -> str:
        """``llama-70b fsdp on 16 x dgx-h100 (128 ranks)``: what was simulated, from the resolved objects."""
        c = self.cluster
        where = f"{c.nodes} x {c.name}" if c.nodes > 1 else c.name
        what = self.workload.name
        if what == "composed":          # a composition: its mesh (sim/workloads/composed.py)
            what = " x ".join(f"{d} {n}" for d, n in self.mesh.as_dict().items())
        return f"{self.model.name} {what} on {where} ({self.plan.world_size} ranks)"

    @property
    def report(self) -> dict:
        return self.reports.get(self.workload.name, {})

    def figure(self, title: str | None = None):
        """The workload's figure (a timeline by default) of this result."""
        if self.workload.figure is not None:
            return self.workload.figure(self, title)
        from distlab.sim.plots import timeline
        return timeline(self.trace, ranks=list(range(min(2, self.plan.world_size))), title=title)
