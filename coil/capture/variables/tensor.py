"""Tensor trackers: every operation on a tensor becomes an FX node.

A :class:`TensorVariable` holds an ``fx.Node`` and the FakeTensor that running the node on fake inputs
produced. :func:`call_op` is the single place where a torch call enters the graph: it maps trackers to
node arguments and fake values, runs the op under the output graph's ``FakeTensorMode`` (the Python
dispatcher with symbolic sizes) and wraps what comes back (:func:`wrap_result`): tensors, containers of
``getitem`` nodes, symbolic numbers, or constants (whose node is removed again). Data-dependent results
are graph breaks unless ``capture_scalar_outputs`` / ``capture_dynamic_output_shape_ops`` record them;
ops that make a new autograd leaf, and ``retain_grad()``, are too (:func:`_autograd_state_change`)."""
from __future__ import annotations

import contextlib
import functools
import logging
import operator
import types

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeTensor)
from torch._dispatch.python import enable_python_dispatcher
from torch._library.custom_ops import OPDEFS

from coil import trace
from coil.exc import Unsupported
from coil.capture.meta_checks import cast_to_eager_dtype, check_call
from coil.capture.source import AttrSource
from coil.capture.substitutes import substitute
from coil.capture.variables.base import (ConstantVariable, NumpyArrayVariable, VariableTracker, instance_dict_attr,
                                         wrap_constant_result)
from coil.capture.variables.containers import (DictVariable, ListVariable, NamedTupleVariable, SliceVariable,
                                               TupleVariable)
from coil.capture.variables.symbolic import SymNodeVariable, tensor_meta, wrap_sym
from coil.capture.variables.functions import BoundMethodVariable


class UserCodeError(Unsupported):
    """User code raises here (eager would raise too). A graph break at that point:
    everything before it runs (with its side effects) and the instruction itself runs
    in plain Python, raising the real error with its own type and message."""

    def __init__(self, message: str):
        super().__init__(f"user code raises {message}")


def _map(v, fn):
    """Map trackers inside ``v`` (trackers, lists, tuples, dicts) with ``fn``."""
    if isinstance(v, VariableTracker):
        return fn(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_map(x, fn) for x in v)
    return {k: _map(x, fn) for k, x in v.items()} if isinstance(v, dict) else v


def to_node_arg(v: VariableTracker):
    if isinstance(v, TensorVariable):
        return v.node
    if isinstance(v, SymNodeVariable):
        return v.as_node()
    if isinstance(v, ListVariable):
        return [to_node_arg(i) for i in v.items]
    if isinstance(v, TupleVariable) and not isinstance(v, NamedTupleVariable):
        return tuple(to_node_arg(i) for i in v.items)
    if isinstance(v, SliceVariable):
        return slice(*[to_node_arg(p) for p in v.parts])
    if isinstance(v, DictVariable):
        return {k: to_node_arg(x) for k, x in v.items.items()}
    from coil.capture.variables.objects import NNModuleVariable
    if isinstance(v, NNModuleVariable):
        raise Unsupported("passing an nn.Module to a torch function")
    if isinstance(v, NumpyArrayVariable):
        raise Unsupported("a numpy array handed to torch", hint="the call runs eagerly")
    if isinstance(c := v.as_python_constant(), (types.FunctionType, types.MethodType, functools.partial)):
        # a graph node cannot hold a Python function (torch.func.grad(f)(x) reaches
        # torch._functorch's grad_impl(f, ...)): the call runs outside the graph
        raise Unsupported(f"a torch function given the Python function {getattr(c, '__qualname__', c)}")
    if isinstance(c, type) and c in _PY_DTYPES:   # x.to(float), torch.tensor(0, dtype=int): a class has no source in the graph's code
        return _PY_DTYPES[c]
    if type(c).__module__ == "numpy" and getattr(c, "ndim", 1) == 0:
        return c.item()     # a numpy scalar (np.sqrt(d)): torch reads it as the Python number; FX cannot print it
    return tuple(c) if isinstance(c, torch.Size) else c


_PY_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool, complex: torch.complex128}


def to_fake(v: VariableTracker):
    if isinstance(v, (TensorVariable)):
        return v.fake
    if isinstance(v, SymNodeVariable):
        return v.value
    if isinstance(v, (TupleVariable, ListVariable)) and not isinstance(v, NamedTupleVariable):
        return (list if isinstance(v, ListVariable) else tuple)(to_fake(i) for i in v.items)
    if isinstance(v, SliceVariable):
        return slice(*[to_fake(p) for p in v.parts])
    return {k: to_fake(x) for k, x in v.items.items()} if isinstance(v, DictVariable) else v.as_python_constant()


