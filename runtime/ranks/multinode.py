"""`distlab run PLAN --nnodes N --node-rank K --rdzv-endpoint HOST:PORT`: this node's share of a multi-node run.

It starts torchrun (``python -m torch.distributed.run``) with static rendezvous and distlab's worker on this node
(run the same command on every node, with its own --node-rank and the same DISTLAB_RUN_SECRET or
DISTLAB_RUN_SECRET_FILE: the ranks present it to rank 0's store, runtime/ranks/rendezvous.py), watches it, and turns its
failures into one line:

- the rendezvous endpoint cannot be reached, or not all N nodes join it, within ``--timeout`` seconds
  (torchrun's ``--rdzv-conf join_timeout=T,read_timeout=T``): exit 2;
- the nodes disagree on the world size (N x nproc-per-node is not the plan's world size): every rank refuses
  the plan before joining the process group: exit 2;
- a rank fails during the run: exit 1 with the rank's error;
- a process that does not present the run's secret connects to rank 0's store: exit 1, naming its address.
torchrun runs in a new session, SIGTERMed then SIGKILLed on Ctrl-C or SIGTERM; its ranks (each in a session of
its own, as torchrun starts them) die with it (PR_SET_PDEATHSIG, runtime/ranks/worker.py), so nothing is left running. Rank 0 writes the one merged trace, aligned to its clock (runtime/execute/clock.py), on its
node; the other nodes write nothing.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from distlab.sim.errors import ConfigError

# torchrun's agent shares its rendezvous TCPStore with the ranks by default; after a restart the new ranks can
# read keys the previous attempt left there (Gloo or NCCL addresses of dead ranks) and fail to connect
# (pytorch/pytorch#135712). A store per attempt avoids it: set this for every torchrun with --max-restarts.
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

WORKER_MODULE = "distlab.runtime.ranks.worker"


@dataclass
class NodeSpec:
    nnodes: int
    node_rank: int
    rdzv_endpoint: str          # HOST:PORT of the rendezvous, served by node 0's torchrun agent
    nproc_per_node: int
    max_restarts: int = 0
    timeout_s: float = 60.0     # to join the rendezvous, and for a rank to wait on a peer

    def check(self) -> None:
        if not isinstance(self.nnodes, int) or self.nnodes < 1:
            raise ConfigError(f"{self.nnodes!r} must be a whole number of nodes >= 1", "--nnodes")
        if not isinstance(self.node_rank, int) or not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"{self.node_rank!r} must be a whole number in 0..{self.nnodes - 1}", "--node-rank")
        host, _, port = (self.rdzv_endpoint or "").rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{self.rdzv_endpoint!r} is not HOST:PORT (e.g. node0.cluster:29500)",
                              "--rdzv-endpoint")
        if self.max_restarts < 0:
            raise ConfigError(f"{self.max_restarts!r} must be a whole number >= 0", "--max-restarts")
        if not self.timeout_s > 0:
            raise ConfigError(f"{self.timeout_s!r} must be a number of seconds > 0", "--timeout")


def torchrun_command(spec: NodeSpec, module: str, args: list[str], log_dir: str | None = None) -> list[str]:
    """The torchrun command line this node runs: static rendezvous (node 0's agent serves it at the endpoint; the
    nodes' ranks are their --node-rank; it times out after timeout_s). Not c10d: its rendezvous unpickles the
    state it reads from its store, so anyone who reaches the endpoint could run code in every agent
    (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py); the static one exchanges JSON. ``log_dir``:
    torchrun's own log folder (without one it leaves a torchelastic_* folder in the temp folder)."""
    t = max(1, int(round(spec.timeout_s)))
    logs = ["--log-dir", log_dir] if log_dir else []
    return [sys.executable, "-m", "torch.distributed.run", *logs, "--nnodes", str(spec.nnodes),
            "--nproc-per-node", str(spec.nproc_per_node), "--node-rank", str(spec.node_rank),
            "--rdzv-backend", "static", "--rdzv-endpoint", spec.rdzv_endpoint,
            "--rdzv-conf", f"timeout={t}", "--max-restarts", str(spec.max_restarts),
            "-m", module, *args]


# torchrun's failures, read from its output -> (exit code, where, message)
_WORKER_ERROR = re.compile(r"^distlab\.runtime\.[\w.]+: error: (.*)$", re.M)


def explain(log: str, spec: NodeSpec) -> tuple[int, str]:
    """(exit code, one line) for a torchrun that ended with an error, from its output."""
    m = _WORKER_ERROR.search(log)
    if m:
        return (1 if m.group(1).startswith(("refused ", "watchdog: ")) else 2), m.group(1)
    t = f"{spec.timeout_s:g} s"
    if "RendezvousTimeoutError" in log or "waiting for clients" in log:
        return 2, (f"--rdzv-endpoint: not all {spec.nnodes} nodes joined the rendezvous at {spec.rdzv_endpoint} "
                   f"within {t} (is every node started, with the same --nnodes and --rdzv-endpoint?)")
    if "RendezvousConnectionError" in log or "DistNetworkError" in log or "RendezvousClosedError" in log:
        return 2, (f"--rdzv-endpoint: cannot reach the rendezvous at {spec.rdzv_endpoint} within {t} (is the "
                   f"host right, the port open, node 0 started?)")
    errors = [m.group(0) for m in re.finditer(r"\b\w*(?:Error|Exception): .+", log)
              if not m.group(0).startswith("ChildFailedError")]
    return 1, "a rank failed: " + (errors[0][:300] if errors else "see torchrun's output (-v)")


def run_node(spec: NodeSpec, module: str, args: list[str], verbose: bool = False,
             prog: str = "distlab run") -> int:
    """Run this node's torchrun to the end; print the workers' summary lines, or one error line."""
    spec.check()
    with tempfile.TemporaryDirectory(prefix="distlab-torchrun-") as logs:     # torchrun's logs, removed after
        return _run_node(spec, torchrun_command(spec, module, args, logs), verbose, prog)


def _run_node(spec: NodeSpec, cmd: list[str], verbose: bool, prog: str) -> int:
    if verbose:
        sys.stderr.write(f"{prog}: {' '.join(cmd)}\n")
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**ELASTIC_ENV, **os.environ})
        old = signal.signal(signal.SIGTERM, _interrupt) if _main_thread() else None
        try:
            rc = proc.wait()
        except BaseException:           # Ctrl-C or SIGTERM: torchrun stops its ranks on SIGTERM
            _end(proc)
            raise
        finally:
            if old is not None:
                signal.signal(signal.SIGTERM, old)
        _kill_session(proc)
        log.seek(0)
        text = log.read()
    if verbose:
        sys.stderr.write(text)
    if rc == 0:
        for line in text.splitlines():
            if line.startswith(("wrote ", "clocks:", "elastic:")):
                print(line)
            elif line.startswith('{"schema": '):          # the worker's --json, one line: printed indented
                sys.stdout.write(json.dumps(json.loads(line), indent=2) + "\n")
        return 0
    code, message = explain(text, spec)
    sys.stderr.write(f"{prog}: error: {message}\n")
    return code


