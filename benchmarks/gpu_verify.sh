#!/usr/bin/env bash
# One device call (at most about 9.5 minutes) that verifies a codegen change on the GPU:
# the whole GPU test file (tests/codegen/test_gpu.py, with the gelu/ndtr tests run on
# CUDA tensors), the memory-bound microbenchmarks, then training steps (paired, fresh
# caches) for $TRAIN_MODELS with what is left. Files in $OUT: tests.txt, micro.md,
# train.md, train.json, logs.txt.
# Usage: TRAIN_MODELS="timm_resnet50 hf_gpt2" bash benchmarks/gpu_verify.sh   (MICRO=0: no microbench)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
TRAIN_MODELS="${TRAIN_MODELS:-timm_resnet50 hf_gpt2}"
. benchmarks/gpu_env.sh
LOGS="$OUT/logs.txt"; : >"$LOGS"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} >>"$LOGS" 2>&1
step tests
timeout -k 5 170 "$PY" -m pytest -q -p no:cacheprovider -p no:randomly --durations=5 \
  tests/codegen/test_gpu.py >"$OUT/tests.txt" 2>&1
tail -3 "$OUT/tests.txt"
if [ "${MICRO:-1}" = 1 ]; then
  step microbench
  timeout -k 5 130 "$PY" benchmarks/microbench.py >"$OUT/micro.md" 2>>"$LOGS"; cat "$OUT/micro.md"
fi
LEFT=$(( 570 - ($(date +%s) - START) ))
if [ "$LEFT" -gt 60 ]; then
  step "bench train"
  timeout -k 5 "$LEFT" "$PY" -m coil.cli bench --isolate --paired --no-warm-compile --no-progress \
    --budget $(( LEFT - 15 )) --mode train --model $TRAIN_MODELS --compiler eager coil inductor \
    --repeat 10 --row-timeout 120 --json "$OUT/train.json" --markdown "$OUT/train.md" \
    >/dev/null 2>>"$LOGS"
  grep -E "^\| (hf|timm)" "$OUT/train.md"
fi
step done
