"""No C++ compiler: the graph falls back (logged reason, warning) and results stay right;
the C++ backend is the default for CPU tensors."""
import warnings

import pytest
import torch

pytest.importorskip("coil.codegen.backend")

from coil.codegen import _pick_backend  # noqa: E402
from coil.config import config  # noqa: E402
from coil.runtime import cpp_build  # noqa: E402


def test_cpp_is_default_cpu_backend():
    assert config.cpu_backend == "cpp"
    assert _pick_backend(torch.device("cpu")).name == "cpp"


def test_missing_compiler_falls_back(monkeypatch, tmp_path):
    from coil.backends.coil_backend import kernel_compiler
    from torch.fx.experimental.proxy_tensor import make_fx
    from coil.aot.decompositions import get_decompositions

    def f(x):
        return (torch.softmax(x, -1) * 3 + 1,)

    x = torch.randn(4, 33)
    gm = make_fx(f, decomposition_table=get_decompositions())(x)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    from coil.config import config
    monkeypatch.setattr(config, "strict_codegen", False)  # the fallback is the subject
    cpp_build._reset_compiler()
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fn = kernel_compiler(gm, [x])
        assert any("CompilerNotFound" in str(m.message) or "compiler" in str(m.message) for m in w)
        torch.testing.assert_close(fn(x)[0], f(x)[0])
    finally:
        monkeypatch.delenv("CXX")
        cpp_build._reset_compiler()
