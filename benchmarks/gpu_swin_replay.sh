#!/usr/bin/env bash
# HF Swin-T training's LayerNorm-gradient reduction (BENCHMARKS.md, issue-19 rows): replay the kept kernel
# under the config that raised an illegal memory access, with and without its device asserts, each config in
# its own process (benchmarks/gpu_kernel_replay.py). About 1 minute. Output: $OUT/replay.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
K=benchmarks/results/kernels/hf_swin_train_red_6272.py
ARGS="--arg 6272x384:bf16 --arg 6272x384:bf16 --arg 6272x384:bf16 --arg 6272x384:f32 --arg 6272:f32 --arg 6272:f32 --arg 384:f32"
for extra in "" "--drop-asserts"; do
  echo "== asserts ${extra:-kept}"
  # shellcheck disable=SC2086
  CUDA_LAUNCH_BLOCKING=1 timeout 150 "$PY" benchmarks/gpu_kernel_replay.py $K triton_red_92_buf177 384 $ARGS \
    --config 1,8192,16 --config 1,8192,8 --config 1,4096,16 $extra
done 2>&1 | tee "$OUT/replay.txt"
