"""Elastic training under torchrun: checkpoints every k steps, a restart after a failure resumes from the last one.

Every rank runs (``torchrun --max-restarts R ... -m distlab.runtime.restart.elastic --dir D``):

    start = last complete checkpoint in D (runtime/restart/checkpoint.py) or 0
    for step in start+1 .. steps:        (1-based)
        batch = seeded by (seed, step, rank); loss.backward(); all_reduce(grads) / world; SGD with momentum
        every ``checkpoint_every`` steps: DCP save, sharded over the ranks

so a resumed run repeats exactly what the lost steps did and ends with the parameters of an uninterrupted
run, bit for bit (CPU, Gloo, one thread: every operation is deterministic). When a rank dies, torchrun's agent
stops the other ranks and, while restarts remain, starts the whole group again (TORCHELASTIC_RESTART_COUNT
counts them). Test hook: ``--kill-rank r --kill-step s`` makes rank r SIGKILL itself as step s begins, in the
first attempt only. Test hook: with DISTLAB_TEST_THREADS_FILE=F set, every rank that ends its loop appends one JSON
line to F, {"dir", "rank", "attempt", "threads"}: the names of the process's threads once ``train`` has returned
(tests/test_elastic.py checks that no Gloo thread outlives the process group).

Rank 0 appends events to ``D/events.jsonl`` (wall clock, time.time(): one host) and at the end writes
``D/final.pt`` (the parameters) and ``D/summary.json``: attempts, the step resumed from, the lost work
(from the end of the last checkpoint to the failure: work done again) and the restart time (from the failure
to the first step of the new attempt: detection, restart of the processes, rendezvous, loading).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from distlab.runtime.ranks.multinode import ELASTIC_ENV  # noqa: F401  (re-exported; one store per restart)


@dataclass
class TrainSpec:
    steps: int = 10
    checkpoint_every: int = 2        # 0: never
    width: int = 32
    layers: int = 3
    batch: int = 16
    lr: float = 0.05
    seed: int = 0
    kill_rank: int = -1              # test hook: this rank SIGKILLs itself ...
    kill_step: int = -1              # ... as this step begins, in the first attempt only
    timeout_s: float = 60.0          # a rank waiting on a dead peer gives up after this long


def build(spec: TrainSpec):
    """A few Linear layers with ReLU, the same initial weights on every rank (seeded), SGD with momentum."""
    import torch
    torch.manual_seed(spec.seed)
    layers = []
    for _ in range(spec.layers - 1):
        layers += [torch.nn.Linear(spec.width, spec.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(spec.width, 1))
    return model, torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9)


def batch(spec: TrainSpec, step: int, rank: int):
    import torch
    g = torch.Generator().manual_seed(spec.seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(spec.batch, spec.width, generator=g)
    return x, x.sum(dim=1, keepdim=True).tanh()


def reference(spec: TrainSpec, world: int = 2) -> dict:
    """The parameters after an uninterrupted run, computed in this process: every rank's gradient, summed in
    rank order and divided by ``world``, as the ranks' all_reduce does (with 2 ranks a + b = b + a exactly, so
    this equals the real run bit for bit)."""
    import torch
    torch.set_num_threads(1)
    model, opt = build(spec)
    for step in range(1, spec.steps + 1):
        grads = []
        for rank in range(world):
            x, y = batch(spec, step, rank)
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            total = grads[0][i]
            for g in grads[1:]:
                total = total + g[i]
            p.grad = total / world
        opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def _event(path: str, **fields) -> None:
    """Append one event line (O_APPEND: lines of two ranks never interleave; never through a symbolic link)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (json.dumps({"time": time.time(), **fields}) + "\n").encode())
    finally:
        os.close(fd)


