"""Lesson 15's library (sim/lessons/precision.py) against torch and its own measurements on this CPU: the formats'
limits are torch.finfo's, the predicted bf16 matmul error is the measured one, fp16 underflows without loss
scaling and overflows with GradScaler's first scale here, the recipes' bytes, and FP8 as the simulator prices it."""
import math

import pytest

from distlab.sim.lessons import precision as P


def test_formats_are_torchs():
    torch = pytest.importorskip("torch")
    for name, (_, mantissa, largest, tiny) in P.FORMATS.items():
        info = torch.finfo(getattr(torch, name))
        assert info.max == largest and info.smallest_normal * 2.0**-mantissa == pytest.approx(tiny), name
        assert info.eps == 2.0**-mantissa, name


def test_measured_here_as_predicted():
    pytest.importorskip("torch")
    from distlab.runtime.lessons.precision import autocast_vs_fp32, fp16_underflow
    run = autocast_vs_fp32(width=128, rows=32, layers=1, repeats=1)
    assert run["matmul_error"] == pytest.approx(P.predicted_matmul_error(), rel=P.TOLERANCE)
    assert run["fp32_matmul_error"] < 1e-5 and run["out_dtype"] == "bfloat16"
    assert "within the lesson's tolerance" in P.error_verdict(run["matmul_error"]).title
    assert "outside the lesson's tolerance" in P.error_verdict(2 * run["matmul_error"]).title
    rows = fp16_underflow()["rows"]
    assert rows[0]["zero"] > 0.9 and rows[0]["finite"]                       # no scaling: underflow
    assert min(r["zero"] for r in rows if r["finite"]) < 0.01                  # a scale that keeps them
    assert not rows[-1]["finite"] and rows[-1]["scale"] == 2.0**16           # GradScaler's init_scale: inf here


def test_recipes_and_fp8():
    assert [r[5] for r in P.recipe_bytes()] == [16, 16, 18, 20]
    from distlab.sim.lessons import solution
    assert solution("15-state-bytes") == f"{18 * 8.03e9 / 2**30:.4g} GiB"
    h100, b200 = P.fp8_saving("dgx-h100"), P.fp8_saving("dgx-b200")
    assert 1.0 < h100 < 2.0 and 1.0 < b200 < 2.0                             # the linears only, casts paid
    assert P.fp8_saving("dgx-h100", "mxfp8") is None                          # Blackwell only
    rows = {(r[0], r[1]): r[4] for r in P.fp8_recipes().rows}                 # every recipe priced by sim/compute
    assert "needs Blackwell" in rows["mxfp8", "dgx-h100"] and "not priced" not in "".join(rows.values())
    speed = {k: float(v.split()[1].rstrip("x")) for k, v in rows.items() if v.startswith("compute")}
    for gpu in P.CLUSTERS:      # TE's delayed scaling casts least, torchao's rowwise most (sim/compute/fp8.py)
        assert speed["rowwise", gpu] < speed["tensorwise", gpu] < speed["delayed", gpu]
    assert speed["mxfp8", "dgx-b200"] > speed["tensorwise", "dgx-b200"]
    assert math.isclose(P.rounding_error("float16") / P.rounding_error("bfloat16"), 1 / 8)
