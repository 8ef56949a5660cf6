"""Shared helpers for coil codegen tests: trace to decomposed ATen, compile, compare."""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coil.aot.decompositions import get_decompositions
from coil.codegen import compile_aten_graph
from coil.config import patch


def aten_graph(fn, *args):
    """Functional ATen graph of ``fn`` (in-place ops removed, like aot/ produces)."""
    return make_fx(torch.func.functionalize(fn, remove="mutations"),
                   decomposition_table=get_decompositions())(*args)


def compile_fn(fn, *args, backend="triton", **options):
    gm = aten_graph(fn, *args)
    with patch(cpu_backend=backend, **options):
        return compile_aten_graph(gm, list(args), torch.device("cpu"))


def check(fn, *args, kernels=None, atol=1e-5, rtol=1e-5, backend="triton", **options):
    """Compile ``fn`` on ``args``, compare every output with eager; optionally assert the
    number of generated kernels. Returns the compiled graph."""
    compiled = compile_fn(fn, *args, backend=backend, **options)
    out = compiled(*args)
    ref = fn(*args)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        if isinstance(r, torch.Tensor):
            assert o.shape == r.shape, (o.shape, r.shape)
            assert o.dtype == r.dtype, (o.dtype, r.dtype)
            torch.testing.assert_close(o, r, atol=atol, rtol=rtol, equal_nan=True)
        else:
            assert o == r
    if kernels is not None:
        assert compiled.kernel_count == kernels, (compiled.kernel_count, compiled.source)
    return compiled


def count_layout_copies(monkeypatch) -> list:
    """Record every ``ensure_layout`` call that had to copy (an extern kernel returned
    another layout than predicted): a list of (size, stride, actual stride) tuples that
    fills as compiled graphs run."""
    import coil.codegen.wrapper as W
    copies: list = []
    orig = W.ensure_layout

    def counting(t, size, stride, dtype=None):
        out = orig(t, size, stride, dtype)
        if out is not t and (dtype is None or t.dtype == dtype):  # (a dtype conversion is not a layout copy)
            copies.append((tuple(size), tuple(stride), t.stride()))
        return out

    monkeypatch.setattr(W, "ensure_layout", counting)
    return copies
