# Sourced (from the repo root, with $OUT set) by the benchmarks/gpu_*.sh scripts: the GPU
# machine has no network, so the bytecode wheel travels in .whl/ and is installed into
# /tmp/coil_site; coil itself comes from the working tree via PYTHONPATH. Sets $PY, and
# $START with `step NAME` (prints NAME and the seconds since sourcing) for timed steps.
PY="$(command -v python3 || command -v python)"
SITE=/tmp/coil_site
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl >"$OUT/setup.log" 2>&1 || echo "wheel install failed (see setup.log)"
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1
START=$(date +%s)
step() { echo "=== $1 at $(( $(date +%s) - START )) s"; }
