"""Shared pieces of the user-report repro files (test_user_reports_3..7.py): run a
function eagerly and compiled on separate copies of its arguments, backpropagate the
same random cotangents through both, and compare outputs and gradients."""
from __future__ import annotations

import torch

import coil


def run_both(fn, a_ref: list, a_out: list, backend: str, options: dict | None = None):
    """``(compiled outputs, eager outputs)`` as tuples: ``fn(*a_ref)`` eagerly and
    ``coil.compile(fn, options={"cpu_backend": backend, **options})(*a_out)``."""
    coil.reset()
    ref = fn(*a_ref)
    out = coil.compile(fn, options={"cpu_backend": backend, **(options or {})})(*a_out)
    as_tuple = lambda v: v if isinstance(v, (tuple, list)) else (v,)
    return as_tuple(out), as_tuple(ref)


def run_on_copies(fn, args, backend: str = "cpp", seed=None, ctx=None, **options):
    """``(compiled outputs, eager outputs, compiled args, eager args)``: ``fn`` run eagerly
    and through ``coil.compile(fn, options={"cpu_backend": backend, **options})`` on
    separate copies of ``args`` (:func:`arg_copies`), outputs as tuples. ``seed``:
    ``torch.manual_seed(seed)`` before each run; ``ctx``: a context factory (e.g.
    ``torch.no_grad``) both runs are called under."""
    a_ref, a_out = arg_copies(args), arg_copies(args)
    coil.reset()
    cf = coil.compile(fn, options={"cpu_backend": backend, **options})
    as_tuple = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,)  # noqa: E731
    outs = []
    for f, a in ((fn, a_ref), (cf, a_out)):
        if seed is not None:
            torch.manual_seed(seed)
        if ctx is None:
            outs.append(as_tuple(f(*a)))
        else:
            with ctx():
                outs.append(as_tuple(f(*a)))
    ref, out = outs
    return out, ref, a_out, a_ref


def backward_both(outs, refs) -> None:
    """Backward through every output whose eager counterpart needs grad, with the same
    random cotangents (seed 99) for eager and compiled."""
    torch.manual_seed(99)
    pairs = [(o, r) for o, r in zip(outs, refs) if r.requires_grad]
    cot = [torch.randn_like(r) for _, r in pairs]
    torch.autograd.backward([r for _, r in pairs], cot)
    torch.autograd.backward([o for o, _ in pairs], cot)


def rand(*size, grad: bool = False, dtype=torch.float32) -> torch.Tensor:
    """Standard-normal tensor of ``size`` in ``dtype``, optionally requiring grad."""
    return torch.randn(*size).to(dtype).requires_grad_(grad)


def assert_arg_grads(a_ref, a_out, atol: float, rtol: float) -> None:
    """Each argument that requires grad got a gradient in the compiled run, close to
    eager's (tolerances ``atol``/``rtol``)."""
    for i, (x, y) in enumerate(zip(a_ref, a_out)):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            assert y.grad is not None, f"grad of arg {i} is None"
            torch.testing.assert_close(y.grad, x.grad, atol=atol, rtol=rtol,
                                       msg=lambda m: f"grad of arg {i}: {m}")


def arg_copies(args) -> list:
    """Detached copies of the tensor arguments (keeping ``requires_grad``); other values
    as they are."""
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
            else a for a in args]


def strides_agree(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal strides on every dim of size > 1 (a size-1 dim's stride is arbitrary)."""
    return all(x == y for x, y, n in zip(a.stride(), b.stride(), b.shape) if n != 1)


def assert_outputs_match(outs, refs, atol: float, rtol: float, same=strides_agree,
                         equal_nan: bool = True) -> None:
    """Compiled ``outs`` vs eager ``refs``: shape, dtype, values (NaN where eager has NaN,
    with ``equal_nan``) and strides by ``same`` (None: not compared)."""
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert o.shape == r.shape and o.dtype == r.dtype, (i, o.shape, r.shape, o.dtype, r.dtype)
        torch.testing.assert_close(o, r, atol=atol, rtol=rtol, equal_nan=equal_nan,
                                   msg=lambda m: f"output {i}: {m}")
        if same is not None:
            assert same(o, r), (i, o.stride(), r.stride())


def assert_args_match(a_ref, a_out, atol: float, rtol: float, equal_nan: bool = False) -> None:
    """The tensor arguments after the call (in-place mutations), compiled vs eager."""
    for i, (x, y) in enumerate(zip(a_ref, a_out)):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(y.detach(), x.detach(), atol=atol, rtol=rtol,
                                       equal_nan=equal_nan,
                                       msg=lambda m: f"argument {i} after the call: {m}")


def assert_grads_match(a_ref, a_out, atol: float, rtol: float, same=strides_agree) -> None:
    """Gradients of the arguments that require grad: values and strides by ``same``."""
    for i, (x, y) in enumerate(zip(a_ref, a_out)):
        if x.requires_grad:
            torch.testing.assert_close(y.grad, x.grad, atol=atol, rtol=rtol,
                                       msg=lambda m: f"grad of arg {i}: {m}")
            assert same(y.grad, x.grad), (i, y.grad.stride(), x.grad.stride())


def run_warned(fn, *args, **options):
    """``(compiled result, coil warnings)`` of ``coil.compile(fn, options=options)(*args)``."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = coil.compile(fn, options=options or None)(*args)
    return out, [str(w.message) for w in caught if "coil" in str(w.message)]
