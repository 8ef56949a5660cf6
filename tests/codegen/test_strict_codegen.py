"""``config.strict_codegen`` (env ``COIL_STRICT_CODEGEN=1``): every fallback from coil's
own kernels to ATen ops / the FX interpreter caused by an internal failure raises
``coil.exc.StrictCodegenError`` instead of warning (coil.exc.refuse_fallback)."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

import coil
from coil.config import patch
from coil.exc import KernelCompileError, StrictCodegenError


def _f(x, y):
    return (torch.sin(x) + y).sum(-1), x * y


def _broken_codegen(monkeypatch):
    import coil.codegen as C

    def boom(gm, example_inputs, device):
        raise AssertionError("test: code generation failed")

    monkeypatch.setattr(C, "compile_aten_graph", boom)


def test_codegen_fallback_warns_by_default_and_raises_when_strict(monkeypatch):
    _broken_codegen(monkeypatch)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with patch(strict_codegen=False), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        coil.reset()
        out = coil.compile(_f)(x, y)
    assert any("code generation failed" in str(m.message) for m in w)
    for o, r in zip(out, _f(x, y)):
        torch.testing.assert_close(o, r)
    coil.reset()
    with patch(strict_codegen=True), pytest.raises(Exception) as info:
        coil.compile(_f, fullgraph=True)(x, y)
    chain, e = [], info.value
    while e is not None:
        chain.append(e)
        e = getattr(e, "inner", None) or e.__cause__
    assert any(isinstance(c, StrictCodegenError) for c in chain), chain
    assert "codegen_fallback" in str(info.value)


def test_kernel_compile_fallback_raises_when_strict():
    from codegen_helpers import compile_fn
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    c = compile_fn(_f, x, y, backend="cpp")

    def broken(*a):
        raise KernelCompileError("test: kernel rejected")

    c.call = broken
    with patch(strict_codegen=True), pytest.raises(StrictCodegenError, match="kernel_compile_fallback"):
        c(x, y)


def test_strict_codegen_from_environment():
    code = "from coil.config import config; print(config.strict_codegen)"
    env = dict(os.environ, COIL_STRICT_CODEGEN="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def _true_branch(x):
    return x.sin()


def _false_branch(x):
    return x.cos()


def _cond(x):
    return torch.cond(x.sum() > 0, _true_branch, _false_branch, (x,)) * 2


def test_cond_branch_fallback_counts_and_raises_when_strict(monkeypatch):
    """A torch.cond branch whose compilation fails runs with the FX interpreter
    (ir/hops.py, hop_branch_fallback): counted, and an error under strict_codegen."""
    import coil.codegen as C
    from coil.exc import fallback_counts

    real, depth = C.compile_aten_graph, [0]

    def branches_fail(gm, example_inputs, device):
        if depth[0]:
            raise AssertionError("test: branch code generation failed")
        depth[0] += 1
        try:
            return real(gm, example_inputs, device)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(C, "compile_aten_graph", branches_fail)
    x = torch.rand(4, 8) + 0.1
    before = fallback_counts["hop_branch_fallback"]
    with patch(strict_codegen=False):
        coil.reset()
        torch.testing.assert_close(coil.compile(_cond)(x), _cond(x))
    assert fallback_counts["hop_branch_fallback"] >= before + 2
    coil.reset()
    with patch(strict_codegen=True), pytest.raises(Exception, match="hop_branch_fallback"):
        coil.compile(_cond, fullgraph=True)(x)