def train(spec: TrainSpec, root: str) -> dict:
    """The loop above, on this rank (the process group is initialised here from torchrun's environment)."""
    import torch
    import torch.distributed as dist

    from datetime import timedelta

    from distlab.runtime.restart import checkpoint     # before the group exists: runtime/restart/checkpoint.py says why
    from distlab.runtime.ranks.rendezvous import run_store
    from distlab.runtime.ranks.secret import run_secret
    from distlab.runtime.execute.wire import all_gather_json, broadcast_json
    from distlab.runtime.ranks.worker import _die_with_parent, env_int, stop_on_refusal
    _die_with_parent(os.getppid())           # torchrun's agent: if it dies, so does this rank
    torch.set_num_threads(1)
    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    key = checkpoint.family_key(run_secret())   # checkpoints of runs with this secret only
    store = run_store(rank, world, spec.timeout_s, on_refused=stop_on_refusal(rank, None))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=spec.timeout_s))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    events = os.path.join(root, "events.jsonl")
    model, opt = build(spec)
    start = broadcast_json(_resume_step(root, key) if rank == 0 else None, src=0)
    load_s = checkpoint.load(root, start, model, opt, key) if start else 0.0
    if rank == 0:
        _event(events, event="start", attempt=attempt, step=start, world_size=world, load_s=load_s)
    for step in range(start + 1, spec.steps + 1):
        if rank == spec.kill_rank and step == spec.kill_step and attempt == 0:
            _event(events, event="killed", attempt=attempt, step=step, rank=rank)
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 0 and step == start + 1:
            _event(events, event="first_step", attempt=attempt, step=step)
        x, y = batch(spec, step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        if spec.checkpoint_every and step % spec.checkpoint_every == 0:
            saved = checkpoint.save(root, step, model, opt, key)
            saved_at = time.time()        # complete on every rank: DCP's finish step ends on all of them
            sizes = all_gather_json(saved["bytes"])
            if rank == 0:
                _event(events, event="checkpoint", attempt=attempt, step=step, time_s=saved["time_s"],
                       bytes=sum(sizes), bytes_per_rank=sizes, time=saved_at)
    dist.barrier()
    if rank == 0:
        import io

        from distlab.sim.io import write_atomic
        buf = io.BytesIO()
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, buf)
        write_atomic(os.path.join(root, "final.pt"), buf.getvalue())
        _event(events, event="done", attempt=attempt, step=spec.steps)
        summary = summarize(read_events(events), spec)
        write_atomic(os.path.join(root, "summary.json"), json.dumps(summary, indent=1))
        print(describe(summary))
    dist.barrier()                 # rank 0 has written: no rank leaves the group while another still uses it
    dist.destroy_process_group()
    return {"rank": rank}


def _resume_step(root: str, key: bytes) -> int:
    """Rank 0: the newest checkpoint that verifies (runtime/restart/checkpoint.py), 0 if none; one line per newer one it
    skips, naming the file and the fallback."""
    from distlab.runtime.restart.checkpoint import latest_good, step_dir
    step, skipped = latest_good(root, key)
    fallback = f"resuming from {step_dir(root, step)} (the previous good checkpoint)" if step else \
        "starting from step 0 (no good checkpoint)"
    for reason in skipped:
        print(f"elastic: checkpoint not used: {reason}; {fallback}", flush=True)
    return step or 0


