"""Regressions from new-user trial 66 (FINDINGS_66.md): operator breadth and numerics (reductions, scans, sorting,
indexing and scatter ops, integer and low-precision arithmetic, unusual layouts, ``dynamic=True``, gradients),
compared with eager on CPU.
"""

import pytest
import torch

import coil


def _raises_like_eager(fn, *args, **compile_kwargs):
    """``fn(*args)`` raises in eager; the compiled ``fn`` raises the same exception type and message."""
    with pytest.raises(Exception) as eager:
        fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    with pytest.raises(type(eager.value)) as compiled:
        coil.compile(fn, **compile_kwargs)(*args)
    assert str(compiled.value) == str(eager.value)


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; values where eager raises, read past the values' buffer): ``index_put`` / ``x[i] = v`` with
# integer indices and values that do not broadcast to the indexing result. torch's meta kernel does not check the
# values' shape, so capture accepted the call and the kernel read 3 values from a 2-element buffer.
# ---------------------------------------------------------------------------------------------------------------

def _setitem(x, v):
    x[torch.tensor([0, 1, 1])] = v
    return x


def _setitem_cols(x, v):
    x[:, torch.tensor([0, 1, 1])] = v
    return x


def _setitem_list(x, v):
    x[[0, 1, 1]] = v
    return x


@pytest.mark.parametrize("fn, shape, vshape", [
    (lambda x, v: x.index_put((torch.tensor([0, 1, 1]),), v), (4,), (2,)),
    (lambda x, v: x.index_put((torch.tensor([0, 1, 1]),), v, accumulate=True), (4, 2), (2, 2)),
    (lambda x, v: x.index_put_((torch.tensor([0, 1, 1]),), v, accumulate=True), (3, 4), (4, 4)),
    (_setitem, (4,), (2,)), (_setitem_cols, (3, 4), (3, 2)), (_setitem_list, (3, 4), (2, 4))])
def test_index_put_values_that_do_not_broadcast_raise(coil_reset, fn, shape, vshape):
    _raises_like_eager(fn, torch.zeros(shape), torch.ones(vshape))


def test_index_put_values_that_broadcast_still_compile(coil_reset):
    def f(x, v, w):
        x[torch.tensor([0, 1, 1])] = v
        x[:, torch.tensor([[0], [2]])] = w
        return x.index_put((torch.tensor([2, 0]),), v[:1], accumulate=True)
    args = (torch.zeros(3, 4), torch.randn(3, 4), torch.randn(3, 1, 1))
    ref = f(*[a.clone() for a in args])
    torch.testing.assert_close(coil.compile(f)(*args), ref)


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed; values where eager raises): ``3 % x`` of an integer tensor holding 0 (``remainder.Scalar_Tensor``)
# returned numbers; eager raises ZeroDivisionError as it does for ``x % 0`` (already checked).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dynamic", [False, True])
def test_python_number_modulo_int_tensor_with_zero_raises(coil_reset, dynamic):
    _raises_like_eager(lambda x: 3 % x, torch.tensor([1, 0, -4]), dynamic=dynamic)
    torch.testing.assert_close(coil.compile(lambda x: 3 % x)(torch.tensor([2, -4])), torch.tensor([1, -1]))


# ---------------------------------------------------------------------------------------------------------------
# Finding 3 (fixed; silent wrong values): ``torch.nextafter`` of float16 / bfloat16 returned its input: the kernel
# stepped in float32 and rounded back to the storage dtype.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nextafter_low_precision_steps_in_its_dtype(coil_reset, dtype):
    a = torch.tensor([0.0, 1.5, -2.5, 1.0], dtype=dtype)
    b = torch.tensor([1.0, 0.0, 0.0, 2.0], dtype=dtype)
    torch.testing.assert_close(coil.compile(torch.nextafter)(a, b), torch.nextafter(a, b), atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Finding 4 (fixed; values where eager raises, one compile failure): ops whose eager CPU kernels refuse bool or
# integer tensors ran: ``clamp`` / ``clamp_min`` / ``clamp_max`` of bool with Python bounds ("clamp_min_scalar_cpu"
# not implemented for 'Bool'), ``lerp`` of integers and bools, ``addcdiv`` of bools, ``dot`` / ``vdot`` / ``mv`` /
# 1-D ``@`` of bools; ``addcmul`` of bools failed to compile (BackendCompilerFailed, not eager's NotImplementedError).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda b: torch.clamp(b, min=True), lambda b: b.clamp(b, b),
                                lambda b: torch.clamp_max(b, False), lambda b: b.clamp_(max=True),
                                lambda b: torch.lerp(b, b, 0.5), lambda b: b.long().lerp_(b.long(), 0.5),
                                lambda b: torch.addcdiv(b, b, b), lambda b: torch.addcmul(b, b, b),
                                lambda b: torch.dot(b, b), lambda b: torch.vdot(b, b), lambda b: b @ b,
                                lambda b: torch.mv(b.view(1, 2), b)])