def _interrupt(signum, frame):
    raise KeyboardInterrupt("SIGTERM")          # the CLI exits 143 for it (sim/cli.py), 130 for Ctrl-C


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _end(proc, grace_s: float = 5.0) -> None:
    """SIGTERM torchrun (its agent then ends its ranks, which also die with it: PR_SET_PDEATHSIG), then
    SIGKILL what is left of its session."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    _kill_session(proc)


def _kill_session(proc) -> None:
    """SIGKILL torchrun's whole session (its agent and every rank it started), then reap torchrun."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_plan_on_node(args) -> int:
    """`distlab run` with --nnodes: the plan's ranks spread over the nodes, this node's share started here."""
    from distlab.runtime.commands.common import parse_nproc
    from distlab.sim.plan import Plan
    if args.node_rank is None or args.rdzv_endpoint is None:
        raise ConfigError("--nnodes needs --node-rank and --rdzv-endpoint", "--nnodes")
    NodeSpec(args.nnodes, args.node_rank, args.rdzv_endpoint, 1, timeout_s=args.timeout).check()
    from distlab.runtime.ranks.secret import run_secret
    run_secret()                       # every node's ranks must present the same secret (runtime/ranks/rendezvous.py)
    plan = Plan.load(args.plan)
    nproc = parse_nproc(args.nproc) if args.nproc is not None else plan.world_size // args.nnodes
    if nproc < 1 or nproc * args.nnodes != plan.world_size:
        raise ConfigError(f"the plan has {plan.world_size} ranks; --nnodes {args.nnodes} x --nproc {nproc} "
                          f"must equal it", "--nproc")
    spec = NodeSpec(args.nnodes, args.node_rank, args.rdzv_endpoint, nproc, timeout_s=args.timeout)
    return run_node(spec, WORKER_MODULE, worker_args(args), args.verbose)


def worker_args(args) -> list[str]:
    """`distlab run`'s options as the arguments of runtime/ranks/worker.py's ``run_torchrun``."""
    out = args.out or os.path.splitext(args.plan)[0] + ".measured.trace"
    worker = [os.path.abspath(args.plan), "--out", os.path.abspath(out), "--backend", args.backend,
              "--threads", str(args.threads), "--timeout", str(args.timeout), "--warmup", str(args.warmup),
              "--repeat", str(args.repeat)]
    if args.dump_dir:
        worker += ["--dump-dir", args.dump_dir]
    return worker + (["--no-check"] if args.no_check else []) + (["--json"] if args.json else [])
