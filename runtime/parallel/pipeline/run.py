"""Run sim.pipeline's schedules for real with torch.distributed.pipelining, and time every action.

The model is ``layers`` blocks of Linear(width, width) + ReLU, split into p·v stages as the plan builder splits
them (stage s on the rank sim.pipeline.schedules.stage_to_rank gives). Each rank builds PipelineStage objects
and the schedule class of sim.pipeline.schedules.TORCH_CLASSES (ScheduleGPipe, Schedule1F1B,
ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble for zbh1, ScheduleZBVZeroBubble), wraps each stage's
forward_one_chunk / backward_one_chunk / backward_weight_one_chunk to record (action, start, end), and runs
``warmup`` + ``steps`` steps (MSE loss). The fastest timed step becomes a sim Trace (source=measured), with op
indices matching the plan that sim.pipeline.plan.build_plan makes for the same configuration.

``calibrate_alone`` times one block's F, B, I and W on each rank in turn, on a core of its own (the simulator
shares the cores itself), and ``calibrate_p2p`` a send/recv ping-pong, for predictions: see
runtime/parallel/pipeline/validate.py.
"""
from __future__ import annotations

import time

from distlab.sim.parallel.pipeline import schedules as S

DEFAULTS = {"schedule": "1f1b", "stages": 2, "microbatches": 4, "virtual_stages": 1, "layers": None,
            "width": 256, "rows": 32, "steps": 2, "warmup": 1}


def _blocks(n: int, width: int, seed: int = 0):
    import torch
    torch.manual_seed(seed)
    return [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()) for _ in range(n)]


def _data(cfg, seed: int = 1):
    import torch
    g = torch.Generator().manual_seed(seed)
    rows = cfg["rows"] * cfg["microbatches"]
    return torch.randn(rows, cfg["width"], generator=g), torch.randn(rows, cfg["width"], generator=g)


def reference_loss(cfg: dict) -> float:
    """Single-process loss of the same model and batch: mean over microbatches of each one's MSE."""
    import torch
    cfg = {**DEFAULTS, **cfg}
    p, v = cfg["stages"], cfg["virtual_stages"]
    model = torch.nn.Sequential(*_blocks(cfg["layers"] or p * v, cfg["width"]))
    x, y = _data(cfg)
    with torch.no_grad():
        losses = [torch.nn.functional.mse_loss(model(a), b) for a, b in
                  zip(x.chunk(cfg["microbatches"]), y.chunk(cfg["microbatches"]))]
    return float(sum(losses) / len(losses))


class _Schedule:
    """One configuration set up on this rank (stages, torch schedule, data), ready to ``step``."""

    def __init__(self, cfg: dict, rank: int):
        import torch
        import torch.distributed.pipelining as pp
        cfg = self.cfg = {**DEFAULTS, **cfg}
        sched_name = S.check(cfg["schedule"], cfg["stages"], cfg["microbatches"], cfg["virtual_stages"])
        p, m, v = cfg["stages"], cfg["microbatches"], cfg["virtual_stages"]
        self.n_stages = n_stages = p * v
        from distlab.sim.parallel.pipeline.plan import split_layers
        ranges = split_layers(cfg["layers"] or n_stages, n_stages, cfg.get("split"))
        blocks = _blocks(cfg["layers"] or n_stages, cfg["width"])
        placement = S.stage_to_rank(sched_name, p, v)
        self.mine = [s for s in range(n_stages) if placement[s] == rank]
        self.log: list[list] = []
        self.stages = []
        for s in self.mine:
            mod = torch.nn.Sequential(*[blocks[i] for i in ranges[s]])
            stage = pp.PipelineStage(mod, s, n_stages, torch.device("cpu"))
            _instrument(stage, self.log)
            self.stages.append(stage)
        cls = getattr(pp, S.TORCH_CLASSES[sched_name])
        loss_fn = torch.nn.MSELoss()
        self.sched = (cls(self.stages[0], m, loss_fn=loss_fn) if sched_name in ("gpipe", "1f1b")
                      else cls(self.stages, m, loss_fn=loss_fn))
        self.x, self.y = _data(cfg)
        self.rank, self.done = rank, 0
        self.steps, self.losses = [], []

    @property
    def total(self) -> int:
        return self.cfg["warmup"] + self.cfg["steps"]

    def step(self) -> None:
        """One step after a barrier; its actions are kept once the warm-up steps are done."""
        import torch.distributed as dist
        for mod in self.stages:
            mod.submod.zero_grad(set_to_none=True)
        del self.log[:]
        out_losses: list = []
        dist.barrier()
        args = (self.x,) if 0 in self.mine else ()
        kwargs = {"target": self.y, "losses": out_losses} if self.n_stages - 1 in self.mine else {}
        self.sched.step(*args, **kwargs)
        if self.done >= self.cfg["warmup"]:
            self.steps.append(list(self.log))
        if out_losses:
            self.losses.append(float(sum(t.item() for t in out_losses) / len(out_losses)))
        self.done += 1

    def result(self, calibration) -> dict:
        return {"rank": self.rank, "steps": self.steps, "losses": self.losses, "calibration": calibration}


