"""Measure on this GPU what the compute model predicts for its preset, beside it the error (scripts/gpu_check.sh).

    python -m distlab.runtime.measure.gpu_check --out DIR [--preset h200] [--quick] [--device cuda]

Each row: what was timed, its shape, the measured and the predicted seconds (sim/compute/, the preset's kernel model
with sustained = 1: these are micro-benchmarks like the ones the model's numbers come from), TFLOP/s (or GB/s)
of each and the error (predicted / measured - 1). Rows:
- bf16 GEMMs of the shapes the H100/H200 model uses: its best shape (MAMF), squares 1024..8192 (the points of
  zzc0721/torch-performance-test-data issue #79) and one Llama 3 8B block's projections at 8192 tokens;
  a float32 GEMM (CUDA cores: torch's default, no TF32);
- attention: torch's scaled_dot_product_attention (causal, bf16, head_dim 128), forward and forward+backward,
  against the model's FlashAttention numbers (the backend SDPA picked is recorded);
- HBM: a 1 GiB copy (read + write) against the datasheet bandwidth x the model's measured fraction;
- one training step of a small Llama (runtime/modules/bridge.py, AdamW) on this GPU, median of the steps after warm-up,
  against `distlab simulate`'s step for the same model on the preset (tp workload, one rank), with and without
  the generation's fitted sustained fraction.
Everything lands in DIR/gpu_check.json. ``--quick`` shrinks every shape (tests run it on CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace

PRESETS = (("GB200", "gb200", "gb200-nvl72"), ("B200", "b200", "dgx-b200"), ("H200", "h200", "hgx-h200"),
           ("H800", "h800", "hgx-h800"), ("H100", "h100", "dgx-h100"), ("A100", "a100", "dgx-a100"),
           ("L40S", "l40s", "pcie-8gpu"))
CLUSTER_OF = {gpu: cluster for _, gpu, cluster in PRESETS}


def preset_for(device_name: str) -> str | None:
    """The GPU preset whose name the device's name contains (GB200 before B200, H200 before H100), or None."""
    upper = device_name.upper()
    return next((gpu for key, gpu, _ in PRESETS if key in upper), None)


def gemm_shapes(quick: bool) -> list[tuple[str, int, int, int]]:
    if quick:
        return [("square", 64, 64, 64), ("llama block qkv", 128, 96, 64)]
    T, h, kv, ffn = 8192, 4096, 1024, 14336
    return ([("best shape (MAMF)", 2048, 2048, 13312)] + [("square", n, n, n) for n in (1024, 2048, 4096, 8192)]
            + [("llama3-8b q / o", T, h, h), ("llama3-8b k / v", T, kv, h), ("llama3-8b gate / up", T, ffn, h),
               ("llama3-8b down", T, h, ffn), ("llama3-8b down, weight grad", ffn, h, T)])


def attention_shapes(quick: bool) -> list[tuple[int, int, int, int]]:
    return [(1, 2, 64, 16)] if quick else [(1, 32, 8192, 128), (2, 16, 4096, 128), (4, 16, 2048, 128)]


def timed(fn, device, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after two warm-up runs (CUDA events on a GPU)."""
    import torch
    for _ in range(2):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def row(what: str, shape, measured_s: float, predicted_s: float, work: float, unit: str = "TFLOP/s") -> dict:
    scale = 1e12 if unit == "TFLOP/s" else 1e9
    return {"what": what, "shape": list(shape), "measured_s": measured_s, "predicted_s": predicted_s,
            f"measured_{unit.replace('/', 'p')}": work / measured_s / scale,
            f"predicted_{unit.replace('/', 'p')}": work / predicted_s / scale, "unit": unit,
            "error": predicted_s / measured_s - 1}


def check_gemms(gpu, device, quick: bool, reps: int) -> list[dict]:
    import torch
    from distlab.sim.compute.kernels import gemm_time
    out = []
    for label, M, N, K in gemm_shapes(quick):
        a = torch.randn(M, K, device=device, dtype=torch.bfloat16)
        b = torch.randn(K, N, device=device, dtype=torch.bfloat16)
        t = timed(lambda: torch.matmul(a, b), device, reps)
        out.append(row(f"gemm bf16 {label}", (M, N, K), t, gemm_time(M, N, K, 2, gpu), 2.0 * M * N * K))
    n = 64 if quick else 4096
    a32, b32 = (torch.randn(n, n, device=device) for _ in range(2))
    torch.backends.cuda.matmul.allow_tf32 = False
    t = timed(lambda: torch.matmul(a32, b32), device, reps)
    out.append(row("gemm float32 square (no TF32)", (n, n, n), t, gemm_time(n, n, n, 4, gpu), 2.0 * n ** 3))
    return out


def check_attention(gpu, device, quick: bool, reps: int) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from distlab.sim.compute.kernels import attention_flops, attention_time
    out = []
    for b, heads, s, d in attention_shapes(quick):
        q, k, v = (torch.randn(b, heads, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        grad = torch.randn(b, heads, s, d, device=device, dtype=torch.bfloat16)
        forward = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        t_f = timed(forward, device, reps)
        t_fb = timed(lambda: forward().backward(grad), device, reps)
        fwd = attention_flops(b, heads, s, d, True)
        out.append({**row("sdpa causal forward", (b, heads, s, d), t_f, attention_time(b, heads, s, d, gpu), fwd),
                    "backend": sdpa_backend(q, k, v)})
        predicted = attention_time(b, heads, s, d, gpu) + attention_time(b, heads, s, d, gpu,
                                                                          attention_pass="backward")
        out.append(row("sdpa causal forward+backward", (b, heads, s, d), t_fb, predicted, 3.5 * fwd))
    return out


def sdpa_backend(q, k, v) -> str:
    """The first SDPA backend torch accepts for these inputs: flash, cudnn, efficient or math."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)):
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=True)
            return name
        except RuntimeError:
            continue
    return "unknown"


