"""benchmarks/gpu_cnn_profile.py: kernel-name classification and a CPU smoke run."""
import importlib.util
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gpu_cnn_profile.py")
spec = importlib.util.spec_from_file_location("gpu_cnn_profile", _PATH)
prof = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prof)


@pytest.mark.parametrize("name,kind", [
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "conv NHWC"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_f16f16_f16f32_f32_nchwkcrs_nchw", "conv NCHW"),
    ("void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<1, c10::BFloat16>", "conv NCHW"),
    ("void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true>", "layout conversion"),
    ("triton_poi_fused__native_batch_norm_legit_no_training_relu_3", "generated"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64", "gemm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other"),
])
def test_kernel_kind(name, kind):
    assert prof.kernel_kind(name) == kind


def test_cpu_smoke_run(tmp_path):
    """The whole script on CPU: the hand-written MobileNetV3-style module (or timm's, when
    installed, at 32x32), eager and coil, one batch; the report has both rows and coil's
    output matches eager's within bf16 rounding."""
    assert prof.main(["--device", "cpu", "--out", str(tmp_path), "--models", "mobilenetv3_large_100",
                      "--batches", "1", "--compilers", "eager", "coil", "coil-base", "--steps", "1"]) == 0
    text = (tmp_path / "cnn_profile.txt").read_text()
    assert "[eager]" in text and "[coil]" in text and "[coil-base]" in text and "summary" in text
    line = next(l for l in text.splitlines() if l.startswith("  [coil]"))
    diff = float(line.split("max |out - eager| ")[1].split(";")[0])
    assert diff < 0.1
