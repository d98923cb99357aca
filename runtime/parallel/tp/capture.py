"""What every collective a rank issues looks like from torch's dispatcher: a TorchDispatchMode that sees the
functional collectives DTensor runs (as torch's CommDebugMode counts them, torch/distributed/tensor/debug/
_comm_mode.py: it lets DTensor desugar first), the c10d ones FSDP2 issues, and pipelining's send/recv.

    from distlab.runtime.parallel.tp.capture import CollectiveCapture
    cap = CollectiveCapture()
    with cap:
        loss = module(x).sum(); loss.backward()
    cap.calls      # [[kind, bytes, dtype, group ranks, phase], ...] in issue order

Its own module (not runtime/parallel/tp/run.py) so that the launcher side of a run (a lesson's kernel, `distlab tp`)
does not import torch: only the ranks, which subclass-check TorchDispatchMode, need it.
"""
from __future__ import annotations

import time

from torch.utils._python_dispatch import TorchDispatchMode

KINDS = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
         "all_reduce": "all_reduce", "all_to_all_single": "all_to_all"}
C10D = {"_allgather_base_": "all_gather", "_reduce_scatter_base_": "reduce_scatter", "allreduce_": "all_reduce"}
P2P = {"send": "send", "recv_": "recv"}


class CollectiveCapture(TorchDispatchMode):
    """Every collective, in issue order: functional ones (DTensor) and c10d ones (FSDP2's all-gather and
    reduce-scatter): [kind, bytes (nccl-tests: AG output, RS input, AR buffer), dtype, group ranks, phase].
    ``phase`` is set by the caller ("forward", "backward", "optimizer"). ``spans``: per call [start, end] in
    perf_counter seconds, from the issue to the ``wait_tensor`` that waits for its result (a functional
    collective runs asynchronously until then), or to the issue's return (c10d calls, waited outside dispatch)."""

    def __init__(self):
        super().__init__()
        self.calls: list[list] = []
        self.spans: list[list] = []
        self.phase = "forward"
        self.dtensor_ops: dict[str, int] = {}       # per phase: ops dispatched on DTensors (sim/parallel/tp/plan.py launches)
        self._pending: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor
        if any(t is DTensor for t in types):
            self.dtensor_ops[self.phase] = self.dtensor_ops.get(self.phase, 0) + 1
            return NotImplemented           # let DTensor desugar into local ops and collectives first
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        end = time.perf_counter()
        name = func._overloadpacket.__name__
        if func.namespace in ("_c10d_functional", "c10d_functional") and name in KINDS:
            self.calls.append(self._note(KINDS[name], args))
            self.spans.append([start, end])
            self._pending[id(out)] = len(self.spans) - 1
        elif func.namespace in ("_c10d_functional", "c10d_functional") and name == "wait_tensor":
            k = self._pending.pop(id(args[0]), None)
            if k is not None:
                self.spans[k][1] = end
        elif func.namespace == "c10d" and name in C10D:
            self.calls.append(self._note_c10d(C10D[name], args))
            self.spans.append([start, end])
        elif func.namespace == "c10d" and name in P2P:          # pipelining's batch_isend_irecv
            self.calls.append(self._note_p2p(P2P[name], args))
            self.spans.append([start, end])
        return out

    def _note_p2p(self, kind: str, args) -> list:
        """c10d.send([t], pg, dst, tag), recv_([t], pg, src, tag): [kind, bytes, dtype, [peer], phase]."""
        import torch
        import torch.distributed as dist
        from torch.distributed import ProcessGroup
        t, pg = args[0][0], args[1]
        if isinstance(pg, torch.ScriptObject):
            pg = ProcessGroup.unbox(pg)
        peer = dist.get_global_rank(pg, args[2])
        return [kind, t.numel() * t.element_size(), str(t.dtype).replace("torch.", ""), [peer], self.phase]

    def _note_c10d(self, kind: str, args) -> list:
        """c10d._allgather_base_(out, in, pg, ...), _reduce_scatter_base_(out, in, pg, ...), allreduce_([t], pg, ...)."""
        import torch
        import torch.distributed as dist
        t, pg = {"all_gather": (args[0], args[2]), "reduce_scatter": (args[1], args[2]),
                 "all_reduce": (args[0][0] if isinstance(args[0], (list, tuple)) else args[0], args[1])}[kind]
        from torch.distributed import ProcessGroup
        if isinstance(pg, torch.ScriptObject):
            pg = ProcessGroup.unbox(pg)
        ranks = dist.get_process_group_ranks(pg)
        return [kind, t.numel() * t.element_size(), str(t.dtype).replace("torch.", ""), ranks, self.phase]

    def _note(self, kind: str, args) -> list:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _resolve_process_group
        t = args[0]
        group = _resolve_process_group(args[-1])
        ranks = dist.get_process_group_ranks(group)
        nbytes = t.numel() * t.element_size() * (len(ranks) if kind == "all_gather" else 1)
        return [kind, nbytes, str(t.dtype).replace("torch.", ""), ranks, self.phase]