def test_ops_refusing_bool_or_int_raise(coil_reset, fn):
    _raises_like_eager(fn, torch.tensor([True, False]))


# ---------------------------------------------------------------------------------------------------------------
# Finding 5 (fixed; strides eager promises, then an error where eager runs): batch norm of an input that is neither
# contiguous nor channels-last (``x.transpose(2, 3)``) returned the input's strides; eager's CPU kernel allocates its
# output in the input's suggested memory format (contiguous here), so ``bn(x).view(2, -1)`` ran in eager only.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_of_transposed_input_is_contiguous(coil_reset, train):
    bn = torch.nn.BatchNorm2d(3).train(train)
    f = lambda x: bn(x)                                           # noqa: E731
    for x in (torch.randn(2, 3, 5, 4).transpose(2, 3), torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)):
        out = coil.compile(f)(x)
        assert out.stride() == torch.nn.BatchNorm2d(3).train(train)(x).stride()
    assert coil.compile(lambda x: torch.nn.functional.batch_norm(x, None, None, training=True))(
        torch.randn(2, 3, 5, 4).transpose(2, 3)).view(2, -1).shape == (2, 60)


# ---------------------------------------------------------------------------------------------------------------
# Finding 6 (fixed; error where eager runs): an output that requires grad in eager but whose backward gives no input a
# gradient (``torch.linalg.vector_norm(x, 0)``: its derivative is None) came back with ``requires_grad=False``, so
# ``out.sum().backward()`` raised "element 0 of tensors does not require grad". Inputs that get no gradient enter the
# compiled node detached; with none left, nothing made its outputs differentiable.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dynamic", [False, True])
def test_output_requiring_grad_with_no_input_gradient(coil_reset, dynamic):
    cf = coil.compile(lambda x: torch.linalg.vector_norm(x, 0, dim=-1), dynamic=dynamic)
    for n in (4, 5):
        x = torch.randn(3, n, requires_grad=True)
        out = cf(x)
        assert out.requires_grad and torch.equal(out, torch.linalg.vector_norm(x, 0, dim=-1))
        out.sum().backward()
        assert x.grad is None


# ---------------------------------------------------------------------------------------------------------------
# Finding 7 (fixed; compile failure where eager runs): ``torch.take`` with a 0-d index tensor, and the backward of
# ``torch.put`` (a ``take`` of the gradient) with one: torch's decomposition ``x.reshape(-1)[index]`` is Python
# indexing, which reads a 0-d integer index's value (DataDependentOutputException).
# ---------------------------------------------------------------------------------------------------------------

def test_take_and_put_backward_with_0d_index(coil_reset):
    x, i = torch.randn(2, 3), torch.tensor(-2)
    torch.testing.assert_close(coil.compile(torch.take)(x, i), torch.take(x, i))
    src = torch.tensor(2.0)
    xs = [torch.arange(3.0).requires_grad_() for _ in range(2)]
    outs = [f(x, torch.tensor(1), src, accumulate=True) for f, x in zip((torch.put, coil.compile(torch.put)), xs)]
    for out in outs:
        (out * torch.arange(3.0)).sum().backward()
    torch.testing.assert_close(outs[1], outs[0])
    torch.testing.assert_close(xs[1].grad, xs[0].grad)


# ---------------------------------------------------------------------------------------------------------------
# Finding 8 (fixed; error where eager runs): the backward of ``torch.sgn`` of a real tensor raised "Attempted to access
# the data pointer on an invalid python storage": its derivative is ``aten._efficientzerotensor``, a ZeroTensor with
# no storage, which the compiled backward returned as the gradient.
# ---------------------------------------------------------------------------------------------------------------

def test_sgn_backward_zero_gradient(coil_reset):
    x = torch.randn(3, requires_grad=True)
    coil.compile(torch.sgn)(x).backward(torch.ones(3))
    assert torch.equal(x.grad, torch.zeros(3)) and not x.grad._is_zerotensor()


# ---------------------------------------------------------------------------------------------------------------
# Finding 9 (fixed; silent wrong shape and values, or an error where eager runs): ``x.any(())`` / ``x.all(())``
# reduce nothing in eager (``x != 0``, contiguous); the ``any`` lowering read the empty dim list as every dim:
# ``any((), keepdim=True)`` gave shape (1, 1), ``any(())`` raised "mismatch in length of strides and shape".
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("op", ["any", "all"])
def test_any_all_over_no_dims_reduce_nothing(coil_reset, op, keepdim):
    f = lambda x: getattr(x, op)((), keepdim=keepdim)       # noqa: E731
    nan = float("nan")
    for x in (torch.tensor([[0.0, -0.0, nan], [2.0, 0.0, 1.0]]).t(), torch.tensor([[0, 3]], dtype=torch.uint8)):
        out, ref = coil.compile(f)(x), f(x)
        assert out.dtype == ref.dtype and out.stride() == ref.stride() and torch.equal(out, ref)


