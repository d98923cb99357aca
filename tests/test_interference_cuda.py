"""`distlab calibrate --compute` on a GPU (skipped without one): bfloat16 GEMMs on CUDA, fitted to the schema."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_gemm_sweep_on_cuda_fits_a_curve_below_the_datasheet():
    from distlab.runtime.measure.compute_probe import CUDA_SHAPES, fit_gemms, gemm_sweep
    sweep = gemm_sweep("cuda", shapes=CUDA_SHAPES[:6] + CUDA_SHAPES[-3:], budget_s=1.0)
    assert sweep["dtype"] == "bfloat16" and sweep["device"] == "cuda"
    fit = fit_gemms(sweep)
    assert 1 < fit["tflops"] < 5000 and fit["hbm_GBps"] > 100 and 0 < fit["launch_s"] < 1e-3
    curve = fit["gemm_efficiency"]
    assert [f for f, _ in curve] == sorted(f for f, _ in curve) and all(0 < e <= 1 for _, e in curve)
    assert curve[0][1] < curve[-1][1]          # a 128^3 GEMM is far below an 8192^3 one on any GPU
