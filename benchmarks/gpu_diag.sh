#!/usr/bin/env bash
# Diagnostics on the lent GPU machine in one call: training-step and bf16 inference
# profiles (top CUDA kernels per compiler, launches, wall time per step) written to $OUT.
# Usage: bash benchmarks/gpu_diag.sh "profile-train hf_gpt2" "profile timm_resnet50" ...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
T="${DIAG_TIMEOUT:-200}"
i=0
for job in "$@"; do
  i=$((i+1))
  echo "=== $job"
  COIL_TRACE="/tmp/diag_trace_$i" timeout -k 5 "$T" "$PY" benchmarks/gpu_diag.py $job 2>&1 \
    | tee "$OUT/diag_$i.txt" | grep -v "^    " | grep -v Warning
done
tar czf "$OUT/traces.tgz" -C /tmp $(cd /tmp && ls -d diag_trace_* 2>/dev/null) 2>/dev/null
echo "gpu_diag: done"
