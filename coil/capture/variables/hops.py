"""Higher-order operators in capture: ``torch.cond`` and activation checkpointing.

Capture traces each function argument in its own scope (:func:`trace_subgraph`) and cuts the nodes it added out into a
``torch.fx.Graph`` whose inputs are the operands, then every parent value read (*lifted*). The parent graph holds the
subgraphs as ``GraphModule`` attributes and calls ``torch.ops.higher_order.<op>`` on them, as torch's capture does, so
AOT's ``make_fx`` applies the operator's own rules. Side effects inside are graph breaks; in-place writes to operands
and mismatched branches are ``UserError`` s. ``checkpoint`` is traced inline and tags its nodes ``meta["recompute"]``
for the partitioner. docs/hops.md, "Capture".
"""
from __future__ import annotations

import functools
import inspect
import itertools
import operator
import re
import types
from typing import Optional

import torch
import torch.fx
import torch._higher_order_ops as hops
import torch.utils.checkpoint as ckpt
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import CheckpointPolicy

from coil import trace
from coil.exc import SourceLocation, Unsupported, UserError
from coil.capture.variables.base import CellVariable, ConstantVariable, KnownCallableVariable, VariableTracker
from coil.capture.variables.containers import DictVariable, ListVariable, TupleVariable
from coil.capture.variables.tensor import TensorVariable, _is_inplace, call_op
from coil.capture.variables.symbolic import SymNodeVariable

_region_ids = itertools.count()


class _RefusingSideEffects:
    """Stands in for ``OutputGraph.side_effects`` while a subgraph is traced: reads pass
    through, any write to state outside the subgraph raises Unsupported."""

    def __init__(self, inner, what: str):
        self._inner, self._what = inner, what
        self._start = VariableTracker().birth   # sourceless trackers made later: the body's

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _refuse(self, kind: str):
        raise Unsupported(f"{self._what}: {kind} inside the function (a side effect "
                          f"a higher-order operator's subgraph cannot have)",
                          hint="move the side effect out of the branch/body function")

    def mutated(self, vt):
        if vt.source is not None or vt.birth <= self._start:  # not made by the body
            self._refuse(f"mutation of {type(vt).__name__}")

    def store_attr(self, obj_vt, name, value):
        self._refuse(f"setting attribute {name!r}")

    def store_global(self, gdict, gname, name, value):
        self._refuse(f"assigning global {name!r}")

    def store_cell(self, cell_vt, value):
        self._refuse("assigning a closure variable")


class Subgraph:
    """One traced function argument: ``graph`` takes ``operands + lifted`` (lifted: parent-graph nodes it reads),
    returns ``outputs`` (flat); ``structure`` is how its result nests them (``"tensor"``, ``"tuple"``, ``"list"``)."""

    def __init__(self, graph, n_operands, lifted, out_fakes, structure, user_line):
        self.graph, self.n_operands, self.lifted, self.out_fakes = graph, n_operands, lifted, out_fakes
        self.structure, self.user_line = structure, user_line

    def add_lifted(self, node) -> None:
        """Another parent node this subgraph takes (unused by it: the other branch reads it)."""
        with self.graph.inserting_after([n for n in self.graph.nodes if n.op == "placeholder"][-1]):
            p = self.graph.placeholder(f"lifted_{node.name}")
        p.meta.update({k: node.meta[k] for k in ("example_value", "val") if k in node.meta})
        self.lifted.append(node)


def _fn_line(fn_vt) -> str:
    code = getattr(getattr(fn_vt, "fn", None), "__code__", None) or getattr(fn_vt, "code", None)
    return "?" if code is None else f"{code.co_filename}:{code.co_firstlineno} ({code.co_name})"


def _flat_outputs(res: VariableTracker, what: str):
    if isinstance(res, TensorVariable):
        return [res], "tensor"
    if isinstance(res, (TupleVariable, ListVariable)) and all(isinstance(v, TensorVariable) for v in res.items):
        return list(res.items), ("list" if isinstance(res, ListVariable) else "tuple")
    raise Unsupported(f"{what} returned {res} (a higher-order operator's function must "
                      "return a tensor or a tuple/list of tensors)")


def _cells_of(fn_vt) -> dict:
    """Content of the frame-made closure cells ``fn_vt`` reads (to detect writes)."""
    return {id(c): (c, c.content) for c in getattr(fn_vt, "closure", []) or [] if isinstance(c, CellVariable)}


