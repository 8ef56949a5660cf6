#!/usr/bin/env bash
# Focused experiments for the lent GPU machine, in one call of under 8 minutes (each
# step has a hard `timeout`). Results go to $OUT (default ./gpu_results):
#   tests.txt       GPU tests (test_gpu.py, the exact-mask and compile-pool tests)
#   bench_cold.*    bf16 GPT-2 with fresh coil/Triton caches: cold compile with the
#                   compile-worker pool (config.autotune_compile_processes), coil vs torch.compile
#   kernels.txt     benchmarks/gpu_kernels.py on large layer_norm / rms_norm (both codes)
#   overhead.txt    python -m coil.runtime.overhead (host µs per call, coil vs inductor)
#   diag_gpt2.txt   top CUDA kernels of bf16 GPT-2 inference, coil vs torch.compile
#   diag_cl_off.txt / diag_cl_on.txt   ResNet-50 bf16 kernels, conv_channels_last off / on
# Usage: bash benchmarks/gpu_experiments.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh

step tests
timeout -k 5 150 "$PY" -m pytest -q -p no:cacheprovider -s tests/codegen/test_gpu.py \
  tests/codegen/test_exact_masks.py tests/codegen/test_compile_pool.py >"$OUT/tests.txt" 2>&1
tail -3 "$OUT/tests.txt"

step "cold compile (fresh caches)"
COIL_CACHE_DIR=/tmp/cold_coil TRITON_CACHE_DIR=/tmp/cold_triton TORCHINDUCTOR_CACHE_DIR=/tmp/cold_ind \
  timeout -k 5 150 "$PY" -m coil.cli bench --isolate --budget 130 --mode bf16 --model hf_gpt2 \
  --compiler eager coil inductor --repeat 10 --row-timeout 100 --no-warm-compile \
  --markdown "$OUT/bench_cold.md" --no-progress >"$OUT/bench_cold.txt" 2>"$OUT/bench_cold.log"
grep -E "hf_gpt2" "$OUT/bench_cold.md"

# later steps reuse the caches the cold run filled
export COIL_CACHE_DIR=/tmp/cold_coil TRITON_CACHE_DIR=/tmp/cold_triton TORCHINDUCTOR_CACHE_DIR=/tmp/cold_ind

step "kernels"
timeout -k 5 75 "$PY" benchmarks/gpu_kernels.py layer_norm rms_norm >"$OUT/kernels.txt" 2>&1
grep "^===" "$OUT/kernels.txt"

step "host overhead"
timeout -k 5 60 "$PY" -m coil.runtime.overhead >"$OUT/overhead.txt" 2>&1
tail -8 "$OUT/overhead.txt"

step "profile GPT-2 bf16"
DIAG_COMPILERS="coil inductor" timeout -k 5 110 "$PY" benchmarks/gpu_diag.py profile hf_gpt2 \
  >"$OUT/diag_gpt2.txt" 2>&1
grep "^\[" "$OUT/diag_gpt2.txt"

for cl in off on; do
  step "profile ResNet-50 channels-last $cl"
  v=0; [ "$cl" = on ] && v=1
  COIL_CONV_CHANNELS_LAST=$v DIAG_COMPILERS=coil timeout -k 5 70 "$PY" benchmarks/gpu_diag.py \
    profile timm_resnet50 >"$OUT/diag_cl_$cl.txt" 2>&1
  grep "^\[" "$OUT/diag_cl_$cl.txt"
done
step done
