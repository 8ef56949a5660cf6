"""Reductions called by generated Triton kernels as ``red.sum(x, 1)``, ``red.max(x, 1)``...

On a GPU these are ``tl.reduce`` with NaN-propagating combine functions (torch's ``amax``/``amin`` propagate NaN;
``tl.max`` does not). Under ``TRITON_INTERPRET=1`` ``coil.runtime.triton_libdevice.red`` replaces them with NumPy
reductions: the interpreter runs custom combine functions element by element in Python, which is orders of magnitude
slower."""
import triton
import triton.language as tl


@triton.jit
def _sum_combine(a, b):
    return a + b


@triton.jit
def _prod_combine(a, b):
    return a * b


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def sum(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _sum_combine)


@triton.jit
def prod(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _prod_combine)


@triton.jit
def max(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _max_combine)


@triton.jit
def min(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _min_combine)
