#!/usr/bin/env bash
# GPU check, for the day a CUDA GPU is at hand (`make gpu-check`; needs a CUDA build of torch in
# .venv, see README "GPU use"). In one go, each step under a `timeout` so that the whole check stays
# under about 8 minutes:
#   1. prints the GPU (nvidia-smi, torch.cuda.get_device_name) and the torch/CUDA versions;
#   2. runs the CUDA tests (pytest -m cuda);
#   3. executes ONE notebook under the full profile on the GPU (the cheapest chapter, ch01);
#   4. runs the quick benchmarks on the GPU, into _build/gpu/bench.json.
# Logs of every step and a summary (_build/gpu/summary.txt) go to _build/gpu/. Exit status 1 if any
# step failed or timed out.
#
#   bash tools/gpu_check.sh            # or: make gpu-check
#   GPU_CHECK_BUDGET=300 bash tools/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=_build/gpu
NOTEBOOK=${GPU_CHECK_NOTEBOOK:-notebooks/ch01_attention_is_nw.ipynb}
BUDGET=${GPU_CHECK_BUDGET:-450}   # seconds for the whole check (8 minutes less a margin)
export PYTHONUNBUFFERED=1 PYDEVD_DISABLE_FILE_VALIDATION=1

mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
START=$SECONDS
FAILED=0

# seconds for the next step: at most $1, and no more than what is left of the budget
allowance() {
  local left=$((BUDGET - (SECONDS - START)))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

# step NAME MAX_SECONDS COMMAND...: run under a timeout, log to $OUT/NAME.log, record the outcome
step() {
  local name=$1 max=$2; shift 2
  local limit; limit=$(allowance "$max")
  if [ "$limit" -lt 15 ]; then
    printf '%-10s %-8s %6s s  %s\n' "$name" SKIPPED 0 "time budget of ${BUDGET} s spent" | tee -a "$SUMMARY"
    FAILED=1
    return
  fi
  echo "=== $name (limit ${limit} s): $*"
  local t0=$SECONDS rc
  timeout --kill-after=15 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  local status=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status=TIMEOUT; FAILED=1
  elif [ "$rc" -ne 0 ]; then status="FAILED"; FAILED=1; fi
  printf '%-10s %-8s %6d s  %s\n' "$name" "$status" $((SECONDS - t0)) "(rc $rc) $*" | tee -a "$SUMMARY"
}

{
  echo "nwlib GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "python: $PYTHON"
} | tee -a "$SUMMARY"

# 1. the GPU
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader \
    2>&1 | sed 's/^/nvidia-smi: /' | tee -a "$SUMMARY"
else
  echo "nvidia-smi: not found" | tee -a "$SUMMARY"
fi
if ! timeout 90 "$PYTHON" - <<'EOF' 2>&1 | tee -a "$SUMMARY"
import sys
import torch
print(f"torch {torch.__version__}, CUDA runtime {torch.version.cuda}, cudnn {torch.backends.cudnn.version()}")
if not torch.cuda.is_available():
    print("torch.cuda.is_available() is False: install a CUDA build of torch into .venv (README, GPU use)")
    sys.exit(1)
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i}: {torch.cuda.get_device_name(i)}, {p.total_memory / 2**30:.0f} GiB, "
          f"compute capability {p.major}.{p.minor}")
x = torch.randn(1024, 1024, device="cuda")
torch.testing.assert_close((x @ x.T).cpu(), x.cpu() @ x.cpu().T, rtol=1e-3, atol=1e-2)
print("a matmul on the GPU agrees with the CPU")
EOF
then
  echo "no usable CUDA device: stopping" | tee -a "$SUMMARY"
  exit 1
fi

# 2. the CUDA tests (tests marked cuda, which are deselected on machines without CUDA)
step pytest 150 "$PYTHON" -m pytest -m cuda -q -p no:cacheprovider --junitxml="$OUT/pytest.xml"

# 3. one notebook under the full profile, on the GPU
step notebook 160 "$PYTHON" tools/run_notebooks.py --profile full --device cuda --timeout 150 \
  --stage "$OUT/stage" "$NOTEBOOK"

# 4. the quick benchmarks on the GPU (older benchmark runners have no --output: then print only)
BENCH_ARGS=(--quick --device cuda)
if timeout 60 "$PYTHON" -m benchmarks.run --help 2>/dev/null | grep -q -- "--output"; then
  BENCH_ARGS+=(--output "$OUT/bench.json")
fi
step bench 130 "$PYTHON" -m benchmarks.run "${BENCH_ARGS[@]}"

echo
echo "=== summary ($((SECONDS - START)) s; also in $SUMMARY)"
cat "$SUMMARY"
exit "$FAILED"
