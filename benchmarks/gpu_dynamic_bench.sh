#!/usr/bin/env bash
# One device call per model (under 10 minutes): `coil bench --mode dynamic` on CUDA for
# MODEL (gpt2: transformers GPT-2 124M; llama: an 8-layer LLaMA, hidden 1024), bf16,
# batch 4, ten sequence lengths 64..512: graphs, compile seconds and ms per length for
# coil (automatic dynamic), coil dynamic=False (one compile per length) and torch.compile,
# timed side by side per length, and the coil / coil-static ratio per length. A budget
# of BUDGET seconds (default 460) cuts the remaining lengths if the run is slow (named
# in the note); timeout is the backstop.
# Each model starts with empty compile caches (all three compilers).
# Files in $OUT: dynamic_bench_MODEL.json/.md/.log.
# Usage: MODEL=gpt2 bash benchmarks/gpu_dynamic_bench.sh   (with .whl/ carried: see gpu_env.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"; export OUT
. benchmarks/gpu_env.sh
"$PY" -c "import sys, torch, triton, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
MODEL="${MODEL:-gpt2}"; BUDGET="${BUDGET:-460}"
# cold caches for every compiler (coil's kernels and tunings, Inductor's FX graph and
# autotune caches, Triton's binaries), so compile seconds do not depend on what ran
# on the machine before: a warm Inductor cache once read 8 s against a cold 28 s
CACHES=$(mktemp -d /tmp/dyncache.XXXX)
export COIL_CACHE_DIR="$CACHES/coil" TORCHINDUCTOR_CACHE_DIR="$CACHES/inductor" TRITON_CACHE_DIR="$CACHES/triton"
step "bench $MODEL"
timeout -k 5 $(( BUDGET + 60 )) "$PY" -m coil.cli bench --mode dynamic --model "$MODEL" \
  --budget "$BUDGET" --repeat 30 --warmup 3 --no-progress --json "$OUT/dynamic_bench_$MODEL.json" \
  --markdown "$OUT/dynamic_bench_$MODEL.md" 2>&1 | tee "$OUT/dynamic_bench_$MODEL.log" | tail -20
step done