def trace_subgraph(tx, fn_vt, operands: list, what: str, alias_ok: bool = True,
                   call: Optional[tuple] = None, flatten=None, sizes: bool = False) -> Subgraph:
    """Trace ``fn_vt(*operands)`` as a subgraph in its own scope (see module docstring). ``what`` names it in messages
    (``"torch.cond true_fn"``). An output that is (a view of) an input is cloned, or with ``alias_ok=False`` a UserError
    (eager's cond refuses it). ``call=(args, kwargs)`` calls ``fn_vt(*args, **kwargs)`` instead, ``operands`` being the
    tensors among them (the rest of what the call reads is lifted). ``flatten(result, what) -> (tensors, structure)``
    (default :func:`_flat_outputs`) flattens the function's result. ``sizes``: the symbols of the inputs' sizes and
    strides are lifted too, as torch's capture lifts them (torch's scan autograd saves a size its backward reads as a
    per-step output, stacked, unless it is an input of the body: a SymInt cannot be stacked)."""
    out = tx.output
    graph = out.graph
    before = set(graph.nodes)
    cells = _cells_of(fn_vt)
    saved_se = out.side_effects
    refusing = out.side_effects = _RefusingSideEffects(saved_se, what)
    try:
        res = tx.call(fn_vt, *(call or (list(operands), {})))
    except Unsupported as e:
        if e.reason.startswith(what):
            raise
        err = Unsupported(f"{what}: {e.reason}", hint=e.hint, location=e.location)
        err.user_stack = getattr(e, "user_stack", None)
        raise err from e
    finally:
        out.side_effects = saved_se
    if any(cell.content is not content for cell, content in cells.values()):
        refusing.store_cell(None, None)   # a frame-made cell the function assigned
    outs, structure = (flatten or _flat_outputs)(res, what)
    region = [n for n in graph.nodes if n not in before and n.op != "placeholder"]
    region_set = set(region)
    op_nodes = list(dict.fromkeys(o.node for o in operands))  # one input per tensor
    lifted: list = []
    for a in [a for n in region for a in n.all_input_nodes] + [o.node for o in outs]:
        if a not in region_set and a not in op_nodes and a not in lifted:
            lifted.append(a)
    for v in [o.fake for o in operands] + [n.meta.get("example_value") for n in lifted] if sizes else ():
        for d in (*v.shape, *v.stride()) if isinstance(v, torch.Tensor) else ():
            if (node := out.symbol_input(d)) is not None and node not in lifted:
                lifted.append(node)
    # a symbolic float (a Python float made a graph input) is specialized to its value, guarded: torch's cond,
    # while_loop and scan take tensor and int operands only (FINDINGS_74 4); each new value recompiles
    floats = {a: float(v) for a in lifted if isinstance(v := a.meta.get("example_value"), torch.SymFloat)}
    if floats:
        lifted = [a for a in lifted if a not in floats]
        trace.log("hop_float_specialized", stage="capture", hop=what, values=list(floats.values()))
    _check_no_input_writes(region, op_nodes + lifted, what)
    sg = torch.fx.Graph()
    env: dict = dict(floats)
    for i, n in enumerate(op_nodes + lifted):
        p = sg.placeholder(n.name if i < len(op_nodes) else f"lifted_{n.name}")
        env[n] = p
        p.meta.update({k: n.meta[k] for k in ("example_value", "val") if k in n.meta})
    for n in region:
        env[n] = sg.node_copy(n, env.__getitem__)
    in_storages = {StorageWeakRef(n.meta["example_value"].untyped_storage())
                   for n in op_nodes + lifted
                   if isinstance(n.meta.get("example_value"), torch.Tensor)}
    results = []
    for o in outs:
        r = env[o.node]
        if StorageWeakRef(o.fake.untyped_storage()) in in_storages:
            if not alias_ok:
                raise UserError(f"{what} returns one of its inputs or a view of one (eager's "
                                "torch.cond refuses outputs aliasing inputs)",
                                location=tx.location(), hint="return a copy (v.clone())")
            # an output aliasing an input: a fresh tensor, as torch's capture makes it
            r = sg.call_function(torch.clone, (r,))
            r.meta["example_value"] = o.fake
        results.append(r)
    sg.output(tuple(results))
    for n in reversed(region):
        if any(u not in region_set for u in n.users):
            raise Unsupported(f"{what}: a value made inside the function escapes it")
        graph.erase_node(n)
    sub = Subgraph(sg, len(op_nodes), lifted, [o.fake for o in outs], structure, tx.location())
    sub.operand_nodes = op_nodes
    return sub


def _check_no_input_writes(region, inputs, what: str) -> None:
    storages = {StorageWeakRef(n.meta["example_value"].untyped_storage()): n for n in inputs
                if isinstance(n.meta.get("example_value"), torch.Tensor)}
    for n in region:
        if n.op not in ("call_function", "call_method") or not _is_inplace(n.op, n.target, n.kwargs):
            continue
        dst = n.args[0] if n.args else None
        fake = dst.meta.get("example_value") if isinstance(dst, torch.fx.Node) else None
        if isinstance(fake, torch.Tensor) and StorageWeakRef(fake.untyped_storage()) in storages:
            src = storages[StorageWeakRef(fake.untyped_storage())]
            raise UserError(
                f"{what} writes in place ({getattr(n.target, '__name__', n.target)}) to "
                f"{src.meta.get('source', src.name)}, a tensor from outside the function (an operand or a closed-over "
                "tensor); higher-order operators' functions must not mutate their inputs",
                location=_node_location(n), hint="compute a new tensor instead (x + 1, not x.add_(1))")


def _needs_grad(nodes) -> bool:
    """Grad mode is on and one of ``nodes``' values is a tensor that requires grad."""
    return torch.is_grad_enabled() and any(isinstance(v := n.meta.get("example_value"), torch.Tensor)
                                           and v.requires_grad for n in nodes)


def _node_location(n) -> Optional[SourceLocation]:
    """The user's innermost frame in node ``n``'s ``stack_trace`` (None if it names none)."""
    frames = [ln.strip() for ln in n.meta.get("stack_trace", "").splitlines() if ln.strip().startswith('File "')]
    m = re.match(r'File "([^"]*)", line (\d+)', frames[-1]) if frames else None
    return SourceLocation.of(m.group(1), int(m.group(2))) if m else None


def _meta_text(f) -> str:
    return f"shape {tuple(f.shape)}, dtype {f.dtype}, stride {tuple(f.stride())}"


def _changed_carry(carried: list, outs: list) -> Optional[int]:
    """The first position whose output fake changes its carried fake's dtype, shape or (beyond one element) strides."""
    return next((i for i, (x, y) in enumerate(zip(carried, outs)) if x.dtype != y.dtype or tuple(x.shape) !=
                 tuple(y.shape) or (x.numel() > 1 and x.stride() != y.stride())), None)


