"""Real runs for lesson 08 (pitfalls): data sharding, checkpoints and seeds on real ranks; a hang caught by the
flight recorder and named by `distlab diagnose`; barriers against a straggler, measured with the executor.

Each function starts fresh Gloo ranks through runtime.ranks.launch and returns plain Python data;
sim/lessons/pitfalls.py builds the matching plans and turns the results into tables.
"""
from __future__ import annotations

import os


# --- DistributedSampler, set_epoch, saving on rank 0, seeds: one launch -----------------------------------------
def data_pitfalls(nproc: int = 4, samples: int = 16, odd_samples: int = 18, base_seed: int = 1234,
                  checkpoint: str = "work/08_checkpoint.pt") -> list[dict]:
    """Per rank: the sample indices it sees without a sampler, with DistributedSampler without and with
    set_epoch (2 epochs each), len(sampler) for ``odd_samples``, the checkpoint keys, and random draws under a
    shared seed and under base_seed + rank, with the first weight before and after DDP."""
    from distlab.runtime.ranks.launch import TRAINING, launch
    payload = {"samples": samples, "odd": odd_samples, "seed": base_seed, "checkpoint": os.path.abspath(checkpoint)}
    from distlab.sim.files import make_folder
    make_folder(os.path.dirname(payload["checkpoint"]), "checkpoint")     # checked as every output folder
    # DDP's constructor imports torch._dynamo (~0.6 s of CPU per rank): the fork server imports it once
    return launch("distlab.runtime.lessons.pitfalls:_data_task", payload, nproc, backend="gloo", timeout=60,
                  preload=TRAINING)


def _data_task(ctx, p):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    rank, world = ctx.rank, ctx.world_size
    ds = TensorDataset(torch.arange(p["samples"]))

    def epochs(loader, sampler=None, set_epoch=False):
        out = []
        for epoch in range(2):
            if set_epoch:
                sampler.set_epoch(epoch)
            out.append([int(i) for (batch,) in loader for i in batch])
        return out
    torch.manual_seed(0)
    naive = epochs(DataLoader(ds, batch_size=4, shuffle=True))
    s1 = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    fixed = epochs(DataLoader(ds, batch_size=2, sampler=s1), s1)
    s2 = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    moving = epochs(DataLoader(ds, batch_size=2, sampler=s2), s2, set_epoch=True)
    odd = DistributedSampler(TensorDataset(torch.arange(p["odd"])), num_replicas=world, rank=rank)
    # seeds: one seed everywhere, then base_seed + rank
    torch.manual_seed(p["seed"])
    shared = torch.rand(3).tolist()
    torch.manual_seed(p["seed"] + rank)
    own = torch.rand(3).tolist()
    model = torch.nn.Linear(4, 2)                        # initialised from base_seed + rank: differs per rank
    before = float(model.weight[0, 0])
    ddp = DDP(model)                                     # broadcasts rank 0's parameters and buffers
    after = float(model.weight[0, 0])
    # checkpoints: only rank 0 writes, the unwrapped module's state, and the others wait before reading
    if rank == 0:
        torch.save(ddp.module.state_dict(), p["checkpoint"])
    dist.barrier()
    loaded = torch.load(p["checkpoint"], weights_only=True)      # tensors only: never unpickle code
    same = all(torch.equal(loaded[k], v) for k, v in ddp.module.state_dict().items())
    return {"rank": rank, "naive": naive, "no_set_epoch": fixed, "set_epoch": moving, "odd_len": len(odd),
            "ddp_keys": list(ddp.state_dict()), "module_keys": list(ddp.module.state_dict()),
            "shared_seed": shared, "rank_seed": own, "w_before_ddp": before, "w_after_ddp": after,
            "loaded_equal": same}


# --- the hang: an all_reduce inside `if rank != 3` ------------------------------------------------------------
def skipped_all_reduce(nproc: int = 4, skip: int = 3, timeout: float = 3.0, dump_dir: str = "work/08_flight"):
    """Run the buggy program (below) with a short timeout; returns (RunFailed, the diagnosis of its flight
    records: runtime.commands.diagnose.diagnose), or (None, None) if it did not hang."""
    from distlab.runtime.commands.diagnose import diagnose
    from distlab.runtime.diagnosis.flight_read import load_dir
    from distlab.runtime.ranks.launch import RunFailed, launch
    try:
        launch("distlab.runtime.lessons.pitfalls:_skip_task", {"skip": skip}, nproc, backend="gloo", timeout=timeout,
               dump_dir=dump_dir, grace=timeout)
    except RunFailed as e:
        return e, diagnose(load_dir(dump_dir))
    return None, None


def _skip_task(ctx, p):
    import torch
    import torch.distributed as dist
    ctx.flight.watch_dist()                              # record this task's own dist.* calls
    grad, loss = torch.ones(1024), torch.tensor([float(ctx.rank)])
    dist.all_reduce(grad)                                # every rank: average the gradients
    if ctx.rank != p["skip"]:                            # the bug: rank 3 "has nothing to log"
        dist.all_reduce(loss)
    dist.barrier()                                       # e.g. before saving a checkpoint
    return ctx.rank


# --- barriers and a straggler, measured -------------------------------------------------------------------------
def run_plans(plans: dict, nproc: int = 4) -> dict:
    """Execute each plan (name -> sim.plan.Plan) once, in one launch; name -> measured Trace."""
    from distlab.runtime.execute.executor import merge_results
    from distlab.runtime.ranks.launch import launch
    names = list(plans)
    results = launch("distlab.runtime.lessons.pitfalls:_plans_task", {"plans": [plans[n].to_dict() for n in names]}, nproc,
                     backend="gloo", timeout=60)
    return {n: merge_results(plans[n], [r[k] for r in results]) for k, n in enumerate(names)}


def _plans_task(ctx, p):
    from distlab.runtime.execute.executor import Executor
    from distlab.runtime.execute.clock import start_barrier
    from distlab.sim.plan import Plan
    out = []
    for d in p["plans"]:
        ex = Executor(Plan.from_dict(d), ctx)
        ex.run()                                          # warm-up: calibrates the matmuls
        zero = start_barrier(ctx, 0.0)
        out.append({"rank": ctx.rank, "runs": [{"zero": zero, "ops": [list(x) for x in ex.run()]}],
                    "complete": True, "backend": ctx.backend})
    return out
