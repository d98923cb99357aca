"""Lesson 15's real measurements, on this machine's CPU in this process (no ranks: one process teaches it):
bf16 autocast against fp32 (time and error), and fp16 gradients underflowing without loss scaling.

    >>> r = autocast_vs_fp32()          # {"fp32_ms", "bf16_ms", "speedup", "matmul_error", "k", ...}
    >>> u = fp16_underflow()            # {"rows": [{"scale", "zero", "finite", "error"}, ...], ...}

- ``autocast_vs_fp32``: an MLP's forward and backward timed in fp32 and under ``torch.autocast("cpu",
  dtype=torch.bfloat16)`` (torch's CPU autocast runs ``linear``/``matmul`` in bf16: torch/amp/autocast_mode.py and
  the CPU lower-precision op list, aten/src/ATen/autocast_mode.cpp), medians over ``repeats``; and the rms relative
  error of one (rows x k) @ (k x cols) matmul under autocast against fp32, what sim/lessons/precision.py predicts.
- ``fp16_underflow``: a small MLP's gradients computed in fp16 (the model and data cast to half) with the loss
  multiplied by ``tiny`` (gradients of the size late-training activation gradients have, Micikevicius et al. 2018,
  arXiv 1710.03740, Fig. 3): the share that flushes to zero, then the same with the loss scaled by ``scale`` before
  backward and the gradients divided by it after, in fp32, as ``torch.amp.GradScaler`` does, for several scales:
  too small leaves zeros, too large overflows to inf.
"""
from __future__ import annotations

import statistics
import time

from distlab.runtime.lessons.common import fewer


def _median_ms(fn, repeats: int) -> float:
    fn()                                                   # warm-up: allocations, oneDNN's kernel choice
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def autocast_vs_fp32(width: int = 512, rows: int = 128, layers: int = 2, k: int = 1024, repeats: int = 5,
                     seed: int = 0) -> dict:
    """Time of an MLP step (forward + backward) in fp32 and under bf16 autocast, and one matmul's error."""
    import torch
    from distlab.runtime.lessons.common import quick
    torch.manual_seed(seed)
    width = min(width, 256) if quick() else width          # quick mode: a 4x cheaper MLP, the same matmul below
    net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    x = torch.randn(rows, width)

    def step(autocast: bool):
        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = net(x)
            out.float().sum().backward()
        return run

    repeats = fewer(repeats, 1)
    fp32_ms, bf16_ms = _median_ms(step(False), repeats), _median_ms(step(True), repeats)
    a, b = torch.randn(rows, k), torch.randn(k, 512)
    exact = a.double() @ b.double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = a @ b
    error = float(((low.double() - exact).norm() / exact.norm()))
    fp32_error = float((((a @ b).double() - exact).norm() / exact.norm()))
    return {"fp32_ms": fp32_ms, "bf16_ms": bf16_ms, "speedup": fp32_ms / bf16_ms, "matmul_error": error,
            "fp32_matmul_error": fp32_error, "out_dtype": str(low.dtype).replace("torch.", ""), "k": k,
            "rows": rows, "width": width, "layers": layers, "threads": torch.get_num_threads()}


SCALES = (1.0, 2.0**8, 2.0**12, 2.0**16)        # 2^16: torch.amp.GradScaler's init_scale (torch/amp/grad_scaler.py:126)


def fp16_underflow(tiny: float = 2.0**-20, scales=SCALES, width: int = 256, seed: int = 0) -> dict:
    """Per loss scale: the share of gradient elements that are zero in fp16 where fp32's are not, whether any is
    inf or nan (an overflow: GradScaler skips that step and halves its scale, backoff_factor 0.5), and the
    unscaled gradients' relative error against fp32's."""
    import copy

    import torch
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))
    x, y = torch.randn(64, width), torch.randn(64, 1)

    def grads(dtype, loss_scale: float) -> torch.Tensor:
        model = copy.deepcopy(net).to(dtype)
        loss = torch.nn.functional.mse_loss(model(x.to(dtype)), y.to(dtype)) * tiny
        (loss * loss_scale).backward()
        return torch.cat([p.grad.float().flatten() for p in model.parameters()]) / loss_scale

    ref = grads(torch.float32, 1.0)
    nonzero = ref != 0
    rows = []
    for scale in scales:
        g = grads(torch.float16, scale)
        finite = bool(torch.isfinite(g).all())
        rows.append({"scale": scale, "zero": float((g[nonzero] == 0).float().mean()), "finite": finite,
                     "error": float((g - ref).norm() / ref.norm()) if finite else float("nan")})
    return {"rows": rows, "tiny": tiny, "median_grad": float(ref.abs().median()),
            "zero_fp32": float((ref == 0).float().mean())}