def run_schedule(cfg: dict, rank: int) -> dict:
    """One configuration on this rank: {"steps": [[name, start, end], ...] per step, "losses": [...],
    "calibration": blocks timed alone right before the steps (with ``calibrate``) or None}."""
    return run_interleaved([cfg], rank)[0]


def run_interleaved(cfgs: list[dict], rank: int) -> list[dict]:
    """Several configurations whose steps alternate (next: the one with the smallest fraction of its steps done, each
    step after a barrier), so that they see the same load of the machine; with ``calibrate`` in the first,
    blocks are timed alone before and after the steps and every result gets the mean of the two
    (runtime/parallel/pipeline/validate.py fits a probe and predicts the configuration beside which it ran)."""
    runs = [_Schedule(cfg, rank) for cfg in cfgs]
    first = runs[0].cfg
    effort = (first.get("calibrate_repeat", 10), first.get("calibrate_rounds", 5))   # calibrate()'s repeat, rounds
    timings = [calibrate_alone(first["width"], first["rows"], *effort)] if first.get("calibrate") else []
    while any(r.done < r.total for r in runs):
        min((r for r in runs if r.done < r.total), key=lambda r: r.done / r.total).step()
    if timings:
        timings.append(calibrate_alone(first["width"], first["rows"], *effort))
    calibration = {k: sum(t[k] for t in timings) / len(timings) for k in timings[0]} if timings else None
    return [r.result(calibration) for r in runs]


def _instrument(stage, log: list) -> None:
    """Record (action, start, end) around each compute call of ``stage`` (perf_counter: one clock per host)."""
    s = stage.stage_index
    fwd, bwd, wgt = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def forward_one_chunk(mb, *a, **k):
        t = time.perf_counter()
        out = fwd(mb, *a, **k)
        log.append([f"{s}F{mb}", t, time.perf_counter()])
        return out

    def backward_one_chunk(mb, *a, full_backward=True, **k):
        t = time.perf_counter()
        out = bwd(mb, *a, full_backward=full_backward, **k)
        log.append([f"{s}{'B' if full_backward else 'I'}{mb}", t, time.perf_counter()])
        return out

    def backward_weight_one_chunk(mb, *a, **k):
        t = time.perf_counter()
        out = wgt(mb, *a, **k)
        log.append([f"{s}W{mb}", t, time.perf_counter()])
        return out

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def calibrate_alone(width: int, rows: int, repeat: int = 10, rounds: int = 5) -> dict:
    """``calibrate`` on each rank in turn while the others wait in a barrier (asleep, holding no core)."""
    import torch.distributed as dist
    mine = None
    for r in range(dist.get_world_size()):
        dist.barrier()
        if r == dist.get_rank():
            mine = calibrate(width, rows, repeat, rounds)
    dist.barrier()
    return mine


def calibrate(width: int, rows: int, repeat: int = 10, rounds: int = 5) -> dict:
    """Seconds of one block's F, B (full), I (input grad only) and W (weight grad only) on this rank: per loop
    (F; F+B; F+I; F+W) the median over ``rounds`` of the wall time of ``repeat`` back-to-back iterations,
    so that a round the OS interrupts does not count."""
    import statistics

    import torch
    block = _blocks(1, width)[0]
    x = torch.randn(rows, width, requires_grad=True)
    params = list(block.parameters())

    def one(wrt):
        out = block(x)
        if wrt is not None:
            torch.autograd.grad(out, wrt, torch.ones_like(out))

    def loop(wrt) -> float:
        for _ in range(3):
            one(wrt)
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(repeat):
                one(wrt)
            times.append((time.perf_counter() - t) / repeat)
        return statistics.median(times)

    f = loop(None)
    return {"F": f, **{k: max(0.0, loop(wrt) - f) for k, wrt in (("B", [x] + params), ("I", [x]), ("W", params))}}


