"""AOT's fake runs outside make_fx (``analyze``, ``eager_layouts``) dispatch ops as its
symbolic traces and coil's capture do: under the Python dispatcher, where composite ops
take torch's Python kernels, which keep sizes symbolic (coil/aot/functional.py
``untraced``, docs/aot.md).

The bug: with torch 2.11, ``aten.linear`` of a 3-D input reached the C++ ``matmul``
kernel in ``analyze``; it read the input's ``sizes()``, which pinned the symbolic
sequence length (guard ``Eq(s14, 128)``), so GPT-2 compiled once per length on the H200.
torch 2.13's C++ kernel keeps SymInts, so torch 2.13 cannot run that kernel; the first
test models it with an operator that has both kinds of composite kernel, as
``aten.matmul`` has. Under torch 2.11 (the GPU machine's version; its CPU wheel too)
every test here failed without the fix: 4 compiles, the length pinned.
"""
import pytest
import sympy
import torch
from torch._C import DispatchKey

import coil
from coil.backends import lookup_backend

_lib = torch.library.Library("coil_test_sym", "DEF")
_lib.define("fold(Tensor x, Tensor w) -> Tensor")


def _fold_reading_ints(x, w):
    """The dispatcher's composite kernel, as torch 2.11's C++ matmul: it reads the sizes
    as ints (each read of a symbolic size pins it)."""
    b, n, k = (int(s) for s in x.shape)
    return torch.mm(x.reshape(b * n, k), w).view(b, n, w.shape[1])


_lib.impl("fold", _fold_reading_ints, "CompositeImplicitAutograd")


@torch.ops.coil_test_sym.fold.default.py_impl(DispatchKey.CompositeImplicitAutograd)
def _fold_symbolic(x, w):
    """Its Python kernel (as torch's Python matmul): symbolic sizes stay symbolic."""
    return torch.mm(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[1])


class Recording:
    """A backend that counts compiles and, after each, lists the symbols of the graph's
    inputs that the ShapeEnv has replaced by a number (pinned)."""

    def __init__(self, name):
        self.inner = lookup_backend(name)
        self.n = 0
        self.pinned = []
        self.__name__ = f"recording_{name}"

    def __call__(self, gm, example_inputs):
        self.n += 1
        out = self.inner(gm, example_inputs)
        for node in gm.graph.nodes:
            v = node.meta.get("example_value") if node.op == "placeholder" else None
            if isinstance(v, torch.Tensor) and v.fake_mode.shape_env is not None:
                env = v.fake_mode.shape_env
                for dim, d in enumerate(v.shape):
                    if isinstance(d, torch.SymInt):
                        expr = env.replace(d.node.expr)
                        if isinstance(expr, sympy.Integer):
                            self.pinned.append((node.name, dim, int(expr)))
        return out


def _lengths(fn, args_of, grad, backend="aot_eager"):
    """Compile ``fn`` (automatic dynamic) and run it on inputs of four lengths."""
    coil.reset()
    rec = Recording(backend)
    f = coil.compile(fn, backend=rec)
    for n in (6, 9, 14, 23):
        args = args_of(n)
        with torch.set_grad_enabled(grad):
            got, want = f(*args), fn(*args)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert g.stride() == w.stride()
            assert g.requires_grad == w.requires_grad
    return rec


@pytest.mark.parametrize("grad", [False, True])
def test_analysis_takes_the_python_kernel_of_a_composite_op(grad):
    """Before: analyze ran the dispatcher's kernel, which pinned the length: a compile per
    length (4), the second graph's length symbol replaced by 9."""
    w = torch.randn(5, 3, requires_grad=True)

    def fn(x):
        return (torch.ops.coil_test_sym.fold(x, w).relu(),)

    rec = _lengths(fn, lambda n: (torch.randn(2, n, 5),), grad)
    assert rec.pinned == []
    assert rec.n == 2                       # static first length, then one symbolic graph


class _Block(torch.nn.Module):
    """Linear layers on 3-D inputs (with and without bias, as GPT-2's lm_head), ``@`` of a
    3-D by a 2-D tensor, and broadcasting batched ``@`` (3-D by transposed 3-D, 4-D by 3-D)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 12)
        self.head = torch.nn.Linear(12, 7, bias=False)
        self.w = torch.nn.Parameter(torch.randn(12, 4))

    def forward(self, x):
        h = self.a(x).relu()
        scores = h @ h.transpose(1, 2)
        per_head = h.view(2, 1, -1, 12) @ h[:1].transpose(1, 2)
        return self.head(h), h @ self.w, scores, per_head


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
@pytest.mark.parametrize("grad", [False, True])
def test_linear_and_matmul_on_3d_inputs_keep_the_length_symbolic(grad, backend):
    torch.manual_seed(0)
    m = _Block()
    rec = _lengths(m, lambda n: (torch.randn(2, n, 8),), grad, backend)
    assert rec.pinned == []
    assert rec.n == 2
