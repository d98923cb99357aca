"""Real local work for a plan's Compute ops: square matmuls, counted to match the planned FLOPs or seconds.

A Compute op with ``seconds`` runs matmuls back to back while the next is expected to end in time (judged
by the fastest one seen), then spins on the clock to the planned end, so it never ends early and the
planned time holds even when ranks share cores; one with ``flops`` runs flops / (2 n^3) matmuls (n x n matmul = 2 n^3 FLOPs), however long
they take; with ``bytes`` too, the roofline max(flops / F, bytes / M) decides (F, M: this rank's measured matmul
FLOP/s and copy bandwidth; a copy of B bytes reads and writes 2B) and a memory-bound op runs that long.
"""
from __future__ import annotations

import statistics
import time


class Matmuls:
    """Pre-allocated n x n operands on one device; ``run(k)`` does k matmuls into a fixed output."""

    def __init__(self, device="cpu", n: int | None = None, dtype=None):
        import torch
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.n = n or (4096 if cuda else 256)
        self.dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
        g = torch.Generator(device="cpu").manual_seed(0)
        self.a = torch.rand(self.n, self.n, generator=g).to(self.device, self.dtype)
        self.b = torch.rand(self.n, self.n, generator=g).to(self.device, self.dtype)
        self.c = torch.empty(self.n, self.n, dtype=self.dtype, device=self.device)
        self.flops_per_iter = 2.0 * self.n ** 3
        self.seconds_per_iter: float | None = None
        self.copy_Bps: float | None = None
        self._src = self._dst = None

    def run(self, iters: int) -> None:
        import torch
        a, b, c = self.a, self.b, self.c
        for _ in range(iters):
            torch.mm(a, b, out=c)

    def run_for(self, seconds: float) -> None:
        """Matmuls until ``seconds`` have passed (CPU; on a GPU use run(k) with k from iters_for)."""
        import torch
        a, b, c = self.a, self.b, self.c
        clock = time.perf_counter
        now = clock()
        end, fastest = now + seconds, 0.0
        while now + fastest < end:
            torch.mm(a, b, out=c)
            t = clock()
            fastest = t - now if not fastest else min(fastest, t - now)
            now = t
        while now < end:
            now = clock()

    def _timed(self, fn, reps: int) -> float:
        """Median seconds of one call of ``fn`` over ``reps`` timings (CUDA-synchronised on a GPU)."""
        import torch
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        fn()
        sync()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def measure(self, seconds: float = 0.2) -> float:
        """Seconds per matmul (median of blocks lasting about ``seconds`` in all); also sets the rate."""
        one = self._timed(lambda: self.run(1), 3)
        block = max(1, int(seconds / 5 / max(one, 1e-7)))
        self.seconds_per_iter = self._timed(lambda: self.run(block), 5) / block
        return self.seconds_per_iter

    @property
    def flops_per_s(self) -> float:
        return self.flops_per_iter / self.seconds_per_iter

    def measure_copy(self, nbytes: int = 32 * 2**20) -> float:
        """Copy bandwidth in bytes/s (read + write) on a ``nbytes`` buffer."""
        import torch
        if self._src is None:
            self._src = torch.ones(nbytes // 4, dtype=torch.float32, device=self.device)
            self._dst = torch.empty_like(self._src)
        t = self._timed(lambda: self._dst.copy_(self._src), 5)
        self.copy_Bps = 2 * self._src.numel() * 4 / t
        return self.copy_Bps

    def work_for(self, seconds: float | None, flops: float, nbytes: float):
        """A Compute op's work as a no-argument callable (see the module docstring)."""
        import functools
        if seconds is None and nbytes:
            if self.seconds_per_iter is None:
                self.measure()
            if self.copy_Bps is None:
                self.measure_copy()
            t_bytes = nbytes / self.copy_Bps
            if t_bytes > flops / self.flops_per_s:
                seconds = t_bytes
        if seconds is None:
            return functools.partial(self.run, round(flops / self.flops_per_iter))
        if self.device.type == "cpu":
            return functools.partial(self.run_for, seconds)
        if self.seconds_per_iter is None:
            self.measure()
        return functools.partial(self.run, round(seconds / self.seconds_per_iter))
