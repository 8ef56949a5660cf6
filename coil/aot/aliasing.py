"""Graph inputs that share memory, when the program writes to one of them.

Functionalization treats every input as its own storage, so the inputs of one storage (a *group*: ``f(a, a[0])``, an
expanded input) are replaced by one **synthetic base**, a 1-D tensor spanning the memory they cover, and the program is
traced as ``with_bases(*other_inputs, *bases)``, which rebuilds each member as an ``as_strided`` view of its base.
:class:`OverlapGuard` raises :class:`RunEagerly` for a write functionalization would get wrong, and a call whose inputs
are grouped differently runs eagerly (``aot_input_groups_eager``). docs/aot.md, "Inputs sharing memory"."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, guard_or_false
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from coil import trace
from coil.exc import CoilError

OVERLAP_MESSAGE = ("unsupported operation: more than one element of the written-to tensor refers to a single memory "
                   "location. Please clone() the tensor before performing the operation.")
SYMBOLIC_OVERLAP_MESSAGE = ("the program writes to an input whose elements overlap (an expanded input) and has "
                            "symbolic sizes: synthetic bases need static layouts, so the program runs eagerly")
OUTSIDE_MESSAGE = ("the program writes (through as_strided) to memory of an input's storage that is not one of the "
                   "input's elements: coil's graphs see only those, so the program runs eagerly")
OUTSIDE_READ_MESSAGE = ("the program reads (through as_strided) memory of a tensor it has written to that is not one "
                        "of the tensor's elements: coil's graphs hold only those, so the program runs eagerly")
OFFSET_WRITE_MESSAGE = ("the program writes through an as_strided view of a tensor that does not start "
                        "at its storage's start (as_strided's offset is absolute; functionalization "
                        "writes it back from 0), so the program runs eagerly")
OUTSIDE_GRAD_MESSAGE = ("the program reads through as_strided of a view that requires grad memory that is not one of "
                        "the view's elements (eager's gradient does not reach them; coil's view of the whole storage "
                        "would send it there), so the program runs eagerly")
RESTRIDE_MESSAGE = ("the program restrides an input (as_strided_) past its last element, or one that does not start at "
                    "its storage's start, which functionalization does not model, so the program runs eagerly")
RESTRIDE_VIEWED_MESSAGE = ("the program restrides in place (squeeze_, t_, as_strided_...) a tensor that requires "
                           "grad after taking views of it, whose autograd views torch cannot rebuild under "
                           "functionalization, so the program runs eagerly")


class RunEagerly(CoilError):
    """Raised while a program is analysed when its graphs cannot mean what eager does (the
    ``*_MESSAGE`` reasons, :func:`_eager_refuses`): ``aot_compile`` then runs it eagerly,
    every call (``aot_overlapping_write_eager``), raising eager's errors after its effects."""


def _overlaps(t: torch.Tensor) -> bool:
    """Whether elements of ``t`` share memory: it has elements and a dim of size > 1 with stride 0 (when ATen's
    ``has_internal_overlap`` says yes). Decided from the sizes and strides alone: ATen first asks whether ``t`` is
    dense, which with symbolic sizes is sympy work (8 ms a view of LLaMA's activations at a symbolic length)."""
    shape = t.shape
    return not any(guard_or_false(n == 0) for n in shape) and any(
        guard_or_false(st == 0) and guard_or_false(n > 1) for n, st in zip(shape, t.stride()))


