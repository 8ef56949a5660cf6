#!/usr/bin/env bash
# The numbers issue 5 is judged by, coil vs eager vs torch.compile side by side, with
# fresh caches (cold compile times are real) and every bench row timed --paired (per
# model, eager and every compiler in the same interleaved rounds: one shared eager series).
#   PART=infer (one device call, about 7 minutes): GPU smoke tests, the memory-bound
#     microbenchmarks, bf16 inference on GPT-2 / LLaMA / ResNet-50 / BERT;
#   PART=train (about 5 minutes): training steps on GPT-2 / ResNet-50 / LLaMA;
#   PART=all (default): both, in one call when time allows (train gets what is left).
# Steps run in priority order, each under a hard `timeout`, and each writes its own files,
# so a late step that runs out of time loses only itself. Results in $OUT (default
# ./gpu_results): machine.txt, tests.txt, microbench.md, bench_bf16.{md,json,log},
# bench_train.{md,json,log}, summary.md.
# Usage: PART=infer bash benchmarks/gpu_headline.sh   (benchmarks/gpu_suite.sh runs everything)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
PART="${PART:-all}"
# the rows (override to run others, e.g. TRAIN_MODELS="timm_vit_b16 hf_bert"); TESTS=0 and
# MICRO=0 skip the GPU tests and the microbenchmarks (models only, in one call)
INFER_MODELS="${INFER_MODELS:-hf_gpt2 hf_llama timm_resnet50 hf_bert}"
TRAIN_MODELS="${TRAIN_MODELS:-hf_gpt2 timm_resnet50 hf_llama}"
# seconds of the device call's 600 this script may use (less when run after other steps)
CALL_BUDGET="${CALL_BUDGET:-500}"
. benchmarks/gpu_env.sh
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
  "$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.txt" 2>&1
COIL="$PY -m coil.cli"

if [ "$PART" != train ]; then
  if [ "${TESTS:-1}" = 1 ]; then
  step tests
  timeout -k 5 60 "$PY" -m pytest -q -p no:cacheprovider tests/codegen/test_gpu.py tests/runtime \
    -k "case or pool or tiled or dropout or launch or channels" >"$OUT/tests.txt" 2>&1
  tail -1 "$OUT/tests.txt"
  fi

  if [ "${MICRO:-1}" = 1 ]; then
  step microbench
  timeout -k 5 150 "$PY" benchmarks/microbench.py >"$OUT/microbench.md" 2>"$OUT/microbench.log"
  cat "$OUT/microbench.md"
  fi

  step "bench bf16"
  timeout -k 5 240 $COIL bench --isolate --paired --budget 190 --mode bf16 \
    --model $INFER_MODELS --compiler eager coil inductor --repeat 20 \
    --row-timeout 100 --no-warm-compile --json "$OUT/bench_bf16.json" \
    --markdown "$OUT/bench_bf16.md" --no-progress >"$OUT/bench_bf16.txt" 2>"$OUT/bench_bf16.log"
  grep -E "^\| (hf|timm)" "$OUT/bench_bf16.md"
fi

if [ "$PART" != infer ]; then
  B=$(( CALL_BUDGET - ($(date +%s) - START) ))
  [ "$B" -gt "${TRAIN_CAP:-260}" ] && B="${TRAIN_CAP:-260}"
  if [ "$B" -gt 30 ]; then
    step "bench train"
    timeout -k 5 $(( B + 40 )) $COIL bench --isolate --paired --budget "$B" --mode train \
      --model $TRAIN_MODELS --compiler eager coil inductor --repeat 10 \
      --row-timeout 110 --no-warm-compile --json "$OUT/bench_train.json" \
      --markdown "$OUT/bench_train.md" --no-progress >"$OUT/bench_train.txt" 2>"$OUT/bench_train.log"
    grep -E "^\| (hf|timm)" "$OUT/bench_train.md"
  fi
fi
{ cat "$OUT/machine.txt"; echo; [ -f "$OUT/tests.txt" ] && tail -1 "$OUT/tests.txt"; echo
  [ -f "$OUT/microbench.md" ] && cat "$OUT/microbench.md"; echo
  for f in bench_bf16 bench_train; do [ -f "$OUT/$f.md" ] && { cat "$OUT/$f.md"; echo; }; done
} >"$OUT/summary.md"
step done
