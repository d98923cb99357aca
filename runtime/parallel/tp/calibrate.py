"""Calibration for tensor parallelism, measured on the ranks in the same launch as the TP steps (runtime/parallel/tp/run.py);
the cluster fitted to it on the host: runtime/parallel/tp/fit.py (runtime/parallel/tp/validate.py uses it).

On the ranks (``Calibrator``), one round before each captured TP step, so that load from other processes falls on
both alike: each collective of the plan at its own sizes on the tp group, issued as DTensor issues it (torch's
functional collectives, float32; timed from the issue to ``wait_tensor``) in the step's duty cycle: one barrier,
then CHAIN calls each after GAP_OPS small local ops (a step of the plan dispatches about that many ops between two
collectives), the mean over the chain (a step's collectives add up, so it pays the mean call, the tails included: in
PP x TP's steps a call's median is ~0.4 ms and its mean ~1 ms, some calls taking 3-6 ms while the cores are
oversubscribed; the median fitted PP x TP ~12 points lower). Isolated calls (a barrier before each) are also timed
and reported: with more ranks than free cores, a rank that has just computed must be woken for every ring hop, and
the in-chain call costs several times the isolated one (4 gloo ranks on ~1 free core: ~3 ms vs ~0.5 ms a hop); the
fit uses the in-chain times. DTensor's host work, as CPU time of this thread (``time.thread_time``: the work, not
the wait for a core, which the simulator's processor sharing adds): one transformer block of the model under the
run's own block plan (TP or TP + SP: ``parallelize_module`` hooks, DTensor dispatch and sharding propagation, the
``from_local``/``redistribute``/``to_local`` autograd functions around its collectives) forward+backward, the same
block unparallelized, and each collective kind the block issues as a bare functional collective at the block's
activation size (issue to wait: that CPU is already inside the fitted collective times); the DTensor ops and
collectives of one forward+backward of the block are counted once (runtime/parallel/tp/capture.py CollectiveCapture). Also CPU
time: the unparallelized model's forward+backward on this rank; AdamW on plain tensors the size of this rank's TP
shards.
"""
from __future__ import annotations

import statistics
import time

from distlab.runtime.ranks.preflight import cpu_cores

CHAIN = 8          # calls per in-chain measurement
GAP_OPS = 30       # local ops between two calls (a tiny Llama's TP step: ~1300 dispatched ops, ~40 collectives)