def contains_tensor(v) -> bool:
    if isinstance(v, TensorVariable):
        return True
    if isinstance(v, (TupleVariable, ListVariable, DictVariable, SliceVariable)):
        v = v.parts if isinstance(v, SliceVariable) else v.items
    if isinstance(v, dict):
        v = list(v.values())
    return isinstance(v, (list, tuple)) and any(contains_tensor(x) for x in v)


class _QuietMetaFailures(logging.Filter):
    """Drops FakeTensorMode's ERROR-level traceback for an op that fails on fake tensors
    (e.g. a shape mismatch): capture turns the error into a graph break and eager
    raises the user's own error, so the 40-line log before it is noise."""

    active = 0

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.active and str(record.msg).startswith("failed while attempting"))


_quiet = _QuietMetaFailures()
logging.getLogger("torch._subclasses.fake_tensor").addFilter(_quiet)


@contextlib.contextmanager
def _quiet_meta_failures():
    _quiet.active += 1
    try:
        yield
    finally:
        _quiet.active -= 1


def _requires_grad_flag(v: VariableTracker):
    """The Python bool a ``requires_grad`` argument holds, or None if it is not a constant."""
    try:
        return bool(v.as_python_constant())
    except Unsupported:  # a tensor: not known at compile time
        return None


def _autograd_state_change(kind: str, target, args: list, kwargs: dict) -> bool:
    """Graph breaks for ops that change which tensors autograd tracks.

    AOT turns a whole graph into one autograd node of its *inputs*: a tensor made to require grad inside the graph
    (``t.requires_grad_()``, ``torch.zeros(3, requires_grad=True)``) would come out as an output of that node, not a
    leaf, and nothing computed from it would reach it in backward (silently missing grads); ``retain_grad()`` on a fake
    tensor retains nothing. So these ops raise Unsupported, a graph break: the op runs eagerly and the rest of the frame
    is captured with the tensor as an input (what torch.compile does).

    Returns True for ``requires_grad_(b)`` on a tensor whose ``requires_grad`` is
    already ``b``: eager returns the tensor and changes nothing, so no node is needed."""
    name = _name(target)
    if kind == "call_method" and name == "requires_grad_":
        flag = args[1] if len(args) > 1 else kwargs.get("requires_grad")
        want = True if flag is None else _requires_grad_flag(flag)
        t = args[0]
        if want is not None and isinstance(t, TensorVariable) and t.fake.requires_grad == want:
            return True
        what = "makes an autograd leaf" if want else "changes whether a tensor requires grad"
        raise Unsupported(f"Tensor.requires_grad_({'' if want else want}) {what} inside the frame", hint=_LEAF_HINT)
    if kind == "call_method" and name == "retain_grad":
        raise Unsupported("Tensor.retain_grad() inside the frame",
                          hint="it runs outside the graph, so backward fills .grad")
    if "requires_grad" in kwargs and _requires_grad_flag(kwargs["requires_grad"]) is not False:
        raise Unsupported(f"{name}(..., requires_grad=True) makes an autograd leaf inside the frame", hint=_LEAF_HINT)
    return False


_LEAF_HINT = ("it runs outside the graph; the rest of the frame is captured with the tensor "
              "as an input, so backward reaches it")


