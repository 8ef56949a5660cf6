#!/usr/bin/env bash
# One device call (under 9 minutes) that checks the GPU-only parts of the newer features:
# the CUDA graph tree tests and the CUDA convolution-epilogue tests; the dynamic-shape
# diagnosis (does GPT-2 recompile per sequence length on CUDA?); the regional-compilation
# compile-time ratio on CUDA (24 layers, with and without nested_compile_region); and the
# reduce-overhead bench rows that changed (ResNet-50, MobileNetV3, the GPT training step,
# greedy decoding). Files in $OUT: tests.log, diag.log, regional.log, ro.{md,json,log}.
# Usage: bash benchmarks/gpu_feature_checks.sh   (with .whl/ carried: see gpu_env.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"; export OUT
. benchmarks/gpu_env.sh
"$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
step tests
COIL_AUTOTUNE=0 timeout -k 5 200 "$PY" -m pytest tests/runtime/test_gpu_cudagraphs.py \
  tests/ir/test_conv_epilogues.py -q -n 0 -p no:cacheprovider --tb=short 2>&1 \
  | tee "$OUT/tests.log" | tail -c 3000
step diag
timeout -k 5 70 "$PY" benchmarks/gpu_dynamic_diag.py --variants default >"$OUT/diag.log" 2>&1
grep -E "^(L=|compiles|SUMMARY)|GUARD|recompile" "$OUT/diag.log" | head -20
step regional
timeout -k 5 170 "$PY" benchmarks/regional_compile_time.py --device cuda >"$OUT/regional.log" 2>&1
tail -15 "$OUT/regional.log"
step ro
LEFT=$(( 545 - ($(date +%s) - START) ))
timeout -k 10 "$LEFT" "$PY" -m coil.cli bench --mode reduce-overhead \
  --model ${MODELS:-train_gpt gpt2_decode resnet50 mobilenet} --repeat 10 --max-timing 10 \
  --row-timeout 150 --budget $(( LEFT - 40 )) --no-progress --json "$OUT/ro.json" \
  --markdown "$OUT/ro.md" >"$OUT/ro.log" 2>&1
grep -v -i warn "$OUT/ro.log" | tail -25
step done