class Calibrator:
    """Rank side. ``sizes``: {op: [bytes, ...]} (all_gather: output bytes, reduce_scatter: input, all_reduce:
    buffer); ``model``: the sim Model; ``group``: the tp process group; ``plan``: the run's block plan and
    ``capture`` its dispatch-mode class (runtime/parallel/tp/run.py block_plan, runtime/parallel/tp/capture.py
    CollectiveCapture); ``fsdp_meshes``:
    (tp mesh, dp_shard mesh) of an FSDP2 x TP run, for FSDP2's host work per unit (:meth:`_fsdp_round`);
    ``root``: the run's root plan (runtime/parallel/tp/run.py root_plan), for the ends' host work (runtime/parallel/tp/ends.py);
    ``calls``: at most this many calls per probe (defaults: CHAIN per chain, 10 per block, 5 per bare collective and
    FSDP2 unit; None keeps them; fewer is noisier, for quick checks)."""

    def __init__(self, sizes: dict, model, group, plan: dict, capture, fsdp_meshes=None, root: dict | None = None,
                 calls: int | None = None):
        import torch
        import torch.distributed as dist

        from distlab.runtime.parallel.tp.model import build_llama
        from distlab.sim.parallel.tp.rules import local_shape
        self.sizes, self.group = sizes, group
        self.calls = calls
        self.n = dist.get_world_size(group)
        torch.manual_seed(0)
        self.module = build_llama(model)
        self.opt = torch.optim.AdamW(self.module.parameters(), lr=1e-4)
        c = model.config
        self.x = torch.randint(0, c["vocab"], (c["micro_batch"], c["seq_len"]))
        numel = [max(1, _prod(local_shape(q, self.n))) for q in model.params]
        self.shards = [torch.zeros(k, requires_grad=True) for k in numel]
        for t in self.shards:
            t.grad = torch.zeros_like(t)
        self.shard_opt = torch.optim.AdamW(self.shards, lr=1e-4)
        self.times = {"collectives": {op: {str(b): [] for b in bs} for op, bs in sizes.items()},
                      "isolated": {op: {str(b): [] for b in bs} for op, bs in sizes.items()},
                      "comm_cpu": {op: {str(b): [] for b in bs} for op, bs in sizes.items()},
                      "comm_main": {op: {str(b): [] for b in bs} for op, bs in sizes.items()},
                      "fwd_bwd": [], "optimizer": [], "block_tp": [], "block_local": [],
                      "block_collectives": {}, "cores": cpu_cores()}
        self.gap = torch.ones(c["micro_batch"], max(1, c["seq_len"] // self.n), c["hidden"])
        self._block_setup(c, plan, capture)
        self.ends = None
        if root is not None:
            from torch.distributed.device_mesh import DeviceMesh

            from distlab.runtime.parallel.tp.ends import EndsProbe
            self.ends = EndsProbe(model, DeviceMesh.from_group(group, "cpu"), root, capture)
            self.times.update({"ends": {k: [] for k in self.ends.ops}, "ends_ops": self.ends.ops})
        self.fsdp_block = None
        if fsdp_meshes is not None:
            self._fsdp_setup(c, plan, *fsdp_meshes)
        self._local_step()                         # warm-up

    def _block_setup(self, c: dict, plan: dict, capture) -> None:
        """The probe of DTensor's host work: one transformer block of the model with the run's block ``plan``
        (runtime/parallel/tp/run.py block_plan: TP or TP + SP) on the tp group, the same block unparallelized, and the
        DTensor ops and collectives one forward+backward of the parallel block dispatches, counted once by
        ``capture`` (runtime/parallel/tp/capture.py CollectiveCapture; the same counts as sim/parallel/tp/plan.py DTENSOR_OPS)."""
        import torch
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor.parallel import parallelize_module

        from distlab.runtime.parallel.tp.model import Block
        torch.manual_seed(0)
        mesh = DeviceMesh.from_group(self.group, "cpu")
        self.block = parallelize_module(Block(c, torch.float32), mesh, plan)
        self.block_plain = Block(c, torch.float32)
        sp = "norm1" in plan                                  # SP: the block's input is Shard(1) of the sequence
        seq = c["seq_len"] // self.n if sp else c["seq_len"]
        self.block_x = torch.ones(c["micro_batch"], seq, c["hidden"], requires_grad=True)
        self.plain_x = torch.ones(c["micro_batch"], c["seq_len"], c["hidden"], requires_grad=True)
        self.block_bytes = 4 * c["micro_batch"] * c["seq_len"] * c["hidden"]
        self._block_step(self.block, self.block_x)                 # warm-up (sharding propagation caches)
        cap = capture()
        with cap:
            self._block_step(self.block, self.block_x)
        self.times["block_ops"] = sum(cap.dtensor_ops.values())
        self.times["block_calls"] = [k for k, *_ in cap.calls]
        self._optimizer_setup(mesh)

    def _optimizer_setup(self, mesh) -> None:
        """AdamW on DTensors: the TP shards of ``self.shards`` as parameters Shard(0) on the tp ``mesh`` (their
        gradients too), timed in :meth:`round` beside ``shard_opt``'s step on the same local tensors plain."""
        import torch
        from torch.distributed.tensor import DTensor, Shard
        params = []
        for t in self.shards:
            q = torch.nn.Parameter(DTensor.from_local(t.detach().clone(), mesh, [Shard(0)], run_check=False))
            q.grad = DTensor.from_local(torch.zeros_like(t), mesh, [Shard(0)], run_check=False)
            params.append(q)
        self.dtensor_opt = torch.optim.AdamW(params, lr=1e-4)
        self.times.update(optimizer_dtensor=[], optimizer_params=len(params))
        self.dtensor_opt.step()                                 # warm-up (state, sharding propagation caches)
        self.shard_opt.step()

    def _fsdp_setup(self, c: dict, plan: dict, tp_mesh, dp_mesh) -> None:
        """The same block as an FSDP2 x TP unit: ``parallelize_module`` on the run's tp mesh, then ``fully_shard``
        on its dp_shard mesh (the run's order, runtime/parallel/tp/run.py), and the TP block again on that tp mesh."""
        import torch
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module

        from distlab.runtime.parallel.tp.model import Block
        torch.manual_seed(0)
        self.fsdp_tp_block = parallelize_module(Block(c, torch.float32), tp_mesh, plan)
        self.fsdp_block = fully_shard(parallelize_module(Block(c, torch.float32), tp_mesh, plan), mesh=dp_mesh)
        self.times["fsdp_forward"], self.times["fsdp_backward"] = [], []
        for m in (self.fsdp_tp_block, self.fsdp_block):
            self._block_step(m, self.block_x)                              # warm-up (FSDP2's lazy init)

    def _at_most(self, default: int) -> int:
        """``default`` calls, or fewer where ``calls`` asks for fewer (at least 1)."""
        return default if self.calls is None else max(1, min(default, self.calls))

    def _fsdp_round(self, calls: int = 5) -> None:
        """FSDP2's host CPU (this thread) per unit, forward and backward apart: the FSDP2 x TP block minus the
        TP block, each the median of ``calls`` steps (its blocking gloo all-gathers and reduce-scatters wait
        without CPU; their copies are in it, an upper bound)."""
        calls = self._at_most(calls)

        def split(module):
            fwd, bwd = [], []
            for _ in range(calls):
                module.zero_grad(set_to_none=True)
                t0 = time.thread_time()
                y = module(self.block_x).sum()
                t1 = time.thread_time()
                y.backward()
                fwd.append(t1 - t0)
                bwd.append(time.thread_time() - t1)
            return statistics.median(fwd), statistics.median(bwd)
        (tf, tb), (ff, fb) = split(self.fsdp_tp_block), split(self.fsdp_block)
        self.times["fsdp_forward"].append(max(ff - tf, 0.0))
        self.times["fsdp_backward"].append(max(fb - tb, 0.0))

    @staticmethod
    def _block_step(module, x) -> None:
        module.zero_grad(set_to_none=True)          # as a training step finds them (optimizer.zero_grad)
        module(x).sum().backward()

    def _block_round(self) -> None:
        """CPU seconds per call: the parallel block, the plain block, each collective kind it issues (funcol,
        issue to wait, at the size of the block's activation X; a bare issue's CPU, inside the fitted
        collective time already)."""
        import torch.distributed as dist
        dist.barrier(group=self.group)
        self.times["block_tp"].append(_cpu_per_call(lambda: self._block_step(self.block, self.block_x),
                                                          self._at_most(10)))
        self.times["block_local"].append(_cpu_per_call(lambda: self._block_step(self.block_plain, self.plain_x),
                                                             self._at_most(10)))
        kinds = set(self.times["block_calls"]) | (self.ends.kinds() if self.ends else set())
        bare = self._at_most(5)
        for op in sorted(kinds):
            self.times["block_collectives"].setdefault(op, []).append(statistics.median(
                self._collective(op, self.block_bytes, barrier=False, clock=time.thread_time) for _ in range(bare)))
        if self.ends:
            issue = {op: v[-1] for op, v in self.times["block_collectives"].items()}
            for key, host in self.ends.round(issue).items():
                self.times["ends"][key].append(host)

    def _local_step(self) -> float:
        """CPU seconds (this thread's) of the unparallelized forward+backward."""
        import torch.nn.functional as F
        t0 = time.thread_time()
        logits = self.module(self.x)
        F.cross_entropy(logits.flatten(0, 1).float(), self.x.roll(-1, 1).flatten()).backward()
        t = time.thread_time() - t0
        self.opt.zero_grad(set_to_none=True)
        return t

    def round(self) -> None:
        import torch.distributed as dist
        chain = self._at_most(CHAIN)
        for op, table in self.times["collectives"].items():
            for size, times in table.items():
                process, thread = time.process_time(), time.thread_time()
                mean, main = self._chain(op, int(size), chain)
                times.append(mean)
                self.times["comm_cpu"][op][size].append(
                    (time.process_time() - process - (time.thread_time() - thread)) / chain)
                self.times["comm_main"][op][size].append(main / chain)
                self.times["isolated"][op][size].append(self._collective(op, int(size)))
        dist.barrier()
        self._block_round()
        if self.fsdp_block is not None:
            self._fsdp_round()
        self.times["fwd_bwd"].append(self._local_step())
        t0 = time.thread_time()
        self.shard_opt.step()
        self.times["optimizer"].append(time.thread_time() - t0)
        t0 = time.thread_time()
        self.dtensor_opt.step()
        self.times["optimizer_dtensor"].append(time.thread_time() - t0)

    def _collective(self, op: str, nbytes: int, barrier: bool = True, clock=time.perf_counter) -> float:
        import torch
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol
        n, g = self.n, self.group
        numel = max(nbytes // 4 // n * n, n)
        big, small = torch.ones(numel), torch.ones(numel // n)
        if barrier:
            dist.barrier(group=g)
        t0 = clock()                   # the functional collectives DTensor issues, issue to wait
        if op == "all_gather":
            out = funcol.all_gather_tensor(small, 0, g)
        elif op == "reduce_scatter":
            out = funcol.reduce_scatter_tensor(big, "sum", 0, g)
        else:
            out = funcol.all_reduce(big, "sum", g)
        funcol.wait_tensor(out)
        return clock() - t0

    def _chain(self, op: str, nbytes: int, calls: int = CHAIN) -> tuple[float, float]:
        """(mean time of one call among ``calls`` calls (CHAIN), each after GAP_OPS local ops (module docstring);
        this thread's CPU in those calls together, issue to wait)."""
        import torch.distributed as dist
        dist.barrier(group=self.group)
        times, main = [], 0.0
        for _ in range(calls):
            y = self.gap
            for _ in range(GAP_OPS):
                y = y * 1.0001
            t0 = time.thread_time()
            times.append(self._collective(op, nbytes, barrier=False))
            main += time.thread_time() - t0
        return statistics.mean(times), main

    def results(self) -> dict:
        return self.times


def _cpu_per_call(fn, calls: int = 50) -> float:
    """This thread's CPU seconds per call of ``fn`` (time.thread_time: the work, not the wait for a core)."""
    fn()
    t0 = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - t0) / calls


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def plan_sizes(plan) -> dict:
    """{op: sorted distinct bytes} of ``plan``'s tp collectives, plus 8 x the largest (a second point for the fit)."""
    from distlab.sim.plan import Collective
    out: dict = {}
    for ops in plan.ranks:
        for o in ops:
            if isinstance(o, Collective) and o.name.startswith("tp "):
                out.setdefault(o.op, set()).add(o.bytes)
    return {op: sorted(v | {8 * max(v)}) for op, v in out.items()}