def call_op(tx, kind: str, target, args: list, kwargs: dict) -> VariableTracker:
    """Add ``target(*args, **kwargs)`` to the graph and run it on fake tensors."""
    out = tx.output
    if _autograd_state_change(kind, target, args, kwargs):
        return args[0]  # requires_grad_ that changes nothing
    if _name(target) in ("resize_", "resize_as_", "set_"):  # nor can AOT's epilogue re-point an input (set_)
        raise Unsupported(f"{_name(target)} changes a tensor's storage: it runs outside the graph",
                          hint="allocate a tensor of the new size (torch.empty) instead")
    if kind == "call_function":
        target = substitute(target)  # checked equivalents (F.one_hot)
    if _name(target) in ("pow", "__pow__", "__rpow__", "pow_", "__ipow__") and torch.is_grad_enabled() and any(
            isinstance(a, TensorVariable) and a.fake.requires_grad for a in args):
        # a symbolic base / exponent of a tensor that needs grad as a 0-d tensor (the result dtype is the tensor's; at
        # least fp32, as eager's scalar): ATen's pow backward formulas read a scalar as a double, which a SymInt cannot
        # give (c10::Scalar: "NYI SymInt"; AOT failed) and a SymFloat only by pinning it (a compile per size)
        t = next(a.fake for a in args if isinstance(a, TensorVariable))    # (0-d: the 0-d scalar tensor would promote)
        dt = ConstantVariable(t.dtype if t.dim() == 0 else torch.promote_types(t.dtype, torch.float32))
        args = [call_op(tx, "call_function", torch.full, [ConstantVariable(()), a], {"dtype": dt})
                if isinstance(a, SymNodeVariable) else a for a in args]
    custom = torch.is_grad_enabled() and _is_custom_op(target)     # (its autograd formula is checked below)
    opdef = OPDEFS.get(getattr(target, "_name", None) or getattr(target, "_qualified_op_name", None)) if custom else None
    if getattr(opdef, "_backward_fn", None):   # its Python autograd formula (grad mode on)
        from coil.capture.variables.objects import probe_autograd

        def forward(ctx):
            with torch.no_grad():      # (no autograd: nothing runs the formula)
                return call_op(tx, kind, target, args, kwargs)
        inputs = list(args) + list(kwargs.values())
        try:
            probe_autograd(tx, _name(target), inputs, forward, opdef._setup_context_fn, opdef._backward_fn)
        except Unsupported as e:     # backward alone: it runs eagerly inside the compiled backward instead
            from coil.capture.opaque_autograd import opaque_call
            probe_autograd(tx, _name(target), inputs, forward, opdef._setup_context_fn, None)   # (or raise)
            if (call := opaque_call(target, opdef, args, kwargs)) is None:
                raise
            trace.log("opaque_op", stage="capture", op=_name(target), reason=f"eager autograd formula: {e.reason}")
            return call_op(tx, "call_function", call[0], call[1], {})
    node_args = tuple(_map(a, to_node_arg) for a in args)
    node_kwargs = {k: _map(v, to_node_arg) for k, v in kwargs.items()}
    fake_args = [_map(a, to_fake) for a in args]
    fake_kwargs = {k: _map(v, to_fake) for k, v in kwargs.items()}
    if out.index_copies and _is_inplace(kind, target, kwargs):
        raise index_copy_break(out.index_copies[0], f"in-place {_name(target)} after indexing with a 0-d integer "
                               "tensor (a view in eager, a copy in the graph)")
    node = out.graph.create_node(kind, target, node_args, node_kwargs)
    tx.locate_node(node)
    guards_before = len(out.shape_env.guards)
    outs = [t for t in pytree.tree_leaves(fake_kwargs["out"]) if isinstance(t, torch.Tensor)] \
        if "out" in fake_kwargs else []
    shapes = [t.shape for t in outs]
    try:
        with out.fake_mode, _quiet_meta_failures(), _symbolic_dispatch(out):
            eager_dtype = check_call(kind, target, fake_args, fake_kwargs)  # eager refuses, meta not
            if kind == "call_method":
                result = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
            else:
                result = target(*fake_args, **fake_kwargs)
            if any(t.shape != n and (t._is_view() or 0 not in n or not _dense(fake_args))
                   for t, n in zip(outs, shapes)):
                # eager resizes the view itself, past its slice of the storage: functionalized, only the slice was
                # written back (``torch.mul(x, 2, out=o[:2])``, 4 values). An empty tensor grows in the AOT epilogue
                # (``resize_``: contiguous, as eager's is from contiguous operands; from a channels-last one eager's is
                # channels-last, the meta kernel's contiguous)
                raise Unsupported(f"{_name(target)}(out=...) resizes a view or a non-empty tensor, or "
                                  "gives an empty one non-contiguous strides",
                                  hint="pass an out= tensor of the result's shape")
            if isinstance(result, torch.Tensor) and eager_dtype not in (None, result.dtype):
                node, result = cast_to_eager_dtype(out.graph, node, result, eager_dtype)
                tx.locate_node(node)
            if custom and opdef is None:
                _run_backward_on_fakes(_name(target), [fake_args, fake_kwargs], result)
    except (DataDependentOutputException, DynamicOutputShapeException) as e:
        out.graph.erase_node(node)
        raise Unsupported(f"data-dependent operation {_name(target)} ({type(e).__name__})",
                          hint="the value depends on tensor data; it runs outside the graph")
    except Unsupported:
        out.graph.erase_node(node)
        raise
    except NotImplementedError as e:
        out.graph.erase_node(node)
        raise Unsupported(f"{_name(target)} cannot run on fake tensors: {e}")
    except Exception as e:  # noqa: BLE001 - eager would raise the same
        out.graph.erase_node(node)
        if "data-dependent" in str(e) or "DataDependent" in type(e).__name__:
            raise Unsupported(f"data-dependent operation {_name(target)}")
        raise UserCodeError(f"{type(e).__name__}: {e}") from e
    if len(out.shape_env.guards) > guards_before:
        out.sites.note(out.shape_env, guards_before, out.where(), reason=_name(target))
    if out.inference_depth or out.inference_made:
        _track_inference(out, kind, target, [fake_args, fake_kwargs], result, kwargs)
    return wrap_result(tx, node, result)


