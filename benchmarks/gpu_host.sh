#!/usr/bin/env bash
# Host-overhead and training diagnostics in one device call (under 7 minutes):
#   host_rn50.txt      ResNet-50 bf16: wall / host ms per step, coil vs torch.compile, and
#                      coil's cProfile (gpu_diag.py host)
#   host_rn50_cl.txt   the same for coil with conv_channels_last on
#   host_gpt2.txt      GPT-2 bf16, coil only
#   train_gpt2.txt     GPT-2 training step: top CUDA kernels, coil vs torch.compile
#   kernels_ln2048.txt layer_norm / rms_norm with COIL_TRITON_PERSISTENT_RNUMEL=2048
# Usage: bash benchmarks/gpu_host.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_results}"; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
D="$PY benchmarks/gpu_diag.py"
step "host ResNet-50"
timeout -k 5 100 $D host timm_resnet50 >"$OUT/host_rn50.txt" 2>&1; grep "^\[" "$OUT/host_rn50.txt"
step "host ResNet-50 channels-last"
COIL_CONV_CHANNELS_LAST=1 DIAG_COMPILERS=coil timeout -k 5 60 $D host timm_resnet50 >"$OUT/host_rn50_cl.txt" 2>&1
grep "^\[" "$OUT/host_rn50_cl.txt"
step "host GPT-2"
DIAG_COMPILERS=coil timeout -k 5 60 $D host hf_gpt2 >"$OUT/host_gpt2.txt" 2>&1; grep "^\[" "$OUT/host_gpt2.txt"
step "layer_norm looped"
COIL_TRITON_PERSISTENT_RNUMEL=2048 timeout -k 5 60 "$PY" benchmarks/gpu_kernels.py layer_norm rms_norm "softmax small long" \
  >"$OUT/kernels_ln2048.txt" 2>&1; grep "^===" "$OUT/kernels_ln2048.txt"
step "profile-train GPT-2"
DIAG_COMPILERS="coil inductor" timeout -k 5 150 $D profile-train hf_gpt2 >"$OUT/train_gpt2.txt" 2>&1
grep "^\[" "$OUT/train_gpt2.txt"
step done