def _check_same_outputs(a: Subgraph, b: Subgraph, names, location) -> None:
    if len(a.out_fakes) != len(b.out_fakes) or a.structure != b.structure:
        raise UserError(
            f"torch.cond: {names[0]} returns {len(a.out_fakes)} tensor(s) as a {a.structure}, {names[1]} "
            f"{len(b.out_fakes)} as a {b.structure}; both branches must return the same structure", location=location)
    def equal(p, q) -> bool:  # sizes from two sources (x + 1 / y * 2, dynamic): equal now, guarded
        try:
            return bool(p == q)
        except Exception:  # noqa: BLE001 - unbacked
            return torch.fx.experimental.symbolic_shapes.statically_known_true(p == q)
    for i, (x, y) in enumerate(zip(a.out_fakes, b.out_fakes)):
        same = x.dtype == y.dtype and x.dim() == y.dim() and x.device == y.device
        if same and not all(equal(p, q) for p, q in zip(x.shape, y.shape)):  # eager's cond runs it
            raise Unsupported(f"torch.cond: output {i} of the branches has other sizes: {_meta_text(x)} and "
                              f"{_meta_text(y)}", hint="return tensors of one shape from both branches")
        if same and x.numel() > 1:
            same = all(equal(p, q) for p, q, s in zip(x.stride(), y.stride(), x.shape) if s != 1)
        if not same:
            raise UserError(
                f"torch.cond: output {i} of the branches differs: {names[0]} ({a.user_line_text}) returns "
                f"{_meta_text(x)}; {names[1]} ({b.user_line_text}) returns {_meta_text(y)}. Both branches must return "
                "tensors with the same metadata", location=location)


class ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous (with ``copy``, a copy). Put on each input of a
    cond branch: torch's cond backward merges the two branch gradients' strides and refuses an expanded gradient
    (``y.sum()``'s) against a dense one; with ``copy`` on each output of a cond: its backward cond refuses gradients
    that alias each other (``a + b`` of two outputs gives both one gradient)."""

    @staticmethod
    def forward(ctx, x, copy=False):
        ctx.copy = copy
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.clone(memory_format=torch.contiguous_format) if ctx.copy else grad.contiguous(), None


def contiguous_grad(x: torch.Tensor, copy: bool = False) -> torch.Tensor:
    """``x`` (a view), with a contiguous gradient (:class:`ContiguousGrad`)."""
    return ContiguousGrad.apply(x, copy)


def _contiguous_grads(sg: torch.fx.Graph) -> None:
    if not (phs := [n for n in sg.nodes if n.op == "placeholder"]):
        return
    with sg.inserting_after(phs[-1]):
        for p in reversed(phs):
            if not (isinstance(val := p.meta.get("example_value"), torch.Tensor) and val.dtype.is_floating_point):
                continue
            q = sg.call_function(contiguous_grad, (p,))
            q.meta["example_value"] = val
            p.replace_all_uses_with(q, delete_user_cb=lambda u: u is not q)


def calls_while_loop(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` or a subgraph of an operator in it (a cond's branch, a map body) calls while_loop: its trip
    count is an unbacked size, so only the capture's fake mode and ShapeEnv can trace the graph again."""
    return any(n.target is torch.ops.higher_order.while_loop for m in gm.modules()
               if isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes)


def _register(out, *subgraphs: tuple[str, torch.fx.Graph]) -> list[str]:
    """Make each ``(prefix, graph)`` of one operator call a GraphModule attribute of the parent graph, named
    ``<prefix>_<index>`` with the call's index; returns the names."""
    subs, names = out.subgraphs, []
    index = out.hop_count = getattr(out, "hop_count", -1) + 1
    for prefix, sg in subgraphs:
        name = f"{prefix}_{index}"
        while name in subs:
            name += "_"
        root = torch.nn.Module()
        for n in sg.nodes:  # subgraphs of operators nested inside this one move with it
            if n.op == "get_attr" and n.target in subs:
                setattr(root, n.target, subs.pop(n.target))
        subs[name] = torch.fx.GraphModule(root, sg, class_name=name)
        names.append(name)
    return names


def _fresh(out, like: torch.Tensor, shape=None, grad: bool = False) -> torch.Tensor:
    """A new fake (capture's mode) with ``like``'s dtype and device, and its shape and strides or, given
    ``shape``, that contiguous shape; requiring grad with ``grad`` (floating and complex dtypes)."""
    with out.fake_mode:
        t = torch.empty_strided(like.shape, like.stride(), dtype=like.dtype, device=like.device) \
            if shape is None else torch.empty(shape, dtype=like.dtype, device=like.device)
    return t.requires_grad_(True) if grad and (like.dtype.is_floating_point or like.dtype.is_complex) else t


def _log_hop(tx, op: str, **payload) -> None:
    """The ``hop`` event of a call of operator ``op`` at ``tx``'s instruction."""
    trace.log("hop", stage="capture", op=op, **payload, where=str(tx.location()).splitlines()[0])


def _emit(tx, target, args: tuple, fakes: list, op: str, lifted: list, **log) -> list:
    """Add ``target(*args)`` to the parent graph with one ``getitem`` per output (value ``fakes[i]``) and log the call
    of ``op`` (its subgraphs: the ``get_attr`` nodes of ``args``; ``lifted``: the parent nodes they read, ``log``: more
    of the event); returns the outputs' TensorVariables."""
    g = tx.output.graph
    node = g.call_function(target, args)
    tx.locate_node(node)
    node.meta["example_value"] = tuple(fakes)
    items = []
    for i, fake in enumerate(fakes):
        item = g.call_function(__import__("operator").getitem, (node, i))
        item.meta["example_value"] = fake
        tx.locate_node(item)
        items.append(TensorVariable(item, fake))
    subs = [a.target for a in args if isinstance(a, torch.fx.Node) and a.op == "get_attr" and a.target in
            tx.output.subgraphs]
    _log_hop(tx, op, subgraphs=subs, lifted=[n.meta.get("source", n.name) for n in lifted], **log)
    return items


def _unflatten(items: list, structure: str) -> VariableTracker:
    return items[0] if structure == "tensor" else ListVariable(items) if structure == "list" else TupleVariable(items)


def _operands(tx, v: VariableTracker) -> list:
    items = v.items if isinstance(v, (TupleVariable, ListVariable)) else None
    if isinstance(v, ConstantVariable) and v.value in ((), []):
        items = []
    if items and any(isinstance(i, (TupleVariable, ListVariable, DictVariable)) for i in items):
        raise Unsupported("torch.cond with nested operands", hint="pass a flat tuple of tensors")  # eager runs it
    if items is None or not all(isinstance(i, TensorVariable) for i in items):
        raise UserError("torch.cond: expected operands to be a tuple or list of tensors, "
                        f"got {v}", location=tx.location())
    return list(items)


def _bind(tx, fn, args: list, kwargs: dict, error=UserError) -> dict:
    """The call's arguments by ``fn``'s parameter names, defaults as constants (``fn``: the operator's Python function,
    whose signature is this torch's). Arguments ``fn`` does not take are an ``error`` with Python's reason."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise error(f"{fn.__name__}(): {e}", location=tx.location()) from None
    bound.apply_defaults()
    return {k: v if isinstance(v, VariableTracker) else ConstantVariable(v) for k, v in bound.arguments.items()}


def call_cond(tx, args: list, kwargs: dict) -> VariableTracker:
    """``torch.cond(pred, true_fn, false_fn, operands)`` (see module docstring)."""
    bound = _bind(tx, hops.cond, args, kwargs)
    pred, true_fn, false_fn = bound["pred"], bound["true_fn"], bound["false_fn"]
    operands = _operands(tx, bound["operands"])
    if isinstance(pred, SymNodeVariable):
        pred = ConstantVariable(bool(pred.evaluate("torch.cond predicate")))
    if not isinstance(pred, TensorVariable):
        value = pred.as_python_constant_or_none()
        if not isinstance(value, (bool, int, float)):
            raise UserError(f"torch.cond: expected pred to be bool or a boolean tensor, got {pred}",
                            location=tx.location())
        # eager runs the chosen branch as a plain call: so does the graph (value guarded)
        _log_hop(tx, "cond", predicate="constant", value=bool(value))
        return tx.call(true_fn if value else false_fn, operands, {})
    if pred.fake.numel() != 1 or pred.fake.dtype is not torch.bool:
        raise UserError("torch.cond: expected pred to be bool or a boolean tensor with a single item, got a "
                        f"{pred.fake.dtype} tensor of shape {tuple(pred.fake.shape)}", location=tx.location(),
                        hint="compare it, e.g. x.sum() > 0")
    location = tx.location()
    if len({StorageWeakRef(o.fake.untyped_storage()) for o in operands}) < len({o.node for o in operands}):
        raise UserError("torch.cond: operands share memory (views of one tensor); eager's cond refuses aliased "
                        "operands", location=location, hint="pass a .clone() of one of them")
    t = trace_subgraph(tx, true_fn, operands, "torch.cond true_fn", alias_ok=False)
    f = trace_subgraph(tx, false_fn, operands, "torch.cond false_fn", alias_ok=False)
    t.user_line_text, f.user_line_text = _fn_line(true_fn), _fn_line(false_fn)
    _check_same_outputs(t, f, ("true_fn", "false_fn"), location)
    _share_lifted(t, f)
    for sg in (t.graph, f.graph) if torch.is_grad_enabled() else ():
        _contiguous_grads(sg)
    out = tx.output
    node_ops = tuple(t.operand_nodes) + tuple(t.lifted)
    grad = _needs_grad(node_ops)
    if grad and not all(x.dtype.is_floating_point or x.dtype.is_complex for x in t.out_fakes):
        raise Unsupported("torch.cond returning integer or bool tensors with inputs that "
                          "require grad (torch's cond backward cannot trace it; eager fails "
                          "in backward)", hint="return the non-float outputs outside the cond")
    tname, fname = _register(out, ("cond_true", t.graph), ("cond_false", f.graph))
    g = out.graph
    items = _emit(tx, torch.ops.higher_order.cond, (pred.node, g.get_attr(tname), g.get_attr(fname), node_ops),
                  [_fresh(out, x, grad=grad) for x in t.out_fakes], "cond", t.lifted, predicate="tensor")
    for k, item in enumerate(items if grad else ()):  # one gradient tensor per output
        node = g.call_function(contiguous_grad, (item.node, True))
        node.meta["example_value"] = fake = _fresh(out, item.fake, grad=True)
        tx.locate_node(node)
        items[k] = TensorVariable(node, fake)
    return _unflatten(items, t.structure)


def _share_lifted(a: Subgraph, b: Subgraph) -> None:
    """Give ``a`` and ``b`` the same lifted inputs, in ``a``'s order (the operator passes both one list of them)."""
    for x, y in ((a, b), (b, a)):
        for n in [n for n in y.lifted if n not in x.lifted]:
            x.add_lifted(n)
    _reorder_lifted(b, {n: i for i, n in enumerate(a.lifted)})


def _reorder_lifted(sg: Subgraph, order: dict) -> None:
    """Put ``sg``'s lifted placeholders in the order ``order`` gives their parent nodes."""
    phs = [n for n in sg.graph.nodes if n.op == "placeholder"][sg.n_operands:]
    pairs = sorted(zip(sg.lifted, phs), key=lambda p: order[p[0]])
    anchor = [n for n in sg.graph.nodes if n.op == "placeholder"][sg.n_operands - 1] if sg.n_operands else None
    for _, p in pairs:
        if anchor is not None:
            anchor.append(p)
        elif (first := next(iter(sg.graph.nodes))) is not p:
            first.prepend(p)
        anchor = p
    sg.lifted = [n for n, _ in pairs]


# --------------------------------------------------------------------------- while_loop

def _flat_carried(tx, v: VariableTracker) -> list:
    items = v.items if isinstance(v, (TupleVariable, ListVariable)) else None
    if items is None or not items or not all(isinstance(i, TensorVariable) for i in items):
        raise Unsupported(f"torch.while_loop: carried_inputs {v} (a non-empty flat tuple "
                          "or list of tensors is captured)")
    return list(items)


def call_while_loop(tx, args: list, kwargs: dict) -> VariableTracker:
    """``torch._higher_order_ops.while_loop(cond_fn, body_fn, carried_inputs)``: both
    functions traced as subgraphs over ``carried + lifted``; the body's outputs must keep
    the carried values' metadata (a :class:`UserError` names the first that changes)."""
    bound = _bind(tx, hops.while_loop, args, kwargs)
    location = tx.location()
    carried = _flat_carried(tx, bound["carried_inputs"])
    if len({id(x.node) for x in carried}) != len(carried):
        raise Unsupported("torch.while_loop with one tensor carried twice")
    c = trace_subgraph(tx, bound["cond_fn"], carried, "torch.while_loop cond_fn")
    p = c.out_fakes[0] if len(c.out_fakes) == 1 and c.structure == "tensor" else None
    if p is None or p.numel() != 1 or p.dtype is not torch.bool:
        raise UserError("torch.while_loop: cond_fn must return a boolean tensor with a single "
                        f"item, got {[_meta_text(f) for f in c.out_fakes]}", location=location)
    out_node = [n for n in c.graph.nodes if n.op == "output"][0]
    out_node.args = (out_node.args[0][0],)   # while_loop's cond_fn returns the tensor itself
    b = trace_subgraph(tx, bound["body_fn"], carried, "torch.while_loop body_fn")
    if len(b.out_fakes) != len(carried):
        raise UserError(f"torch.while_loop: body_fn returns {len(b.out_fakes)} tensor(s) for "
                        f"{len(carried)} carried input(s)", location=location)
    if (i := _changed_carry([x.fake for x in carried], b.out_fakes)) is not None:
        raise UserError(f"torch.while_loop: body_fn changes carried input {i}: it comes in with "
                        f"{_meta_text(carried[i].fake)} and leaves with {_meta_text(b.out_fakes[i])}; the carried "
                        "state must keep its metadata", location=location)
    if _needs_grad([x.node for x in carried] + b.lifted + c.lifted):
        raise Unsupported("torch.while_loop with inputs that require grad (its backward needs the trip count as a "
                          "size: not captured)", hint="run it under torch.no_grad(), or it runs outside the graph")
    _share_lifted(c, b)
    out = tx.output
    cname, bname = _register(out, ("while_cond", c.graph), ("while_body", b.graph))
    g = out.graph
    items = _emit(tx, torch.ops.higher_order.while_loop, (
        g.get_attr(cname), g.get_attr(bname), tuple(x.node for x in carried), tuple(c.lifted)),
        [_fresh(out, x.fake) for x in carried], "while_loop", c.lifted)
    return ListVariable(items) if b.structure == "list" else TupleVariable(items)  # eager: the body's container


# --------------------------------------------------------------------------- map

def call_map(tx, args: list, kwargs: dict) -> VariableTracker:
    """``torch._higher_order_ops.map(f, xs, *args)``: ``f`` traced once as a subgraph over
    one slice ``xs[0]`` (and ``args`` + lifted values); the results are stacked."""
    if kwargs or len(args) < 2:
        raise Unsupported("torch map(f, xs, *args) with keyword arguments")
    f, xs, rest = args[0], args[1], list(args[2:])
    if not isinstance(xs, TensorVariable) or not all(isinstance(a, TensorVariable) for a in rest):
        raise Unsupported("torch map over a non-tensor xs or with non-tensor args")
    if xs.fake.dim() == 0 or xs.fake.shape[0] == 0:
        raise UserError("map: xs needs a non-empty leading dimension", location=tx.location())
    piece = call_op(tx, "call_function", __import__("operator").getitem, [xs, ConstantVariable(0)], {})
    body = trace_subgraph(tx, f, [piece] + rest, "torch map f")
    tx.output.graph.erase_node(piece.node)
    if _needs_grad([xs.node] + [a.node for a in rest] + body.lifted):
        raise Unsupported("torch map with inputs that require grad (not captured)",
                          hint="run it under torch.no_grad(), or it runs outside the graph")
    out = tx.output
    (name,) = _register(out, ("map_body", body.graph))
    items = _emit(tx, torch.ops.higher_order.map_impl, (
        out.graph.get_attr(name), [xs.node], body.operand_nodes[1:] + body.lifted),
        [_fresh(out, y, (xs.fake.shape[0], *y.shape)) for y in body.out_fakes], "map", body.lifted)
    return _unflatten(items, body.structure)


# --------------------------------------------------------------------------- scan

def _tensor_tree(v: VariableTracker, what: str):
    """``v`` (a tensor or a tuple/list of tensors) as (tensors, structure)."""
    if isinstance(v, TensorVariable) or isinstance(v, (TupleVariable, ListVariable)) and \
            v.items and all(isinstance(i, TensorVariable) for i in v.items):
        return _flat_outputs(v, what)
    raise Unsupported(f"{what}: {v} (a tensor or a flat tuple/list of tensors is captured)")


def _scan_outputs(res: VariableTracker, what: str):
    if not (isinstance(res, (TupleVariable, ListVariable)) and len(res.items) == 2):
        raise Unsupported(f"{what} returned {res} (scan's combine_fn returns (carry, y))")
    carry, cs = _tensor_tree(res.items[0], what)
    ys, ystruct = _tensor_tree(res.items[1], what)
    return carry + ys, (len(carry), cs, ystruct)


def call_scan(tx, args: list, kwargs: dict) -> VariableTracker:
    """``torch._higher_order_ops.scan(combine_fn, init, xs, dim=0, reverse=False)``: ``combine_fn(carry, x)``
    traced once over the carry and one slice of ``xs`` (plus lifted values); the parent moves ``dim`` to the
    front and flips for ``reverse`` around ``torch.ops.higher_order.scan`` as torch's scan does. The carry it
    returns must keep ``init``'s metadata (a :class:`UserError` names the first that changes). Gradients are
    torch's scan autograd rule (a backward scan)."""
    bound = _bind(tx, hops.scan, args, kwargs, Unsupported)
    dim, reverse = bound["dim"].as_python_constant(), bound["reverse"].as_python_constant()
    init, init_struct = _tensor_tree(bound["init"], "torch scan init")
    xs, xs_struct = _tensor_tree(bound["xs"], "torch scan xs")
    if len({id(t.node) for t in init}) != len(init):
        raise Unsupported("torch scan with one tensor twice in init")
    location = tx.location()

    def op(fn, *a):
        return call_op(tx, "call_function", fn, list(a), {})
    lead = []
    d = dim + xs[0].fake.dim() if dim < 0 else dim
    for x in xs:
        if x.fake.dim() <= d or x.fake.shape[d] == 0:
            raise UserError("scan: every xs leaf needs a non-empty dimension dim", location=location)
        x = op(torch.movedim, x, ConstantVariable(d), ConstantVariable(0)) if d else x
        lead.append(op(torch.flip, x, ConstantVariable([0])) if reverse else x)
    pieces = [op(__import__("operator").getitem, x, ConstantVariable(0)) for x in lead]
    body = trace_subgraph(tx, bound["combine_fn"], list(init) + pieces, "torch scan combine_fn",
                          call=([_unflatten(list(init), init_struct),
                                 _unflatten(pieces, xs_struct)], {}), flatten=_scan_outputs, sizes=True)
    for p in pieces:   # the slices were only the body's example inputs
        tx.output.graph.erase_node(p.node)
    n_carry, carry_struct, y_struct = body.structure
    if n_carry != len(init) or carry_struct != init_struct or len(body.operand_nodes) != len(init) + len(pieces):
        raise UserError(f"scan: combine_fn returns a carry of {n_carry} tensor(s) for an init "
                        f"of {len(init)}", location=location)
    if (i := _changed_carry([x.fake for x in init], body.out_fakes)) is not None:
        raise UserError(f"scan: combine_fn changes carry {i}: it comes in with {_meta_text(init[i].fake)} and leaves "
                        f"with {_meta_text(body.out_fakes[i])}", location=location)
    grad = _needs_grad([t.node for t in init] + [x.node for x in lead] + body.lifted)
    ret = body.graph.output_node()
    outs, cloned = list(ret.args[0]), []
    for i, r in enumerate(outs[:n_carry] if grad else []):
        if len(r.users) > 1 or outs.count(r) > 1:   # torch's scan autograd refuses a carry
            cloned.append(i)
            with body.graph.inserting_before(ret):  # the body reads too: "might be aliasing"
                outs[i] = body.graph.call_function(torch.clone, (r,))
            outs[i].meta["example_value"] = r.meta["example_value"]
    ret.args = (tuple(outs),)
    out = tx.output
    (name,) = _register(out, ("scan_combine", body.graph))
    g = out.graph
    length = lead[0].fake.shape[0]
    items = _emit(tx, torch.ops.higher_order.scan, (
        g.get_attr(name), [t.node for t in init], [x.node for x in lead], tuple(body.lifted)),
        [_fresh(out, y, y.shape if i < n_carry else (length, *y.shape), grad) for i, y in enumerate(body.out_fakes)],
        "scan", body.lifted, length=length if isinstance(length, int) else str(length),
        cloned_carries=cloned)   # read by the body too: saved values would alias them
    ys = [op(torch.flip, y, ConstantVariable([0])) for y in items[n_carry:]] if reverse else items[n_carry:]
    ys = [op(torch.movedim, y, ConstantVariable(0), ConstantVariable(d)) if d and d < y.fake.dim() else y for y in ys]
    return TupleVariable([_unflatten(items[:n_carry], carry_struct), _unflatten(ys, y_struct)])


class _CarryAndOutput(VariableTracker):
    """``fn``'s ``(result, copy of result)``: a scan body whose carry is its output (may not return a tensor twice)."""

    def __init__(self, fn: VariableTracker):
        super().__init__(None)
        self.fn = fn
        self.closure = getattr(fn, "closure", None)

    def call_function(self, tx, args, kwargs):
        out = tx.call(self.fn, list(args), dict(kwargs))
        ts, struct = _tensor_tree(out, "associative_scan combine_fn")
        return TupleVariable([out, _unflatten([call_op(tx, "call_function", torch.clone, [t], {}) for t in ts], struct)])


def call_associative_scan(tx, args: list, kwargs: dict) -> VariableTracker:
    """``associative_scan(combine_fn, xs, dim, reverse=False, combine_mode="pointwise")``: a :func:`call_scan` whose
    carry is the running combination ``combine_fn(carry, x)`` of single elements (as the generic mode's vmap calls
    it), started at a contiguous copy of the first element, which is put back in front of the outputs. The same
    values as torch's log-depth scan up to rounding (``combine_fn`` is associative). What eager refuses (pointwise
    mode off CUDA, a bad ``dim``) or a combine_fn that changes an element's metadata is left to eager."""
    bound = _bind(tx, hops.associative_scan, args, kwargs, Unsupported)
    dim, reverse, mode = (bound[k].as_python_constant() for k in ("dim", "reverse", "combine_mode"))
    xs, struct = _tensor_tree(bound["xs"], "associative_scan xs")
    nd = xs[0].fake.dim()
    d = dim + nd if isinstance(dim, int) and dim < 0 else dim
    if mode not in ("pointwise", "generic") or not isinstance(d, int) or not 0 <= d < nd or \
            any(x.fake.dim() != nd or x.fake.shape[d] == 0 for x in xs) or \
            mode == "pointwise" and any(x.fake.device.type not in ("cuda", "xpu") for x in xs):
        raise Unsupported("associative_scan arguments eager refuses: left to eager to raise")

    def op(fn, *a, **kw):
        return call_op(tx, "call_function", fn, list(a), {k: ConstantVariable(v) for k, v in kw.items()})
    getitem = __import__("operator").getitem
    lead = []
    for x in xs:
        x = op(torch.movedim, x, ConstantVariable(d), ConstantVariable(0)) if d else x
        lead.append(op(torch.flip, x, ConstantVariable([0])) if reverse else x)
    outs = firsts = [op(getitem, x, ConstantVariable(slice(0, 1))) for x in lead]
    if lead[0].fake.shape[0] > 1:
        init = [op(torch.clone, op(getitem, x, ConstantVariable(0)), memory_format=torch.contiguous_format)
                for x in lead]
        rest = [op(getitem, x, ConstantVariable(slice(1, None))) for x in lead]
        try:
            res = call_scan(tx, [_CarryAndOutput(bound["combine_fn"]), _unflatten(init, struct), _unflatten(rest, struct)], {})
        except UserError as e:
            raise Unsupported(f"associative_scan: {e}") from e
        ys, _ = _tensor_tree(res.items[1], "associative_scan combine_fn")
        outs = [op(torch.cat, TupleVariable([f, y]), ConstantVariable(0)) for f, y in zip(firsts, ys)]
    if reverse:
        outs = [op(torch.flip, y, ConstantVariable([0])) for y in outs]
    outs = [op(torch.movedim, y, ConstantVariable(0), ConstantVariable(d)) if d else y for y in outs]
    return _unflatten(outs, struct)


# --------------------------------------------------------------------------- checkpoint

_CHECKPOINT_DEFAULTS = {"preserve_rng_state": True, "context_fn": None, "determinism_check": "default", "debug": False,
                        "early_stop": True}


def call_checkpoint(tx, args: list, kwargs: dict) -> VariableTracker:
    """``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=..., **fn_kwargs)``:
    ``fn`` traced inline, its nodes tagged for recomputation (module docstring)."""
    if not args:
        raise UserError("checkpoint() needs the function to run", location=tx.location())
    kwargs = dict(kwargs)
    reentrant = kwargs.pop("use_reentrant", None)  # same values and gradients, but for in-place writes (hops.md)
    reentrant = reentrant is None or reentrant.as_python_constant_or_none() is not False
    for k, default in _CHECKPOINT_DEFAULTS.items():
        if k in kwargs and (v := kwargs.pop(k).as_python_constant_or_none()) != default and k != "preserve_rng_state":
            raise Unsupported(f"torch.utils.checkpoint.checkpoint({k}={v!r})",
                              hint="only the default value is captured")
    # without early stop, eager's recomputation replays the body's in-place writes after the last save into the saved
    # values (coil/aot/functional.py, _CheckpointSaves, reads them as of that save)
    flag = f"{tx.output.guards.const(ckpt)}._enable_checkpoint_early_stop"
    se = tx.output.side_effects    # (set_checkpoint_early_stop(False) entered in the frame: a pending global store)
    pending = se.pending_global(vars(ckpt), "_enable_checkpoint_early_stop") or se.pending_attr(
        ckpt, "_enable_checkpoint_early_stop")
    if (ckpt._enable_checkpoint_early_stop if pending is None else pending.as_python_constant_or_none()) is False:
        raise Unsupported("torch.utils.checkpoint.checkpoint under set_checkpoint_early_stop(False)")
    tx.output.guards.add(f"{flag} is not False", flag, ckpt._enable_checkpoint_early_stop)
    out = tx.output
    before = set(out.graph.nodes)
    # eager's reentrant checkpoint is an autograd.Function run under no_grad: no argument that requires grad, no grad
    grad = torch.is_grad_enabled()
    if off := grad and reentrant and not any(isinstance(a, TensorVariable) and a.fake.requires_grad for a in args[1:]):
        out.set_grad_mode(tx, False)
    try:
        res = tx.call(args[0], list(args[1:]), kwargs)
    finally:
        torch._C._set_grad_enabled(grad)
    if off:
        out.set_grad_mode(tx, True)
    region = next(_region_ids)
    tagged, names = 0, frozenset(a.node.name for a in args[1:] if isinstance(a, TensorVariable))  # (saved by eager)
    # an operator (scan, cond) and its getitems stay untagged: make_fx would copy the tags onto the joint graph
    # torch's scan autograd partitions, whose min-cut then has no source (NetworkXError)
    hop = lambda n: isinstance(n, torch.fx.Node) and isinstance(n.target, torch._ops.HigherOrderOperator)  # noqa: E731
    for n in out.graph.nodes:  # a nested checkpoint's nodes join this region: eager recomputes them with the rest
        if n not in before and n.op in ("call_function", "call_method") and not hop(n) and not (
                n.target is operator.getitem and hop(n.args[0])):
            n.meta.setdefault("recompute", CheckpointPolicy.PREFER_RECOMPUTE)
            n.meta["ac_graph_id"] = region
            n.meta["ac_reentrant"] = n.meta.get("ac_reentrant", False) or reentrant
            n.meta["ac_args"] = n.meta.get("ac_args", frozenset()) | names
            tagged += 1
    _log_hop(tx, "checkpoint", region=region, nodes=tagged)
    return res


# --------------------------------------------------------------------------- nested_compile_region

def call_region(tx, fn_vt, args: list, kwargs: dict) -> VariableTracker:
    """A ``torch.compiler.nested_compile_region`` call: ``fn(*args, **kwargs)`` traced as a subgraph (tensor arguments
    are operands, what else it reads is lifted) called by :func:`coil.aot.regions.invoke_region`; a call whose subgraph
    equals an earlier one's (:func:`_region_key`) reuses it, so AOT compiles it once. Traced at every call: the Python
    state it reads (a rebound global) is in its graph. A body that cannot be a subgraph (side effect, write to an input,
    output aliasing an input) is inlined, logged as ``region_inlined``."""
    from coil.aot.regions import invoke_region
    out = tx.output
    graph, before, subs_before = out.graph, set(out.graph.nodes), set(out.subgraphs)
    operands = [a for a in args if isinstance(a, TensorVariable)]
    what = f"nested_compile_region {_fn_line(fn_vt)}"
    try:
        sub = trace_subgraph(tx, fn_vt, operands, what, alias_ok=False, call=(list(args), kwargs))
    except (Unsupported, UserError) as e:
        for n in reversed(list(graph.nodes)):  # what the failed trace added (inputs stay)
            if n not in before and n.op != "placeholder":
                graph.erase_node(n)
        for k in set(out.subgraphs) - subs_before:
            out.subgraphs.pop(k)
        trace.log("region_inlined", stage="capture", fn=what, reason=str(e).splitlines()[0],
                  where=str(tx.location()).splitlines()[0])
        return tx.call(fn_vt, list(args), kwargs)
    key = _region_key(sub.graph, out.subgraphs)
    regions = out.__dict__.setdefault("regions", {})   # key -> [subgraph name, calls]
    if (entry := regions.get(key)) is None:
        entry = regions[key] = [*_register(out, ("region", sub.graph)), 0]
    else:  # the same region again: this call's nested subgraphs are not needed
        for n in sub.graph.find_nodes(op="get_attr"):
            out.subgraphs.pop(n.target, None)
    entry[1] += 1
    items = _emit(tx, invoke_region, (out.graph.get_attr(entry[0]), entry[0], *sub.operand_nodes, *sub.lifted),
                  sub.out_fakes, "nested_compile_region", sub.lifted, call=entry[1])
    return _unflatten(items, sub.structure)


class _Same:
    """A key part compared by identity (an object without a value equality)."""

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


def _key_of(v):
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(_key_of(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple((k, _key_of(x)) for k, x in v.items()))
    if isinstance(v, (bool, int, float, complex, str, type(None), torch.dtype, torch.device,
                      torch.layout, torch.memory_format)):
        return (type(v).__name__, repr(v))
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", str(v))
    if isinstance(v, slice):
        return ("slice", _key_of((v.start, v.stop, v.step)))
    return _Same(v)   # a tensor constant, a callable: the same object only


def _input_key(v):
    # requires_grad is left out: AOT compiles a region for the union of its calls' needs
    if isinstance(v, torch.Tensor):
        return ("tensor", str(tuple(v.shape)), str(v.stride()), str(v.storage_offset()), v.dtype, v.device)
    return _key_of(v)


def _region_key(sg: torch.fx.Graph, subs: dict) -> tuple:
    """What makes two region calls the same compiled code: each node's op, target and arguments (other nodes
    by position, constants by value, other objects by identity), the inputs' metadata (shape, stride, offset,
    dtype, device) and nested subgraphs' keys. Node names and stack traces are left out."""
    pos: dict = {}
    items = []
    for i, n in enumerate(sg.nodes):
        pos[n] = ("node", i)
        if n.op == "placeholder":
            items.append(("in", _input_key(n.meta.get("example_value"))))
        elif n.op == "get_attr" and n.target in subs:
            items.append(("sub", _region_key(subs[n.target].graph, subs)))
        else:
            args = torch.fx.node.map_arg((n.args, n.kwargs), pos.__getitem__)
            target = n.target if isinstance(n.target, str) else _Same(n.target)
            items.append((n.op, target, _key_of(args), str(n.meta.get("recompute"))))
    return tuple(items)


_HANDLERS: dict = {}


def hop_handler(value):
    """The capture handler for a higher-order callable ``value``, or None."""
    if not _HANDLERS:
        # the public operator functions of torch._higher_order_ops (scan, associative_scan, ...) not captured: a graph
        # break naming them (not their helpers, e.g. nested_compile_region's wrapper, which is inlined)
        for name, v in vars(hops).items():
            if not name.startswith("_") and isinstance(v, types.FunctionType):
                _HANDLERS[v] = functools.partial(_not_captured, v)
        _HANDLERS.update({torch.cond: call_cond, hops.cond: call_cond, hops.while_loop: call_while_loop,
                          ckpt.checkpoint: call_checkpoint, hops.map: call_map, hops.scan: call_scan,
                          hops.associative_scan: call_associative_scan})
    try:
        return _HANDLERS.get(value)
    except TypeError:  # unhashable
        return None


def _not_captured(fn, tx, args, kwargs):
    """Handler of the operators ``fn`` of ``torch._higher_order_ops`` coil does not capture."""
    raise Unsupported(f"higher-order operator {getattr(fn, '__qualname__', fn)} is not captured: it runs outside the "
                      "graph", hint="torch.cond and while_loop are captured (docs/hops.md)")


class HigherOrderVariable(KnownCallableVariable):
    """A higher-order callable (``torch.cond``, ``checkpoint``): calls go to its handler."""

    def __init__(self, fn, source=None):
        super().__init__(fn, source)
        self.handler = hop_handler(fn)

    def call_function(self, tx, args, kwargs):
        return self.handler(tx, list(args), dict(kwargs))