def _track_inference(out, kind, target, fake_args, result, kwargs) -> None:
    """Eager's inference tensors: a tensor an op makes inside ``torch.inference_mode()`` (not a view of a normal
    tensor) and any view of one is one, kept in ``out.inference_made``. Outside the block eager refuses one in
    an in-place op or in autograd-recorded math (grad on, an input requiring grad): the frame runs eagerly there."""
    made = out.inference_made
    ins = [t for t in pytree.tree_leaves(fake_args) if isinstance(t, torch.Tensor)]
    args, f_kwargs = fake_args
    written = pytree.tree_leaves(f_kwargs["out"] if "out" in f_kwargs else args[0] if args and not isinstance(
        target, torch._ops.OpOverload) else fake_args)    # (eager writes a normal tensor from an inference one)
    if not out.inference_depth and any(id(t) in made for t in ins) and (
            (_is_inplace(kind, target, kwargs) and any(made.get(id(t)) is t for t in written))
            or (torch.is_grad_enabled() and any(t.requires_grad for t in ins))):
        raise InferenceTensorUse(f"{_name(target)} of a tensor made in torch.inference_mode(), in place or with "
                                 "autograd recording (eager raises or records differently): the frame runs eagerly")
    detached = _name(target) in ("detach", "_get_data_attr") and any(id(t) in made for t in ins)
    for r in pytree.tree_leaves(result):
        if isinstance(r, torch.Tensor) and all(r is not t for t in ins) and (
                id(r._base) in made if r._is_view() else out.inference_depth or detached):
            made[id(r)] = (r,) if detached else r   # (eager writes a detached one in place: not ``is`` its fake)


class InferenceTensorUse(Exception):
    """An inference tensor used where eager refuses it or treats it unlike a no_grad tensor: the frame runs eagerly."""


def _dense(args) -> bool:
    """Whether every tensor among ``args`` is contiguous (asked only of an op resizing an out= tensor: the
    question guards on sizes, and a data-dependent size cannot answer it)."""
    return all(t.is_contiguous() for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor))


def _symbolic_dispatch(out):
    """With symbolic sizes, ops run under the Python dispatcher (as in torch's capture): composite kernels that need
    concrete ints (``F.pad``'s ``constant_pad_nd``) take their Python decompositions, which accept SymInts."""
    return enable_python_dispatcher() if out.shape_env.var_to_range else contextlib.nullcontext()


#: namespaces of torch's own operators; an OpOverload of any other one is a custom op
_BUILTIN_OP_NAMESPACES = ("aten", "prims", "quantized", "_c10d_functional", "c10d_functional", "higher_order")


def _is_custom_op(target) -> bool:
    """An OpOverload or OpOverloadPacket (whose namespace is in its qualified name) outside torch's own namespaces."""
    ns = getattr(target, "namespace", None) or getattr(target, "_qualified_op_name", "aten::").split("::")[0]
    return ns not in _BUILTIN_OP_NAMESPACES


def _run_backward_on_fakes(name: str, inputs, result) -> None:
    """A custom op's autograd formula registered outside ``torch.library.custom_op`` (``torch.library.define`` with
    ``register_autograd``, a C++ formula) run once on the fakes, as AOT's joint trace will: one that cannot (Python
    reading data, ``offs.tolist()``; a backward op without a fake kernel) raises Unsupported, a graph break, where
    the compile failed (BackendCompilerFailed)."""
    outs = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor) and t.requires_grad]
    ins = [t for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    try:
        if outs and ins:
            torch.autograd.grad(outs, ins, [torch.ones_like(t) for t in outs], allow_unused=True)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"the autograd formula of custom op {name} cannot run on fake tensors "
                          f"({type(e).__name__})", hint="it runs eagerly, with its own backward") from e


def _input_value(tx, v):
    """The real tensor behind graph input ``v`` (None for a tensor made in the frame)."""
    return None if v.source is None else next((value for _, value, node in tx.output.inputs if node is v.node), None)


def _user_attr(tx, v, name):
    """A Python attribute torch.Tensor lacks (``p._no_weight_decay``, a Parameter subclass's class attribute or
    method): looked up on the real tensor, its instance ``__dict__`` then its class (whose type is guarded). Guarded
    to stay where it was found: a value by its source, an absent name by ``name not in t.__dict__`` (added
    later, it recompiles). A tensor made in the frame has no instance attributes (setting one is a graph break,
    after which it is an input), unless it is an input returned by an in-place op: that input is looked up."""
    from coil.capture.variables.objects import wrap_class_attr
    src, real = v.source, _input_value(tx, v)
    if src is None:
        src, real = next(((s, r) for s, r, n in tx.output.inputs if n.meta.get("example_value") is v.fake),
                         (None, None))
    if real is None and src is not None:
        raise Unsupported(f"attribute {name} of a tensor that is not a graph input")
    cls = type(real) if real is not None else v.cls
    if real is not None and (found := instance_dict_attr(tx, real, src, name)) is not None:
        return found
    return wrap_class_attr(tx, v, cls, name, AttrSource(src, name) if src is not None else None)


