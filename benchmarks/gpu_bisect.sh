#!/usr/bin/env bash
# One broad-suite row (eager and coil paired, fresh caches) from several trees in one device call, to find the
# commit where a row's coil / eager speedup changed. Unpack each tree's coil/ into an ignored folder first, e.g.
#   for c in <revs>; do mkdir -p bisect/$c && git archive $c coil | tar -x -C bisect/$c; done
# and pass carry [".whl", "bisect"] (plus "oldtree" if TREES names it) to the device call. Then:
#   TREES=". bisect/abc1234 bisect/def5678" MODEL=b_whisper MODE=bf16 bash benchmarks/gpu_bisect.sh
# Rows run in the order given until CALL_BUDGET seconds (default 540) have passed; each prints
# "== <tree>: eager <ms> coil <ms> coil/eager <x>". Results in $OUT/bisect_<n>.json (default OUT ./gpu_results).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"
. benchmarks/gpu_env.sh
MODEL="${MODEL:-b_whisper}"; MODE="${MODE:-bf16}"; CALL_BUDGET="${CALL_BUDGET:-540}"
COMPILERS="${COMPILERS:-eager coil}"; ROW_TIMEOUT="${ROW_TIMEOUT:-90}"
n=0
for tree in ${TREES:-.}; do
  [ -d "$tree/coil" ] || { echo "== $tree: no coil/ here"; continue; }
  left=$(( CALL_BUDGET - ($(date +%s) - START) ))
  [ "$left" -gt "$ROW_TIMEOUT" ] || { echo "== $tree: skipped ($left s left)"; continue; }
  n=$((n + 1))
  (cd "$tree" && PYTHONPATH="$PWD:/tmp/coil_site" timeout -k 5 "$ROW_TIMEOUT" "$PY" -m coil.cli bench --suite broad \
     --isolate --paired --budget "$ROW_TIMEOUT" --mode "$MODE" --model "$MODEL" --compiler $COMPILERS \
     --repeat 10 --max-timing 10 --row-timeout "$ROW_TIMEOUT" --no-warm-compile --no-progress --quiet \
     --json "$OUT/bisect_$n.json") >"$OUT/bisect_$n.txt" 2>&1
  "$PY" - "$OUT/bisect_$n.json" "$tree" <<'PYEOF'
import json, sys
try:
    rows = {r["compiler"]: r for r in json.load(open(sys.argv[1]))["rows"]}
    e, c = rows["eager"]["eager_ms"], rows["coil"]["compiled_ms"]
    print(f"== {sys.argv[2]}: eager {e:.2f} coil {c:.2f} coil/eager {e / c:.3f} ({rows['coil']['status']})")
except Exception as ex:  # noqa: BLE001
    print(f"== {sys.argv[2]}: no row ({type(ex).__name__}: {ex})")
PYEOF
done
step done
