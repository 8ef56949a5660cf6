"""Testing helpers: compare a compiled program with eager PyTorch.

Design note ----------- The reference for everything coil produces is eager PyTorch on the same inputs.
:func:`assert_same_as_eager` runs ``fn`` eagerly and compiled on *separate deep copies* of the arguments (and of ``fn``
itself when it is an ``nn.Module``), with the same RNG seed, and compares:

- the outputs (any pytree of tensors and Python values): shape, dtype, values and strides (of dims of size > 1: a size-0
  or size-1 dim's stride is arbitrary, torch's own meta kernels disagree with eager there);
- the arguments afterwards (so an in-place update the compiled code forgot, or one it made up, is caught) and, for a
  module, its ``state_dict`` (buffers such as BatchNorm's running statistics);
- with ``check_grads=True``, the gradients of every floating-point tensor argument and module parameter, from a backward
  pass with the same random cotangents.

Tolerances are per dtype (:data:`TOLERANCES`; ``atol``/``rtol`` override them). Low-precision results (bf16/fp16) are
also checked against an fp32 reference, the same program run on fp32 copies: the compiled result's error against it (RMS
and max-abs) must be at most ``LOW_PRECISION_MARGIN`` times eager's error plus a small floor. A compiled kernel that
keeps intermediates in fp32 is then accepted even where it differs from eager's bf16 rounding, while a genuinely wrong
one is not.

:class:`CompileCounter` is a backend that counts graphs and operators and runs each graph as it is (``gm.forward``)."""
from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch
import torch.utils._pytree as pytree

import coil

__all__ = ["assert_same_as_eager", "CompileCounter", "TOLERANCES", "LOW_PRECISION_MARGIN"]

#: (atol, rtol) per dtype for compiled vs eager. Looser than torch.testing's
#: defaults for fp32 because fused kernels reorder reductions.
TOLERANCES: dict = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-4),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.complex64: (1e-5, 1e-4),
    torch.complex128: (1e-7, 1e-7),
}
_LOW_PRECISION = (torch.float16, torch.bfloat16)
#: Compiled error vs the fp32 reference may be this many times eager's error.
LOW_PRECISION_MARGIN: float = 2.0
_SEED = 1234


class CompileCounter:
    """A backend that counts what it is given and runs each graph eagerly.

    Attributes:
        frame_count: graphs compiled (one per graph, graph breaks make several).
        op_count: ``call_function`` / ``call_method`` / ``call_module`` nodes, summed.
        graphs: the ``torch.fx.GraphModule`` objects, in order.

    Use as ``cnt = CompileCounter(); coil.compile(fn, backend=cnt)`` (or with ``torch.compile``)."""

    def __init__(self) -> None:
        self.clear()
        self.__name__ = "compile_counter"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.frame_count += 1
        self.graphs.append(gm)
        self.op_count += sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
        return gm.forward

    def clear(self) -> None:
        """Reset the counts (call ``coil.reset()`` too, to force recompiles)."""
        self.frame_count, self.op_count, self.graphs = 0, 0, []

    def __repr__(self) -> str:
        return f"CompileCounter(frame_count={self.frame_count}, op_count={self.op_count})"


# ----------------------------------------------------------------- comparisons

def _errors(x: torch.Tensor, ref: torch.Tensor):
    """(rms, max-abs) of ``x - ref`` in fp64, ignoring positions where both are nan/equal inf."""
    a, b = x.detach().to(torch.float64), ref.detach().to(torch.float64)
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    if (diff := torch.where(same, torch.zeros_like(a), a - b)).numel() == 0:
        return 0.0, 0.0
    diff = torch.nan_to_num(diff, nan=float("inf"))
    return diff.pow(2).mean().sqrt().item(), diff.abs().max().item()