def _is_set_to(tx, a, b) -> bool:
    """``a.is_set_to(b)``: one storage, offset, sizes and strides (the fakes' meta kernel says False). Storage identity
    is structural where the graph made a view; distinct inputs' aliasing is not guarded, so comparing them breaks."""
    key, ins = (lambda t: t.untyped_storage()._cdata), [n.meta["example_value"] for _, v, n in tx.output.inputs]
    ins = [key(t) for t in ins if isinstance(t, torch.Tensor)]
    if ins.count(key(a)) > 1 or (key(a) != key(b) and key(a) in ins and key(b) in ins):
        raise Unsupported("Tensor.is_set_to of tensors from two graph inputs (their aliasing is not guarded)")
    return key(a) == key(b) and (a.storage_offset(), a.shape, a.stride()) == (b.storage_offset(), b.shape, b.stride())


def _name(target) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _holds_tensor(v) -> bool:
    if isinstance(v, torch.Tensor):
        return True
    if type(v) is dict:  # torch.func.vmap(grad(f)) of a dict of parameters
        v = list(v.values())
    return isinstance(v, (tuple, list)) and any(_holds_tensor(x) for x in v)


def _wrap_sequence(out, node, result) -> VariableTracker:
    """Trackers for a tuple/list/structseq result of graph node ``node``: each tensor, at any depth
    (``histogramdd``'s ``bin_edges`` is a list inside a structseq), becomes a ``getitem`` node of its own; a
    fake tensor must never reach user code as a constant."""
    items = []
    for i, r in (result.items() if type(result) is dict else enumerate(result)):
        sym = isinstance(r, (torch.SymInt, torch.SymFloat, torch.SymBool))  # (an autograd.Function's k * 2)
        if not (sym or _holds_tensor(r)):
            items.append(ConstantVariable(r))
            continue
        sub = out.graph.create_node("call_function", operator.getitem, (node, i), {})
        sub.meta["example_value"] = r
        sub.meta.update({k: node.meta[k] for k in ("stack", "stack_trace") if k in node.meta})  # its source location
        items.append(TensorVariable(sub, r) if isinstance(r, torch.Tensor) else wrap_sym(out, r, ("node", sub)) if sym
                     else _wrap_sequence(out, sub, r))
    if type(result) is dict:
        return DictVariable(dict(zip(result, items)))
    if hasattr(type(result), "_fields") or hasattr(type(result), "n_fields"):
        return NamedTupleVariable(items, type(result))
    return ListVariable(items) if isinstance(result, list) else TupleVariable(items)


def wrap_result(tx, node, result) -> VariableTracker:
    out = tx.output
    if sparse := [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor) and t.layout is not torch.strided]:
        out.graph.erase_node(node)  # x.to_sparse(): the kernels read strided storage only
        raise Unsupported(f"{_name(node.target)} returns a {sparse[0].layout} tensor", "the call runs eagerly")
    if isinstance(result, torch.Tensor):
        if not isinstance(result, FakeTensor):
            out.graph.erase_node(node)  # a real tensor (e.g. returned from a constant) is lifted as a constant input
            return out.lift_constant_tensor(tx, result)
        node.meta["example_value"] = result
        return TensorVariable(node, result)
    if isinstance(result, (tuple, list, dict)) and _holds_tensor(result):
        node.meta["example_value"] = result
        return _wrap_sequence(out, node, result)
    if isinstance(result, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        node.meta["example_value"] = result
        return wrap_sym(out, result, ("node", node))
    if any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(result)):  # (OrderedDict, ...)
        out.graph.erase_node(node)
        raise Unsupported(f"{_name(node.target)} returned tensors inside a {type(result).__name__}",
                          hint="the call runs outside the graph")
    name = _name(node.target)
    side_effecting = (result is None or node.target is operator.setitem or name.endswith("_") or "out" in node.kwargs)
    if len(node.users) == 0 and not side_effecting:
        out.graph.erase_node(node)
    return wrap_constant_result(tx, result)


#: Tensor methods/attributes whose value is static metadata (read from the fake tensor).
_META_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "element_size", "stride",
                 "is_contiguous", "is_floating_point", "is_complex", "get_device",
                 "storage_offset", "is_inference", "is_signed", "has_names"}
_META_ATTRS = {"shape", "dtype", "device", "ndim", "requires_grad", "is_leaf", "layout",
               "is_cuda", "is_cpu", "is_sparse", "is_quantized", "is_meta", "is_mkldnn",
               "is_nested", "itemsize", "nbytes", "names", "is_mps", "is_xpu"}
