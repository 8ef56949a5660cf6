#!/usr/bin/env bash
# Host-overhead A/B in one device call (under 6 minutes): GPU smoke tests of the launch
# paths, then gpu_diag.py hostab on ResNet-50 and GPT-2 (torch.compile / coil / coil
# channels-last / coil without direct launch, timed in shared rounds).
# Variants: RN_VARIANTS / GPT_VARIANTS (gpu_diag.py hostab's DIAG_VARIANTS names); then
# gpu_kernels.py on the small long-row softmax (the split-reduction rule).
# Results in $OUT (default ./gpu_results): tests.txt, hostab_rn50.txt, hostab_gpt2.txt,
# kernels_split.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
step tests
timeout -k 5 90 "$PY" -m pytest -q -p no:cacheprovider tests/codegen/test_gpu.py tests/runtime \
  -k "case or pool or tiled or dropout or launch or channels" >"$OUT/tests.txt" 2>&1
tail -3 "$OUT/tests.txt"
step "hostab ResNet-50"
DIAG_VARIANTS="${RN_VARIANTS:-inductor coil coil_clw}" \
  timeout -k 5 150 "$PY" benchmarks/gpu_diag.py hostab timm_resnet50 >"$OUT/hostab_rn50.txt" 2>&1
grep "^\[" "$OUT/hostab_rn50.txt" || tail -20 "$OUT/hostab_rn50.txt"
step "hostab GPT-2"
DIAG_VARIANTS="${GPT_VARIANTS:-inductor coil coil_nopad}" \
  timeout -k 5 130 "$PY" benchmarks/gpu_diag.py hostab hf_gpt2 >"$OUT/hostab_gpt2.txt" 2>&1
grep "^\[" "$OUT/hostab_gpt2.txt" || tail -20 "$OUT/hostab_gpt2.txt"
step "kernels: split rule"
timeout -k 5 60 "$PY" benchmarks/gpu_kernels.py "softmax small long" >"$OUT/kernels_split.txt" 2>&1
grep "^===\|autotune" "$OUT/kernels_split.txt" | cut -c1-300
step done
