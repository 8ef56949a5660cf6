#!/usr/bin/env bash
# One device call (under 4 minutes): the CUDA graph tree tests (marked gpu), then
# benchmarks/cudagraph_smoke.py. Files in $OUT: tests.log, bench.log, setup.log.
# Usage: bash benchmarks/gpu_cudagraphs.sh   (with .whl/ carried: see gpu_env.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
"$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
step tests
COIL_AUTOTUNE=0 timeout -k 5 140 "$PY" -m pytest tests/runtime/test_gpu_cudagraphs.py -q -n 0 \
  -p no:cacheprovider --tb=short 2>&1 | tee "$OUT/tests.log" | tail -c 6000
step bench
timeout -k 5 $(( 228 - ($(date +%s) - START) )) "$PY" benchmarks/cudagraph_smoke.py 2>&1 \
  | tee "$OUT/bench.log" | tail -20
step done
