"""Sharded checkpoints with torch.distributed.checkpoint (DCP): ``DIR/step_000004/`` per saved step.

``save`` is a collective: every rank writes its own file (``__R_0.distcp``) in parallel; tensors every rank
holds alike (a replicated model) are written once, by one rank each (DCP's default planner deduplicates them,
spreading the bytes over the ranks); rank 0 writes ``.metadata`` last, so a folder with ``.metadata`` is a
complete checkpoint and one without it (a save cut short by a failure) is ignored by ``latest``.
The model and optimizer state go through torch.distributed.checkpoint.state_dict (``get_state_dict`` /
``set_state_dict``: keys by parameter name, the optimizer's state created before loading into it).
"""
from __future__ import annotations

import os
import re
import time

_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step:06d}")


def latest(root: str) -> int | None:
    """The last step with a complete checkpoint in ``root`` (None if there is none)."""
    steps = []
    if os.path.isdir(root):
        for name in os.listdir(root):
            m = _STEP_DIR.match(name)
            if m and os.path.exists(os.path.join(root, name, ".metadata")):
                steps.append(int(m.group(1)))
    return max(steps, default=None)


def save(root: str, step: int, model, optimizer, extra: dict | None = None) -> dict:
    """Write the checkpoint of ``step`` (all ranks call it). Returns {time_s, bytes (this rank's files)}."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    t0 = time.perf_counter()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    path = step_dir(root, step)
    dcp.save({"model": model_sd, "optim": optim_sd, **(extra or {})}, checkpoint_id=path)
    elapsed = time.perf_counter() - t0
    import torch.distributed as dist
    rank = dist.get_rank() if dist.is_initialized() else 0
    mine = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.startswith(f"__{rank}_"))
    return {"step": step, "time_s": elapsed, "bytes": mine}


def load(root: str, step: int, model, optimizer) -> float:
    """Load the checkpoint of ``step`` into ``model`` and ``optimizer`` in place (all ranks). Seconds taken."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    t0 = time.perf_counter()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=step_dir(root, step))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return time.perf_counter() - t0


def state_bytes(model, optimizer) -> int:
    """Bytes of the model's parameters and buffers plus the optimizer's tensors: what a checkpoint holds."""
    import torch
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for state in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return total
