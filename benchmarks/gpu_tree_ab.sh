#!/usr/bin/env bash
# Host-side A/B of one broad-suite row between this tree and an older one, in one device call.
# Make the old tree first (ignored by git: pass carry ["oldtree", ".whl"] to the device call):
#   rm -rf oldtree && mkdir oldtree && git archive <rev> | tar -x -C oldtree && cp -r .whl oldtree/ \
#     && cp benchmarks/host_step_ab.py benchmarks/interleave_diag.py oldtree/benchmarks/
# Then: MODEL=b_whisper MODE=bf16 bash benchmarks/gpu_tree_ab.sh
# Per tree: host_step_ab.py (events / throughput / cProfile top $TOP) with the compile log in
# $OUT/trace_<tree> (the wrapper source is an artifact there), interleave_diag.py (coil's step alone and between
# eager / torch.compile steps; INTERLEAVE=0 skips it), then with ROWS=1 the suite row
# (eager, coil, torch.compile) for this tree. Results in $OUT (default ./gpu_results).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
MODEL="${MODEL:-b_whisper}"; MODE="${MODE:-bf16}"; TOP="${TOP:-80}"
for tree in . oldtree; do
  [ -d "$tree/coil" ] || continue
  tag=$([ "$tree" = . ] && echo new || echo old)
  step "host_step_ab $tag"
  (cd "$tree" && COIL_TRACE="$OUT/trace_$tag" PYTHONPATH="$PWD:/tmp/coil_site" timeout -k 5 200 "$PY" \
     benchmarks/host_step_ab.py --model "$MODEL" --mode "$MODE" --top "$TOP") >"$OUT/hostab_$tag.txt" 2>&1
  grep "^==" "$OUT/hostab_$tag.txt" || tail -5 "$OUT/hostab_$tag.txt"
  if [ "${INTERLEAVE:-1}" = 1 ]; then
    step "interleave_diag $tag"
    (cd "$tree" && PYTHONPATH="$PWD:/tmp/coil_site" timeout -k 5 150 "$PY" benchmarks/interleave_diag.py \
       --model "$MODEL" --mode "$MODE") >"$OUT/interleave_$tag.txt" 2>&1
    tail -6 "$OUT/interleave_$tag.txt"
  fi
done
if [ "${ROWS:-0}" = 1 ]; then
  for tree in . oldtree; do
    [ -d "$tree/coil" ] || continue
    tag=$([ "$tree" = . ] && echo new || echo old)
    step "suite row $tag"
    (cd "$tree" && PYTHONPATH="$PWD:/tmp/coil_site" timeout -k 5 150 "$PY" -m coil.cli bench --suite broad \
       --isolate --paired --budget 100 --mode "$MODE" --model "$MODEL" --compiler eager coil inductor \
       --repeat 10 --max-timing 20 --row-timeout 90 --no-warm-compile --no-progress \
       --json "$OUT/row_$tag.json") >"$OUT/row_$tag.txt" 2>&1
    tail -4 "$OUT/row_$tag.txt"
  done
fi
step done