def _compare_tensor(what: str, actual: torch.Tensor, expected: torch.Tensor,
                    reference: Optional[torch.Tensor], atol, rtol) -> Optional[str]:
    if actual.shape != expected.shape:
        return f"{what}: shape {tuple(actual.shape)} != eager's {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"{what}: dtype {actual.dtype} != eager's {expected.dtype}"
    if actual.device != expected.device:
        return f"{what}: device {actual.device} != eager's {expected.device}"
    a, e = actual.detach(), expected.detach()
    if a.is_complex():
        a, e = torch.view_as_real(a), torch.view_as_real(e)
        reference = torch.view_as_real(reference.detach()) if reference is not None else None
    if not (a.is_floating_point()):
        if torch.equal(a, e):
            return None
        bad = (a != e).nonzero()
        return (f"{what}: {bad.shape[0]} of {a.numel()} elements differ (exact dtype {a.dtype}); first at index "
                f"{tuple(bad[0].tolist())}: {a[tuple(bad[0])].item()} vs eager {e[tuple(bad[0])].item()}")
    d_atol, d_rtol = TOLERANCES.get(expected.dtype, (0.0, 0.0))
    at, rt = (d_atol if atol is None else atol), (d_rtol if rtol is None else rtol)
    if expected.dtype in _LOW_PRECISION and reference is not None:
        ref = reference.detach().to(torch.float32)
        c_rms, c_max = _errors(a, ref)
        e_rms, e_max = _errors(e, ref)
        floor = at / 10
        if c_rms <= LOW_PRECISION_MARGIN * e_rms + floor and c_max <= LOW_PRECISION_MARGIN * e_max + at:
            return None
        return (f"{what} ({expected.dtype}): compiled is further from the fp32 reference than eager: rms error "
                f"{c_rms:.3g} vs eager's {e_rms:.3g}, max error {c_max:.3g} vs eager's {e_max:.3g} (allowed: "
                f"{LOW_PRECISION_MARGIN}x eager's + {floor:.3g} rms, + {at:.3g} max)")
    try:
        torch.testing.assert_close(a, e, atol=at, rtol=rt, equal_nan=True, check_device=False, check_stride=False)
    except AssertionError as err:
        return f"{what}: {err}"
    return None


def _path_str(path) -> str:
    return "".join(str(k) for k in path) or "<root>"


def _compare_trees(what: str, actual: Any, expected: Any, reference: Any, atol, rtol) -> list:
    a_leaves, a_spec = pytree.tree_flatten_with_path(actual)
    e_leaves, e_spec = pytree.tree_flatten_with_path(expected)
    if a_spec != e_spec:
        return [f"{what}: pytree structure differs from eager's:\n      compiled: {a_spec}\n      eager:    {e_spec}"]
    r_leaves = [x for _, x in pytree.tree_flatten_with_path(reference)[0]] \
        if reference is not None else [None] * len(e_leaves)
    if len(r_leaves) != len(e_leaves):
        r_leaves = [None] * len(e_leaves)
    problems = []
    for (path, a), (_, e), r in zip(a_leaves, e_leaves, r_leaves):
        name = what + _path_str(path)
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                problems.append(f"{name}: got {type(a).__name__}, eager gave a tensor")
                continue
            if msg := _compare_tensor(name, a, e, r if isinstance(r, torch.Tensor) else None, atol, rtol):
                problems.append(msg)
        elif isinstance(a, torch.Tensor):
            problems.append(f"{name}: got a tensor, eager gave {type(e).__name__} {e!r}")
        elif not _same_python_value(a, e):
            problems.append(f"{name}: {a!r} != eager's {e!r}")
    return problems


def _stride_problems(what: str, actual: Any, expected: Any) -> list:
    """Tensors of ``actual`` whose strides differ from ``expected``'s on a dim of size > 1 (a size-0 or size-1 dim's
    stride is arbitrary, and torch's meta kernels disagree with eager there; so are an empty tensor's)."""
    return [f"{what}{_path_str(path)}: strides {a.stride()} != eager's {e.stride()} (dims of size > 1)"
            for (path, a), e in zip(pytree.tree_flatten_with_path(actual)[0], pytree.tree_leaves(expected))
            if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and a.layout == e.layout == torch.strided
            and a.shape == e.shape and e.numel()
            and any(n > 1 and x != y for x, y, n in zip(a.stride(), e.stride(), e.shape))]


def _same_python_value(a: Any, e: Any) -> bool:
    if isinstance(a, float) and isinstance(e, float) and a != a and e != e:
        return True
    try:
        return bool(a == e)
    except Exception:
        return a is e


# ------------------------------------------------------------------- running

def _upcast(tree: Any) -> Any:
    """Copy of ``tree`` with every bf16/fp16 tensor in fp32 (requires_grad kept)."""

    def up(x):
        if isinstance(x, torch.Tensor) and x.dtype in _LOW_PRECISION:
            y = x.detach().to(torch.float32)
            return y.requires_grad_(x.requires_grad) if x.is_leaf else y
        return x
    return pytree.tree_map(up, tree)


def _has_low_precision(tree: Any) -> bool:
    return any(isinstance(x, torch.Tensor) and x.dtype in _LOW_PRECISION for x in pytree.tree_leaves(tree))


def _grad_leaves(args: Any, module: Optional[torch.nn.Module]) -> list:
    """(name, tensor) of what gradients are compared for: float tensor args, params."""
    out = [("args" + _path_str(path), x) for path, x in pytree.tree_flatten_with_path(args)[0]
           if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())]
    if module is not None:
        out += [(f"param {n}", p) for n, p in module.named_parameters() if p.requires_grad]
    return out


