"""Real PP x TP on a (pp, tp) mesh: each pipeline stage is a slice of the Llama (embedding and the first blocks;
the last blocks, final norm and head), parallelized over the tp sub-mesh with the plan of runtime/parallel/tp/run.py and
run by torch.distributed.pipelining (``PipelineStage`` on the pp sub-mesh's group, ``ScheduleGPipe`` or
``Schedule1F1B``), as torchtitan composes them (TP inside each stage, stages exchanging the TP-local activations).
Recorded per rank: every collective (runtime/parallel/tp/capture.py CollectiveCapture, the phase set by the stage's forward
and backward chunks) and every point-to-point send and receive (c10d ``send``/``recv_``: bytes, peer), local
shard shapes and the step time. No optimizer (the simulated pipeline plans have none)."""
from __future__ import annotations

import contextlib
import time

import torch.nn as nn

from distlab.runtime.parallel.tp.capture import CollectiveCapture
from distlab.runtime.parallel.tp.model import Stage  # noqa: F401  (the stage module; runtime/parallel/tp/model.py)


def _loss(logits, target):
    import torch.nn.functional as F
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


def run_variant(ctx, v: dict, steps: int, warmup: int, tp, calibrate: dict | None = None,
                calibrate_calls: int | None = None) -> dict:
    """One pipelined variant on this rank: {model, sequence_parallel, mesh [[pp, n], ...], schedule, microbatches,
    split (blocks per stage; none: even), reshard_after_forward}; ``tp``: the runtime/parallel/tp/run.py module (its
    capture, plan and shapes). As torchtitan builds it (pipeline_llama, then parallelize_llama per stage): each
    stage module parallelized on the tp sub-mesh (when the mesh has tp), then, with dp_shard in the mesh,
    ``fully_shard`` on every block and on the stage (over (dp_replicate, dp_shard) for HSDP), not resharded after
    forward by default (torchtitan with pp), and AdamW after the schedule's step. With ``calibrate``
    (runtime/parallel/tp/calibrate.py sizes), one calibration round on the tp group (without tp: the dp_shard group)
    before each captured step and one uncaptured step after it (``plain_time``), as runtime/parallel/tp/run.py does for
    the other compositions (``calibrate_calls``: the Calibrator's ``calls``)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining as pp
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.runtime.parallel.tp.model import build_llama
    from distlab.sim.models import model_from_spec
    from distlab.sim.parallel.pipeline.plan import stage_ranges
    model = model_from_spec(v["model"])
    dims = v["mesh"]
    mesh = init_device_mesh("cpu", tuple(n for _, n in dims), mesh_dim_names=tuple(d for d, _ in dims))
    n_stages, s = mesh["pp"].size(), mesh["pp"].get_local_rank()
    names = [model.layers[i].name for i in stage_ranges(model, n_stages, v.get("split"))[s]]
    torch.manual_seed(0)
    module = Stage(build_llama(model), names)
    if "tp" in mesh.mesh_dim_names:
        module = tp.parallelize(module, mesh["tp"], v.get("sequence_parallel", True))
    fsdp = "dp_shard" in mesh.mesh_dim_names
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        dp_mesh = mesh["dp_replicate", "dp_shard"] if "dp_replicate" in mesh.mesh_dim_names else mesh["dp_shard"]
        raf = v.get("reshard_after_forward", False)
        for block in module.h.values():
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=raf)
        fully_shard(module, mesh=dp_mesh)
    stage = pp.PipelineStage(module, s, n_stages, torch.device("cpu"), group=mesh["pp"].get_group())
    m = v.get("microbatches", 2)
    cls = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B}[v.get("schedule", "1f1b")]
    sched = cls(stage, m, loss_fn=_loss)
    c = model.config
    x = torch.randint(0, c["vocab"], (c["micro_batch"] * m, c["seq_len"]))
    cap = CollectiveCapture()
    _phases(stage, cap)
    kwargs = {"target": x.roll(-1, 1)} if s == n_stages - 1 else {}
    args = (x,) if s == 0 else ()

    def step(capture: bool) -> float:
        module.zero_grad(set_to_none=True)
        cap.calls, cap.spans, cap.actions = [], [], []
        dist.barrier()
        t0 = time.perf_counter()
        cap.t0 = t0
        with cap if capture else contextlib.nullcontext():
            sched.step(*args, **kwargs)
            if opt is not None:
                cap.phase = "optimizer"
                opt.step()
        return time.perf_counter() - t0
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4) if fsdp else None
    from distlab.runtime.parallel.tp.calibrate import Calibrator
    sp = v.get("sequence_parallel", True)
    group = mesh["tp" if "tp" in mesh.mesh_dim_names else "dp_shard"].get_group()
    cal = Calibrator(calibrate, model, group, tp.block_plan(sp), CollectiveCapture,
                     root=tp.root_plan(sp), calls=calibrate_calls) if calibrate else None
    tp_size = mesh["tp"].size() if "tp" in mesh.mesh_dim_names else 1
    seq = c["seq_len"] // tp_size if v.get("sequence_parallel", True) else c["seq_len"]   # TP-local
    probe = RuntimeProbe(mesh, s, n_stages, m, cls, (c["micro_batch"], seq, c["hidden"])) if cal else None
    out = []
    for i in range(warmup + steps):
        if cal and i >= warmup:
            cal.round()
            cal.times.setdefault("pipeline_action", []).append(probe.action_seconds())
        t = step(i >= warmup)
        if i >= warmup:
            out.append({"time": t, "calls": list(cap.calls), "phases": [],            # spans: from the step's start
                        "spans": [[a - cap.t0, b - cap.t0] for a, b in cap.spans]})
            if cal:
                process, thread = time.process_time(), time.thread_time()
                out[-1]["plain_time"] = step(False)
                out[-1]["plain_cpu"] = [time.thread_time() - thread, time.process_time() - process]
                out[-1]["plain_actions"] = cap.actions
    return {"local_shapes": tp.local_shapes(module), "steps": out, "stage": s,
            **({"calibration": cal.results()} if cal else {})}


def _phases(stage, cap) -> None:
    """Set ``cap.phase`` while the stage runs a forward or a backward chunk, and note each chunk in
    ``cap.actions``: [kind F or B, micro-batch, start, end (perf_counter seconds from ``cap.t0``), this thread's
    CPU seconds in it]."""
    fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

    def timed(kind, fn, mb, *a, **k):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(mb, *a, **k)
        finally:
            cap.actions.append([kind, mb, t0 - cap.t0, time.perf_counter() - cap.t0, time.thread_time() - c0])

    def forward_one_chunk(mb, *a, **k):
        cap.phase = "forward"
        return timed("F", fwd, mb, *a, **k)

    def backward_one_chunk(mb, *a, **k):
        cap.phase = "backward"
        return timed("B", bwd, mb, *a, **k)
    stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk


class RuntimeProbe:
    """The pipelining runtime's own CPU per action, apart from any model: the run's schedule class on the same
    pp group with a one-Linear stage (hidden -> hidden) exchanging the run's boundary tensors (b, s or s / tp
    under SP, h), its step's CPU time
    (``time.thread_time``: this rank's Python thread: schedule bookkeeping, splitting and merging micro-batches,
    building and posting the p2p ops, the loss) minus the same Linear's forward, loss and backward on each
    micro-batch alone, over the 2m actions (m forwards, m backwards) a stage runs: ``action_seconds``."""

    def __init__(self, mesh, stage: int, stages: int, m: int, cls, shape: tuple):
        import torch
        import torch.distributed.pipelining as pp
        b, s, h = shape
        self.m, self.last = m, stage == stages - 1
        torch.manual_seed(0)
        self.linear = nn.Linear(h, h, bias=False)
        self.sched = cls(pp.PipelineStage(self.linear, stage, stages, torch.device("cpu"),
                                          group=mesh["pp"].get_group()), m, loss_fn=_probe_loss)
        self.x = torch.ones(b * m, s, h)
        self.args = (self.x,) if stage == 0 else ()
        self.kwargs = {"target": self.x} if self.last else {}
        self.group = mesh["pp"].get_group()
        self.action_seconds()                          # warm-up (shape inference, buffers)

    def _step(self) -> float:
        import torch.distributed as dist
        self.linear.zero_grad(set_to_none=True)
        dist.barrier(group=self.group)
        t0 = time.thread_time()
        self.sched.step(*self.args, **self.kwargs)
        return time.thread_time() - t0

    def _alone(self) -> float:
        x = self.x[: len(self.x) // self.m].detach().requires_grad_()
        t0 = time.thread_time()
        for _ in range(self.m):
            _probe_loss(self.linear(x), x).backward()
        return time.thread_time() - t0

    def action_seconds(self) -> float:
        return max(min(self._step() for _ in range(3)) - self._alone(), 0.0) / (2 * self.m)


def _probe_loss(y, target):
    return (y - target).pow(2).mean()
