#!/usr/bin/env bash
# One device call (about 9 minutes) that re-measures everything issue 5 is judged by
# after a change: the memory-bound microbenchmarks, the bf16 inference rows, the ResNet-50
# training row with a channels-last-training A/B (benchmarks/bench_variants.py COIL_CLT)
# and the GPT-2 training row; every bench row --paired, fresh caches. Returns at most 8
# files in $OUT: micro.md, bf16.md, bf16.json, train_rn50.md, train_rn50.json,
# train_gpt2.md, train_gpt2.json, logs.txt (stderr of every step).
# Usage: bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
LOGS="$OUT/logs.txt"; : >"$LOGS"
B="$PY -m coil.cli bench --isolate --paired --no-warm-compile --no-progress"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"; } >>"$LOGS" 2>&1
step microbench
timeout -k 5 110 "$PY" benchmarks/microbench.py >"$OUT/micro.md" 2>>"$LOGS"; cat "$OUT/micro.md"
step "bench bf16"
timeout -k 5 230 $B --budget 200 --mode bf16 --model hf_gpt2 hf_llama timm_resnet50 hf_bert \
  --compiler eager coil inductor --repeat 20 --row-timeout 100 --json "$OUT/bf16.json" \
  --markdown "$OUT/bf16.md" >/dev/null 2>>"$LOGS"
grep -E "^\| (hf|timm)" "$OUT/bf16.md"
step "train ResNet-50"
timeout -k 5 200 $B --budget 180 --mode train --model timm_resnet50 \
  --compiler eager coil benchmarks.bench_variants:COIL_CLT inductor --repeat 10 --row-timeout 120 \
  --json "$OUT/train_rn50.json" --markdown "$OUT/train_rn50.md" >/dev/null 2>>"$LOGS"
grep -E "^\| (hf|timm)" "$OUT/train_rn50.md"
LEFT=$(( 585 - ($(date +%s) - START) ))
if [ "$LEFT" -gt 60 ]; then
  step "train GPT-2"
  timeout -k 5 "$LEFT" $B --budget $(( LEFT - 15 )) --mode train --model hf_gpt2 \
    --compiler eager coil inductor --repeat 10 --row-timeout 100 \
    --json "$OUT/train_gpt2.json" --markdown "$OUT/train_gpt2.md" >/dev/null 2>>"$LOGS"
  grep -E "^\| (hf|timm)" "$OUT/train_gpt2.md"
fi
step done