def check_copy(gpu, device, quick: bool, reps: int) -> list[dict]:
    import torch
    from distlab.sim.compute.kernels import memory_time
    n = (1 << 20) if quick else (1 << 30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), device, reps)
    return [row("hbm copy (read + write)", (n,), t, memory_time(2 * n, gpu), 2.0 * n, "GB/s")]


def step_model(quick: bool) -> dict:
    """A small Llama (multi-head attention: SDPA's flash backend takes it on every GPU)."""
    if quick:
        return dict(arch="llama", layers=1, hidden=64, heads=4, ffn_hidden=128, vocab=256, seq_len=32, micro_batch=2)
    return dict(arch="llama", layers=8, hidden=2048, heads=16, ffn_hidden=5632, vocab=32000, seq_len=2048,
                micro_batch=4)


def check_step(gpu_name: str, device, quick: bool, steps: int) -> list[dict]:
    import torch
    from distlab.runtime.modules.bridge import build_module
    from distlab.sim import scenario as sc
    from distlab.sim.compute.flops import model_flops_per_token
    from distlab.sim.models import gpt
    spec = step_model(quick)
    model = gpt(**spec, dtype="bfloat16", name="gpu-check-llama")
    module = build_module(model).to(device)
    params = list(module.parameters())
    # AdamW as the simulated step has it; --quick (a test of the logic on CPU) steps the parameters by hand:
    # torch.optim's first use imports torch._dynamo, seconds a test need not spend
    opt = None if quick else torch.optim.AdamW(params, lr=1e-4)
    idx = torch.randint(0, spec["vocab"], (spec["micro_batch"], spec["seq_len"]), device=device)

    def step():
        logits = module(idx)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx.flatten())
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
            return
        with torch.no_grad():
            for p in params:
                p.sub_(1e-4 * p.grad)
                p.grad = None
    measured = timed(step, device, steps)
    d = {"model": {**spec, "dtype": "bfloat16"}, "mesh": {"tp": 1}, "tp": {}, "cluster": CLUSTER_OF[gpu_name],
         "world_size": 1}
    job = sc.simulate(d, "gpu check").summary["step_s"]
    kernels = _simulate_with(d, sustained=1.0)
    work = model_flops_per_token(model) * spec["micro_batch"] * spec["seq_len"]
    return [{**row("training step (simulate, fitted sustained)", (spec["layers"], spec["hidden"]), measured, job,
                   work), "model": spec},
            row("training step (kernel rates, sustained 1)", (spec["layers"], spec["hidden"]), measured, kernels, work)]


def _simulate_with(d: dict, sustained: float) -> float:
    """`distlab simulate`'s step for scenario ``d`` with the GPU's sustained fraction set to ``sustained``."""
    from distlab.sim import scenario as sc
    from distlab.sim.kernel.engine import simulate
    result = sc.build(d, "gpu check")
    cluster = replace(result.cluster, gpu=replace(result.cluster.gpu, sustained=sustained))
    return simulate(result.plan, cluster, record_transfers=False, check=False).makespan


def kernel_gpu(name: str):
    """The preset GPU with sustained 1: micro-benchmark rates (what gpus.py's numbers are)."""
    from distlab.sim.cluster import GPUS
    return replace(GPUS[name], sustained=1.0)


def run(out_dir: str, preset: str | None = None, device: str | None = None, quick: bool = False) -> dict:
    import torch
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    preset = preset or preset_for(name) or "h200"
    gpu, reps = kernel_gpu(preset), (3 if quick else 20)
    rows = (check_gemms(gpu, dev, quick, reps) + check_attention(gpu, dev, quick, reps)
            + check_copy(gpu, dev, quick, reps) + check_step(preset, dev, quick, 3 if quick else 10))
    report = {"device": name, "preset": preset, "torch": torch.__version__,
              "cuda": torch.version.cuda, "quick": quick, "rows": rows}
    from distlab.sim.files import write_atomic
    write_atomic(os.path.join(out_dir, "gpu_check.json"), json.dumps(report, indent=1))
    return report


def print_report(report: dict) -> None:
    print(f"# {report['device']} against the {report['preset']} preset (torch {report['torch']})")
    print(f"# {'what':46} {'shape':>24} {'measured':>10} {'predicted':>10} {'unit':>8} {'error':>8}")
    for r in report["rows"]:
        key = r["unit"].replace("/", "p")
        print(f"  {r['what']:46} {'x'.join(map(str, r['shape'])):>24} {r['measured_' + key]:10.1f} "
              f"{r['predicted_' + key]:10.1f} {r['unit']:>8} {100 * r['error']:+7.1f}%"
              + (f"  ({r['backend']})" if "backend" in r else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json (must exist)")
    ap.add_argument("--preset", choices=[g for _, g, _ in PRESETS], help="the GPU preset to compare with "
                    "(default: from the device's name, else h200)")
    ap.add_argument("--device", help="torch device (default: cuda if present, else cpu)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a test of the logic, not of a GPU)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.out):
        sys.stderr.write(f"gpu_check: error: --out {args.out!r} is not a folder\n")
        return 2
    print_report(run(args.out, args.preset, args.device, args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
