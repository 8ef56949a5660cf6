#!/usr/bin/env bash
# The whole broad suite in one device call on a machine of several GPUs (nvidia-h100-x8, nvidia-h200-x8, ...):
# one worker per GPU, each pinned to its GPU (CUDA_VISIBLE_DEVICES) and to its own slice of the CPU cores
# (taskset: timing and cold compile seconds are not shared with the other workers), running
# benchmarks/suite_broad.sh's command (--isolate --paired, fresh caches) on its share of the models; the
# models are dealt round-robin in the order of benchmarks/broad_cost.txt when it lists them (slowest first),
# else in BROAD's order. Rows a worker has not started by CALL_BUDGET are "skipped": run the call again
# with MODELS="..." for those. Results: $OUT/broad_gpu<i>.{json,md,txt,log}, merged into $OUT/broad.{json,md}.
#   MODELS="b_gpt2 b_vit_b16" picks models; MODES="bf16" (default "bf16 train"); GPUS=4 uses the first 4 GPUs
#   (default: all); PLAN=1 prints each GPU's models and exits (no GPU needed).
# Usage: bash benchmarks/suite_broad_sharded.sh      (carry .whl: see gpu_env.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
MODES="${MODES:-bf16 train}"
CALL_BUDGET="${CALL_BUDGET:-540}"
NGPU="${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}"
[ "$NGPU" -ge 1 ] 2>/dev/null || NGPU=1
ALL="${MODELS:-$("$PY" -c "from coil.bench.broad import BROAD; print(' '.join(BROAD))")}"
if [ -f benchmarks/broad_cost.txt ]; then   # slowest first, then the models it does not list
  ALL=$(for m in $(grep -v '^#' benchmarks/broad_cost.txt | awk '{print $1}') $ALL; do echo "$m"; done |
        awk -v want=" $ALL " 'index(want, " " $0 " ") && !seen[$0]++' | tr '\n' ' ')
fi
declare -a SHARD
i=0
for m in $ALL; do SHARD[$(( i % NGPU ))]+="$m "; i=$(( i + 1 )); done
if [ "${PLAN:-0}" = 1 ]; then
  for g in $(seq 0 $(( NGPU - 1 ))); do echo "gpu $g: ${SHARD[$g]:-}"; done
  exit 0
fi
CORES=$(nproc); PER=$(( CORES / NGPU ))
{ date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1
  "$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  "$PY" -c "import transformers, timm; print('transformers', transformers.__version__, 'timm', timm.__version__)" 2>&1
  echo "$NGPU workers, $PER cores each; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.txt" 2>&1
step "broad suite on $NGPU GPUs"
LEFT=$(( CALL_BUDGET - ($(date +%s) - START) - 30 ))
for g in $(seq 0 $(( NGPU - 1 ))); do
  [ -n "${SHARD[$g]:-}" ] || continue
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$g OMP_NUM_THREADS=$PER \
    timeout -k 5 $(( LEFT + 15 )) taskset -c $(( g * PER ))-$(( g * PER + PER - 1 )) \
    "$PY" -m coil.cli bench --suite broad --isolate --paired --budget "$LEFT" --mode $MODES \
    --model ${SHARD[$g]} --compiler eager coil inductor --repeat 10 --max-timing 20 --row-timeout 150 \
    --no-warm-compile --json "$OUT/broad_gpu$g.json" --markdown "$OUT/broad_gpu$g.md" --no-progress \
    >"$OUT/broad_gpu$g.txt" 2>"$OUT/broad_gpu$g.log" &
done
wait
step merge
MERGE=1 bash benchmarks/suite_broad.sh | tail -5
step done