def _partial_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """ATen's partial overlap of written ``a`` and operand ``b`` (``at::get_overlap_status``), for which an in-place op
    raises: both dense, in one storage, their byte ranges intersecting but not the same range with the same strides
    (``x[1:].add_(x[:-1])``, ``x.add_(x.t())``; s210 #3393). Symbolic layouts (``x.copy_(x.t())`` under dynamic shapes)
    are decided through the ShapeEnv, each comparison a guard; an unbacked size leaves it undecided (False)."""
    if a is b or not isinstance(b, torch.Tensor) or \
            StorageWeakRef(a.untyped_storage()) != StorageWeakRef(b.untyped_storage()):
        return False
    try:
        if guard_or_false(a.numel() == 0) or guard_or_false(b.numel() == 0) or not (_dense(a) and _dense(b)):
            return False
        (sa, ea), (sb, eb) = ((t.storage_offset() * t.itemsize, (t.storage_offset() + t.numel()) * t.itemsize)
                              for t in (a, b))
        if bool(sa == sb) and bool(ea == eb) and a.dim() == b.dim() and \
                all(bool(x == y) for x, y in zip(a.stride(), b.stride())):
            return False
        return bool(sa < eb) and bool(sb < ea)
    except GuardOnDataDependentSymNode:
        return False


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t`` is non-overlapping and dense: its strides, ordered (by their hints when symbolic), are a
    contiguous layout's, each compared (a guard when symbolic) with the product of the sizes inside it.
    False where a hint is missing (unbacked)."""
    dims = []
    for n, st in zip(t.shape, t.stride()):
        if guard_or_false(n == 1):
            continue
        if (h := st if isinstance(st, int) else st.node.hint) is None:
            return False
        dims.append((h, st, n))
    expect = 1
    for _, st, n in sorted(dims, key=lambda d: d[0]):
        if not bool(st == expect):
            return False
        expect = expect * n
    return True


def _static(*vals) -> bool:
    return all(isinstance(v, int) for v in pytree.tree_leaves(vals))


@dataclasses.dataclass
class _Group:
    """Inputs ``members`` of one storage: each ``(input index, size, stride, offset)``, the offset absolute in the
    storage; the base covers storage elements ``[0, span)``. It starts at the storage's start, so that the
    ``as_strided`` offsets in the graph (absolute, in ATen) mean the same at run time and inside compilers (whose
    buffers start at offset 0; ``as_strided_scatter`` keeps its input's offset, which fake tensors do not always say);
    the cost is copying back the elements before the first member, unchanged."""

    members: list
    span: int
    dtype: torch.dtype


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) storage elements ``t`` covers (empty: (offset, offset))."""
    lo = t.storage_offset()
    return (lo, lo) if t.numel() == 0 else (lo, lo + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1)


class InputGroups:
    """The synthetic bases of one compiled program (see module docstring)."""

    def __init__(self, groups: list, n_inputs: int):
        self.groups = groups
        grouped = {m[0] for g in groups for m in g.members}
        #: original input positions passed through as they are, in order
        self.kept = [i for i in range(n_inputs) if i not in grouped]
        self.n_inputs = n_inputs
        #: input -> (size, stride, storage offset) it ends with, for a member the program
        #: restrides in place (``as_strided_``, ``t_``): applied to the caller's tensor
        self.restrides: dict = {}
        #: output leaf -> member input the program returns itself (``a.add_(b)`` returns ``a``): the
        #: caller's tensor is returned, as eager's is
        self.returned: dict = {}

    # -- compile time ---------------------------------------------------------------
    def fake_args(self, fake_args: list, fake_mode) -> list:
        """The traced program's inputs: the kept ones, then one fake base per group."""
        out = [fake_args[i] for i in self.kept]
        with fake_mode:
            for g in self.groups:
                full = torch.empty(g.span, dtype=g.dtype, device=fake_args[g.members[0][0]].device)
                if any(rg := [fake_args[m[0]].requires_grad for m in g.members]):
                    full.requires_grad_(True)
                    if not all(fake_args[m[0]].is_leaf for m, r in zip(g.members, rg) if r):
                        full = full.clone()  # written by the program: not a leaf, as in eager
                out.append(full)
        return out

    def wrap(self, fn: Callable) -> Callable:
        """``fn`` over the kept inputs and the bases (rebuilds the members)."""
        groups, kept, n = self.groups, self.kept, self.n_inputs

        def with_bases(*args):
            full: list = [None] * n
            for i, a in zip(kept, args):
                full[i] = a
            for g, base in zip(groups, args[len(kept):]):
                for i, size, stride, off in g.members:
                    full[i] = torch.as_strided(base, size, stride, off)
            out = fn(*full)
            members = {id(full[m[0]]): m[0] for g in groups for m in g.members}
            self.returned = {k: members[id(o)] for k, o in enumerate(pytree.tree_leaves(out)) if id(o) in members}
            for g in groups:
                for m in g.members:
                    t = full[m[0]]
                    if (lay := (tuple(t.shape), t.stride(), t.storage_offset())) != m[1:]:
                        self.restrides[m[0]] = lay
            return out
        return with_bases

    # -- run time -------------------------------------------------------------------
    def call_args(self, args) -> Optional[list]:
        """This call's arguments for the traced program, or None when its inputs do not
        share memory the way the compiled ones did."""
        out = [args[i] for i in self.kept]
        for g in self.groups:
            ts = [args[m[0]] for m in g.members]
            if not all(isinstance(t, torch.Tensor) for t in ts):
                return None
            ptr = ts[0].untyped_storage().data_ptr()
            for t, (_, size, stride, off) in zip(ts, g.members):
                if (t.untyped_storage().data_ptr() != ptr or t.dtype != g.dtype or tuple(t.shape) != size
                        or t.stride() != stride or t.storage_offset() != off):
                    return None
            if (src := _covering(ts, 0, g.span)) is None:
                return None
            out.append(torch.as_strided(src, (g.span,), (1,), 0))
        return out


def _covering(ts: list, lo: int, hi: int) -> Optional[torch.Tensor]:
    """The tensor to take a group's base from: a member, or the tensor the members are autograd views of, that covers
    storage elements [lo, hi), so that gradients of the base flow to all of it (``as_strided`` of ``x[0]``
    differentiates only into ``x[0]``). Without gradients, any member. None if gradients are needed and none covers."""
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in ts):
        return ts[0]
    for t in ts + [t._base for t in ts if t._base is not None]:
        first, end = _extent(t)
        if t.requires_grad and first <= lo and end >= hi:
            return t
    return None


