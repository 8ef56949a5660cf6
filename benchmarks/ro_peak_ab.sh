#!/usr/bin/env bash
# Steady-state peak memory of reduce-overhead workloads, each copy alone in its own process
# (`python -m coil.bench.reduce_overhead --peak`, as the bench's isolated_peaks), for torch.compile,
# coil of this tree and coil of a variant tree: a copy of this one with a sed expression applied
# (VARIANT_FILE, VARIANT_SED; default: the wrapper's buffer reuse on under CUDA graphs, as before
# 2026-12-06). Prints one line per workload: GiB reserved at the peak beyond the module, per copy.
#   WORKLOADS="llama_b1 train_gpt" JOBS=4 bash benchmarks/ro_peak_ab.sh     # the GPU machine
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
WORKLOADS="${WORKLOADS:-gpt2_b1 gpt2_b8 llama_b1 llama_b8 gpt2_decode resnet50 mobilenet train_gpt}"
VARIANT_FILE="${VARIANT_FILE:-coil/codegen/__init__.py}"
VARIANT_SED="${VARIANT_SED:-s/reuse = not (config.cudagraphs.*/reuse = True/}"
VT=/tmp/coil_variant; rm -rf "$VT"; mkdir -p "$VT"
cp -r coil "$VT/" && sed -i "$VARIANT_SED" "$VT/$VARIANT_FILE"
diff -u "$VARIANT_FILE" "$VT/$VARIANT_FILE" | sed -n 3,12p
for w in $WORKLOADS; do
  for c in "inductor $PWD" "coil $PWD" "coil $VT"; do echo "$w $c"; done
done | (cd /tmp && xargs -P "${JOBS:-4}" -L1 bash -c '
  r=$(PYTHONPATH="$3:$PYTHONPATH" timeout 300 "$0" -m coil.bench.reduce_overhead --peak "$1" "$2" full 3 2>/dev/null | tail -1)
  echo "$1 $2 $3 ${r:-failed}"' "$PY") | sort > "$OUT/ro_peak_ab.txt"
cat "$OUT/ro_peak_ab.txt"
