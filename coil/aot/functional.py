"""Tracing a torch-level program to functional ATen graphs, on fake tensors.

:func:`analyze` runs the program once under ``FunctionalTensorMode`` without recording a graph and writes down what the
runtime wrapper must do (:class:`ProgramInfo`: mutated inputs, outputs that alias inputs or each other, outputs
requiring grad). :func:`trace_inference` / :func:`trace_joint` trace it under ``make_fx`` + functionalization + coil's
decompositions to one flat-argument ATen GraphModule, ``(*inputs) -> (*mutated_input_values, *graph_outputs)``, or for
the joint ``(*primals, *tangents) -> (*mutated_input_values, *graph_outputs, *input_grads)`` (``JointInfo.grad_is_none``
lists dropped grads). "Graph outputs" own their storage; aliases are rebuilt by :mod:`coil.aot.runtime`. The graphs'
invariants (functional, no ``prims.*``, ``meta["val"]`` everywhere): docs/aot.md."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
import threading
from typing import Any, Callable, Optional

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.autograd.function import BackwardCFunction
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, disable_fake_tensor_cache
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode, disable_functional_mode
from torch.fx.experimental.proxy_tensor import (disable_proxy_modes_tracing, get_proxy_mode, make_fx,
                                               maybe_enable_thunkify, track_tensor_tree)
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, guard_or_false, statically_known_true
from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
import torch.utils.checkpoint as ckpt
from torch.utils.checkpoint import CheckpointPolicy
from torch.utils.weak import WeakIdKeyDictionary

from coil import trace
from coil.exc import LINALG_ERROR_MESSAGE, ZERO_DIVISION_MARK
from coil.aot.aliasing import (OFFSET_WRITE_MESSAGE, OUTSIDE_GRAD_MESSAGE, OUTSIDE_READ_MESSAGE,
                               RESTRIDE_VIEWED_MESSAGE, OverlapGuard, RunEagerly, _addresses, _extent, _overlaps,
                               _static, inside)

aten = torch.ops.aten


# --------------------------------------------------------------------------- metadata

@dataclasses.dataclass
class InputInfo:
    """One flat input. ``mutated``: its data is changed in place by the program; ``mutation_hidden``: every mutation
    happened under no_grad (so the runtime replays it without recording autograd history). ``layout``: set when the
    program changes the input's metadata in place (``t_``, ``squeeze_``, ``as_strided_``...): its final
    ``(size, stride, offset)``, the offset relative to its storage offset before the call (the runtime applies it
    with ``as_strided_``)."""

    is_tensor: bool
    requires_grad: bool = False
    mutated: bool = False
    mutation_hidden: bool = False
    layout: Optional[tuple] = None


@dataclasses.dataclass
class OutputInfo:
    """One flat user output and how the runtime produces it.

    ``kind``: ``"graph"`` (``index`` = position among the graph outputs), ``"input"`` (the input object ``index``
    itself), ``"alias_of_input"`` (a view of input ``index``), ``"alias_of_output"`` (a view of the graph output
    ``index``), ``"alias_of_base"`` (a view of the extra graph output ``index`` holding an intermediate base),
    ``"same_as_output"`` (the user output ``index`` again), ``"constant"`` (``value``). ``size/stride/offset``
    describe the view (elements; offset is absolute in the storage). ``requires_grad``: the eager output requires
    grad. ``dtype``: set for an ``alias_of_input``/``alias_of_base`` of another dtype than its input or base
    (``a.view(torch.int32)``, ``.real``): the runtime builds it on that storage, and its offset is in bytes.
    ``src_stride``: for an ``alias_of_output``/``alias_of_base``, the eager strides of the tensor it views (the
    runtime copies a compiled one of other strides into them before taking views)."""

    kind: str
    index: int = -1
    size: tuple = ()
    stride: tuple = ()
    offset: int = 0
    requires_grad: bool = False
    value: Any = None
    dtype: Optional[torch.dtype] = None
    src_stride: Optional[tuple] = None
    #: a differentiable view eager refuses an in-place op on: one of several from one op (``split``, ``unbind``; the
    #: runtime's view is marked so), or a custom Function's (or a view of one): computed, kept a view (runtime.py)
    multi_output: bool = False
    #: (conj, neg): the view carries a lazy conjugation or negation bit (``x.conj()``, ``x.conj().imag``),
    #: which the runtime's view (an as_strided of the storage) sets again
    lazy: tuple = (False, False)
    #: a ``"graph"`` output whose eager result shares input ``shares``'s memory: a view as another dtype (not
    #: differentiable) that a differentiable in-place op made require grad; the runtime points the computed tensor
    #: at that input's storage (``dtype`` and a byte ``offset`` as for an alias)
    shares: int = -1
    #: eager's output is no autograd view (``x.detach()``): the runtime's alias is detached too
    detached: bool = False
    #: a view that requires grad made under no_grad (the caller's or the program's): eager's has no ``grad_fn``
    no_grad_view: bool = False
    #: the graph outputs whose backward in eager reads a value autograd saved in this (computed) output's memory
    #: (``x.exp()``, ``x.exp().t()``): the runtime refuses, as eager, such a backward after a write to it
    saved: tuple = ()


@dataclasses.dataclass
class ProgramInfo:
    """What :func:`analyze` learned; drives tracing and the runtime wrapper."""

    inputs: list
    outputs: list
    out_spec: Any
    #: user-output positions computed by the graph, in graph-output order
    graph_outputs: list
    #: user-output positions whose ``_base`` is an extra graph output (intermediate bases)
    base_sources: list
    #: per forward graph output (mutated inputs, graph outputs, bases): requires grad?
    fw_out_requires_grad: list = dataclasses.field(default_factory=list)
    #: per forward graph output: (shape, dtype, device), to build tangents
    fw_out_meta: list = dataclasses.field(default_factory=list)
    #: the program calls ops with side effects that functionalization cannot thread
    #: (``aten._linalg_check_errors``); they are dropped while tracing
    drop_error_checks: bool = False
    #: the fake inputs analysed, kept only when their sizes are symbolic
    #: (``torch.compile(dynamic=...)``): the SymInts above (alias layouts, ``fw_out_meta``)
    #: are expressions in their symbols, which the runtime binds to each call's inputs
    fake_inputs: Optional[list] = None

    @property
    def mutated_inputs(self) -> list:
        return [i for i, x in enumerate(self.inputs) if x.mutated]

    @property
    def restrided_inputs(self) -> list:
        """Inputs whose metadata the program changes in place."""
        return [i for i, x in enumerate(self.inputs) if x.layout is not None]

    @property
    def num_fw_outputs(self) -> int:
        return len(self.mutated_inputs) + len(self.graph_outputs) + len(self.base_sources)

    @property
    def free_layout_outputs(self) -> frozenset:
        """Forward-graph output positions the runtime hands to the user as they come (user outputs that no other
        output views and that share no input's memory): a compiler may return these in another layout than eager's
        (``config.keep_padded_matmul_outputs``); every other output must have the traced strides."""
        viewed = {o.index for o in self.outputs if o.kind == "alias_of_output"}
        n_mut = len(self.mutated_inputs)
        return frozenset(n_mut + o.index for o in self.outputs
                         if o.kind == "graph" and o.shares < 0 and o.index not in viewed)


def fake_mode_of(example_inputs: list) -> Optional[FakeTensorMode]:
    """The FakeTensorMode of the first fake tensor in ``example_inputs`` (or None)."""
    return next((x.fake_mode for x in example_inputs if isinstance(x, FakeTensor)), None)


def fakeify(example_inputs: list) -> tuple[FakeTensorMode, list]:
    """Fake versions of ``example_inputs`` (same sizes, strides, storage offsets, dtypes, devices, requires_grad,
    leafness); reuses the inputs' fake mode if they are already fake. Non-tensors pass through."""
    if (mode := fake_mode_of(example_inputs)) is not None:
        return mode, list(example_inputs)
    # symbolic numbers and no tensor (``torch.full((n,), 1.5)`` of an int that changed): their ShapeEnv
    env = next((x.node.shape_env for x in example_inputs if isinstance(x, (torch.SymInt, torch.SymFloat))), None)
    mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=env)
    return mode, [mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor) else x for x in example_inputs]


def _to_functional(x: Any) -> Any:
    return FunctionalTensor.to_functional(x) if isinstance(x, torch.Tensor) else x


def _from_functional(x: Any) -> Any:
    return x.from_functional() if isinstance(x, FunctionalTensor) else x