# ---------------------------------------------------------------------------------------------------------------
# Finding 10 (fixed by an eager fallback; compile failure where eager runs): ``x.fill_diagonal_(v)`` under
# ``dynamic=True`` of an input with a step (``torch.randn(4, 12)[:, ::2]``): the symbolic fake of a strided input has a
# storage of ``numel`` elements, so the functionalized ``as_strided_scatter`` of its diagonal was "out of bounds for
# storage". The graph now runs eagerly (warned), as for the other writes functionalization refuses.
# ---------------------------------------------------------------------------------------------------------------

def test_fill_diagonal_of_strided_input_dynamic(coil_reset):
    f = lambda x: x.fill_diagonal_(5.0)         # noqa: E731
    cf = coil.compile(f, dynamic=True)
    for rows, cols in ((4, 12), (5, 14)):
        base = torch.randn(rows, cols)
        ref_base = base.clone()
        with pytest.warns(UserWarning, match="coil"):
            out = cf(base[:, ::2])
        torch.testing.assert_close(out, f(ref_base[:, ::2]))
        torch.testing.assert_close(base, ref_base)


# ---------------------------------------------------------------------------------------------------------------
# Finding 11 (fixed; silent wrong values, 1 ulp): bfloat16 ``x ** 3`` and ``x ** -2`` on the CPU: eager's kernel
# computes ``x * x * x`` and ``1 / (x * x)`` in bfloat16 arithmetic (the square rounded to bfloat16 first); coil's
# ``pow`` in float32 rounded once (0.333984375 ** 3: eager 0.037109375, coil 0.037353515625).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("exponent", [3, -2, 3.0])
def test_bfloat16_cube_and_inverse_square_round_the_square(coil_reset, exponent):
    x = torch.tensor([0.3333, -1.7, 3.1, 0.0, -0.0, float("inf")] * 3).bfloat16()
    f = lambda x: x ** exponent     # noqa: E731
    torch.testing.assert_close(coil.compile(f)(x), f(x), atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Finding 12 (fixed; silent wrong values, 1 ulp in about a fifth of the elements): ``log_softmax`` over the last dim
# of a float16 / bfloat16 tensor on the CPU: eager's kernel rounds the sum of exponentials and its log to the input's
# dtype; torch's decomposition computed in float32 throughout. (``cross_entropy`` of bf16 logits goes through it.)
# ``logsumexp`` of float16 / bfloat16 alike: eager's composite rounds after each op, the decomposition did not.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_log_softmax_last_dim_matches_eager(coil_reset, dtype):
    torch.manual_seed(0)
    for x, dim in ((torch.randn(64, 33), 1), (torch.randn(40, 30).t(), -1), (torch.randn(8, 20), 0)):
        x = x.to(dtype)
        f = lambda x: x.log_softmax(dim)     # noqa: E731
        out, ref = coil.compile(f)(x), f(x)
        torch.testing.assert_close(out, ref, atol=0, rtol=0)
        assert out.stride() == ref.stride()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_logsumexp_rounds_each_step(coil_reset, dtype):
    torch.manual_seed(0)
    x = torch.randn(200, 8).to(dtype)
    for dim, keepdim in ((1, False), ((0, 1), True)):
        f = lambda x: x.logsumexp(dim, keepdim=keepdim)     # noqa: E731
        torch.testing.assert_close(coil.compile(f)(x), f(x), atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# FINDINGS_66 observation (fixed since): ``torch.cross`` / ``linalg.cross`` of bool tensors raised BackendCompilerFailed
# (the decomposition's bool subtraction) where eager raises NotImplementedError; integer cross still compiles.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["cross", "linalg", "method"])
def test_cross_of_bools_raises_as_eager_and_of_ints_runs(coil_reset, how):
    f = {"cross": lambda a, b: torch.cross(a, b, dim=1), "linalg": lambda a, b: torch.linalg.cross(a, b, dim=1),
         "method": lambda a, b: a.cross(b, dim=1)}[how]
    a, b = torch.rand(2, 3, 4) > 0.5, torch.rand(2, 3, 4) > 0.5
    _raises_like_eager(f, a, b)
    coil.reset()
    torch.testing.assert_close(coil.compile(f)(a.long(), b.long()), f(a.long(), b.long()))