_TENSOR_ATTRS = {"T", "mT", "H", "mH", "real", "imag"}
_BREAK_METHODS = {"item": "Tensor.item() reads tensor data", "tolist": "Tensor.tolist() reads tensor data",
                  "numpy": "Tensor.numpy() leaves torch", "__bool__": "bool() of a tensor depends on its data",
                  "data_ptr": "Tensor.data_ptr()", "backward": "Tensor.backward() inside the frame",
                  "register_hook": "Tensor.register_hook", "__array__": "numpy conversion",
                  "untyped_storage": "storage access", "storage": "storage access",
                  "__index__": "tensor used as a Python index", "__int__": "int() of a tensor",
                  "__float__": "float() of a tensor"}


def _is_int_scalar_tensor(v) -> bool:
    return isinstance(v, TensorVariable) and v.fake.dim() == 0 and not v.fake.dtype.is_floating_point and \
        not v.fake.dtype.is_complex and v.fake.dtype is not torch.bool


def _is_symint(v) -> bool:
    return isinstance(v, SymNodeVariable) and isinstance(v.value, torch.SymInt)


def _select_symints(tx, t: "TensorVariable", basic, picks) -> "TensorVariable":
    """``x[..., n, ...]`` with symbolic ints ``n``: the basic view, then ``select`` of each
    (innermost first, so positions hold). torch's C++ indexing pins a SymInt index to its
    value (``kcache[:, pos] = k`` compiled once per position); ``select`` keeps it symbolic."""
    view = call_op(tx, "call_function", operator.getitem, [t, basic], {})
    for p, n in reversed(picks):
        view = call_op(tx, "call_method", "select", [view, ConstantVariable(p), n], {})
    return view


def _split_scalar_tensor_index(t: "TensorVariable", idx):
    """``x[..., i, ...]`` with 0-d integer tensors ``i`` (and otherwise only ints, slices, ``None``, ``...``): the basic
    index with each such ``i`` replaced by ``:``, and the dims ``(position, i)`` of that view that ``i`` then picks.
    ``None`` when the index has no 0-d integer tensor or has anything else (lists, other tensors, bools)."""
    items = list(idx.items) if isinstance(idx, TupleVariable) and not isinstance(idx, NamedTupleVariable) else [idx]
    picked = [_is_int_scalar_tensor(v) for v in items]
    if not any(picked) and not any(map(_is_symint, items)) or any(picked) and any(map(_is_symint, items)):
        return None  # (symbolic ints with 0-d tensors: C++ indexing, pinned)
    consumed = 0
    for v in items:
        if _is_int_scalar_tensor(v) or _is_symint(v) or isinstance(v, SliceVariable) or (
                isinstance(v, ConstantVariable) and (isinstance(v.value, slice) or type(v.value) is int)):
            consumed += 1
        elif not (isinstance(v, ConstantVariable) and (v.value is None or v.value is Ellipsis)):
            return None
    r, basic, picks = 0, [], []
    for v in items:
        if _is_int_scalar_tensor(v) or _is_symint(v):
            basic.append(ConstantVariable(slice(None)))
            picks.append((r, v))
            r += 1
        else:
            basic.append(v)
            if isinstance(v, ConstantVariable) and v.value is Ellipsis:
                r += t.fake.dim() - consumed
            elif not (isinstance(v, ConstantVariable) and type(v.value) is int):
                r += 1
    return TupleVariable(basic), picks


def _index_list(view: "TensorVariable", picks) -> ListVariable:
    slots: list = [ConstantVariable(None)] * (max(p for p, _ in picks) + 1)
    for p, i in picks:
        slots[p] = i
    return ListVariable(slots)


def _index_with_scalar_tensors(tx, t: "TensorVariable", basic, picks) -> VariableTracker:
    """``x[i]`` with a 0-d integer tensor ``i``: the basic view, then ``aten.index`` with the tensors (no ``.item()``,
    no graph break). Eager returns a view here, the graph a copy: the output graph remembers it with the root frame's
    site, and an in-place op later in the frame (or a graph break with it, or a view of it, live) captures the frame
    again with a graph break at that site: the indexing runs eagerly, a real view, and the rest resumes captured."""
    view = call_op(tx, "call_function", operator.getitem, [t, basic], {})
    out = call_op(tx, "call_function", torch.ops.aten.index.Tensor, [view, _index_list(view, picks)], {})
    tx.output.index_copies.append((out.fake, *tx.root_site(), tx.parent is not None))
    return out


def index_copy_break(copy: tuple, reason: str) -> Unsupported:
    """The graph break at the root frame's instruction that made index copy ``copy`` (``(fake, offset, user stack,
    inlined)``). Made in an inlined call, the callee runs uncaptured from the call stub (``frame_inspection``): captured
    on its own frame, it would return the copy where eager returns a view."""
    e = Unsupported(reason, hint="the graph breaks at the indexing, which runs eagerly")
    e.root_offset, e.user_stack, e.frame_inspection = copy[1:]
    return e


