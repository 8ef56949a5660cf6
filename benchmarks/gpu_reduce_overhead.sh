#!/usr/bin/env bash
# One device call (under 9 minutes): the CUDA graph GPU tests (TESTS=0 skips them), then
# `coil bench --mode reduce-overhead` (eager vs torch.compile vs coil, both with
# mode="reduce-overhead", in one process; coil/bench/reduce_overhead.py). Rows not started
# before the budget runs out are reported as skipped. MODELS="gpt2_b1 train_gpt" picks
# workloads; BUDGET=s (default 525) bounds the whole call. Files in $OUT: tests.log, ro.json, ro.md, bench.log, setup.log.
# Usage: bash benchmarks/gpu_reduce_overhead.sh   (with .whl/ carried: see gpu_env.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
"$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
if [ "${TESTS:-1}" = 1 ]; then
  step tests
  COIL_AUTOTUNE=0 timeout -k 5 170 "$PY" -m pytest tests/runtime/test_gpu_cudagraphs.py -q -n 0 \
    -p no:cacheprovider --tb=short 2>&1 | tee "$OUT/tests.log" | tail -c 6000
fi
step bench
LEFT=$(( ${BUDGET:-525} - ($(date +%s) - START) ))
# shellcheck disable=SC2086
timeout -k 10 "$LEFT" "$PY" -m coil.cli bench --mode reduce-overhead ${MODELS:+--model $MODELS} \
  --repeat 10 --max-timing 10 --row-timeout 200 --budget $(( LEFT - 150 )) --no-progress \
  --json "$OUT/ro.json" --markdown "$OUT/ro.md" 2>&1 | tee "$OUT/bench.log" | tail -40
step done
