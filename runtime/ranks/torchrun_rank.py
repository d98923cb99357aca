"""A distlab command run as one rank of a torchrun job: `distlab bench`, `calibrate`, `validate` (and `run`)
across nodes (issue 20). The same command on every node:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0:29500 \\
        -m distlab.runtime.cli bench --sizes 1MiB:1GiB --out bench.json

torchrun starts N x G processes, each running the command. Where the command would start its own local ranks
(runtime/ranks/launch.py's ``Launch``), each process becomes one of them instead (``TorchrunRank``): it joins
torchrun's process group (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT from torchrun's environment), runs
the same task (runtime/measure/sweep.py's ``sweep_task``), and global rank 0 gathers every rank's result. Rank 0 alone
goes on to fit, print and write; the other ranks end their command there with exit code 0 and print nothing
on stdout (``quiet_other_ranks``). The world size is torchrun's: ``--nproc`` may be left out or must equal it,
and world sizes torchrun did not start (validate's held-out world sizes) cannot be measured in the same job.
torchrun sets TORCHELASTIC_RUN_ID in every rank's environment (torch/distributed/elastic/agent/server/
local_elastic_agent.py); distlab's own launcher does not, so that variable tells the two apart.
"""
from __future__ import annotations

import os
import sys

from distlab.sim.errors import ConfigError

_GROUP: dict = {}           # the process group's Context, joined once per process and reused by later commands


def under_torchrun() -> bool:
    """True in a process torchrun started (it sets TORCHELASTIC_RUN_ID)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def quiet_other_ranks() -> None:
    """Under torchrun, every rank but global rank 0 prints nothing on stdout (errors still go to stderr)."""
    if under_torchrun() and global_rank() != 0 and not getattr(sys.stdout, "distlab_quiet", False):
        sys.stdout = open(os.devnull, "w")
        sys.stdout.distlab_quiet = True


def join_group(backend: str = "auto", threads: int = 1, timeout: float = 60.0):
    """This process's Context (runtime/ranks/worker.py) in torchrun's process group: joined on the first call, reused
    by every later command of the process, left at exit (``_leave_group``)."""
    if "ctx" not in _GROUP:
        import atexit

        from distlab.runtime.execute.clock import install_test_shift
        from distlab.runtime.ranks.worker import _die_with_parent, init
        install_test_shift()                    # the tests' clock shift of one node, as runtime/ranks/worker.py's
        _die_with_parent(os.getppid())          # torchrun's agent: if it dies, so does this rank
        _GROUP["ctx"] = init(backend, threads, timeout)
        atexit.register(_leave_group)
    return _GROUP["ctx"]


def _leave_group() -> None:
    """At exit, every rank waits for the others (rank 0 last: it writes the results) and leaves the process group:
    a rank that exits with the group still up, its peers' sockets closing under it, may abort (SIGABRT)."""
    import torch.distributed as dist
    if dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:          # noqa: BLE001 - a peer already gone: nothing left to wait for
            pass


def world_sizes(text, default: str, where: str = "--nproc") -> list[int]:
    """The world sizes to measure: ``text`` (or ``default``) as a list; under torchrun [WORLD_SIZE], and a
    ``text`` naming any other world size is a ConfigError."""
    from distlab.runtime.commands.common import parse_nprocs
    if not under_torchrun():
        return parse_nprocs(default if text is None else text, where)
    world = int(os.environ["WORLD_SIZE"])
    if text is not None and parse_nprocs(text, where) != [world]:
        raise ConfigError(f"{text!r}: torchrun started {world} ranks (WORLD_SIZE), the only world size this job "
                          f"can measure; leave {where} out or give {world}", where)
    return [world]


def new_launch(target: str, payload, nproc: int, **options):
    """runtime.ranks.launch.Launch(target, payload, nproc, **options), or this process's share of it under torchrun."""
    if under_torchrun():
        return TorchrunRank(target, payload, nproc, **options)
    from distlab.runtime.ranks.launch import Launch
    return Launch(target, payload, nproc, **options)


class TorchrunRank:
    """Launch's interface (start, polls, partial, finish, wait, wait_progress, abort) for one torchrun rank: it
    runs ``target(ctx, payload)`` here; ``finish()`` returns every rank's result on global rank 0 and ends the
    command on the others (SystemExit(0)). A task that raises is RunFailed (exit 1: torchrun then stops the
    other ranks)."""

    def __init__(self, target: str, payload, nproc: int, backend: str = "auto", threads: int = 1,
                 timeout: float = 60.0, verbose: bool = False, warn_cores: str | None = None, **_ignored):
        from distlab.runtime.ranks.launch import check_options, check_plans
        world, local = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if nproc != world:
            raise ConfigError(f"{nproc} ranks asked, but torchrun started {world} (WORLD_SIZE)", "--nproc")
        check_options(local, backend, threads, timeout)       # NCCL: one GPU per rank of this node
        if warn_cores and int(os.environ.get("LOCAL_RANK", "0")) == 0:
            from distlab.runtime.ranks.preflight import warn_cores as warn
            warn(local, threads, warn_cores)
        check_plans(payload)
        self.target, self.payload, self.nproc = target, payload, nproc
        self.backend, self.threads, self.timeout, self.verbose = backend, threads, timeout, verbose
        self.kept: dict = {}
        self.pids = [os.getpid()]
        self._gathered, self._done = None, False

    def start(self) -> "TorchrunRank":
        self.ctx = join_group(self.backend, self.threads, self.timeout)
        if self.verbose:
            sys.stderr.write(f"distlab: rank {self.ctx.rank} of {self.ctx.world_size} pid {os.getpid()} "
                             f"({self.ctx.backend})\n")
        return self

    def polls(self):
        """Run the task on this rank, gather every rank's result on rank 0; one yield when done."""
        from distlab.runtime.ranks.launch import RunFailed
        from distlab.runtime.execute.wire import gather_json
        from distlab.runtime.ranks.worker import load_target
        try:
            result = load_target(self.target)(self.ctx, self.payload)
        except Exception as e:      # noqa: BLE001 - one line; torchrun then ends the other ranks
            message = f"{type(e).__name__}: {e}".strip().splitlines()[0][:500]
            raise RunFailed(self.ctx.rank, f"rank {self.ctx.rank} failed: {message}", {}, {}) from e
        gathered = gather_json(result, dst=0)
        self._gathered, self._done = gathered, True
        yield

    def partial(self, r: int = 0):
        return None                 # results come back once, at the end

    def finish(self) -> list:
        if not self._done:
            for _ in self.polls():
                pass
        if self.ctx.rank != 0:
            raise SystemExit(0)     # rank 0 fits, prints and writes; this rank's part is done
        return self._gathered

    def wait(self, on_poll=None) -> list:
        for _ in self.polls():
            if on_poll is not None:
                on_poll(self)
        return self.finish()

    def wait_progress(self, total: int, description: str, count, enabled: bool = True) -> list:
        return self.wait()

    def abort(self, interrupted: str | None = None) -> dict:
        return self.kept


def one_world_size(text, default: str, where: str = "--nproc") -> int:
    """One world size: ``text`` (or ``default``); under torchrun its WORLD_SIZE (``text``, if given, must equal it)."""
    from distlab.runtime.commands.common import parse_nproc
    if text is not None:
        parse_nproc(text, where)
    return world_sizes(text, default, where)[0]


def local_ranks(nproc: int) -> int:
    """The ranks on this node: LOCAL_WORLD_SIZE under torchrun, else all ``nproc``."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", nproc)) if under_torchrun() else nproc
