"""Values between ranks as JSON bytes in tensors: never pickles.

    every = all_gather_json(ctx_value)            # [rank 0's value, rank 1's, ...] on every rank
    rows = gather_json(result, dst=0)             # the list on rank 0, None elsewhere
    probe = broadcast_json(seconds, src=0)        # rank 0's value on every rank

torch.distributed's ``all_gather_object``, ``gather_object`` and ``broadcast_object_list`` pickle their objects
and unpickle what the other ranks sent (torch/distributed/distributed_c10d.py, ``_object_to_tensor`` and
``_tensor_to_object``; their docstrings warn that a malicious pickle runs code), so a process that joins the
group, or a rank that was tampered with, runs its code in every rank that receives. These helpers move the
same values as UTF-8 JSON in uint8 tensors, with the same collectives the object versions issue (one for the
lengths, one for the padded bytes), so timings and the order of collectives on the group stay as they were.
Values are JSON values: tuples come back as lists, dict keys as strings; floats round-trip exactly (repr).
Tensors live on the device the group's backend needs (CUDA for NCCL, else CPU).
"""
from __future__ import annotations

import json


def _device(group):
    import torch
    import torch.distributed as dist
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _encode(obj, device):
    import torch
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data else \
        torch.zeros(0, dtype=torch.uint8, device=device)


def _decode(tensor, length: int):
    return json.loads(bytes(tensor[:length].cpu().tolist()).decode("utf-8"))


def _lengths(payload, group, device) -> list[int]:
    import torch
    import torch.distributed as dist
    n = dist.get_world_size(group)
    mine = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    every = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(n)]
    dist.all_gather(every, mine, group=group)
    return [int(t.item()) for t in every]


def _padded(payload, size: int, device):
    import torch
    out = torch.zeros(max(size, 1), dtype=torch.uint8, device=device)
    out[:payload.numel()] = payload
    return out


def all_gather_json(obj, group=None) -> list:
    """Every rank's ``obj`` (a JSON value), in rank order, on every rank of ``group``."""
    import torch
    import torch.distributed as dist
    device = _device(group)
    payload = _encode(obj, device)
    lengths = _lengths(payload, group, device)
    size = max(max(lengths), 1)
    every = [torch.zeros(size, dtype=torch.uint8, device=device) for _ in lengths]
    dist.all_gather(every, _padded(payload, size, device), group=group)
    return [_decode(t, n) for t, n in zip(every, lengths)]


def gather_json(obj, dst: int = 0, group=None) -> list | None:
    """Every rank's ``obj`` in rank order on rank ``dst`` (a global rank); None on the others."""
    import torch
    import torch.distributed as dist
    device = _device(group)
    payload = _encode(obj, device)
    lengths = _lengths(payload, group, device)
    size = max(max(lengths), 1)
    me = dist.get_rank()
    every = [torch.zeros(size, dtype=torch.uint8, device=device) for _ in lengths] if me == dst else None
    dist.gather(_padded(payload, size, device), every, dst=dst, group=group)
    return [_decode(t, n) for t, n in zip(every, lengths)] if me == dst else None


def broadcast_json(obj, src: int = 0, group=None):
    """Rank ``src``'s ``obj`` (a JSON value) on every rank; the others pass anything (None)."""
    import torch
    import torch.distributed as dist
    device = _device(group)
    me = dist.get_rank()
    payload = _encode(obj if me == src else None, device)
    length = torch.tensor([payload.numel() if me == src else 0], dtype=torch.int64, device=device)
    dist.broadcast(length, src=src, group=group)
    buf = _padded(payload, int(length.item()), device) if me == src else \
        torch.zeros(max(int(length.item()), 1), dtype=torch.uint8, device=device)
    dist.broadcast(buf, src=src, group=group)
    return _decode(buf, int(length.item()))
