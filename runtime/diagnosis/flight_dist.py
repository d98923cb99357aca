"""Record a task's own torch.distributed collectives in its flight recorder (runtime/diagnosis/flight.py).

``patch(recorder)`` replaces the module functions (dist.all_reduce, broadcast, reduce, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single, barrier) by wrappers that record each call, with bytes counted as a
plan counts them (sim/plan.py): a blocking call stays ``issued`` until it returns; an async one is ``started``
once handed to the backend and ``completed`` when its work handle's wait() returns.
"""
from __future__ import annotations

from distlab.sim.plan import COLLECTIVES, DTYPE_BYTES

# torch function -> (plan op, which tensor argument counts: 0 the first, 1 the second, None no tensor)
FUNCTIONS = {"all_reduce": ("all_reduce", 0), "broadcast": ("broadcast", 0), "reduce": ("reduce", 0),
             "all_gather_into_tensor": ("all_gather", 0), "reduce_scatter_tensor": ("reduce_scatter", 1),
             "all_to_all_single": ("all_to_all", 1), "barrier": ("barrier", None)}


class _Work:
    def __init__(self, work, recorder, rec):
        self._work, self._recorder, self._rec = work, recorder, rec

    def wait(self, *args, **kwargs):
        out = self._work.wait(*args, **kwargs)
        self._recorder.completed(self._rec)
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


def patch(recorder) -> None:
    import torch.distributed as dist
    for name, (op, which) in FUNCTIONS.items():
        real = getattr(dist, name)
        if getattr(real, "_distlab_flight", False):
            continue
        setattr(dist, name, _wrapper(dist, recorder, real, op, which))


def _wrapper(dist, recorder, real, op, which):
    root_arg = {"broadcast": "src", "reduce": "dst"}.get(op)
    code = COLLECTIVES.index(op)
    dtypes = list(DTYPE_BYTES)

    def wrapped(*args, **kwargs):
        group = kwargs.get("group")
        ranks = dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
        key = recorder.key(ranks, "")
        nbytes, dtype = 0, "float32"
        if which is not None:
            t = args[which] if len(args) > which else kwargs.get(("tensor", "input")[which] if op != "all_gather"
                                                                  else "output_tensor")
            if t is not None:
                nbytes, dtype = t.numel() * t.element_size(), str(t.dtype).removeprefix("torch.")
        root = kwargs.get(root_arg, args[1] if root_arg and len(args) > 1 else 0) if root_arg else 0
        rec = recorder.issued(key, code, nbytes, dtypes.index(dtype) if dtype in dtypes else 255, root)
        work = real(*args, **kwargs)
        if kwargs.get("async_op"):
            recorder.started(rec)
            return _Work(work, recorder, rec)
        recorder.completed(rec)
        return work
    wrapped._distlab_flight = True
    wrapped.__name__ = real.__name__
    return wrapped
