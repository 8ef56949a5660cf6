"""Sparse tensors are not compiled (coil's kernels read strided storage): a sparse input, or an op returning a
sparse tensor, is a logged graph break where the compile failed (BackendCompilerFailed "Cannot access storage of
SparseTensorImpl") or the kernel crashed ("Cannot access data pointer of Tensor that doesn't have storage")."""
import pytest
import torch

import coil


def _dense(t):
    return t.to_dense() if t.layout is not torch.strided else t


@pytest.mark.parametrize("fn, make", [
    (lambda x, s: (s * 2).to_dense() + x, lambda: torch.randn(3, 3).to_sparse()),
    (lambda x, s: torch.sparse.mm(s, x).cos(), lambda: torch.randn(3, 3).to_sparse()),
    (lambda x, s: (x.to_sparse() * 2).to_dense() + s, lambda: torch.randn(3, 3)),
    (lambda x, s: x.sin().to_sparse_csr().to_dense() * s, lambda: torch.randn(3, 3)),
    (lambda x, s: x.to_sparse(), lambda: torch.randn(3, 3)),
])
def test_sparse_tensors_run_eagerly(fn, make):
    x, s = torch.randn(3, 3), make()
    want, got = fn(x, s), coil.compile(fn)(x, s)
    assert got.layout == want.layout
    torch.testing.assert_close(_dense(got), _dense(want))
