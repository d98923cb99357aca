"""Real GEMMs on this machine for lesson 13: a sweep of torch.mm over shapes (square, skinny, tensor-parallel slices).

Each shape is timed as the fastest of a few blocks of back-to-back ``torch.mm(a, b, out=c)`` (CUDA-synchronised on
a GPU), so the figure is the steady rate of that GEMM, not its first call nor a block in which another process
had the core. On a CPU the sweep runs on one thread (``threads``): a multi-threaded matmul on a shared machine
mostly measures the scheduler. In quick mode
(DISTLAB_LESSONS_QUICK, runtime/lessons/common.py) the sweep takes fewer shapes and shorter blocks.
"""
from __future__ import annotations

import time

from distlab.runtime.lessons.common import fewer, quick

# (M, N, K) of torch.mm(M x K, K x N): squares from tiny to medium, skinny ones (few rows, or a short inner
# dimension), and one GEMM cut as tensor parallelism cuts a column-parallel linear (N / tp, tp = 1, 2, 4, 8).
SQUARES = (16, 32, 64, 128, 256, 384, 512)
SKINNY = ((8, 512, 512), (512, 512, 8))
TP_SLICES = tuple((256, 2048 // tp, 512) for tp in (1, 2, 4, 8))


def default_shapes() -> list[tuple[int, int, int]]:
    """The sweep's shapes (fewer squares in quick mode)."""
    squares = SQUARES[::2] if quick() else SQUARES
    return [(n, n, n) for n in squares] + list(SKINNY) + list(TP_SLICES)


def gemm_sweep(shapes=None, device: str = "cpu", dtype: str | None = None, block_s: float = 0.01,
               threads: int | None = 1) -> list[dict]:
    """Time ``torch.mm`` of each (M, N, K) here: per shape, the fastest of a few blocks of about ``block_s``
    seconds, on ``threads`` CPU threads (None: torch's default). Rows: M, N, K, flops (2·M·N·K), time_s (one
    GEMM), flops_per_s, device, dtype."""
    import torch
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _sweep(torch, shapes or default_shapes(), torch.device(device), dtype, block_s)
    finally:
        torch.set_num_threads(before)


def _sweep(torch, shapes, dev, dtype, block_s) -> list[dict]:
    dt = getattr(torch, dtype) if dtype else (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator(device="cpu").manual_seed(0)
    block_s = block_s / 5 if quick() else block_s
    rows = []
    for M, N, K in shapes:
        a = torch.rand(M, K, generator=g).to(dev, dt)
        b = torch.rand(K, N, generator=g).to(dev, dt)
        c = torch.empty(M, N, device=dev, dtype=dt)
        torch.mm(a, b, out=c)                                     # warm-up: first call picks the kernel
        sync()
        one = []
        for _ in range(3):
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            sync()
            one.append(time.perf_counter() - t0)
        iters = max(1, int(block_s / max(min(one), 1e-7)))
        times = []
        for _ in range(fewer(7, 4)):
            t0 = time.perf_counter()
            for _ in range(iters):
                torch.mm(a, b, out=c)
            sync()
            times.append((time.perf_counter() - t0) / iters)
        t = min(times)
        flops = 2.0 * M * N * K
        rows.append({"M": M, "N": N, "K": K, "flops": flops, "time_s": t, "flops_per_s": flops / t,
                     "device": str(dev), "dtype": str(dt).replace("torch.", "")})
    return rows
