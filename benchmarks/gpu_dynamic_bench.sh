#!/usr/bin/env bash
# One device call (under 9 minutes): `coil bench --mode dynamic` on CUDA. transformers
# GPT-2 124M and an 8-layer LLaMA (hidden 1024), bf16, batch 4, ten sequence lengths
# 64..512; per model: graphs, compile seconds and ms per length for coil (automatic
# dynamic), coil dynamic=False (one compile per length) and torch.compile, and the
# coil / coil-static ratio per length. --budget splits 420 s over the six rows (a row out
# of time skips its remaining lengths, named in its note); timeout is the backstop.
# Then benchmarks/gpu_dynamic_diag.py (why GPT-2 recompiles per length), if time is left.
# Files in $OUT: dynamic_bench.json/.md/.log, dynamic_diag.log (+ dynamic_diag_trace/).
# Usage: bash benchmarks/gpu_dynamic_bench.sh   (with .whl/ carried: see gpu_env.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"; export OUT
. benchmarks/gpu_env.sh
"$PY" -c "import sys, torch, triton, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
step bench
timeout -k 5 470 "$PY" -m coil.cli bench --mode dynamic --budget 420 --no-progress \
  --json "$OUT/dynamic_bench.json" --markdown "$OUT/dynamic_bench.md" 2>&1 \
  | tee "$OUT/dynamic_bench.log" | tail -20
step diag
LEFT=$(( 530 - ($(date +%s) - START) ))
if [ "$LEFT" -gt 60 ]; then
  timeout -k 5 "$LEFT" "$PY" benchmarks/gpu_dynamic_diag.py --variants default math \
    > "$OUT/dynamic_diag.log" 2>&1; tail -c 4000 "$OUT/dynamic_diag.log"
fi
step done