def read_events(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(events: list[dict], spec: TrainSpec) -> dict:
    """Attempts, resumes, lost work and restart time from the events of rank 0 (and of the killed rank)."""
    starts = [e for e in events if e["event"] == "start"]
    firsts = {e["attempt"]: e for e in events if e["event"] == "first_step"}
    ckpts = [e for e in events if e["event"] == "checkpoint"]
    out = {"steps": spec.steps, "checkpoint_every": spec.checkpoint_every, "attempts": len(starts),
           "resumed_from_step": [e["step"] for e in starts[1:]], "failures": [], "checkpoints": len(ckpts),
           "checkpoint_time_s": [e["time_s"] for e in ckpts],
           "checkpoint_bytes": ckpts[-1]["bytes"] if ckpts else 0}
    for e in events:
        if e["event"] != "killed":
            continue
        before = [c for c in ckpts if c["attempt"] == e["attempt"] and c["time"] <= e["time"]]
        began = [s for s in starts if s["attempt"] == e["attempt"]][0]["time"]
        saved_at = before[-1]["time"] if before else began
        resumed = firsts.get(e["attempt"] + 1)
        out["failures"].append({
            "rank": e["rank"], "step": e["step"],
            "last_checkpoint_step": before[-1]["step"] if before else 0,
            "lost_steps": e["step"] - 1 - (before[-1]["step"] if before else 0),
            "lost_work_s": e["time"] - saved_at,
            "restart_s": (resumed["time"] - e["time"]) if resumed else None})
    return out


def describe(summary: dict) -> str:
    """One line: ``elastic: ...``."""
    head = (f"elastic: {summary['steps']} steps in {summary['attempts']} attempt(s), "
            f"{summary['checkpoints']} checkpoints of {summary['checkpoint_bytes']} bytes")
    for f in summary["failures"]:
        restart = f"{f['restart_s']:.2f} s" if f["restart_s"] is not None else "no restart"
        head += (f"; rank {f['rank']} died at step {f['step']}, resumed from step {f['last_checkpoint_step']}: "
                 f"lost {f['lost_steps']} whole steps ({f['lost_work_s']:.3f} s of work), restart {restart}")
    return head


def run_local(root: str, spec: TrainSpec, nproc: int = 2, max_restarts: int = 1, timeout: float = 120.0) -> dict:
    """Start ``torchrun --nproc-per-node nproc --max-restarts R`` on this machine (static rendezvous on
    127.0.0.1, a new secret for the run: runtime/ranks/rendezvous.py), wait for it.
    Returns {"returncode", "output", "summary" (or None), "final" (the parameters, or None)}."""
    import torch

    from distlab.runtime.ranks.launch import free_port
    from distlab.runtime.ranks.secret import SECRET_ENV, SECRET_FILE_ENV, family_secret_file
    from distlab.sim.files import make_folder
    make_folder(root, "root")                        # yours, not others' to write, not a link (sim/files.py)
    secret_file = family_secret_file(root)           # the run family: every run_local on this folder
    logs = os.path.join(root, "torchrun-logs")         # torchrun's own logs (else a torchelastic_* temp folder)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--log-dir", logs, "--nnodes", "1", "--node-rank", "0",
           "--rdzv-backend", "static", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--nproc-per-node",
           str(nproc),
           "--max-restarts", str(max_restarts), "--monitor-interval", "0.1", "-m", "distlab.runtime.restart.elastic",
           "--dir", root] + [f"--{k.replace('_', '-')}={v}" for k, v in asdict(spec).items()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env={**ELASTIC_ENV, **{k: v for k, v in os.environ.items() if k != SECRET_ENV},
                                 "OMP_NUM_THREADS": "1", SECRET_FILE_ENV: secret_file})
    try:
        output = proc.communicate(timeout=timeout)[0]
    except BaseException:
        from distlab.runtime.ranks.multinode import _end
        _end(proc)
        raise
    from distlab.runtime.ranks.multinode import _kill_session
    from distlab.sim.io import read_text
    _kill_session(proc)
    summary_path, final_path = os.path.join(root, "summary.json"), os.path.join(root, "final.pt")
    summary = json.loads(read_text(summary_path, "summary")) if os.path.exists(summary_path) else None
    final = torch.load(final_path, weights_only=True) if os.path.exists(final_path) else None   # tensors only
    return {"returncode": proc.returncode, "output": output, "summary": summary, "final": final}


PROG = "python -m distlab.runtime.restart.elastic"
THREADS_ENV = "DISTLAB_TEST_THREADS_FILE"


def _note_threads(root: str, rank: int) -> None:
    """The test hook (module docstring): this process's thread names, after ``train`` returned."""
    path = os.environ.get(THREADS_ENV)
    if path:
        names = []
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        _event(path, dir=root, rank=rank, attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
               threads=names)


def main(argv: list[str] | None = None) -> int:
    from distlab.runtime.restart.checkpoint import CheckpointError
    from distlab.sim.cli import Parser
    from distlab.sim.errors import ConfigError, OutputError
    from distlab.sim.io import check_output
    p = Parser(prog=PROG, description="Elastic training with DCP checkpoints (run it under torchrun).")
    p.add_argument("--dir", required=True, help="checkpoints, events.jsonl, final.pt and summary.json go here "
                   "(created if missing; its parent must exist)")
    for name, value in asdict(TrainSpec()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = vars(p.parse_args(argv))
    root = args.pop("dir")
    try:
        from distlab.sim.files import make_folder
        check_output(root, "--dir", "dir")
        make_folder(root, "--dir")           # yours (or root's), not writable by others, not a link (sim/files.py)
        done = train(TrainSpec(**args), root)
        _note_threads(root, done["rank"])
        return 0
    except ConfigError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2
    except (CheckpointError, OutputError) as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 1


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)        # past the process group's end, skip the interpreter's teardown of torch's C++ objects
