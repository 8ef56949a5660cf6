#!/usr/bin/env bash
# One device call (under 7 minutes) that re-checks host-time and dynamic-shape work on the
# GPU: the dynamic-kernel and CUDA-graph GPU tests; the dynamic recompile's compile time
# (benchmarks/compile_profile.py, GPT-2 at 64/96/128); the dynamic vs static GPT-2 forward
# kernel by kernel (benchmarks/gpu_dynamic_profile.py); ResNet-50 / MobileNetV3 at batch 1
# under reduce-overhead, host vs GPU time per forward (benchmarks/gpu_cnn_profile.py).
# Files in $OUT: tests.log, cprof.log, dynprof.log, cnn.log (+ the scripts' own files).
# Usage: bash benchmarks/gpu_host_dynamic_checks.sh   (with .whl/ carried: see gpu_env.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"; export OUT
. benchmarks/gpu_env.sh
"$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
step tests
timeout -k 5 ${TESTS_S:-75} "$PY" -m pytest -q -p no:cacheprovider --tb=short -x \
  tests/codegen/test_gpu.py -k dynamic tests/runtime/test_cudagraph_trees.py >"$OUT/tests.log" 2>&1
tail -c 1500 "$OUT/tests.log"
step compile_profile
timeout -k 5 110 "$PY" benchmarks/compile_profile.py --lengths 64 96 128 --out "$OUT" >"$OUT/cprof.log" 2>&1
grep -E "first call|compile 0|runtime events" "$OUT/cprof.log" | cut -c1-400
step dynamic_profile
timeout -k 5 100 "$PY" benchmarks/gpu_dynamic_profile.py --out "$OUT" >"$OUT/dynprof.log" 2>&1
grep -E "^\[|largest|->" "$OUT/dynprof.log" | head -14 | cut -c1-200
step cnn_ro
timeout -k 5 110 "$PY" benchmarks/gpu_cnn_profile.py --batches 1 --compilers coil-ro inductor-ro \
  --budget 95 --out "$OUT" >"$OUT/cnn.log" 2>&1
grep -A8 "=== summary" "$OUT/cnn.log"
step done
