#!/usr/bin/env bash
# One device call: why a broad row or a reduce-overhead row is slow. Runs broad_diag on
# $ROWS (model:mode), gpu_train_profile on $PROFILE models (AMP training, coil vs
# torch.compile kernel by kernel) and gpu_ro_events on $RO timm models (--profile).
# Usage: ROWS="b_whisper:train" PROFILE="b_whisper" RO="mobilenetv3_large_100" bash benchmarks/gpu_diag_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
for m in ${RO:-}; do step "ro $m"; timeout -k 5 150 "$PY" benchmarks/gpu_ro_events.py "$m" --profile > "$OUT/ro_$m.txt" 2>&1; tail -5 "$OUT/ro_$m.txt"; done
[ -n "${ROWS:-}" ] && { step diag; timeout -k 5 240 "$PY" benchmarks/broad_diag.py $ROWS --out "$OUT" ${DIAG_ARGS:-} 2>&1 | grep -v lowering_fallbacks | tail -60; }
for m in ${PROFILE:-}; do step "profile $m"; timeout -k 5 200 "$PY" benchmarks/gpu_train_profile.py --model "$m" --out "$OUT" 2>&1 | tail -70; done
step done