def input_groups(fake_args: list, mutated: list) -> Optional[InputGroups]:
    """The groups to trace through synthetic bases: storages holding a mutated input together with another input, or a
    mutated input whose elements overlap. None when there are none, or when some group cannot have one (symbolic
    layouts, several dtypes on one storage): the caller then keeps inputs independent (and refuses or runs aliased calls
    eagerly)."""
    if not mutated:
        return None
    by_storage: dict = {}
    for i, a in enumerate(fake_args):
        if isinstance(a, torch.Tensor) and a.untyped_storage().nbytes() != 0:
            by_storage.setdefault(StorageWeakRef(a.untyped_storage()), []).append(i)
    groups = []
    for members in by_storage.values():
        if not any(i in mutated for i in members):
            continue
        ts = [fake_args[i] for i in members]
        if len(members) == 1:
            t, static = ts[0], _static(ts[0].shape, ts[0].stride())
            if not static and 0 in [st for st in t.stride() if isinstance(st, int)] and _overlaps(t):
                # an expanded input with symbolic sizes: no synthetic base (static
                # layouts only) and no single new value to copy back: run eagerly
                raise RunEagerly(SYMBOLIC_OVERLAP_MESSAGE)
            if not (static and _overlaps(t)):
                continue
        if not all(_static(t.shape, t.stride(), t.storage_offset()) for t in ts) or len({t.dtype for t in ts}) != 1:
            return None
        groups.append(_Group([(i, tuple(t.shape), tuple(t.stride()), t.storage_offset())
                              for i, t in zip(members, ts)], max(_extent(t)[1] for t in ts), ts[0].dtype))
    if not groups:
        return None
    trace.log("aot_input_groups", stage="aot",
              groups=[{"inputs": [m[0] for m in g.members], "span": g.span} for g in groups])
    return InputGroups(groups, len(fake_args))


