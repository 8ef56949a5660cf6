#!/usr/bin/env bash
# One device call: where reduce-overhead rows' memory and host time go. Runs
# benchmarks/gpu_ro_train_profile.py in separate processes: each memory workload with
# torch.compile and coil (pools, segments, largest blocks, coil's tree), and the decode loop
# with coil alone and after an eager copy (main-thread wall vs CPU time, cProfile of 3 steps).
# Usage: MEM="resnet50 gpt2_b1" bash benchmarks/gpu_ro_memory_host.sh (with .whl/ carried)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
for w in ${MEM-resnet50 gpt2_b1}; do
  step "memory $w"
  timeout -k 5 150 "$PY" benchmarks/gpu_ro_train_profile.py --workload "$w" --compilers inductor coil \
    --steps 10 --out "$OUT/mem_$w" 2>&1 | grep -v "^    [0-9 .]*µs" | tail -60
done
if [ "${DECODE:-1}" = 1 ]; then
  step "decode coil alone"
  timeout -k 5 120 "$PY" benchmarks/gpu_ro_train_profile.py --workload gpt2_decode --compilers coil \
    --steps 10 --host 3 --out "$OUT/dec_alone" 2>&1 | tail -70
  step "decode after eager"
  timeout -k 5 150 "$PY" benchmarks/gpu_ro_train_profile.py --workload gpt2_decode --compilers eager coil \
    --steps 10 --host 3 --out "$OUT/dec_eager" 2>&1 | tail -70
fi
step done
