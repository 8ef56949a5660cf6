"""A custom op (``torch.library.custom_op`` with ``register_autograd``) whose autograd formula capture cannot trace
(``offs.tolist()`` on a tensor saved for backward, a Python side effect) stays in the graph, its formula run eagerly.

The graph node is :class:`OpaqueFormula`'s ``apply``: its forward is the op (opaque to AOT, as every custom op),
saving the op's tensor inputs and outputs; its backward is one opaque op, ``coil::custom_backward``, which runs the
op's ``setup_context`` and ``backward`` on those real tensors when the compiled backward reaches it, once per backward
as in eager. Gradients come back in their inputs' dtype and layout (the layout the fake kernel promised).
``setup_context`` runs then too, so it must trace free of side effects (else the call stays a graph break, as it does
for keyword-only arguments and tensor-list arguments or results)."""
from __future__ import annotations

import functools

import torch
import torch.utils._pytree as pytree

#: key -> (op, opdef, args with each tensor replaced by TENSOR, each tensor's argument position)
_CALLS: dict = {}


TENSOR = type("Tensor", (), {"__repr__": lambda self: "T"})()   #: an argument that is a tensor


def opaque_call(target, opdef, args: list, kwargs: dict):
    """``(fn, tensors)``: a graph target ``fn`` calling ``target(*args, **kwargs)`` (trackers) whose backward is
    ``opdef``'s formula run eagerly, and the trackers to call it with (the tensors among ``args``/``kwargs`` in schema
    order). None where not handled (the caller breaks the graph); Unsupported for an argument that is not a tensor or a
    constant."""
    from coil.capture.variables.base import VariableTracker
    from coil.capture.variables.tensor import TensorVariable
    target = getattr(target, "default", target)     # (an OpOverloadPacket: a custom_op has one overload)
    schema = target._schema
    params = schema.arguments
    if any(a.kwarg_only for a in params) or len(args) > len(params) or set(kwargs) - {a.name for a in params} or any(
            "Tensor[]" in str(a.type) or "Tensor?[]" in str(a.type) for a in (*params, *schema.returns)):
        return None
    rest = [kwargs.get(a.name, a.default_value if a.has_default_value() else TENSOR) for a in params[len(args):]]
    bound = list(args) + rest
    if any(r is TENSOR for r in rest):
        return None     # (a missing argument: eager raises)
    consts = [TENSOR if isinstance(a, TensorVariable) else a.as_python_constant() if isinstance(a, VariableTracker)
              else a for a in bound]
    key = f"{schema.name}.{schema.overload_name}/{consts!r}"
    _CALLS[key] = (target, opdef, consts, [i for i, a in enumerate(consts) if a is TENSOR])

    call = functools.partial(OpaqueFormula.apply, key)
    call.__name__ = f"{schema.name.replace('::', '_')}_eager_backward"
    return call, [a for a, c in zip(bound, consts) if c is TENSOR]


def _args(key, tensors):
    op, opdef, args, where = _CALLS[key]
    it = iter(tensors[:len(where)])
    return op, opdef, [next(it) if a is TENSOR else a for a in args], where


class OpaqueFormula(torch.autograd.Function):
    """``op(*args)`` whose backward is ``coil::custom_backward`` (see the module docstring)."""

    @staticmethod
    def forward(ctx, key, *tensors):
        op, _, args, _ = _args(key, tensors)
        out = op(*args)
        ctx.key = key
        ctx.save_for_backward(*tensors, *pytree.tree_leaves(out))
        return out

    @staticmethod
    def backward(ctx, *grads):
        needs = [i for i, flag in enumerate(ctx.needs_input_grad[1:]) if flag]
        res = iter(torch.ops.coil.custom_backward(ctx.key, needs, list(ctx.saved_tensors), list(grads)))
        return (None, *(next(res) if i in needs else None for i in range(len(ctx.needs_input_grad) - 1)))


@torch.library.custom_op("coil::custom_backward", mutates_args=())
def custom_backward(key: str, needs: list[int], saved: list[torch.Tensor], grads: list[torch.Tensor]
                    ) -> list[torch.Tensor]:
    """The gradients (in ``needs`` order, each the dtype and layout of its input) of the op of ``key``
    (:func:`opaque_call`), from its eager ``setup_context`` and ``backward`` on its tensor inputs and
    outputs ``saved`` and the gradients ``grads`` of its outputs."""
    op, opdef, args, where = _args(key, saved)
    n = len(where)
    ctx = torch.autograd.function.FunctionCtx()     # (save_for_backward keeps ``to_save``)
    ctx.needs_input_grad = tuple(i in [where[k] for k in needs] for i in range(len(args)))
    out = saved[n] if len(op._schema.returns) == 1 else tuple(saved[n:])
    opdef._setup_context_fn(ctx=ctx, inputs=tuple(args), output=out)
    ctx.saved_tensors = getattr(ctx, "to_save", ())
    res = opdef._backward_fn(ctx, *grads)
    res = res if isinstance(res, tuple) else (res,)
    return [_like(res[where[k]], saved[k]) for k in needs]


def _like(g, t):
    """``g`` (None: zeros) in ``t``'s dtype, shape and the layout ``empty_like`` gives it."""
    ref = torch.empty_like(t)
    return ref.zero_() if g is None else g.to(t.dtype) if g.stride() == ref.stride() else ref.copy_(g)


@custom_backward.register_fake
def _(key, needs, saved, grads):
    return [torch.empty_like(saved[i]) for i in needs]
