#!/usr/bin/env bash
# The broad model suite (coil/bench/broad.py, docs/bench.md) on the GPU machine, in batches
# that each fit one device call (< 10 minutes): per model, bf16 inference and AMP training,
# eager / coil / torch.compile timed --paired (one shared eager series per model and mode),
# fresh caches (cold compile seconds are real), each model in its own subprocess.
#   BATCH=i (0-based) runs the i-th slice of BATCH_SIZE models (default 3: 16 batches for
#     the 47 models); BATCH=list prints the batches and exits;
#   MODELS="b_swin_tiny b_gpt2" runs those instead of a batch;
#   MODES="bf16" (default "bf16 train"); STRICT=1 sets COIL_STRICT_CODEGEN=1 (a codegen
#     fallback is then the row's error instead of a count in its "fallbacks" column);
#   ROW_TIMEOUT=s (default 150) bounds one model and mode;
#   MERGE=1 merges every $OUT/broad_*.json into $OUT/broad.{md,json} (no device needed).
# Results: $OUT/broad_<batch>.{json,md,txt,log}, machine.txt.
# Usage: BATCH=0 bash benchmarks/suite_broad.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
BATCH_SIZE="${BATCH_SIZE:-3}"
MODES="${MODES:-bf16 train}"
CALL_BUDGET="${CALL_BUDGET:-540}"

if [ "${MERGE:-0}" = 1 ]; then
  "$PY" - "$OUT" <<'PYEOF'
import glob, json, os, sys
from coil.bench import suite
out = sys.argv[1]
files = sorted(f for f in glob.glob(os.path.join(out, "broad_*.json")) if not f.endswith("broad.json"))
results = [json.load(open(f)) for f in files]
merged = {"meta": dict(results[0]["meta"] if results else {}, merged=files),
          "rows": [r for res in results for r in res["rows"]]}
json.dump(merged, open(os.path.join(out, "broad.json"), "w"), indent=1)
open(os.path.join(out, "broad.md"), "w").write(suite.format_markdown(merged))
print(suite.format_text(merged))
PYEOF
  exit 0
fi

ALL=$("$PY" -c "from coil.bench.broad import BROAD; print(' '.join(BROAD))")
if [ "${BATCH:-}" = list ]; then
  echo $ALL | tr ' ' '\n' | awk -v n="$BATCH_SIZE" '{printf "%s%s", $0, (NR % n ? " " : "\n")}'
  echo; exit 0
fi
if [ -n "${MODELS:-}" ]; then
  SEL="$MODELS"; TAG="${TAG:-custom}"
else
  B="${BATCH:-0}"; TAG="$B"
  SEL=$(echo $ALL | tr ' ' '\n' | sed -n "$(( B * BATCH_SIZE + 1 )),$(( (B + 1) * BATCH_SIZE ))p" | tr '\n' ' ')
  [ -n "$SEL" ] || { echo "batch $B is empty"; exit 1; }
fi
[ "${STRICT:-0}" = 1 ] && export COIL_STRICT_CODEGEN=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
  "$PY" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  "$PY" -c "import transformers, timm; print('transformers', transformers.__version__, 'timm', timm.__version__)" 2>&1
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.txt" 2>&1
step "broad batch $TAG: $SEL"
LEFT=$(( CALL_BUDGET - ($(date +%s) - START) - 20 ))
timeout -k 5 $(( LEFT + 15 )) "$PY" -m coil.cli bench --suite broad --isolate --paired \
  --budget "$LEFT" --mode $MODES --model $SEL --compiler eager coil inductor --repeat 10 \
  --max-timing 20 --row-timeout "${ROW_TIMEOUT:-150}" --no-warm-compile \
  --json "$OUT/broad_$TAG.json" --markdown "$OUT/broad_$TAG.md" --no-progress \
  >"$OUT/broad_$TAG.txt" 2>"$OUT/broad_$TAG.log"
cat "$OUT/broad_$TAG.txt"
step done