class OverlapGuard(TorchDispatchMode):
    """While a program runs under functionalization (``analyze`` runs every program with it), :class:`RunEagerly` is
    raised for an in-place write to overlapping memory or, into an input's storage, outside the elements of every one of
    ``inputs`` (the program's arguments, before it runs), an ``as_strided_`` past the tensor's storage as
    functionalization sizes it, and an op that eager refuses for its scalar or index dtype."""

    def __init__(self, inputs=()):
        super().__init__()
        self.inputs: dict = {}  # storage -> [(byte addresses or None if dense, lo, hi)]
        for x in inputs:
            if isinstance(x, torch.Tensor) and _static(x.shape, x.stride(), x.storage_offset()):
                self.inputs.setdefault(StorageWeakRef(x.untyped_storage()), []).append(
                    (x.dtype.itemsize, *_addresses(x)))

    # higher-order operators (torch.cond...) pass through to the modes and keys below
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if func is torch.ops.aten.as_strided_.default and _restrides_beyond(*args, **kwargs):
            raise RunEagerly(RESTRIDE_MESSAGE)
        if func.overloadpacket is torch.ops.aten.set_:  # x.data = y under torch's capture: not functionalized
            raise RunEagerly(f"{func} swaps a tensor's storage")
        if refused := _eager_refuses(func, args, kwargs):
            raise RunEagerly(f"eager raises at {func} whatever the elements, the graph would not: {refused}")
        for k, name in _written_args(func):
            t = args[k] if k < len(args) else kwargs.get(name)
            if isinstance(t, torch.Tensor) and (_overlaps(t) or any(
                    _partial_overlap(t, o) for o in pytree.tree_leaves((args, kwargs)))):
                raise RunEagerly(OVERLAP_MESSAGE)
            if isinstance(t, torch.Tensor) and not self._covered(t):
                raise RunEagerly(OUTSIDE_MESSAGE)
        return func(*args, **kwargs)

    def _covered(self, t: torch.Tensor) -> bool:
        """Whether written ``t``'s elements are an input's (or no input holds its storage)."""
        held = self.inputs.get(StorageWeakRef(t.untyped_storage()))
        if not held or t.numel() == 0 or not _static(t.shape, t.stride(), t.storage_offset()):
            return True
        return any(inside(t, *x) for x in held)


def inside(t: torch.Tensor, itemsize: int, x_addrs, x_lo: int, x_hi: int) -> bool:
    """Whether ``t``'s elements are among those of a tensor whose element size and
    :func:`_addresses` are ``itemsize, x_addrs, x_lo, x_hi`` (static layouts)."""
    addrs, lo, hi = _addresses(t)
    return x_lo <= lo and hi <= x_hi and (x_addrs is None or (
        itemsize == t.dtype.itemsize and bool(np.isin(addrs, x_addrs).all())))


def _addresses(t: torch.Tensor) -> tuple:
    """(byte offsets of ``t``'s elements in its storage, or None when they fill [lo, hi) densely; lo; hi)."""
    lo, end = _extent(t)
    size = t.dtype.itemsize
    if end - lo == t.numel() or t.numel() == 0:
        return None, lo * size, end * size
    addrs = np.zeros((), dtype=np.int64)
    for n, st in zip(t.shape, t.stride()):
        addrs = np.add.outer(addrs, np.arange(n, dtype=np.int64) * st)
    return (addrs.ravel() + lo) * size, lo * size, end * size


def _restrides_beyond(t, size, stride, storage_offset=None) -> bool:
    """Whether ``t.as_strided_(...)`` ends past ``t``'s storage as functionalization sizes it, or ``t`` starts past its
    storage's start: a later ``as_strided`` of its functional value (starting at 0) would take the absolute offset from
    there (s217 #392: ``a[1:]`` restrided to offset 3, then written, read element 3 of a 3-element value)."""
    if t.storage_offset() != 0:    # (a symbolic offset: guarded, s302 #376)
        return True
    offset = t.storage_offset() if storage_offset is None else storage_offset
    if any(guard_or_false(n == 0) for n in size):
        return False
    end = offset + sum((n - 1) * st for n, st in zip(size, stride)) + 1
    # under symbolic sizes, undecidable is beyond: eager's values (s308 #1147)
    return not guard_or_false(end * t.dtype.itemsize <= t.untyped_storage().nbytes())