def _run(fn: Callable, args: tuple, kwargs: dict, check_grads: bool,
         module: Optional[torch.nn.Module], cotangent_seed: int):
    """Call ``fn``; with ``check_grads`` also run backward; return (out, grads)."""
    leaves = _grad_leaves(args, module) if check_grads else []
    for _, x in leaves:
        if x.is_leaf:
            x.requires_grad_(True)
            x.grad = None
    devices = sorted({x.device.index or 0 for x in pytree.tree_leaves((args, kwargs))
                      if isinstance(x, torch.Tensor) and x.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):  # same stream each run; caller's RNG kept
        torch.manual_seed(_SEED)
        out = fn(*args, **kwargs)
    grads = None
    if check_grads:
        if not (outs := [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]):
            raise AssertionError("check_grads=True but no output requires grad "
                                 "(pass floating-point tensor inputs or a module with parameters)")
        gen = torch.Generator().manual_seed(cotangent_seed)
        cots = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype).to(o.device) for o in outs]
        torch.autograd.backward(outs, cots)
        grads = {name: (x.grad if x.is_leaf else None) for name, x in leaves}
    return out, grads


def assert_same_as_eager(fn: Callable, args: Any, *, backend: Any = "coil", check_grads: bool = False,
                         check_input_mutation: bool = True, atol: Optional[float] = None, rtol: Optional[float] = None,
                         kwargs: Optional[dict] = None, check_strides: bool = True) -> Any:
    """Assert that ``coil.compile(fn, backend=backend)(*args)`` matches ``fn(*args)``.

    Args:
        fn: a function or ``nn.Module``. A module is deep-copied for each run, so its
            buffers (running stats) are compared too.
        args: a tuple of positional arguments (a single non-tuple is treated as one
            argument); any pytree of tensors and Python values. Never modified: each
            run gets its own deep copy.
        backend: passed to :func:`coil.compile` (a name or a callable backend).
        check_grads: also compare gradients of float tensor arguments and module
            parameters (cotangents: fixed-seed standard normal).
        check_input_mutation: compare the arguments (and module state) after the call.
        atol, rtol: override the per-dtype :data:`TOLERANCES`.
        kwargs: keyword arguments for ``fn`` (deep-copied like ``args``).
        check_strides: compare the strides of outputs (and of arguments after the call, with
            ``check_input_mutation``) with eager's on every dim of size > 1 (opt out, with a comment
            saying why, where eager's layout is unspecified).

    Returns:
        The compiled run's output.

    Raises:
        AssertionError: listing every mismatch found (outputs, mutated inputs,
        gradients), each with its pytree path."""
    if not isinstance(args, tuple):
        args = (args,)
    kwargs = dict(kwargs or {})
    is_module = isinstance(fn, torch.nn.Module)

    def fresh(upcast: bool = False):
        a, k = copy.deepcopy((args, kwargs))
        f = copy.deepcopy(fn) if is_module else fn
        if upcast:
            a, k = _upcast((a, k))
            if is_module:
                f = f.float() if any(p.dtype in _LOW_PRECISION for p in list(f.parameters()) + list(f.buffers())) else f
        return f, a, k
    e_fn, e_args, e_kwargs = fresh()  # Eager.
    e_out, e_grads = _run(e_fn, e_args, e_kwargs, check_grads, e_fn if is_module else None, 7)
    r_fn = r_args = r_kwargs = r_out = r_grads = None  # fp32 reference, only when something is bf16/fp16.
    low = _has_low_precision((args, kwargs, e_out)) or (
        is_module and any(p.dtype in _LOW_PRECISION for p in fn.parameters()))
    if low:
        r_fn, r_args, r_kwargs = fresh(upcast=True)
        r_out, r_grads = _run(r_fn, r_args, r_kwargs, check_grads, r_fn if is_module else None, 7)
    c_fn, c_args, c_kwargs = fresh()  # Compiled.
    compiled = coil.compile(c_fn, backend=backend)
    c_out, c_grads = _run(compiled, c_args, c_kwargs, check_grads, c_fn if is_module else None, 7)
    problems = _compare_trees("output", c_out, e_out, r_out, atol, rtol)
    problems += _stride_problems("output", c_out, e_out) if check_strides else []
    if check_input_mutation:
        problems += _compare_trees("args after call", c_args, e_args, r_args, atol, rtol)
        problems += _stride_problems("args after call", c_args, e_args) if check_strides else []
        problems += _compare_trees("kwargs after call", c_kwargs, e_kwargs, r_kwargs, atol, rtol)
        if is_module:
            problems += _compare_trees("module state", dict(c_fn.state_dict()), dict(e_fn.state_dict()),
                                       dict(r_fn.state_dict()) if low else None, atol, rtol)
    if check_grads:
        problems += _compare_trees("grad of ", c_grads, e_grads, r_grads, atol, rtol)
    if problems:
        raise AssertionError(f"compiled (backend={getattr(backend, '__name__', backend)!r}) "
                             f"differs from eager in {len(problems)} place(s):\n  - " + "\n  - ".join(problems))
    return c_out