class _DropErrorChecks(TorchDispatchMode):
    """Replaces ``aten._linalg_check_errors`` (an ordered side effect that functionalization refuses without effect
    tokens) by ``aten._assert_async`` of ``info == 0``: a singular input raises a RuntimeError naming the function
    (compiled code raises it as eager's ``LinAlgError``), where the graph returned inf/nan."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _ERROR_CHECK_OPS:
            info, api = args[0], args[1]
            return aten._assert_async.msg(aten.eq.Scalar(info, 0).all(), f"{api}: {LINALG_ERROR_MESSAGE}")
        return func(*args, **(kwargs or {}))


_ERROR_CHECK_OPS = {aten._linalg_check_errors.default}


@functools.lru_cache(None)
def _composite(func) -> bool:
    try:    # (TorchScript's ``prim::`` ops and ``aten::stride`` of symbolic sizes are not in the dispatcher)
        return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
    except RuntimeError:
        return False


class _ViewRewrites(TorchDispatchMode):
    """Views re-expressed for functionalization, while a program is analysed or traced.

    - ``x.expand(x.shape)`` becomes ``aten.alias`` and an expand that only adds size-1
      dims a ``view``: functionalization writes through an expand as ``base + sum_to(new
      - base)`` (NaN next to inf, inexact, an error for bool); through these, exactly.
    - a view is taken from the root of its view chain with ``as_strided`` (same sizes,
      strides, absolute offset) where functionalization cannot go through the chain:
      ``as_strided`` of a view, any view of an ``as_strided`` view, a non-overlapping
      view of overlapping memory (writes through it raised eager's overlap error).
    - ``squeeze_`` of a tensor with symbolic sizes (:func:`_squeeze_`).
    docs/aot.md ("Inputs sharing memory") has the cases."""

    supports_higher_order_operators = True  # higher-order operators (torch.cond...) pass through (docs/hops.md)

    def __init__(self):
        super().__init__()
        self.roots = WeakIdKeyDictionary()  # view -> the non-view tensor its chain starts at
        self.strided = WeakIdKeyDictionary()  # views made by as_strided
        self.grad_viewed = WeakIdKeyDictionary()  # roots with views taken under autograd

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))
        if torch.Tag.inplace_view in func.tags and args[0] in self.grad_viewed:
            # autograd rebuilds the views taken before by replaying their view ops on the restrided tensor (functional
            # tensors lack as_strided): IndexError, transposing a 1-D tensor after squeeze_ (gradient fuzzer s1016 #980)
            raise RunEagerly(RESTRIDE_VIEWED_MESSAGE)
        if func in _SQUEEZE_ and any(isinstance(n, torch.SymInt) for n in args[0].shape):
            return _squeeze_(func, *args)
        if _composite(func):
            # a composite op reaches here undecomposed under inference_mode (no autograd key decomposed it): its own
            # ops, through these modes as under no_grad, say whether it copied (an expand's contiguous() was taken
            # for a view of the unexpanded tensor, read past its end: trial 78 #2) and meet _DropErrorChecks
            # (linalg.inv's _linalg_check_errors reached functionalization: "no token for effect")
            with self:
                if (r := func.decompose(*args, **(kwargs or {}))) is not NotImplemented:
                    return r
        if func is aten.expand.default and len(args) >= 2 and len(args[1]) == args[0].dim() and \
                all(isinstance(s, int) and (s == -1 or (isinstance(d, int) and s == d))
                    for s, d in zip(args[1], args[0].shape)):
            return aten.alias.default(args[0])
        if func is aten.as_strided_.default:  # as for as_strided (fuzz s92 #4, s81 #2963)
            _lay_out_as_eager(self.roots.get(args[0], args[0]), aten.as_strided.default(*args, **(kwargs or {})))
        for a in args:  # an as_strided view read after a write to its root (s93 #358)
            if isinstance(a, torch.Tensor) and a in self.strided and a in self.roots:
                _lay_out_as_eager(self.roots[a], a)
        if func._schema.is_mutable and args and isinstance(args[0], torch.Tensor) and args[0] in self.strided \
                and self.roots.get(args[0], args[0]).storage_offset() != 0:
            # functionalization writes it back at the absolute offset into a value that starts at 0: the
            # element 14 of a tensor starting at 9 became its element 14, read back as 23 (s213 #1811)
            raise RunEagerly(OFFSET_WRITE_MESSAGE)
        try:
            out = func(*args, **(kwargs or {}))
        except (RuntimeError, ValueError):
            # functionalization's value of a tensor written through a transposed view kept
            # the view's strides, and a view of it refused them (fuzz s83 #1591)
            roots = {id(r): r for r in (self.roots.get(a, a) for a in args if isinstance(a, torch.Tensor))
                     if isinstance(r, FunctionalTensor) and not _overlaps(r)
                     and _static(r.shape, r.stride(), r.storage_offset())}
            if not [r for r in roots.values() if _relay(r, "a view of it refused its value's layout")]:
                raise
            out = func(*args, **(kwargs or {}))
        if func is aten.as_strided.default and _lay_out_as_eager(self.roots.get(args[0], args[0]), out):
            out = func(*args, **(kwargs or {}))
        if func._schema.is_mutable and torch.Tag.inplace_view not in func.tags:
            # eager's in-place op keeps the written tensor's layout; functionalization's new value (of the tensor, or
            # of the root of the view written through) has the out-of-place op's: y.t().masked_fill_(m, 0) left y
            # transposed, and the views and ops of y after it read other elements or gave other strides (trial 76 #0)
            for a, t in zip(func._schema.arguments, (*args, *[(kwargs or {}).get(a.name) for a in
                                                           func._schema.arguments[len(args):]])):
                if a.alias_info is not None and a.alias_info.is_write and isinstance(t, FunctionalTensor) and \
                        isinstance(r := self.roots.get(t, t), FunctionalTensor) and \
                        torch._is_functional_tensor(r.elem) and not _overlaps(r):   # (a constant: not functional)
                    _relay(r, "an in-place op keeps its tensor's layout", known=True)
        if not (func.is_view and args and isinstance(args[0], torch.Tensor)):
            return out
        if isinstance(out, (tuple, list)):  # split, unbind: each piece a view (s81 #1779)
            return type(out)(self._view(func, args, o) for o in out)
        return self._view(func, args, out)

    def _view(self, func, args, out):
        src = args[0]
        if func is aten.expand.default and (_static(out.shape, src.shape) and out.numel() == src.numel()
                                            or _adds_unit_dims(src, args[1])):
            out = aten.view.default(src, out.shape)
        root, strided = self.roots.get(src, src), func is aten.as_strided.default
        if strided and root is not src and src.requires_grad and torch.is_grad_enabled() and \
                not _reads_inside(out, src):  # a.narrow(0, 1, 1).as_strided((2,), (1,), 13) (s1027 #616)
            raise RunEagerly(OUTSIDE_GRAD_MESSAGE)
        if out.dtype == root.dtype and ((strided and root is not src) or src in self.strided or
                                        (root is not src and _overlaps(src) and not _overlaps(out))):
            out = aten.as_strided.default(root, out.shape, out.stride(), out.storage_offset())
            strided = True
        if strided:
            self.strided[out] = True
        if src.requires_grad and torch.is_grad_enabled():
            self.grad_viewed[root] = True
        self.roots[out] = root
        return out


_SQUEEZE_ = {aten.squeeze_.default, aten.squeeze_.dim, aten.squeeze_.dims}


def _adds_unit_dims(src, sizes) -> bool:
    """Whether ``src.expand(sizes)`` only adds leading size-1 dims, also with symbolic sizes (``a.expand(1, -1, -1)``
    under ``dynamic=True``: s302 #1981, inf became NaN)."""
    k = len(sizes) - src.dim()
    return k >= 0 and all(type(s) is int and s == 1 for s in sizes[:k]) and all(
        s == -1 if type(s) is int else isinstance(s, torch.SymInt) and isinstance(d, torch.SymInt)
        and s.node.expr == d.node.expr for s, d in zip(sizes[k:], src.shape))


def _lay_out_as_eager(t, view) -> bool:
    """For ``view``, an ``as_strided`` view of functional tensor ``t`` (it reads storage): where the value
    functionalization holds for ``t`` has other strides or another offset than ``t`` (eager's: an in-place op keeps
    them; ``scatter_`` of a transposed input became an out-of-place ``scatter``, whose result is contiguous), it is
    replaced by a copy at ``t``'s strides and offset; returns whether it was (the view is to be taken again). Raises
    RunEagerly if ``view`` reads memory outside ``t``'s elements then (the graph does not hold it)."""
    if not isinstance(t, FunctionalTensor) or _overlaps(t):
        return False
    torch._sync(t)
    if (torch._functionalize_has_data_mutation(t.elem) or not _same_layout(t)) and not _reads_inside(view, t):
        raise RunEagerly(OUTSIDE_READ_MESSAGE)  # the graph holds t's new elements only
    return _relay(t, "as_strided reads storage")


def _reads_inside(view, t) -> bool:
    """Whether ``view`` reads only elements of ``t``. Symbolic layouts: decided, with guards, for a dense ``t`` (an
    as_strided read at offset 1 of a written ``x[2:4]`` under ``dynamic=True`` read its new value from 0: s312 #106);
    otherwise (or data-dependent) False."""
    if _static(t.shape, t.stride(), t.storage_offset(), view.shape, view.stride(), view.storage_offset()):
        return inside(view, t.dtype.itemsize, *_addresses(t))
    (lo, hi), (t_lo, t_hi) = _extent(view), _extent(t)
    return all(guard_or_false(c) for c in (t_hi - t_lo == t.numel(), t_lo <= lo, hi <= t_hi))


def _same_layout(t, known: bool = False) -> bool:
    inner = torch._from_functional_tensor(t.elem)
    eq = statically_known_true if known else bool  # known: provably (no guard; if not, a copy lays it out again)
    return eq(inner.storage_offset() == t.storage_offset()) and \
        all(eq(n <= 1) or eq(a == b) for a, b, n in zip(inner.stride(), t.stride(), t.shape))


def _relay(t, why: str, known: bool = False) -> bool:
    """Replace the value functionalization holds for ``t`` (a FunctionalTensor) by a copy at ``t``'s strides and offset
    when it has others; returns whether it did."""
    torch._sync(t)
    if _same_layout(t, known):
        return False
    inner = torch._from_functional_tensor(t.elem)
    flat = torch.empty(_extent(t)[1], dtype=t.dtype, device=t.device)
    laid = flat.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(t)
    torch._sync(laid)
    t.replace_(torch._from_functional_tensor(laid.elem))
    t.commit_update()
    trace.log("aot_eager_layout", stage="aot", size=list(t.shape), stride=list(t.stride()),
              offset=t.storage_offset(), reason=f"{why}; functionalization's value had "
              f"strides {list(inner.stride())}, offset {inner.storage_offset()}")
    return True


def _squeeze_(func, t, dims=None):
    """``t.squeeze_(dims)`` of a tensor with symbolic sizes as ``squeeze_`` of exactly the dims whose size is 1 (a no-op
    when none is): functionalization's ``squeeze_`` of a dim with a symbolic size killed the process (SIGSEGV, user
    report 18 #1). Squeezing no dim is still a restride of ``t`` (the analysis records it; autograd has rebased its
    history, so a joint trace would drop the gradient of what read it before: s319 #989)."""
    if func is aten.squeeze_.default:
        dims = range(t.dim())
    elif func is aten.squeeze_.dim:
        dims = [dims]
    dims = sorted({d % t.dim() for d in dims if t.dim() and t.shape[d] == 1})
    return aten.squeeze_.dims(t, dims)


@contextlib.contextmanager
def _rewrites(drop_error_checks: bool):
    """The modes a program runs under: :class:`_ViewRewrites` on top (composite ops decompose there)."""
    with _DropErrorChecks() if drop_error_checks else contextlib.nullcontext(), _ViewRewrites():
        yield


def _call(fn: Callable, args: list, drop_error_checks: bool):
    with _rewrites(drop_error_checks):
        try:
            return fn(*args)
        except ValueError as e:  # symbolic sizes: FakeTensor's view of functionalization's new value of an
            if not str(e).startswith("Cannot view a tensor"):  # intermediate, in another layout than eager's
                raise  # (y.t().masked_fill_(m, 0); y.view(-1)), checks its strides (trial 62 finding 5)
            raise RunEagerly(f"a view of a written tensor's new value: {e}") from e


def _is_differentiable(t: torch.Tensor) -> bool:
    return t.requires_grad and (t.is_floating_point() or t.is_complex())


def analyze(fn: Callable, fake_args: list, fake_mode: FakeTensorMode, grad: bool) -> ProgramInfo:
    """Run ``fn`` once on functional fake tensors and describe its mutations and aliasing.

    Views of inputs the program mutates (data or metadata) and the inputs' final metadata are taken from a second,
    plain fake run (:func:`eager_layouts`): under functionalization a mutated input is replaced by its new value,
    whose layout is the out-of-place op's (contiguous), not the one eager writes into."""
    try:
        return _analyze(fn, fake_args, fake_mode, grad, drop_error_checks=False)
    except AssertionError as e:
        if "token for effect" not in str(e):
            raise
        return _analyze(fn, fake_args, fake_mode, grad, drop_error_checks=True)


@contextlib.contextmanager
def untraced(fake_mode: FakeTensorMode):
    """For a fake run outside ``make_fx`` (:func:`analyze`, :func:`eager_layouts`): the unbacked symbols it makes
    (``nonzero``, ``.item()``) are not waiting for a graph node to bind them; and with a ShapeEnv, ops dispatch as in
    make_fx's symbolic trace (and coil's capture): under the Python dispatcher, so that composite ops take torch's
    Python kernels, which keep sizes symbolic. Without it, torch 2.11's C++ ``matmul`` (reached from ``linear``) read
    a 3-D operand's ``sizes()`` and pinned its symbolic length (``Eq(s0, 128)``): every sequence length compiled
    again (GPT-2 on CUDA)."""
    if (env := fake_mode.shape_env) is None:
        yield
        return
    with env.ignore_fresh_unbacked_symbols(), enable_python_dispatcher():
        yield


def _analyze(fn, fake_args, fake_mode, grad, drop_error_checks) -> ProgramInfo:
    with fake_mode, untraced(fake_mode), torch.set_grad_enabled(grad), without_cudnn_choices():
        with FunctionalTensorMode():
            f_args = [_to_functional(a) for a in fake_args]
            before, grad_fns = _aliases_before(f_args), [getattr(a, "grad_fn", None) for a in f_args]
            with OverlapGuard(inputs=f_args):  # eager's refusal of overlapping writes
                outs = _call(fn, f_args, drop_error_checks)
        return _describe(fn, fake_args, f_args, before, outs, grad, drop_error_checks, fake_mode, grad_fns=grad_fns)


def _saved_storages(nodes: list, memo: dict) -> set:
    """The storages of the tensors autograd saved for the backward from ``nodes`` (``memo``: node -> its own)."""
    todo, seen, out = list(nodes), set(), set()
    while todo:
        if (n := todo.pop()) is None or n in seen:
            continue
        seen.add(n)
        todo += [m for m, _ in n.next_functions]
        if n not in memo:
            memo[n] = set()
            for v in (_saved_value(n, a[4:]) for a in dir(n) if a.startswith("_raw_saved_")):  # (tensors only)
                memo[n].update(StorageWeakRef(t.untyped_storage()) for t in (v if isinstance(v, tuple) else (v,))
                               if isinstance(t, torch.Tensor) and t.layout == torch.strided)
        out |= memo[n]
    return out


def _saved_value(node, name: str) -> Any:
    try:
        return getattr(node, name)
    except (RuntimeError, AttributeError):    # (written since: eager's backward raises there; a Function's)
        return None


def _describe(fn, fake_args, f_args, before, outs, grad, drop_error_checks, fake_mode, grad_fns=None,
              one_run: bool = False) -> Optional[ProgramInfo]:
    """What a functional run of ``fn`` on ``f_args`` (made from ``fake_args``; ``before``: their
    :func:`_aliases_before`; ``grad_fns``: their ``grad_fn`` before it) that returned ``outs`` did: the
    :class:`ProgramInfo`. ``one_run`` (a run that is also the trace, :func:`trace_joint`'s): None if the program
    restrides an input, writes one that requires grad or returns a view of one it changed; with symbolic sizes also if
    it changes any input or returns an alias or a SymInt."""
    for t in before:
        if isinstance(t, torch.Tensor):
            torch._sync(t)
    flat_outs, spec = pytree.tree_flatten(outs)
    inputs, input_storage = [], {}
    for i, (a, fa) in enumerate(zip(fake_args, f_args)):
        if not isinstance(a, torch.Tensor):
            inputs.append(InputInfo(is_tensor=False))
            continue
        torch._sync(fa)
        mutated = torch._functionalize_has_data_mutation(fa.elem)
        hidden = mutated and torch._functionalize_are_all_mutations_under_no_grad_or_inference_mode(fa.elem)
        # not one a custom Function wrote and marked dirty (``ctx.mark_dirty``): its history is now that Function's
        hidden = hidden and not (fa.requires_grad and isinstance(fa.grad_fn, BackwardCFunction))
        # or only through tensors that are no autograd view of it (a.detach().mul_(b)): its history is as before
        hidden = hidden or mutated and grad_fns is not None and fa.grad_fn is grad_fns[i]
        inputs.append(InputInfo(True, _is_differentiable(a), mutated, hidden))
        if torch._functionalize_has_metadata_mutation(fa.elem):
            inputs[-1].layout = ()  # filled in from eager_layouts below
        input_storage.setdefault(StorageWeakRef(fa.untyped_storage()), i)
    outputs: list = []
    graph_outputs: list = []
    groups: dict = {}  # storage -> user-output positions computed from it
    for k, o in enumerate(flat_outs):
        if not isinstance(o, torch.Tensor):
            outputs.append(OutputInfo("constant", value=o))
            continue
        # a view from an op returning several (split) or a custom Function, its base written after: autograd refuses
        # its history when it is read (s1046 #65; eager raises at the caller's read, so the program runs eagerly)
        try:
            g = o.grad_fn if _multi_output_view(o, ("MULTI_OUTPUT_NODE", "IN_CUSTOM_FUNCTION")) else None
        except RuntimeError:
            raise RunEagerly(MULTI_OUTPUT_WRITTEN_MESSAGE) from None
        while g is not None and g is not o._base.grad_fn and not isinstance(g, BackwardCFunction):
            g = g.next_functions[0][0] if g.next_functions else None  # (a view of it: its history to the base's)
        custom = g is not None and g is not o._base.grad_fn  # a custom Function's view (or a view of one)
        lay = _layout_of(o)
        meta = dict(size=tuple(lay.shape), stride=tuple(lay.stride()), offset=lay.storage_offset(),
                    requires_grad=_is_differentiable(o), multi_output=custom or _multi_output_view(o),
                    lazy=(o.is_conj(), o.is_neg()), detached=not o._is_view(),
                    no_grad_view=o.requires_grad and o._is_view() and o.grad_fn is None)
        if same := [j for j, fa in enumerate(f_args) if fa is o]:
            outputs.append(OutputInfo("input", same[0], **meta))
            continue
        if earlier := [j for j in range(k) if flat_outs[j] is o]:  # the same tensor returned twice: the same object
            outputs.append(OutputInfo("same_as_output", earlier[0], **meta))
            continue
        if (st := StorageWeakRef(o.untyped_storage())) in input_storage:
            # a view as another dtype (view(dtype)) is not differentiable; the graph computes a differentiable
            # one (view_as_real: a copy) and one of an input whose elements share memory (an expand): as_strided
            # of that differentiates its storage (each element got the mean of theirs), not its elements
            # no autograd view of an input at all (view(dtype) and back to its dtype, detach(), or a view of those)
            # has a gradient of its own too (s1037 #1355: a.view(torch.int32).view(torch.float32).add_(floor(a)))
            other = fake_args[input_storage[st]].dtype != o.dtype
            own = other or all(o._base is not fa for fa in f_args)
            if not (meta["requires_grad"] and (own or custom or _overlaps(fake_args[input_storage[st]]))):
                outputs.append(OutputInfo("alias_of_input", input_storage[st], **meta,
                                          dtype=o.dtype if other else None))
                continue
            if own and not _overlaps(fake_args[input_storage[st]]) and inputs[input_storage[st]].layout is None:
                meta["shares"] = input_storage[st]  # (s1015 #155: b.view(torch.float16).div_(b.sum()))
        outputs.append(OutputInfo("graph", -1, **meta))
        if st not in input_storage and not custom:
            groups.setdefault((st, o.dtype), []).append(k)
            if _view_of_written_intermediate(o, o):  # (its new value has the out-of-place op's layout: trial 62)
                outputs[-1].src_stride = meta["stride"]
    base_sources: list = []
    for members in groups.values():
        first = members[0]
        if len(members) == 1 and not _view_of_written_intermediate(flat_outs[first]):
            continue
        owner = next((k for k in members if flat_outs[k]._base is None), None) if len(members) > 1 else None
        if owner is not None:
            # one output owns the storage: the others are views of it
            for k in members:
                if k != owner:
                    outputs[k].kind, outputs[k].index = "alias_of_output", owner
                    outputs[k].src_stride = outputs[owner].stride
        else:
            base_sources.append(first)  # all are views of an intermediate: return that base too
            for k in members:
                outputs[k].kind, outputs[k].index = "alias_of_base", len(base_sources) - 1
                outputs[k].src_stride = tuple(_layout_of(flat_outs[first]._base).stride())
    changed = {i for i, x in enumerate(inputs) if x.mutated or x.layout is not None}
    layouts = any(x.layout is not None for x in inputs) or any(
        o.kind == "alias_of_input" and o.index in changed for o in outputs)
    plain = one_run and is_symbolic(fake_args) and (changed or base_sources or not all(
        o.kind == "graph" or o.kind == "constant" and not isinstance(o.value, torch.SymInt) for o in outputs))
    if plain or one_run and (layouts or any(inputs[i].requires_grad for i in changed)):
        return None
    if layouts:
        in_lay, out_lay, fresh = eager_layouts(fn, fake_args, fake_mode, drop_error_checks)
        for i in changed:
            if inputs[i].layout is not None:
                size, stride, off = in_lay[i]
                inputs[i].layout = (size, stride, off - fake_args[i].storage_offset())
        for k, o in enumerate(outputs):
            src = outputs[o.index] if o.kind == "same_as_output" else o
            if not (src.kind == "alias_of_input" and src.index in changed and out_lay[k] is not None):
                continue
            o.size, o.stride, o.offset = out_lay[k]
            if fresh[k]:  # functional contiguous() of a mutated input's (contiguous) new value
                o.kind, o.index, o.dtype = "graph", -1, None  # is a no-op; eager's, a copy
    for k, info in enumerate(outputs):
        if info.kind == "graph":
            info.index = len(graph_outputs)
            graph_outputs.append(k)
    # storage offsets relative to the tensor each alias is regenerated from
    for k, o in enumerate(outputs):
        if o.kind not in ("alias_of_input", "alias_of_output", "alias_of_base") and o.shares < 0:
            continue
        a = fake_args[o.index] if o.kind == "alias_of_input" else flat_outs[o.index] if o.kind == "alias_of_output" \
            else fake_args[o.shares] if o.shares >= 0 else flat_outs[base_sources[o.index]]._base
        if a.dtype != flat_outs[k].dtype:  # a view as another dtype (view(dtype), .real, view_as_real): in bytes
            o.dtype = flat_outs[k].dtype
        o.offset = o.offset * o.dtype.itemsize - a.storage_offset() * a.dtype.itemsize if o.dtype else \
            o.offset - a.storage_offset()
    for o in outputs:  # alias_of_output: index → graph-output position of the owner
        if o.kind == "alias_of_output":
            o.index = outputs[o.index].index
    memo: dict = {}     # output k's backward in eager reads what autograd saved in storages reads[k]
    roots = {k: flat_outs[k].grad_fn for k in graph_outputs
             if outputs[k].requires_grad and flat_outs[k].grad_fn is not None}
    # one walk from every output first: usually no output's memory is saved, and no walk per output is needed
    stored = {StorageWeakRef(flat_outs[j].untyped_storage()) for j in graph_outputs} if roots else set()
    reads = {k: _saved_storages([g], memo) for k, g in roots.items()} \
        if stored & _saved_storages(list(roots.values()), memo) else {}
    for j in graph_outputs if reads else ():
        st = StorageWeakRef(flat_outs[j].untyped_storage())
        outputs[j].saved = tuple(outputs[k].index for k, r in reads.items() if st in r)
    info = ProgramInfo(inputs, outputs, spec, graph_outputs, base_sources, drop_error_checks=drop_error_checks,
                       fake_inputs=list(fake_args) if is_symbolic(fake_args) else None)
    # a mutated input's new value requires grad if the program made it so
    rg = [grad and not inputs[i].mutation_hidden and _is_differentiable(f_args[i]) for i in info.mutated_inputs]
    rg += [outputs[k].requires_grad and not outputs[k].no_grad_view for k in graph_outputs]
    rg += [_is_differentiable(flat_outs[k]._base) for k in base_sources]
    info.fw_out_requires_grad = rg
    fw_vals = ([before[i] for i in info.mutated_inputs] + [flat_outs[k] for k in graph_outputs]
               + [flat_outs[k]._base for k in base_sources])
    info.fw_out_meta = [(tuple(v.shape), v.dtype, v.device) for v in fw_vals]
    return info


MULTI_OUTPUT_WRITTEN_MESSAGE = ("the program returns a view made by an op that returns several views (split, "
                                "unbind) or by a custom autograd.Function after writing its base in place, whose "
                                "history autograd refuses, so the program runs eagerly")


def _layout_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose sizes and strides are ``t``'s eager layout: ``t``, or the inner tensor of a FunctionalTensor
    where an ``out=`` op resized it (its wrapper keeps the old sizes: trial 79 #6)."""
    return t if (e := getattr(t, "elem", t)).shape == t.shape else e


def _multi_output_view(o: torch.Tensor, metas: tuple = ("MULTI_OUTPUT_NODE",)) -> bool:
    """Whether ``o`` is a differentiable view made by an op that returns several views (or as ``metas`` name)."""
    return o.requires_grad and o._is_view() and torch._C._autograd._get_creation_meta(o).name in metas


def _view_of_written_intermediate(o: torch.Tensor, base: Optional[torch.Tensor] = None) -> bool:
    """Whether output ``o`` is a view of an intermediate (``base``: is that intermediate) the program wrote through a
    view (``torch.add(x, y, out=torch.empty(4, n).t())``, ``y.t().masked_fill_(m, 0)``): functionalization's new value
    of that intermediate has the out-of-place op's layout, so ``o`` is rebuilt from it at eager's strides."""
    base = o._base if base is None else base
    return base is not None and isinstance(base, FunctionalTensor) and torch._functionalize_has_data_mutation(base.elem)


# --------------------------------------------------------------------------- tracing

def _aliases_before(f_args: list) -> list:
    """An alias of each functional tensor input, taken before the program runs: after it, the alias holds the input's
    new value *in the input's original layout*, also when the program changed the input's metadata
    (``x.t_(); x.add_(1)``), which is the value the runtime copies into the caller's tensor before restriding it."""
    return [aten.alias.default(a) if isinstance(a, torch.Tensor) else a for a in f_args]


def eager_layouts(fn: Callable, fake_args: list, fake_mode: FakeTensorMode,
                  drop_error_checks: bool = False) -> tuple[list, list]:
    """Run ``fn`` on plain (not functional) fakes of ``fake_args`` and return each input's and each flat output's
    ``(size, stride, storage_offset)`` afterwards (None for non-tensors): the layouts eager gives; and per flat
    output whether it is a new tensor (not an earlier output, not on an input's storage). Fake tensors model in-place
    ops as eager does (``x.index_add_`` keeps a transposed ``x``'s strides, ``x.t_()`` restrides ``x``), while under
    functionalization a mutated input becomes a new (contiguous) value. Each input is a fresh tensor object on the
    same fake storage (``detach``), so metadata changes leave ``fake_args`` as they are; runs under no_grad (layouts
    do not depend on it, and no autograd check is wanted here: the functional run made them)."""
    with fake_mode, untraced(fake_mode), torch.no_grad(), without_cudnn_choices():
        args = [a.detach() if isinstance(a, torch.Tensor) else a for a in fake_args]
        for a, f in zip(args, fake_args):  # a float argument's number (the detached copy lost it)
            if item_memo(f) is not None:
                a.item_memo = item_memo(f)
        outs = _call(fn, list(args), drop_error_checks)

    def lay(t):
        return None if not isinstance(t, torch.Tensor) else (tuple(t.shape), tuple(t.stride()), t.storage_offset())
    flat = pytree.tree_leaves(outs)
    ins = {StorageWeakRef(a.untyped_storage()) for a in args if isinstance(a, torch.Tensor)}
    fresh = [isinstance(o, torch.Tensor) and all(o is not p for p in flat[:k])
             and StorageWeakRef(o.untyped_storage()) not in ins for k, o in enumerate(flat)]
    return [lay(a) for a in args], [lay(o) for o in flat], fresh


def _forward_values(fn, args, info: ProgramInfo, label_autograd: bool = False):
    before = _aliases_before(args) if info.restrided_inputs else args
    return _selected(before, _call(_located(fn, label_autograd), args, info.drop_error_checks), info)


def _selected(before: list, outs, info: ProgramInfo) -> list:
    """The forward graph's values (mutated inputs, graph outputs, bases) of a run that returned ``outs``."""
    flat = pytree.tree_leaves(outs)
    return [before[i] for i in info.mutated_inputs] + [flat[k] for k in info.graph_outputs] + [
        flat[k]._base for k in info.base_sources]


def _flatten_signature(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Drop make_fx's pytree codegen: the module takes flat placeholders, returns a list."""
    gm.graph._codegen = torch.fx.graph.CodeGen()
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat, _ = pytree.tree_flatten(out.args[0])
    out.args = (list(flat),)
    _cleanup(gm.graph)
    gm.recompile()
    return gm


def _cleanup(graph: torch.fx.Graph) -> None:
    """Replace ``aten.alias`` (a no-op in a functional graph) by its input."""
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.alias.default:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


def item_memo(t: Any) -> Optional[Any]:
    """The symbolic number ``t.item()`` returns for a fake tensor, or None.

    torch's capture with ``dynamic=True`` (or after a float argument changed) passes a Python float
    (``LayerNorm.eps``, a temperature) as a 0-d float64 tensor input that the graph reads with ``.item()``; its fake
    carries the SymFloat the capture made for the float as ``item_memo``, which the fake ``aten._local_scalar_dense``
    returns. Without it that op raises ``DataDependentOutputException``."""
    m = getattr(t, "item_memo", None) if isinstance(t, FakeTensor) else None
    return m if isinstance(m, (torch.SymInt, torch.SymFloat, torch.SymBool)) else None


def is_symbolic(args) -> bool:
    """Whether ``args`` (nested) holds a SymInt, a tensor with a symbolic size, or a 0-d fake tensor holding a symbolic
    number (:func:`item_memo`): tracing must then be symbolic."""
    return any(isinstance(a, torch.SymInt) or isinstance(a, torch.Tensor) and (
        any(isinstance(d, torch.SymInt) for d in a.shape) or item_memo(a) is not None)
        for a in pytree.tree_leaves(args))


def _traced(fn: Callable, args: list) -> Callable:
    """``fn`` as ``make_fx`` traces it:

    - symbolic size arithmetic is recorded lazily (``maybe_enable_thunkify``, as torch's AOTAutograd does): a node only
      for a SymInt that a traced op or output uses. Each view's or new tensor's symbolic sizes, strides and contiguity
      are otherwise graph nodes, later dead: 12,000 of them for an 8-layer LLaMA at a symbolic length, 60% of its trace
      time;
    - its tensor arguments first get the ``item_memo`` of the fakes in ``args`` they were made from. In "symbolic" mode
      make_fx fakes its arguments again (same sizes and symbols) and the copies lose the memo, so ``.item()`` of a
      capture's 0-d float input raised inside the trace; with it, ``.item()`` returns the capture's SymFloat, traced as
      ``aten._local_scalar_dense`` of the input (which :mod:`coil.aot.scalars` then replaces by reading the tensor)."""
    memos = [item_memo(a) for a in pytree.tree_leaves(args)]

    @functools.wraps(fn)  # make_fx reads the signature (placeholders)
    def traced(*inner):
        for a, m in zip(pytree.tree_leaves(inner), memos):
            if m is not None and isinstance(a, FakeTensor) and item_memo(a) is None:
                a.item_memo = m
        with maybe_enable_thunkify():
            return fn(*inner)
    return traced


def _make_fx(fn: Callable, args: list, decompositions: dict, fake_mode: FakeTensorMode):
    # symbolic sizes are traced as sym_size nodes only in "symbolic" mode (reusing the inputs' fake mode and ShapeEnv);
    # static inputs trace in "real" mode (an unbacked size, from nonzero or .item(), needs the capture's ShapeEnv too)
    mode = "symbolic" if is_symbolic(args) or fake_mode.shape_env is not None else "real"
    if fake_mode.shape_env is not None:     # left by runs that are over (capture, analyze)
        fake_mode.shape_env.pending_fresh_unbacked_symbols.clear()
    with fake_mode, without_cudnn_choices(), fx_traceback.preserve_node_meta():
        gm = make_fx(_traced(fn, args), decomposition_table=decompositions, tracing_mode=mode)(*args)
    _cudnn_layouts(gm, fake_mode)
    _insert_zero_division_checks(gm)
    if (env := fake_mode.shape_env) is not None and any(env.deferred_runtime_asserts.values()):
        _insert_runtime_asserts(gm, env, [item_memo(a) for a in pytree.tree_leaves(args)])
    return gm


#: integer division ops that raise ``RuntimeError: ZeroDivisionError`` in eager on the CPU
_INT_DIVISIONS = {aten.floor_divide.default, aten.remainder.Tensor, aten.fmod.Tensor, aten.div.Tensor_mode,
                  aten.remainder.Scalar, aten.fmod.Scalar, aten.remainder.Scalar_Tensor}


def _insert_zero_division_checks(gm: torch.fx.GraphModule) -> None:
    """Before each integer division, remainder or fmod by a CPU tensor, check that no divisor is 0
    (``aten._assert_async.msg``, raising eager's ``RuntimeError: ZeroDivisionError``): the kernels divide unchecked and
    returned numbers where eager raised. A Python divisor that is 0 in the result's dtype, or a symbolic one that is 0,
    fails the check for a non-empty result; eager's own trace checks other Python numbers; CUDA's eager does not raise.
    An integer ``pow`` by a symbolic int checks it is not negative, as eager does. Logged ``zero_division_checks``."""
    added = 0
    for n in list(gm.graph.nodes):
        if n.target is aten.pow.Tensor_Scalar and isinstance(e := n.args[1], torch.fx.Node) and \
                isinstance(ev := e.meta.get("val"), torch.SymInt) and not n.args[0].meta["val"].is_floating_point() \
                and not n.args[0].meta["val"].is_complex():    # an integer power by an int that became symbolic
            with gm.graph.inserting_before(n):
                ge = gm.graph.call_function(operator.ge, (e, 0))
                gm.graph.call_function(aten._assert_scalar.default,
                                       (ge, "Integers to negative integer powers are not allowed."))
            ge.meta["val"], added = ev >= 0, added + 1
        if n.op != "call_function" or n.target not in _INT_DIVISIONS or len(n.args) < 2:
            continue
        out, b = n.meta.get("val"), n.args[1]
        bv = b.meta.get("val") if isinstance(b, torch.fx.Node) else None
        if not isinstance(out, torch.Tensor) or out.dtype.is_floating_point or out.dtype.is_complex or \
                out.dtype == torch.bool or out.device.type != "cpu":
            continue
        if isinstance(bv, torch.SymInt) or type(b) is int and b % (1 << 8 * out.dtype.itemsize) == 0:
            # a Python divisor that is 0 in the result's dtype (``x // 0``, int8 ``x // 256``: eager casts it) or a
            # symbolic one (an int that changed between calls), as a tensor of the result's shape: eager raises for
            # every element there is
            with gm.graph.inserting_after(n):
                zeros = gm.graph.call_function(aten.mul.Tensor, (n, 0))
            with gm.graph.inserting_after(zeros):
                b = gm.graph.call_function(aten.add.Tensor, (zeros, b))
            b.meta["val"] = zeros.meta["val"] = bv = out
        elif not isinstance(bv, torch.Tensor):
            continue
        with gm.graph.inserting_before(n) if b is n.args[1] else gm.graph.inserting_after(b):
            nonzero = gm.graph.call_function(aten.ne.Scalar, (b, 0))
        with gm.graph.inserting_after(nonzero):
            ok = gm.graph.call_function(aten.all.default, (nonzero,))
        with gm.graph.inserting_after(ok):
            gm.graph.call_function(aten._assert_async.msg, (ok, "ZeroDivisionError"))
        nonzero.meta["val"] = bv.ne(0)
        ok.meta["val"] = nonzero.meta["val"].all()
        added += 1
    if added:
        gm.recompile()
        trace.log("zero_division_checks", stage="aot", checks=added)


def _insert_runtime_asserts(gm: torch.fx.GraphModule, env, memos: list) -> None:
    """Add ``aten._assert_scalar`` nodes for the facts the program asserted about data-dependent sizes
    (``torch._check(n < 10)``, ``torch._check_is_size(n)`` on ``n = t.item()``): the ShapeEnv keeps them as deferred
    runtime asserts, which tracing leaves out of the graph, so the compiled program returned values where eager
    raised. Each check goes right after the node that binds its symbols (torch.fx's
    ``insert_deferred_runtime_asserts``); logged ``runtime_asserts``."""
    before, places = len(gm.graph.nodes), gm.graph.find_nodes(op="placeholder")
    for n in gm.graph.find_nodes(op="call_function", target=aten._local_scalar_dense.default):
        # ``.item()`` of an input whose fake carries the capture's symbol (item_memo): no binding was recorded, so its
        # checks (and a view's ``6 % u0 == 0``) had no node to follow; the read binds the symbol. One since replaced
        # by a number (``x.view(n.item(), 3)`` of 6 elements pins it to 2) had no value: the wrapper checks it (ir).
        memo = memos[places.index(n.args[0])] if n.args[0] in places else None
        if memo is None or "unbacked_bindings" in n.meta or not (sym := memo.node._expr).is_Symbol or \
                not free_unbacked_symbols(sym):
            continue
        n.meta["val"], n.meta["unbacked_bindings"] = memo, {sym: ()}
    insert_deferred_runtime_asserts(gm, env, "coil")
    ours = {f"expression {ra.expr} on": ra.msg for ras in env.deferred_runtime_asserts.values() for ra in ras
            if ra.msg.startswith(ZERO_DIVISION_MARK)}     # (capture's, for Python's ZeroDivisionError: its message)
    for n in gm.graph.find_nodes(op="call_function", target=aten._assert_scalar.default):
        n.args = (n.args[0], next((m for e, m in ours.items() if e in str(n.args[1])), n.args[1]))
    if added := [str(n.args[1]) for n in gm.graph.nodes if n.target is torch.ops.aten._assert_scalar.default]:
        gm.recompile()
        trace.log("runtime_asserts", stage="aot", asserts=added, nodes=len(gm.graph.nodes) - before)


# --------------------------------------------------------------------------- source locations

class _LocatingInterpreter(torch.fx.Interpreter):
    """Runs a torch-level GraphModule node by node while ``make_fx`` traces it, each node's meta being the current one
    (``Interpreter`` sets it under ``preserve_node_meta``): make_fx copies its ``stack_trace`` (the user's source
    lines, from coil's capture or Dynamo) onto the ATen nodes it becomes. With ``label_autograd``, the autograd nodes
    a graph node creates are labelled with the same trace, for :func:`_locate_backward`, and the values a checkpoint
    region's nodes save are read as eager's checkpoint recomputes them (:class:`_CheckpointSaves`)."""

    def __init__(self, gm: torch.fx.GraphModule, label_autograd: bool):
        super().__init__(gm)
        self.extra_traceback = False  # errors keep their own message
        self.label_autograd = label_autograd
        self.checkpoints: dict = {}  # checkpoint region -> its _CheckpointSaves (while the joint is traced)

    def run(self, *args):
        if self.label_autograd:
            _label_grad_fns(args, "")  # made before the program (input clones): no line
        return super().run(*args)

    def run_node(self, n: torch.fx.Node) -> Any:
        region = checkpoint_region(n) if self.label_autograd and not n.meta.get("ac_reentrant") else None
        if region is None:
            out = super().run_node(n)
        else:
            saves = self.checkpoints.setdefault(region, _CheckpointSaves())
            for a in n.all_input_nodes:
                if checkpoint_region(a) != region:
                    saves.read(self.env[a])
            with torch.autograd.graph.saved_tensors_hooks(saves.pack, saves.unpack):
                out = super().run_node(n)
        if self.label_autograd:
            _label_grad_fns(out, n.meta.get("stack_trace", ""))
        return out


def checkpoint_region(n: torch.fx.Node) -> Optional[int]:
    """The activation-checkpoint region of node ``n`` (``meta["ac_graph_id"]`` where ``meta["recompute"]`` is a
    recompute policy: capture's tags on a ``torch.utils.checkpoint.checkpoint`` body, docs/hops.md), or None."""
    return n.meta.get("ac_graph_id", 0) if n.meta.get("recompute") in _RECOMPUTE else None


_RECOMPUTE = {CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE}


def run_eagerly(gm: torch.fx.GraphModule) -> Callable:
    """``gm``'s forward, each activation-checkpoint region of a captured graph run by ``torch.utils.checkpoint`` as
    in the user's program: its backward recomputes the region from the checkpoint's tensor arguments (which autograd
    refuses to find written) and the current values of the other tensors it reads (capture's ``ac_args``)."""
    regions: dict = {}
    for n in gm.graph.nodes:
        if (r := checkpoint_region(n)) is not None:
            regions.setdefault(r, []).append(n)
    if not regions:
        return gm.forward

    class Checkpointing(torch.fx.Interpreter):
        def run_node(self, n):
            if (nodes := regions.get(checkpoint_region(n))) is None:
                return super().run_node(n)
            if n is not nodes[-1]:    # the region runs at its last node (nodes between it are not calls)
                return None
            env, inside = self.env, set(nodes)
            outs = [m for m in nodes if any(u not in inside for u in m.users)]
            names = set().union(*(m.meta.get("ac_args", ()) for m in nodes))
            args = list({a: 0 for m in nodes for a in m.all_input_nodes if a not in inside and a.name in names})
            held: dict = {}  # outputs that are tensors from outside (a buffer's `+=`): not returned through the
            # checkpoint, whose reentrant Function would make them its outputs and recurse into itself in the backward

            def body(*values):
                local = dict(zip(args, values))
                for m in nodes:
                    a, kw = torch.fx.node.map_arg((m.args, m.kwargs), lambda x: local.get(x, env.get(x)))
                    local[m] = getattr(self, m.op)(m.target, a, kw)
                outer = {id(env[a]) for m in nodes for a in m.all_input_nodes if a not in inside and a in env}
                held.update((m, local[m]) for m in outs if id(local[m]) in outer | set(map(id, values)))
                return tuple(None if m in held else local[m] for m in outs)
            vals = ckpt.checkpoint(body, *[env[a] for a in args], use_reentrant=bool(n.meta.get("ac_reentrant")))
            env.update((m, held.get(m, v)) for m, v in zip(outs, vals))
            return env.get(n)

    def run(*args):
        interp = Checkpointing(gm, garbage_collect_values=False)
        interp.extra_traceback = False
        return interp.run(*args)
    return run


class _CheckpointSaves:
    """What the autograd of one checkpoint region saves while the joint graph is traced. Eager's non-reentrant
    checkpoint saves nothing: its backward recomputes the region from the region's inputs up to the region's last
    save, so a saved value written in place afterwards (by the body: ``z.tanh().add_(1)``, or after the region) is
    recomputed as it was at that last save, where autograd's version check refuses it. The partitioner recomputes
    the region, so the joint's backward reads a copy made at each save (a dead node where the value is not written).
    A region input written before the backward (eager recomputes from the written input) raises autograd's error."""

    def __init__(self):
        self.reads: dict = {}   # id -> (tensor the region reads from outside it, its version at the first read)
        self.saved: list = []   # [tensor, version when saved, its value at the region's latest save, that version]

    def read(self, value: Any) -> None:
        """Note the tensors of ``value`` (an input of a region node computed outside the region)."""
        for t in pytree.tree_leaves(value):
            if isinstance(t, torch.Tensor):
                self.reads.setdefault(id(t), (t, t._version))

    def pack(self, t: torch.Tensor) -> list:
        """saved_tensors_hooks pack: the tensor, its version and a copy; earlier saves written since get new copies."""
        with torch.no_grad():
            for e in self.saved:
                if e[0]._version != e[3]:
                    e[2:] = e[0].clone(), e[0]._version
            self.saved.append(e := [t, t._version, t.clone(), t._version])
        return e

    def unpack(self, e: list) -> torch.Tensor:
        """saved_tensors_hooks unpack: the tensor if unwritten, else its value at the region's last save."""
        if any(r._version != v for r, v in self.reads.values()):  # (eager: recomputed from it, or refused)
            raise RuntimeError("one of the variables needed for gradient computation has been modified by an "
                               "inplace operation: an input of its checkpoint region")
        if e[0]._version == e[1]:
            return e[0]
        if len(e) == 4:     # (once: _saved_storages reads it too)
            e.append(trace.log("aot_checkpoint_written_save", stage="aot", shape=[str(d) for d in e[0].shape]))
        return e[2]


def _located(fn: Callable, label_autograd: bool) -> Callable:
    """``fn``, run by :class:`_LocatingInterpreter` if it is a plain GraphModule."""
    if isinstance(fn, torch.fx.GraphModule) and "forward" not in vars(fn):
        return _LocatingInterpreter(fn, label_autograd).run
    return fn


_TRACE_KEY = "coil_stack_trace"  # in grad_fn.metadata


def _autograd_nodes(tensors, seen: Callable):
    """The autograd nodes reachable from ``tensors`` through nodes not ``seen`` (asked once per visit), depth first."""
    todo = [_grad_fn(t) for t in tensors if isinstance(t, torch.Tensor)]
    while todo:
        if (node := todo.pop()) is not None and not seen(node):
            yield node
            todo.extend(fn for fn, _ in node.next_functions)


def _grad_fn(t: torch.Tensor):
    """``t.grad_fn``; None for a view made under no_grad whose base was then written (``w[0].mul_(2)`` under no_grad:
    autograd refuses to rebuild its grad_fn, and eager never asks)."""
    try:
        return t.grad_fn
    except RuntimeError:
        return None


def _label_grad_fns(value: Any, trace: str) -> None:
    """Label every autograd node reachable from the tensors in ``value`` and not labelled yet (those the last graph node
    created) with ``trace``."""
    for node in _autograd_nodes(pytree.tree_leaves(value), lambda n: _TRACE_KEY in n.metadata):
        node.metadata[_TRACE_KEY] = trace


def _locate_backward(outputs: list) -> None:
    """Before ``autograd.grad`` in a joint trace: each labelled autograd node sets the current stack trace when its
    backward starts, so the backward's ATen nodes carry the line of the forward op they differentiate (gradient sums:
    the consumer's line)."""
    seen: set = set()
    for node in _autograd_nodes(outputs, lambda n: n in seen or seen.add(n)):
        if (trace := node.metadata.get(_TRACE_KEY)) is not None:
            node.register_prehook(_stack_trace_setter(trace))


def _stack_trace_setter(trace: str) -> Callable:
    def prehook(grad_outputs):
        fx_traceback.set_stack_trace([trace] if trace else [])
    return prehook


@contextlib.contextmanager
def _without_mkldnn():
    """oneDNN off for the joint trace: torch's LSTM decomposition picks ``mkldnn_rnn_layer`` when the *input* needs no
    grad, even with trainable weights, and that op gives no workspace under the no_grad the compiled forward runs in
    (the backward raised "got None for argument #22 'workspace'"); off, the LSTM traces as portable cell ops. No other
    decomposition or meta kernel reads the flag (convolutions trace as ``aten.convolution``)."""
    on = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(on)


def without_cudnn_choices():
    """cuDNN off while tracing (fake tensors: no kernel runs), so that composite ops that pick a cuDNN-specific ATen op
    by the global flag trace their portable form: ``batch_norm`` on CUDA picks ``cudnn_batch_norm``, whose schema
    does not mark the running statistics as mutated, and the joint graph lost their update (the running mean and
    variance of every BatchNorm stayed 0 and 1 in CUDA training, while ``native_batch_norm`` traces the update).
    Extern kernels still run cuDNN at run time.

    Only the ``enabled`` flag is touched, and restored on exit. It is process-global: eager CUDA work in *other*
    threads during a trace runs without cuDNN (correct values, slower kernels) until the trace ends."""
    return _cudnn_enabled(False)


_CUDNN_LAYOUT_DEVICES = ("cuda",)  # convolution layouts follow the cuDNN flag (tests add "cpu")


def _cudnn_layouts(gm: torch.fx.GraphModule, fake_mode: FakeTensorMode) -> None:
    """``gm``'s fake values again with the user's cuDNN flag, where ``gm`` (traced by :func:`without_cudnn_choices`) has
    a ``_CUDNN_LAYOUT_DEVICES`` convolution: with cuDNN off its fake output is NCHW, where eager's cuDNN keeps a
    channels-last input's layout, and graph outputs take fake strides (a channels-last CNN's output came back NCHW).
    Uncached (the cache key lacks the flag); skipped for data-dependent sizes; logged."""
    nodes, meta = list(gm.graph.nodes), torch.device("meta")
    if not torch._C._get_cudnn_enabled() or not any(
            n.target in (aten.convolution.default, aten.convolution_backward.default) and getattr(
                n.args[0].meta.get("val"), "device", meta).type in _CUDNN_LAYOUT_DEVICES for n in nodes):
        return
    if any(n.op == "get_attr" and "val" not in n.meta or free_unbacked_symbols(n.meta.get("val")) for n in nodes):
        return trace.log("aot_cudnn_layouts", stage="aot", redone=False, reason="unbacked sizes or get_attr")
    new, changed = {}, 0
    with fake_mode, torch.no_grad(), disable_fake_tensor_cache(fake_mode):
        for n in nodes:
            old = new[n] = n.meta.get("val")
            if n.op == "call_function":
                new[n] = n.meta["val"] = n.target(*torch.fx.map_arg(n.args, new.get),
                                                  **torch.fx.map_arg(n.kwargs, new.get))
                changed += isinstance(old, torch.Tensor) and old.stride() != new[n].stride()
    trace.log("aot_cudnn_layouts", stage="aot", redone=True, restrided=changed, reason="cuDNN off in tracing")


_cudnn_lock = threading.Lock()
_cudnn_users = [0, True]  # traces inside without_cudnn_choices; the flag before the first


@contextlib.contextmanager
def _cudnn_enabled(on: bool):
    """The cuDNN flag set to ``on`` while any trace (in any thread, nested or not) is inside; the first one in saves the
    user's value and the last one out restores it. Uses the C setter: ``torch.backends.cudnn.enabled = ...`` raises
    after ``torch.backends.disable_global_flags()`` (torch's test utilities call it on import)."""
    with _cudnn_lock:
        if _cudnn_users[0] == 0:
            _cudnn_users[1] = torch._C._get_cudnn_enabled()
            torch._C._set_cudnn_enabled(on)
        _cudnn_users[0] += 1
    try:
        yield
    finally:
        with _cudnn_lock:
            _cudnn_users[0] -= 1
            if _cudnn_users[0] == 0:
                torch._C._set_cudnn_enabled(_cudnn_users[1])


def trace_inference(fn: Callable, fake_args: list, info: ProgramInfo, decompositions: dict,
                    fake_mode: FakeTensorMode) -> torch.fx.GraphModule:
    """Functional ATen graph ``(*inputs) -> [*mutated_input_values, *graph_outputs, *bases]``, traced in the caller's
    grad mode (torch's capture of torch.func.grad(f)(x) calls autograd.grad with no enable_grad)."""

    def inference(primals):
        with FunctionalTensorMode():
            vals = _forward_values(fn, [_to_functional(a) for a in primals], info)
        return [_from_functional(v) for v in vals]
    return _flatten_signature(_make_fx(inference, [list(fake_args)], decompositions, fake_mode))


@dataclasses.dataclass
class JointInfo:
    """Shape of a joint graph: ``num_primals`` primals, then one tangent per forward output that requires grad; outputs
    are ``num_fw_outputs`` forward values, then one grad per input in ``grad_inputs`` whose grad is not None."""

    num_primals: int
    num_fw_outputs: int
    grad_inputs: list  # input indices that require grad
    grad_is_none: list  # per grad_inputs entry: the gradient is None (unused input)
    program: Optional[ProgramInfo] = None  # what the trace's own run found, when it analysed the program
    #: grad_inputs entries that are not leaves: the caller may write them in place after the call (eager allows it
    #: where its autograd did not save them), so the min cut saves them only where nothing computed can stand in
    nonleaf_inputs: tuple = ()


def trace_joint(fn: Callable, fake_args: list, info: Optional[ProgramInfo], decompositions: dict,
                fake_mode: FakeTensorMode, grad: bool = True) -> Optional[tuple[torch.fx.GraphModule, JointInfo]]:
    """Trace forward + backward into one functional ATen graph (see module docstring).

    ``grad``: the caller's grad mode, which the program runs in (its own ``torch.enable_grad()`` / ``no_grad``
    regions then decide what is differentiable, as in eager); False under the caller's no_grad. ``info`` None: the
    forward's run is also the analysis (``JointInfo.program``; tangents become graph inputs once it is over: static
    sizes, grad on), so a model's ops run once, not twice; None for a program it cannot describe alone
    (:func:`_describe`'s ``one_run``), another needing tangents or an error: :func:`analyze` and a trace decide."""
    grad_inputs = [i for i, a in enumerate(fake_args) if isinstance(a, torch.Tensor) and _is_differentiable(a)]
    one_run = info is None
    with fake_mode:
        tangents = [] if info is None else [torch.empty(shape, dtype=dtype, device=device) for (shape, dtype, device),
                                            rg in zip(info.fw_out_meta, info.fw_out_requires_grad) if rg]
    grad_is_none: list = []

    def joint(primals, tangents):
        nonlocal info
        with torch.enable_grad():
            with FunctionalTensorMode():
                f_primals = [_to_functional(a) for a in primals]
                fns = [getattr(a, "grad_fn", None) for a in f_primals]
                if one_run:
                    with torch.set_grad_enabled(grad), OverlapGuard(inputs=f_primals):
                        outs = _call(_located(fn, True), f_primals, False)
                    info = _describe(fn, fake_args, f_primals, f_primals, outs, grad, False, fake_mode, fns, True)
                    if info is None or any(info.fw_out_requires_grad) and (not grad or is_symbolic(primals)):
                        raise ValueError("not one run")  # caught below
                    vals, tangents = _selected(f_primals, outs, info), _tangent_inputs(info)
                else:
                    # a mutated (or restrided) input that requires grad is cloned first, so that its gradient is
                    # taken w.r.t. its value (and layout) before the mutation
                    clone = {i for i in info.mutated_inputs + info.restrided_inputs if info.inputs[i].requires_grad}
                    args = [a.clone() if i in clone else a for i, a in enumerate(f_primals)]
                    with torch.set_grad_enabled(grad):
                        vals = _forward_values(fn, args, info, label_autograd=True)
                f_tangents = [_to_functional(t) for t in tangents]
                if any(f_primals[i].grad_fn is not fns[i] for i in grad_inputs):
                    # an in-place op the analysis missed rebased an input's history: its gradient would be the
                    # restrided tensor's, without what was read before (a no-op squeeze_: s319 #989)
                    raise RunEagerly("the program changed an input's autograd history in place unseen")
                diff = [v for v, rg in zip(vals, info.fw_out_requires_grad) if rg]
                wrt = [f_primals[i] for i in grad_inputs]
                _locate_backward(diff)
                if not diff:
                    grads = [None] * len(wrt)
                else:  # (the backward's writes through views too: relu_ of b.expand(-1), s1016 #102)
                    with _rewrites(info.drop_error_checks):
                        grads = torch.autograd.grad(diff, wrt, f_tangents, allow_unused=True)
                fx_traceback.set_stack_trace([])
            grad_is_none[:] = [g is None for g in grads]
            return [_from_functional(v) for v in vals], [_from_functional(g) for g in grads if g is not None]
    try:  # (oneDNN only for the backward's sake)
        with _without_mkldnn() if grad or not one_run else contextlib.nullcontext():
            gm = _make_fx(joint, [list(fake_args), tangents], decompositions, fake_mode)
    except Exception as e:  # noqa: BLE001 - an error check only in the backward (see _DropErrorChecks), or one run
        if one_run:
            return None
        if not isinstance(e, AssertionError) or "token for effect" not in str(e) or info.drop_error_checks:
            raise
        info.drop_error_checks = True
        with _without_mkldnn():
            gm = _make_fx(joint, [list(fake_args), tangents], decompositions, fake_mode)
    return _flatten_signature(gm), JointInfo(len(fake_args), info.num_fw_outputs, grad_inputs, list(grad_is_none),
                                             info if one_run else None,
                                             tuple(i for i in grad_inputs if not fake_args[i].is_leaf))


def _tangent_inputs(info: ProgramInfo) -> list:
    """Fake tangents for ``info``'s values that require grad, made the traced graph's inputs after the primals."""
    tracer = get_proxy_mode().tracer
    with disable_functional_mode(), disable_proxy_modes_tracing():  # (before the first op: one made each value)
        fakes = [torch.empty(shape, dtype=dtype, device=device)
                 for (shape, dtype, device), rg in zip(info.fw_out_meta, info.fw_out_requires_grad) if rg]
        with tracer.graph.inserting_before(next((n for n in tracer.graph.nodes if n.op != "placeholder"), None)):
            for k, t in enumerate(fakes):
                track_tensor_tree(t, tracer.create_proxy("placeholder", f"tangents_{k + 1}", (), {}), constant=None,
                                  tracer=tracer)
    return fakes