def _eager_refuses(func, args, kwargs) -> Optional[str]:
    """Eager's error for ``func`` where eager raises whatever the elements and the meta
    kernel (so the graph) does not, tried on real empty tensors; None where it runs:

    - "value cannot be converted ... without overflow", when a finite number exceeds a fp16/bf16/fp32 or integer
      argument's range (a graph loses the check: ``masked_fill`` becomes ``where`` of a saturating ``scalar_tensor``;
      ``add``, ``where`` accept such a scalar);
    - ``view`` to sizes the input's strides cannot give (FakeTensor's view accepted (6, 1, 3) with strides (1, 1, 6) as
      (1, 18));
    - an in-place op whose result type cannot be cast to its tensor's dtype (``bool.mul_(2)``: the decomposition casts);
    - ``sub``/``rsub`` with a bool operand (``x - True``; FakeTensor's sub accepts it);
    - an index of a dtype eager refuses (``index_put`` with float32 indices, ``index_fill`` with int32 ones, empty or
      not): the op raises with them and runs with int64 indices;
    - ``index_select`` of a 0-d tensor with more than one index."""
    if func is torch.ops.aten.index_select.default and args[0].dim() == 0 and \
            isinstance(args[2].numel(), int) and args[2].numel() > 1:  # (the meta returns a value)
        return f"index_select(): Index to scalar can have only 1 value, got {args[2].numel()} value(s)"
    if func is torch.ops.aten.view.default and _static(args[0].shape, args[0].stride(), args[1]):
        try:  # FakeTensor's view accepts layouts eager's refuses (s95 #2671); meta's does not
            with torch.utils._python_dispatch._disable_current_modes():
                torch.empty_strided(args[0].shape, args[0].stride(), device="meta").view(args[1])
        except RuntimeError as e:
            return str(e)
    if func._schema.is_mutable and args and isinstance(args[0], torch.Tensor) and any(
            isinstance(o, (bool, int, float, torch.Tensor)) and not isinstance(o, torch.SymInt)
            and not torch.can_cast(torch.result_type(args[0], o), args[0].dtype) for o in args[1:2]):
        if error := _error_on_empty(func, args, kwargs):  # bool.mul_(2): eager's cast (s97 #202)
            return error
    leaves = pytree.tree_leaves((args, kwargs))
    if func._schema.name in _SUB_OPS and any(
            x is True or x is False or getattr(x, "dtype", None) is torch.bool for x in leaves):
        return _error_on_empty(func, args, kwargs)  # float - True: eager's bool check (s99 #2532)
    dtypes = [x.dtype for x in leaves if isinstance(x, torch.Tensor)] + \
        [x for x in leaves if isinstance(x, torch.dtype)]
    ranges = [torch.finfo(d) for d in dtypes if d in _NARROW_FLOATS] + [
        torch.iinfo(d) for d in dtypes if not (d.is_floating_point or d.is_complex or d is torch.bool)]
    if any(type(x) in (int, float) and math.isfinite(x) and not r.min <= x <= r.max for x in leaves for r in ranges):
        error = _error_on_empty(func, args, kwargs)  # (int8 add(x, y, alpha=300), threshold: trial 62)
        return error if error and "without overflow" in error else None
    if ranges and (error := _symbolic_scalar_overflows(func, args, kwargs, dtypes)):
        return error
    names = [a.name for a in func._schema.arguments]
    index = {n for k, n in enumerate(names) if n in ("index", "indices") and any(
        isinstance(t, torch.Tensor) and t.dtype != torch.int64
        for t in pytree.tree_leaves(args[k:k + 1] or kwargs.get(n)))}
    if not index:
        return None
    error = _error_on_empty(func, args, kwargs)
    as_long = {k for k, n in enumerate(names) if n in index} | index
    return error if error and _error_on_empty(func, args, kwargs, as_long) is None else None


