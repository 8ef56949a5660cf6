#!/usr/bin/env bash
# The whole GPU suite in one command, for the lent GPU machine (Python 3.12, torch 2.11,
# transformers and timm preinstalled, no network). Runs in under 12 minutes (QUICK=1: about
# 9): every step has a time budget (rows/ops not started in time are reported as
# "skipped") and a hard `timeout`. Results go to $OUT (default ./gpu_results):
#   machine.txt, gpu_tests.txt, microbench.md, demo.txt, demo/{trace,report}/,
#   bench_*.{json,md,txt,log} (bench_cl: channels-last convolutions on), conformance_*.{json,md,txt,log}, summary.md (all markdown
#   blocks, for BENCHMARKS.md). GPU_SUITE_TAR=1 packs all but summary.md into all.tgz.
# Usage:  bash benchmarks/gpu_suite.sh        (from anywhere; it cd's to the repo root)
#         CL_ROW=1 adds a channels-last bf16 row (ResNet-50, convnet) after the kernel tests
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"
mkdir -p "$OUT"
# coil without network: the bytecode wheel travels in .whl/; coil itself via PYTHONPATH.
. benchmarks/gpu_env.sh  # (also sets START)
left() { echo $(( ${1} - ($(date +%s) - START) )); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  "$PY" -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1
  "$PY" -c "import transformers, timm; print('transformers', transformers.__version__, 'timm', timm.__version__)" 2>&1
  git log -1 --oneline 2>/dev/null; } >"$OUT/machine.txt"
"$PY" -c "import coil, coil.cli" || { echo "coil does not import; see above"; exit 1; }
COIL="$PY -m coil.cli"

# QUICK=1 skips the demo, the fp32 crossings and conformance (bf16 + train + kernels only).
QUICK="${QUICK:-0}"

# 0. GPU kernel tests and memory-bound microbenchmarks                       ~1.5 min max
timeout -k 5 120 "$PY" -m pytest -q -p no:cacheprovider tests/codegen/test_gpu.py \
  tests/codegen/test_codegen_lead_regressions.py tests/codegen/test_training_layouts.py \
  tests/codegen/test_tiling.py tests/codegen/test_channels_last.py >"$OUT/gpu_tests.txt" 2>&1
timeout -k 5 150 "$PY" benchmarks/microbench.py >"$OUT/microbench.md" 2>&1

# 0b. (CL_ROW=1) channels-last convolutions (config.conv_channels_last, off by default
#     until this row shows it helps): ResNet-50 and the conv net, bf16, coil with the
#     option on next to eager; ~100 s, taken from the later steps' budgets.
if [ "${CL_ROW:-0}" = 1 ]; then
  COIL_CONV_CHANNELS_LAST=1 timeout -k 5 130 $COIL bench --isolate --budget 100 --mode bf16 \
    --model timm_resnet50 convnet --compiler eager coil --repeat 20 --row-timeout 80 \
    --no-warm-compile --json "$OUT/bench_cl.json" --markdown "$OUT/bench_cl.md" --no-progress \
    >"$OUT/bench_cl.txt" 2>"$OUT/bench_cl.log"
fi

# 1. demo (GPT-2 124M config, eager vs coil, compile log + HTML report)    ~1.5 min max
if [ "$QUICK" = 0 ]; then
  timeout -k 5 100 $COIL demo --out "$OUT/demo" >"$OUT/demo.txt" 2>&1
  echo "demo exit $?" >>"$OUT/demo.txt"
fi

# 2. bench: bf16 inference on every model (transformers and timm first), eager/coil/inductor.
#    One subprocess per model (a crash loses only that model's unfinished rows).
MODELS="hf_gpt2 hf_llama hf_bert hf_t5 hf_vit timm_resnet50 timm_vit_b16 small_gpt convnet mlp"
B=$(( $(left 390) - 20 ))
timeout -k 5 $(( B + 75 )) $COIL bench --isolate --budget "$B" --mode bf16 --model $MODELS \
  --compiler eager coil inductor --repeat 20 --row-timeout 120 --no-warm-compile \
  --json "$OUT/bench_bf16.json" --markdown "$OUT/bench_bf16.md" --no-progress \
  >"$OUT/bench_bf16.txt" 2>"$OUT/bench_bf16.log"

# 3. bench: training step (autocast bf16) on three models, eager/coil/inductor.
B=$(( $(left 540) - 15 ))
if [ "$B" -gt 20 ]; then
  timeout -k 5 $(( B + 75 )) $COIL bench --isolate --budget "$B" --mode train \
    --model hf_gpt2 hf_llama small_gpt convnet --compiler eager coil inductor --repeat 10 \
    --row-timeout 120 --no-warm-compile --json "$OUT/bench_train.json" \
    --markdown "$OUT/bench_train.md" --no-progress \
    >"$OUT/bench_train.txt" 2>"$OUT/bench_train.log"
fi

# 4. bench: the crossings and warm compile, fp32 inference on small_gpt, all five compilers.
B=$(( $(left 600) - 15 ))
if [ "$QUICK" = 0 ] && [ "$B" -gt 20 ]; then
  timeout -k 5 $(( B + 60 )) $COIL bench --isolate --budget "$B" --mode fp32 \
    --model small_gpt hf_gpt2 --repeat 20 --row-timeout 100 \
    --json "$OUT/bench_cross.json" --markdown "$OUT/bench_cross.md" --no-progress \
    >"$OUT/bench_cross.txt" 2>"$OUT/bench_cross.log"
fi

# 5. conformance on a fixed shard of op_db (every 8th op), coil then torch.compile.
for C in coil inductor; do
  B=$(( $(left 660) - 10 ))
  [ "$C" = coil ] && B=$(( B / 2 ))
  if [ "$QUICK" = 0 ] && [ "$B" -gt 15 ]; then
    timeout -k 5 $(( B + 30 )) $COIL conformance --device cuda --dtype float32 --shard 0/8 \
      --compiler "$C" --timeout 30 --budget "$B" --no-progress \
      --json "$OUT/conformance_$C.json" --markdown "$OUT/conformance_$C.md" \
      >"$OUT/conformance_$C.txt" 2>"$OUT/conformance_$C.log"
  fi
done

{ echo "# GPU suite results"; echo; cat "$OUT/machine.txt" | sed 's/^/    /'; echo
  echo "## GPU tests"; echo; echo '```'; tail -5 "$OUT/gpu_tests.txt"; echo '```'; echo
  echo "## microbench"; echo; cat "$OUT/microbench.md"; echo
  [ -f "$OUT/demo.txt" ] && { echo "## demo"; echo; echo '```'; tail -20 "$OUT/demo.txt"; echo '```'; echo; }
  for f in bench_bf16 bench_cl bench_train bench_cross conformance_coil conformance_inductor; do
    [ -f "$OUT/$f.md" ] && { echo "## $f"; echo; cat "$OUT/$f.md"; echo; }
  done; } >"$OUT/summary.md"
# the device tool brings back at most 8 files: everything but the summary in one archive
if [ "${GPU_SUITE_TAR:-0}" = 1 ]; then
  tar czf /tmp/gpu_suite_all.tgz -C "$OUT" . && find "$OUT" -mindepth 1 ! -name summary.md -delete \
    && mv /tmp/gpu_suite_all.tgz "$OUT/all.tgz"
fi
echo "gpu_suite: done in $(( $(date +%s) - START )) s; results in $OUT (summary.md)"
