#!/usr/bin/env bash
# Kernel-config sweep and ResNet-50 training profile in one device call (under 9 minutes):
#   tests.txt         GPU tests (tests/codegen/test_gpu*.py, tests/runtime)
#   sweep_large.txt   gpu_sweep.py on the large rows that trail torch.compile
#   sweep_small.txt   the same for the small rows
#   train_rn50.txt    ResNet-50 training step: top CUDA kernels, coil vs torch.compile
# Usage: bash benchmarks/gpu_sweep.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
step "GPU tests"
timeout -k 5 90 "$PY" -m pytest -q -x tests/codegen/test_gpu.py tests/codegen/test_gpu_split_rule.py tests/runtime -k "case or pool or tiled or dropout or launch or channels or split" -p no:cacheprovider >"$OUT/tests.txt" 2>&1
tail -3 "$OUT/tests.txt"
step "sweep small"
timeout -k 5 120 "$PY" benchmarks/gpu_sweep.py "rms_norm small" "cross_entropy small" >"$OUT/sweep_small.txt" 2>&1
grep "===\|\[" "$OUT/sweep_small.txt" | cut -c1-400
step "sweep large"
timeout -k 5 220 "$PY" benchmarks/gpu_sweep.py layer_norm rms_norm "softmax long" "gelu bf16" >"$OUT/sweep_large.txt" 2>&1
grep "===\|\[" "$OUT/sweep_large.txt" | cut -c1-400
step "profile-train ResNet-50"
DIAG_COMPILERS="coil inductor" timeout -k 5 170 "$PY" benchmarks/gpu_diag.py profile-train timm_resnet50 >"$OUT/train_rn50.txt" 2>&1
grep "^\[" "$OUT/train_rn50.txt"
step done
