#!/usr/bin/env bash
# GPU check (under 8 minutes on one GPU): what the compute model predicts, measured; then the NCCL runtime.
#   bash scripts/gpu_check.sh [OUT_DIR]          (default: $OUT, else /tmp/distlab-gpu-check)
# Runs on a bare GPU machine with only this repository: if torch (a CUDA build) and distlab's dependencies do not
# import, it makes a virtual environment (.venv-gpu-check, reusing the system's site packages, so a CUDA torch
# already installed is kept) and installs the repository with pip from the package index.
# Writes under OUT_DIR: gpu_check.json (each measurement beside the preset's prediction and the error:
# runtime/measure/gpu_check.py), bench.json and bench.png (nccl-tests-style sweep), gpu-overlap.trace, status.txt.
# With one GPU the NCCL runs use one rank (NCCL refuses two ranks on one GPU); with two or more, two ranks.
# Environment: PYTHON (default python3), GPU_CHECK_PRESET (the GPU preset to compare with; default from the
# device name), GPU_CHECK_VENV (the virtual environment's folder).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/distlab-gpu-check}}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
STATUS="$OUT/status.txt"
: > "$STATUS"
step() {            # step NAME SECONDS COMMAND...: run, record "NAME ok|failed (rc) SECONDS s", never abort
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name"
  timeout "$limit" "$@"
  local rc=$?
  if [ "$rc" -eq 0 ]; then echo "$name ok $((SECONDS - t0)) s" >> "$STATUS"
  else echo "$name failed (rc $rc) $((SECONDS - t0)) s" >> "$STATUS"; fi
}

echo "== 0. environment"
if ! "$PY" -c "import torch, simpy, yaml, rich, matplotlib, numpy, PIL, distlab.sim, distlab.runtime" 2>/dev/null; then
  VENV=${GPU_CHECK_VENV:-$PWD/.venv-gpu-check}
  [ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
  PY="$VENV/bin/python"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -e . pytest      # pyproject.toml's dependencies; torch only if none imports
fi
"$PY" - <<'PY' || { echo "environment failed" >> "$STATUS"; exit 1; }
import torch
assert torch.cuda.is_available(), "no CUDA GPU visible to torch (a CPU build of torch?)"
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(),
      "gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))
PY
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,power.limit --format=csv || true
N=$("$PY" -c "import torch; print(min(torch.cuda.device_count(), 2))")
PRESET_ARGS=()
[ -n "${GPU_CHECK_PRESET:-}" ] && PRESET_ARGS=(--preset "$GPU_CHECK_PRESET")

step "1. compute model vs this GPU (GEMMs, attention, HBM, a training step)" 300 \
  "$PY" -m distlab.runtime.measure.gpu_check --out "$OUT" ${PRESET_ARGS[@]+"${PRESET_ARGS[@]}"}

step "2. collectives and CUDA-stream timing under NCCL (pytest -m cuda)" 180 \
  "$PY" -m pytest -q -m cuda tests/test_runtime_cuda.py

step "3. distlab bench on $N NCCL rank(s)" 120 \
  "$PY" -m distlab.runtime.cli bench --backend nccl --nproc "$N" --ops all_reduce,all_gather,reduce_scatter \
  --sizes 1MiB:1GiB:4 --iters 10 --out "$OUT/bench.json" --plot "$OUT/bench.png"

"$PY" - "$OUT" "$N" <<'PY'
import sys
from distlab.sim.plan import Collective, Compute, Plan, Record, Wait
out, n = sys.argv[1], int(sys.argv[2])
ops = []
for i in range(4):
    ops += [Compute(name=f"bwd{i}", flops=2e12), Record(f"g{i}", stream="compute"), Wait(f"g{i}", stream="comm"),
            Collective("all_reduce", 256 * 2**20, name=f"ar{i}", algorithm="ring")]
Plan([list(ops) for _ in range(n)], name="gpu-overlap").save(f"{out}/gpu-overlap.json")
PY
step "4. distlab run: a two-stream plan, trace from CUDA events" 120 \
  "$PY" -m distlab.runtime.cli run "$OUT/gpu-overlap.json" --backend nccl --nproc "$N" --repeat 3 \
  --out "$OUT/gpu-overlap.trace"

echo "gpu_check: done in $SECONDS s; files in $OUT"
cat "$STATUS"
! grep -q failed "$STATUS"