_FLIPPED = {operator.lt: operator.gt, operator.le: operator.ge, operator.gt: operator.lt, operator.ge: operator.le}


def _rand_compared(node) -> Optional[bool]:
    """``torch.rand(...) < c`` (``rand_like``; <, <=, >, >=; either side) with a number ``c``: known without the
    draw where every value in [0, 1] compares alike (a draw is in [0, 1); a half-precision one may round to 1).
    LayerDrop's ``torch.rand([]) < self.layerdrop`` at 0.0 (OPT, BART, Whisper, wav2vec2 in training) was a graph
    break per layer. None: unknown (a draw written in place, or used otherwise, is not assumed in [0, 1])."""
    if node.op != "call_function" or node.target not in _FLIPPED or len(node.args) != 2:
        return None
    (r, c), op = (node.args, node.target) if isinstance(node.args[0], torch.fx.Node) else \
        (node.args[::-1], _FLIPPED[node.target])
    if not (isinstance(r, torch.fx.Node) and r.target in (torch.rand, torch.rand_like) and "out" not in r.kwargs
            and type(c) in (int, float) and all(u.target in _FLIPPED for u in r.users)):
        return None
    return op(0, c) if op(0, c) == op(1, c) else None    # monotone in the draw: the ends of [0, 1] decide


def _is_inplace(kind: str, target, kwargs) -> bool:
    if target is operator.setitem or "out" in kwargs:
        return True
    name = _name(target)
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    return name.endswith("_") and not name.endswith("__") or name in (
        "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul", "iand",
        "ior", "ixor", "ilshift", "irshift")