def calibrate_p2p(rank: int, world: int, nbytes: int, repeat: int = 20) -> dict | None:
    """Ping-pong between ranks 2k and 2k+1, one pair at a time (the others wait in a barrier, so that the pair
    has the cores): one-way seconds of 4 bytes and of ``nbytes``; None on a rank without a partner."""
    import statistics

    import torch
    import torch.distributed as dist
    peer, out = rank ^ 1, None
    for pair in range(0, world - 1, 2):
        dist.barrier()
        if rank // 2 * 2 != pair:
            continue
        out = {}
        for key, n in (("small", 4), ("large", nbytes)):
            buf = torch.zeros(max(1, n // 4))
            rtts = []
            for _ in range(repeat + 3):
                t = time.perf_counter()
                if rank % 2 == 0:
                    dist.send(buf, peer), dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer), dist.send(buf, peer)
                rtts.append(time.perf_counter() - t)
            out[key] = statistics.median(rtts[3:]) / 2
        out["bytes"] = nbytes
    dist.barrier()
    return out


def rank_main(ctx, payload: dict) -> dict:
    """Worker entry (runtime.ranks.launch): optional calibration, then each configuration in turn."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    out = {"rank": ctx.rank, "runs": []}
    if payload.get("calibrate"):
        dist.barrier()
        shape = payload["calibrate"]
        out["calibration"] = calibrate_alone(shape["width"], shape["rows"], shape.get("repeat", 10),
                                             shape.get("rounds", 5))
        out["p2p"] = calibrate_p2p(ctx.rank, ctx.world_size, shape["width"] * shape["rows"] * 4)
    group = payload.get("interleave", 1)
    for i in range(0, len(payload["runs"]), group):
        out["runs"] += run_interleaved(payload["runs"][i:i + group], ctx.rank)
    return out


def to_trace(cfg: dict, per_rank: list[dict]):
    """The fastest measured step as a sim Trace (times from its first action; op index = the plan's)."""
    from distlab.sim.models import Layer, Model
    from distlab.sim.parallel.pipeline.plan import PipelineSpec, build_plan
    from distlab.sim.trace import OpRecord, Trace
    cfg = {**DEFAULTS, **cfg}
    p, v = cfg["stages"], cfg["virtual_stages"]
    model = Model("blocks", [Layer(f"b{i}", [], fwd_flops=1.0) for i in range(cfg["layers"] or p * v)])
    plan = build_plan(model, PipelineSpec(cfg["schedule"], p, cfg["microbatches"], v, split=cfg.get("split")))
    index = [{op.name: i for i, op in enumerate(ops) if op.kind == "compute"} for ops in plan.ranks]
    n_steps = len(per_rank[0]["steps"])

    def span(k):
        acts = [a for r in per_rank for a in r["steps"][k]]
        return min(a[1] for a in acts), max(a[2] for a in acts)

    best = min(range(n_steps), key=lambda k: span(k)[1] - span(k)[0])
    t0 = span(best)[0]
    ops = [OpRecord(r["rank"], "compute", index[r["rank"]][name], "compute", name, s - t0, e - t0)
           for r in per_rank for name, s, e in r["steps"][best]]
    ops.sort(key=lambda o: (o.rank, o.index))
    return Trace(ops, [], {"source": "measured", "plan": plan.name, "pipeline": plan.meta["pipeline"],
                           "step_makespans": [span(k)[1] - span(k)[0] for k in range(n_steps)]})


def measure(runs: list[dict], nproc: int, calibrate_shape: dict | None = None, timeout: float = 120.0,
            interleave: int = 1) -> dict:
    """Launch ``nproc`` gloo ranks (runtime.ranks.launch) and run every configuration, the steps of each
    ``interleave`` consecutive ones alternating (run_interleaved); per-rank results."""
    from distlab.runtime.ranks.launch import PIPELINING, launch
    payload = {"runs": runs, "calibrate": calibrate_shape, "interleave": interleave}
    results = launch("distlab.runtime.parallel.pipeline.run:rank_main", payload, nproc, backend="gloo", threads=1,
                     timeout=timeout, preload=PIPELINING)
    return {"ranks": results,
            "traces": [to_trace(cfg, [r["runs"][i] for r in results]) for i, cfg in enumerate(runs)]}


def main(argv=None) -> int:
    """``python -m distlab.runtime.parallel.pipeline.run --schedule zbv --stages 2 --virtual-stages 2 --microbatches 8
    --out DIR``: run one schedule for real, print its metrics, write the measured trace and the pipeline diagram."""
    import os
    import sys

    from distlab.sim.cli import Parser
    from distlab.sim.errors import ConfigError
    ap = Parser(prog="python -m distlab.runtime.parallel.pipeline.run", description=main.__doc__.split("\n")[0])
    for key, val in DEFAULTS.items():
        ap.add_argument("--" + key.replace("_", "-"), type=type(val) if val is not None else int, default=val)
    ap.add_argument("--out", default="distlab-out")
    args = ap.parse_args(argv)
    cfg = {k: getattr(args, k) for k in DEFAULTS}
    try:
        S.check(cfg["schedule"], cfg["stages"], cfg["microbatches"], cfg["virtual_stages"])
        from distlab.sim.files import make_folder
        make_folder(args.out, "--out")       # before measuring; never through a link, in a folder only you write
        trace = measure([cfg], cfg["stages"])["traces"][0]
    except ConfigError as e:
        sys.stderr.write(f"python -m distlab.runtime.parallel.pipeline.run: error: {e}\n")
        return 2
    from distlab.sim.parallel.pipeline import diagram
    from distlab.sim.parallel.pipeline import metrics as M
    met = M.compute(trace, trace.meta["pipeline"])
    trace.save(os.path.join(args.out, "pipeline-measured.trace"))
    diagram.draw(trace, os.path.join(args.out, "pipeline-measured.png"),
                 title="measured: " + diagram.title_for(trace.meta["pipeline"], met), p=cfg["stages"])
    print(f"makespan {met.makespan * 1e3:.2f} ms, bubble {met.bubble:.1%}, peak in flight {met.peak_in_flight}")
    print(f"wrote {args.out}/pipeline-measured.trace and {args.out}/pipeline-measured.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