def _symbolic_scalar_overflows(func, args, kwargs, dtypes) -> Optional[str]:
    """Eager's overflow error where a symbolic number at a ``Scalar`` argument does not fit the type the op converts
    it to (``clamp(h, max=s)`` of a float16 ``h`` and ``s`` 70000.0; int8 ``add(x, y, alpha=s)``), else None. Which
    type that is, if any, is eager's choice (clamp converts to the tensor's dtype, leaky_relu to float32): a probe on
    empty tensors (the other symbolic numbers at their values now) with the number just past each narrow range tells.
    The range found is guarded (a value crossing it recompiles); a symbolic value is finite and not NaN (capture
    guards that), as eager's check (c10's ``overflows``) then asks."""
    sym = (torch.SymInt, torch.SymFloat, torch.SymBool)
    at = {k: a.name for k, a in enumerate(func._schema.arguments) if str(a.type) in ("number", "Optional[number]")
          and isinstance(args[k] if k < len(args) else kwargs.get(a.name), sym)}
    leaves = pytree.tree_leaves((args, kwargs))
    if not at or any(isinstance(x, sym) and not x.node.has_hint() for x in leaves):
        return None
    hinted = pytree.tree_map_only(sym, lambda x: x.node.pytype(x.node.hint), (list(args), dict(kwargs)))
    ranges = sorted({(-(m := torch.finfo(d).max), m) for d in set(dtypes) & set(_NARROW_FLOATS) | {torch.float32}} | {
        r for d in dtypes if d in _NARROW_INTS for i in [torch.iinfo(d)] for r in ((i.min, i.max), (-i.max, -i.min))
    }, key=lambda r: r[1])      # (``sub`` checks that ``-alpha`` fits)
    for k, name in at.items():
        v = args[k] if k < len(args) else kwargs[name]
        for lo, m in ranges:
            if isinstance(v, torch.SymInt) and m >= 2 ** 63:
                break   # (an int64 fits bfloat16's and float32's range)
            p_args, p_kwargs = list(hinted[0]), dict(hinted[1])
            past = math.nextafter(m, math.inf) if isinstance(v, torch.SymFloat) else int(m) + 1
            if k < len(args):
                p_args[k] = past
            else:
                p_kwargs[name] = past
            try:
                error = _error_on_empty(func, p_args, p_kwargs)
            except Exception:  # noqa: BLE001 - a probe the op refuses otherwise (a TypeError): no check learnt
                error = None
            if error and "without overflow" in error:
                fits = bool(v <= m) and bool(v >= lo)     # (guards)
                trace.log("scalar_range_guard", stage="aot", op=str(func), arg=name, bound=m, fits=fits,
                          reason="eager checks that the number fits the type the op converts it to")
                if not fits:
                    return error
                break
    return None


def _error_on_empty(func, args, kwargs, as_long=frozenset()) -> Optional[str]:
    """What eager's ``func`` raises (its message) on real empty tensors of the arguments' dtypes (int64 for the
    arguments whose position or name is in ``as_long``), ranks and devices; None if it runs."""
    def empty(dtype):
        return lambda x: torch.empty((0,) * x.dim(), dtype=dtype or x.dtype, device=x.device)

    def replace(k, v):
        return pytree.tree_map_only(torch.Tensor, empty(torch.int64 if k in as_long else None), v)
    with torch.utils._python_dispatch._disable_current_modes():
        try:
            func(*[replace(k, a) for k, a in enumerate(args)], **{n: replace(n, v) for n, v in kwargs.items()})
        except (RuntimeError, IndexError) as e:
            return f"{type(e).__name__}: {e}"
    return None


_NARROW_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_NARROW_INTS = (torch.int8, torch.uint8, torch.int16, torch.int32)
_SUB_OPS = ("aten::sub", "aten::sub_", "aten::rsub")
_WRITTEN: dict = {}


def _written_args(func) -> tuple:
    """(position, name) of the arguments ``func`` writes data into (none for ops that only
    change metadata in place, such as ``t_``); cached per op."""
    if (hit := _WRITTEN.get(func)) is None:
        hit = ()
        if func._schema.is_mutable and torch.Tag.inplace_view not in func.tags:
            hit = tuple((k, a.name) for k, a in enumerate(func._schema.arguments)
                        if a.alias_info is not None and a.alias_info.is_write)
        _WRITTEN[func] = hit
    return hit
