"""Dynamic-shape programs written as a user would, each the smallest input of a bug
found that way (docs/dynamic_shapes.md), on both CPU code generators, against eager."""
import pytest
import torch

import coil

BACKENDS = ["cpp", "triton"]


def _compiled(fn, backend, options=(), **kw):
    coil.reset()
    return coil.compile(fn, dynamic=True, options={"cpu_backend": backend, **dict(options)}, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sum_of_last_chunk_of_a_dynamic_dim(backend):
    """The last chunk's length ``L - 2*((L+2)//3)`` is a reduction's row length: the C++
    tail loop printed ``L - 2*((L+2)/3) % 8`` (``%`` before ``-``) and summed the wrong
    elements for L = 10 and 11; on Triton, L = 7 (a row of 1) launched without RBLOCK."""
    fn = lambda x: x.chunk(3, dim=1)[2].sum(1)  # noqa: E731
    f = _compiled(fn, backend)
    for n in (7, 8, 10, 11):
        x = torch.arange(2.0 * n).view(2, n)
        torch.testing.assert_close(f(x), fn(x))


def test_shape_guard_on_a_float_of_a_size_accepts_its_own_sizes():
    """``x.shape[0] * 0.3 > 1.0`` guards ``0.3*torch.sym_float(x.size()[0]) > 1.0``: the
    guard function had no ``torch``, raised NameError, and every call recompiled."""
    from coil.testing import CompileCounter

    def fn(x):
        if x.shape[0] * 0.3 > 1.0:
            return x * 2
        return x * 3

    coil.reset()
    cnt = CompileCounter()
    f = coil.compile(fn, backend=cnt, dynamic=True)
    for n in (4, 5, 4, 5, 2, 6):
        x = torch.randn(n)
        torch.testing.assert_close(f(x), fn(x))
    assert cnt.frame_count == 2  # one entry for n > 3.33, one for n = 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernels_after_a_boolean_mask_are_generated(backend):
    """A kernel over ``x[x > 0]`` has a data-dependent length ``u0``: Triton's int32 index
    check guarded ``u0 < 2**31 - 1``, which cannot be decided, and the whole graph fell
    back to the FX interpreter (with a warning). It now indexes such kernels in int64."""
    import warnings

    fn = lambda x: x[x > 0].exp() * 2  # noqa: E731
    f = _compiled(fn, backend, options={"capture_scalar_outputs": True,
                                        "capture_dynamic_output_shape_ops": True})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (5, 8, 13):
            x = torch.randn(n, 4)
            torch.testing.assert_close(f(x), fn(x))
    assert not [w for w in caught if "code generation failed" in str(w.message)]