class TensorVariable(VariableTracker):
    """A tensor in the graph: ``node`` (fx.Node) and ``fake`` (its FakeTensor)."""

    def __init__(self, node, fake, source=None, cls=torch.Tensor):
        super().__init__(source)
        self.node, self.fake, self.cls = node, fake, cls

    def python_type(self):
        return self.cls

    def truthy(self, tx):
        if (known := _rand_compared(self.node)) is not None:
            return known
        raise Unsupported("bool() of a tensor depends on its data",
                          hint="data-dependent control flow runs outside the graph")

    def unpack(self, tx):
        if self.fake.dim() == 0:
            raise Unsupported("iteration over a 0-d tensor (raised by user code)")
        n = wrap_sym(tx.output, self.fake.shape[0], ("size", self, 0))
        n = n.evaluate("iteration over a tensor") if isinstance(n, SymNodeVariable) else n.value
        return [call_op(tx, "call_function", operator.getitem, [self, ConstantVariable(i)], {}) for i in range(n)]

    def var_getattr(self, tx, name):
        if name == "is_leaf" and self.fake.requires_grad and self.source is not None:
            for src, value, node in tx.output.inputs:   # an input's fake is a leaf; eager's may not be
                if node is self.node:
                    e = src.expr()
                    tx.output.guards.add(f"{e}.is_leaf is {value.is_leaf}", f"{e}.is_leaf", value.is_leaf, src=e)
                    return ConstantVariable(value.is_leaf)
        if name in _META_ATTRS:
            return tensor_meta(tx, self, name, getattr(self.fake, name))
        if name in _TENSOR_ATTRS:
            return call_op(tx, "call_function", getattr, [self, ConstantVariable(name)], {})
        if name == "data":
            return call_op(tx, "call_method", "detach", [self], {})
        if name == "grad":
            if (real := _input_value(tx, self)) is None:
                raise Unsupported("Tensor.grad of a tensor made inside a compiled frame")
            return tx.wrap(real.grad, AttrSource(self.source, "grad"))
        if name == "__class__":
            return wrap_constant_result(tx, self.cls)
        if name == "_version" and self.source is None and id(self.fake) not in tx.output.inference_made:
            return ConstantVariable(self.fake._version)  # (an intermediate's in-place ops bumped its fake's counter)
        if name in ("grad_fn", "_base", "_version"):
            raise Unsupported(f"Tensor.{name} inside a compiled frame")
        if hasattr(torch.Tensor, name) and callable(getattr(torch.Tensor, name)):
            return BoundMethodVariable(self, name)
        if not hasattr(torch.Tensor, name):
            return _user_attr(tx, self, name)
        raise Unsupported(f"Tensor attribute {name}")

    def call_method(self, tx, name, args, kwargs):
        if name == "item" and tx.output.shape_env.allow_scalar_outputs:
            # capture_scalar_outputs: an unbacked symbolic number (docs/dynamic_shapes.md)
            return call_op(tx, "call_method", "item", [self], {})
        if name in _BREAK_METHODS:
            raise Unsupported(_BREAK_METHODS[name], hint="it runs outside the graph" + (
                "; options={'capture_scalar_outputs': True} keeps it in the graph" if name in (
                    "item", "__int__", "__float__", "__index__") else ""))
        if name == "to" and not any(isinstance(a, TensorVariable) for a in [*args, *kwargs.values()]):
            with tx.output.fake_mode:       # ``t.to(its own dtype / device)`` is ``t`` itself, as in eager
                if self.fake.to(*[to_fake(a) for a in args], **{k: to_fake(v) for k, v in kwargs.items()}) is self.fake:
                    return self
        if name == "is_set_to" and len(args) == 1 and not kwargs and isinstance(args[0], TensorVariable):
            return ConstantVariable(_is_set_to(tx, self.fake, args[0].fake))
        if name == "is_inference" and id(self.fake) in tx.output.inference_made:
            return ConstantVariable(True)
        if name in _META_METHODS:
            fargs, fkw = [to_fake(a) for a in args], {k: to_fake(v) for k, v in kwargs.items()}
            res = getattr(self.fake, name)(*fargs, **fkw)
            if name == "storage_offset":  # it derives from the inputs' offsets: each static one is guarded, and a
                sym = isinstance(res, torch.SymInt)  # symbolic one in it by the ShapeEnv's bound >= 2 (not in shapes')
                for src, value, node in [i for i in tx.output.inputs if isinstance(i[1], torch.Tensor)]:
                    e, off = src.expr(), getattr(node.meta.get("example_value", value), "storage_offset")()
                    if not (sym and isinstance(off, torch.SymInt)):
                        off = value.storage_offset()
                        tx.output.guards.add(f"{e}.storage_offset() == {off}", f"{e}.storage_offset()", off, src=e)
                    elif off.node.expr.free_symbols & res.node.expr.free_symbols:
                        tx.output.guards.add(f"{e}.storage_offset() >= 2", f"{e}.storage_offset()", ">= 2", src=e)
            if name in ("size", "stride") and isinstance(res, torch.SymInt):
                d = fargs[0] if fargs else fkw.get("dim")
                d = d % self.fake.dim() if isinstance(d, int) else d
                return wrap_sym(tx.output, res, (name, self, d))
            return tensor_meta(tx, self, name, res)
        if name == "type" and not args and not kwargs:
            return ConstantVariable(self.fake.type().replace("Fake", ""))
        if name == "__len__":
            if self.fake.dim() == 0:
                raise UserCodeError("TypeError: len() of a 0-d tensor")
            return wrap_sym(tx.output, self.fake.shape[0], ("size", self, 0))
        if name == "__getitem__":
            if (split := _split_scalar_tensor_index(self, args[0])) is not None and _is_symint(split[1][0][1]):
                return _select_symints(tx, self, *split)
            if split is not None:
                return _index_with_scalar_tensors(tx, self, *split)
            return call_op(tx, "call_function", operator.getitem, [self, args[0]], {})
        if name == "__setitem__":
            if (split := _split_scalar_tensor_index(self, args[0])) is not None and _is_symint(split[1][0][1]):
                view, value = _select_symints(tx, self, *split), args[1]
                call_op(tx, "call_method", "copy_" if isinstance(value, TensorVariable) else "fill_", [view, value], {})
                return ConstantVariable(None)
            if split is not None:
                view = call_op(tx, "call_function", operator.getitem, [self, split[0]], {})
                if not isinstance(value := args[1], TensorVariable):
                    value = call_op(tx, "call_function", torch.full, [ConstantVariable(()), value], {
                        "dtype": ConstantVariable(self.fake.dtype), "device": ConstantVariable(self.fake.device)})
                elif value.fake.untyped_storage()._cdata == self.fake.untyped_storage()._cdata:   # (eager's copy_
                    value = call_op(tx, "call_method", "clone", [value], {})   # reads it first: ``x[i] += 1``)
                call_op(tx, "call_function", torch.ops.aten.index_put_.default,
                        [view, _index_list(view, split[1]), value], {})
                return ConstantVariable(None)
            call_op(tx, "call_function", operator.setitem, [self, args[0], args[1]], {})
            return ConstantVariable(None)
        if name == "__contains__":
            raise Unsupported("`in` on a tensor depends on its data")
        if name == "new_tensor" and contains_tensor(list(args)):
            raise Unsupported("Tensor.new_tensor of a tensor")
        if name == "new" and len(args) == 1 and args[0].python_type() is torch.Size:
            name = "new_empty"   # x.new(torch.Size) is a shape; the graph's plain tuple would be data
        return call_op(tx, "call_method", name, [self] + list(args), kwargs)

    def reconstruct(self, cg):
        return cg.graph_output(self)

    def __repr__(self):
        return f"TensorVariable({self.node.name}, {tuple(self.fake.shape)}, {self.fake.dtype})"
