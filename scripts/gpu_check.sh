#!/usr/bin/env bash
# GPU check of the runtime (< 5 min on one GPU): NCCL path, CUDA-event timing, compute calibration.
#   bash scripts/gpu_check.sh [OUT_DIR]
# With one GPU the NCCL runs use one rank (NCCL refuses two ranks on one GPU); with two or more, two ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/distlab-gpu-check}}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA GPU visible"
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(),
      "gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))
PY
N=$(python -c "import torch; print(min(torch.cuda.device_count(), 2))")

echo "== 1. collectives and CUDA-stream timing under NCCL (pytest -m cuda)"
timeout 240 python -m pytest -q -m cuda tests/test_runtime_cuda.py 2>&1 | tail -5

echo "== 2. compute calibration: bf16 matmul TFLOP/s and copy GB/s on GPU 0"
timeout 60 python - <<'PY'
from distlab.runtime.compute import Matmuls
mm = Matmuls("cuda:0")
mm.measure(1.0)
mm.measure_copy(1 << 30)
print(f"matmul {mm.n}x{mm.n} bf16: {mm.flops_per_s / 1e12:.1f} TFLOP/s; copy {mm.copy_Bps / 1e9:.0f} GB/s")
PY

echo "== 3. distlab bench on $N NCCL rank(s)"
timeout 120 python -m runtime.cli bench --backend nccl --nproc "$N" --ops all_reduce,all_gather,reduce_scatter \
  --sizes 1MiB:1GiB:4 --iters 10 --out "$OUT/bench.json" --plot "$OUT/bench.png"

echo "== 4. distlab run: a two-stream plan, trace from CUDA events"
python - "$OUT" "$N" <<'PY'
import sys
from distlab.sim.plan import Collective, Compute, Plan, Record, Wait
out, n = sys.argv[1], int(sys.argv[2])
ops = []
for i in range(4):
    ops += [Compute(name=f"bwd{i}", flops=2e12), Record(f"g{i}", stream="compute"), Wait(f"g{i}", stream="comm"),
            Collective("all_reduce", 256 * 2**20, name=f"ar{i}", algorithm="ring")]
Plan([list(ops) for _ in range(n)], name="gpu-overlap").save(f"{out}/gpu-overlap.json")
PY
timeout 120 python -m runtime.cli run "$OUT/gpu-overlap.json" --backend nccl --repeat 3 --out "$OUT/gpu-overlap.trace"
echo "gpu_check: done; files in $OUT"
