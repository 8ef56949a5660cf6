"""Python numbers that torch's capture passes as 0-d tensors are read as tensors.

Traced to ATen, such a float (``LayerNorm.eps``, a sampling temperature) is ``s = aten._local_scalar_dense(t)`` passed
as a Scalar argument, which a code generator would specialize (a recompile per value). :func:`tensorize_scalar_reads`
rewrites each use to read the tensor, cast to the dtype the op computes a Python number in, and checks each rewrite on
fake tensors; what cannot be rewritten keeps the SymFloat (logged ``aot_scalar_inputs``). docs/aot.md, "Scalar reads".
"""
from __future__ import annotations

import operator
from typing import Any, Optional

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
from torch._subclasses.fake_tensor import FakeTensor

from coil import trace

aten = torch.ops.aten

_SYM_TYPES = (torch.SymFloat, torch.SymInt, torch.SymBool)
#: Python arithmetic on SymFloats (as make_fx records it) → ATen op on 0-d float64 tensors
#: (``math.sqrt(2.0 / math.pi)`` in GPT-2's gelu: Dynamo passes ``math.pi`` as a tensor)
_ARITH = {operator.add: aten.add.Tensor, operator.sub: aten.sub.Tensor, operator.mul: aten.mul.Tensor,
          operator.truediv: aten.div.Tensor, operator.pow: aten.pow.Tensor_Tensor, operator.neg: aten.neg.default,
          torch._sym_sqrt: aten.sqrt.default, torch._sym_sin: aten.sin.default, torch._sym_cos: aten.cos.default,
          torch._sym_tan: aten.tan.default, torch._sym_tanh: aten.tanh.default, torch._sym_log2: aten.log2.default,
          torch.sym_float: aten.clone.default,  # (its operand is cast to float64 already)
          operator.abs: aten.abs.default, torch.sym_min: aten.minimum.default, torch.sym_max: aten.maximum.default}
#: ops of _ARITH whose operands must all be tensors (a number is made a 0-d float64 tensor)
_TENSORS_ONLY = {torch.sym_min, torch.sym_max}
#: comparisons of symbolic numbers (``x * (v > 0.5)``, ``v`` from ``.item()``) → a 0-d bool tensor
_COMPARE = {operator.gt: aten.gt, operator.lt: aten.lt, operator.ge: aten.ge, operator.le: aten.le,
            operator.eq: aten.eq, operator.ne: aten.ne}
_SAMPLE = {torch.SymFloat: 1.0, torch.SymInt: 1, torch.SymBool: True}
#: factories of a tensor filled with the number (rewritten whole: _Rewriter._rewrite_factory)
_FACTORIES = {aten.scalar_tensor.default, aten.full.default, aten.new_full.default, aten.full_like.default}
_ALPHA_OPS = {aten.add.Tensor, aten.sub.Tensor}


def tensorize_scalar_reads(gm: torch.fx.GraphModule, graph: str) -> dict:
    """Rewrite the uses of ``aten._local_scalar_dense`` of 0-d tensors in ``gm`` (in place) to read the tensor
    (module docstring). ``graph`` names the graph in the log. Returns ``{"tensorized": [op, ...],
    "specialized": [op, ...]}`` (empty lists when the graph reads no scalar)."""
    reads = [n for n in gm.graph.nodes if _is_scalar_read(n)]
    if not reads and not any(isinstance(n.meta.get("val"), torch.SymFloat) for n in gm.graph.nodes):
        return {"tensorized": [], "specialized": []}
    rw = _Rewriter(gm)
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
                and node.target is not aten._local_scalar_dense.default \
                and any(rw.tensor_of(a) is not None for a in _flat_args(node)):
            rw.rewrite_use(node)
    for node in reversed(list(gm.graph.nodes)):  # reads, arithmetic, casts left unused
        if node.op == "call_function" and not node.users and (
                node in rw.made or _is_scalar_read(node) or rw.exact.get(node) is not None):
            gm.graph.erase_node(node)
    left: set = set()  # symbolic numbers still computed from a read
    for n in gm.graph.nodes:
        if _is_scalar_read(n) or (_is_sym(n) and any(a in left for a in _flat_args(n))):
            left.add(n)
    specialized = sorted({str(u.target) for n in left for u in n.users if u not in left})
    gm.graph.lint()
    gm.recompile()
    out = {"tensorized": rw.tensorized, "specialized": specialized}
    trace.log("aot_scalar_inputs", stage="aot", graph=graph, reads=len(reads), **out)
    return out


def _is_sym(n: Any) -> bool:
    return isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), _SYM_TYPES)


def _is_scalar_read(n: torch.fx.Node) -> bool:
    if n.op != "call_function" or n.target is not aten._local_scalar_dense.default or not _is_sym(n):
        return False
    src = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
    return isinstance(src, torch.Tensor) and src.dim() == 0


def _flat_args(node: torch.fx.Node) -> list:
    return list(node.args) + list(node.kwargs.values())


def _is_tensor_type(t: str) -> bool:
    return t in ("Tensor", "Optional[Tensor]")


def _is_number_type(t: str) -> bool:
    return t in ("number", "Optional[number]")


def _tensor_overload(op: torch._ops.OpOverload, positions: set, absent: set) -> Optional[torch._ops.OpOverload]:
    """The overload of ``op``'s packet with the same arguments, except a Tensor where ``op`` takes a Scalar at each of
    ``positions`` (argument indices); arguments in ``absent`` (not given, or None) may have another optional type."""
    args = op._schema.arguments
    if all(_is_tensor_type(str(args[i].type)) for i in positions):
        return op
    packet = op.overloadpacket
    for name in packet.overloads():
        cand = getattr(packet, name)
        cargs = cand._schema.arguments
        if cand._schema.is_mutable or len(cargs) != len(args) or len(cand._schema.returns) != len(op._schema.returns):
            continue
        ok = True
        for i, (a, c) in enumerate(zip(args, cargs)):
            ta, tc = str(a.type), str(c.type)
            if a.name != c.name:
                ok = False
            elif i in positions:
                ok = _is_tensor_type(tc) and (_is_tensor_type(ta) or _is_number_type(ta))
            elif a.name in absent:  # clamp(x, min=s): max=None is either type
                ok = ta == tc or (ta.startswith("Optional[") and tc.startswith("Optional["))
            else:
                ok = ta == tc
            if not ok:
                break
        if ok:
            return cand
    return None


def _same_meta(a: Any, b: Any) -> bool:
    def meta(t):
        return (t.dtype, t.device, str(tuple(t.shape)), str(t.stride())) if isinstance(t, torch.Tensor) else None
    (fa, sa), (fb, sb) = pytree.tree_flatten(a), pytree.tree_flatten(b)
    return sa == sb and all(meta(x) == meta(y) for x, y in zip(fa, fb))


class _Rewriter:
    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        #: SymFloat/SymInt node → node of a 0-d tensor holding exactly its value
        self.exact: dict = {}
        #: (tensor node, dtype) → its cast; and every node this pass made
        self.casts: dict = {}
        self.made: set = set()
        self.tensorized: list = []
        self.fake_mode = next((v.fake_mode for n in gm.graph.nodes
                               if isinstance(v := n.meta.get("val"), FakeTensor)), None)

    def _new(self, before: torch.fx.Node, target, args, kwargs=None) -> torch.fx.Node:
        with self.fake_mode:
            val = target(*[_val(a) for a in args], **{k: _val(v) for k, v in (kwargs or {}).items()})
        with self.gm.graph.inserting_before(before):
            n = self.gm.graph.call_function(target, tuple(args), dict(kwargs or {}))
        n.meta["val"] = val
        if before.meta.get("stack_trace"):
            n.meta["stack_trace"] = before.meta["stack_trace"]
        self.made.add(n)
        return n

    def tensor_of(self, n: Any) -> Optional[torch.fx.Node]:
        """A node holding the value of the symbolic number ``n`` as a 0-d tensor (float64
        for a SymFloat made by arithmetic), or None when it cannot be had."""
        if not _is_sym(n) or self.fake_mode is None:
            return None
        if n in self.exact:
            return self.exact[n]
        out = None
        if _is_scalar_read(n):  # (detached: .item() ends the gradient, which the tensor would carry in a joint)
            out = self._new(n, aten.detach.default, (n.args[0],))
        elif n.op == "call_function" and (n.target in _ARITH and isinstance(n.meta["val"], torch.SymFloat)
                                          or n.target in _COMPARE and isinstance(n.meta["val"], torch.SymBool)):
            ops = []
            # Python compares two ints exactly, anything else as doubles (int64 beside a float would be float32)
            exact_ints = n.target in _COMPARE and all(isinstance(_val(a), (int, torch.SymInt)) for a in n.args)
            for a in n.args:
                t = self.tensor_of(a)
                if t is None and _is_sym(a) and isinstance(a.meta["val"], torch.SymInt):  # a size
                    t = self._new(n, aten.scalar_tensor.default, (a,), {"dtype": torch.float64})
                if t is None and not isinstance(a, (int, float)) or isinstance(a, bool):
                    ops = None
                    break
                ops.append(a if t is None or exact_ints else self.cast(t, torch.float64, n))
            if ops is not None and n.target in _TENSORS_ONLY:     # min(v, 2.0): both 0-d float64 tensors
                ops = [o if isinstance(o, torch.fx.Node) else
                       self._new(n, aten.scalar_tensor.default, (float(o),), {"dtype": torch.float64}) for o in ops]
            if ops is not None and not any(isinstance(o, torch.fx.Node) for o in ops[:1]):
                # a number first (2.0 / s): make it a 0-d float64 tensor too
                ops[0] = self._new(n, aten.scalar_tensor.default, (float(ops[0]),), {"dtype": torch.float64})
            if ops is not None:
                scalar = len(ops) > 1 and not isinstance(ops[1], torch.fx.Node)
                if n.target in _COMPARE:
                    target = _COMPARE[n.target].Scalar if scalar else _COMPARE[n.target].Tensor
                else:
                    target = aten.pow.Tensor_Scalar if scalar and n.target is operator.pow else _ARITH[n.target]
                try:
                    out = self._new(n, target, tuple(ops))
                except Exception:  # noqa: BLE001 - keep the SymFloat (specialized later)
                    out = None
        self.exact[n] = out
        return out

    def cast(self, t: torch.fx.Node, dtype: torch.dtype, before: torch.fx.Node) -> torch.fx.Node:
        if t.meta["val"].dtype == dtype:
            return t
        if (key := (t, dtype)) not in self.casts:
            self.casts[key] = self._new(before, aten._to_copy.default, (t,), {"dtype": dtype})
        return self.casts[key]

    def rewrite_use(self, node: torch.fx.Node) -> None:
        """Replace the symbolic-number arguments of ATen op ``node`` by 0-d tensors."""
        op = node.target
        if (schema := op._schema).is_mutable:
            return
        names = [a.name for a in schema.arguments]
        given = dict(zip(names, node.args))
        given.update(node.kwargs)
        positions = {i for i, a in enumerate(names) if a in given and self.tensor_of(given[a]) is not None}
        if op in _FACTORIES:
            return self._rewrite_factory(node, self.tensor_of(given[names[min(positions)]]))
        if op in _ALPHA_OPS and positions == {names.index("alpha")}:
            return self._rewrite_alpha(node, given)
        absent = {a for a in names if given.get(a) is None}
        consts: set = set()  # clamp(x, s, 10.0): the constant bound is made a 0-d tensor too
        if (new_op := _tensor_overload(op, positions, absent)) is None:
            consts = {i for i, a in enumerate(names) if i not in positions and type(given.get(a)) in (int, float)
                      and _is_number_type(str(schema.arguments[i].type))}
            if not consts or (new_op := _tensor_overload(op, positions | consts, absent)) is None:
                return
        # the dtype a Python number of that kind becomes inside the op
        operands = [_val(given[a]) for i, a in enumerate(names) if a in given and i not in positions
                    and isinstance(_val(given[a]), torch.Tensor)]
        operands += [_SAMPLE[type(given[names[i]].meta["val"])] for i in positions]
        operands += [given[names[i]] for i in consts]
        try:
            compute, _ = elementwise_dtypes(*operands, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
        except Exception:  # noqa: BLE001 - no tensor operand: leave it
            return
        if not self._same_device(node, [self.tensor_of(given[names[i]]) for i in positions]):
            return
        def build():
            new = dict(given)
            for i in positions:
                new[names[i]] = self.cast(self.tensor_of(given[names[i]]), compute, node)
            for i in consts:
                new[names[i]] = self._new(node, aten.scalar_tensor.default, (given[names[i]],), {"dtype": compute})
            args, kwargs = _call_args(new_op, new)
            with self.fake_mode:
                val = new_op(*[_val(a) for a in args], **{k: _val(v) for k, v in kwargs.items()})
            return (args, kwargs), val
        if (done := self._attempt(build, node.meta.get("val"))) is None:
            return
        node.target, (node.args, node.kwargs) = new_op, done
        self.tensorized.append(str(op))

    def _same_device(self, node: torch.fx.Node, tensors: list) -> bool:
        """Every tensor ``node`` reads or makes is on the device of the 0-d ``tensors`` (a CPU tensor from a Python
        float): a CUDA kernel cannot read a CPU buffer, so elsewhere the number stays a (specialized) SymFloat."""
        vals = [_val(a) for a in _flat_args(node)] + [node.meta.get("val")]
        devs = {v.device for v in pytree.tree_leaves(vals) if isinstance(v, torch.Tensor)}
        return all(devs <= {t.meta["val"].device} for t in tensors)

    def _attempt(self, build, expected) -> Any:
        """``build()`` -> ``(result, fake value)``, which adds nodes for one rewrite; the
        result if that ran and its fake value has ``expected``'s dtype, sizes and strides,
        else None with the nodes it added removed (the use keeps its SymFloat)."""
        made_before = set(self.made)
        try:
            result, val = build()
            ok = _same_meta(val, expected)
        except Exception:  # noqa: BLE001 - the rewrite does not apply here
            ok = False
        if not ok:
            self._drop_made_since(made_before)
            return None
        return result

    def _drop_made_since(self, before: set) -> None:
        for n in reversed(list(self.gm.graph.nodes)):  # nodes made for one failed rewrite
            if n in self.made and n not in before and not n.users:
                self.gm.graph.erase_node(n)
                self.made.discard(n)
                self.casts = {k: v for k, v in self.casts.items() if v is not n}

    def _rewrite_alpha(self, node: torch.fx.Node, given: dict) -> None:
        """``add(x, y, alpha=s)`` → ``add(x, y * s)`` (``sub`` alike): alpha is a Scalar
        in every overload (an optimizer step's ``p.add_(g, alpha=-lr)``)."""
        y, t = given["other"], self.tensor_of(given["alpha"])
        if not isinstance(y, torch.fx.Node) or not isinstance(_val(y), torch.Tensor) \
                or not self._same_device(node, [t]):
            return
        compute, _ = elementwise_dtypes(_val(y), _SAMPLE[type(_val(given["alpha"]))],
                                        type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
        x, f64, out = given["self"], torch.float64, _val(node).dtype
        fma = all(_val(v).dtype in (torch.float32, f64) for v in (x, y, node))

        def build():  # in float64, rounded once as eager's fused multiply-add (ir's add with alpha alike)
            ts = self.cast(self.cast(t, out if fma else compute, node), f64 if fma else compute, node)
            scaled = self._new(node, aten.mul.Tensor, (self.cast(y, f64, node) if fma else y, ts))
            if fma:
                scaled = self._new(node, node.target, (self.cast(x, f64, node), scaled))
            with self.fake_mode:
                return scaled, scaled.meta["val"].to(out) if fma else node.target(_val(x), scaled.meta["val"])
        if (scaled := self._attempt(build, node.meta.get("val"))) is None:
            return
        self.tensorized.append(str(node.target))
        node.target, node.args, node.kwargs = (aten._to_copy.default, (scaled,), {"dtype": out}) if fma else (
            node.target, (x, scaled), {})

    def _rewrite_factory(self, node: torch.fx.Node, t: torch.fx.Node) -> None:
        """``scalar_tensor(s)`` → a copy of the 0-d tensor in the dtype asked for; ``full(size, s)`` / ``new_full(x,
        size, s)`` → that copy expanded to ``size``, made contiguous; ``full_like(x, s)`` → ``ones_like(x) * copy``."""
        if not isinstance(out := node.meta.get("val"), torch.Tensor) or not self._same_device(node, [t]):
            return
        def build():
            rep = self._new(node, aten._to_copy.default, (t,), {"dtype": out.dtype})
            if node.target is aten.full_like.default:  # 1 * v is v (-0.0, inf, nan, ints, bools)
                ones = self._new(node, aten.ones_like.default, (node.args[0],), dict(node.kwargs))
                rep = self._new(node, aten.mul.Tensor, (ones, rep))
            elif node.target is not aten.scalar_tensor.default:
                size = node.args[0] if node.target is aten.full.default else node.args[1]
                rep = self._new(node, aten.expand.default, (rep, size))
                rep = self._new(node, aten.clone.default, (rep,), {"memory_format": torch.contiguous_format})
            return rep, rep.meta["val"]
        if (rep := self._attempt(build, out)) is None:
            return
        self.tensorized.append(str(node.target))
        node.replace_all_uses_with(rep)
        self.gm.graph.erase_node(node)


def _call_args(op: torch._ops.OpOverload, given: dict) -> tuple:
    """Positional arguments up to the last one given (defaults in between), keyword-only ones as keywords."""
    pos_args = [a for a in op._schema.arguments if not a.kwarg_only]
    last = max((i for i, a in enumerate(pos_args) if a.name in given), default=-1)
    args = tuple(given[a.name] if a.name in given else a.default_value for a in pos_args[:last + 1])
    return args, {a.name: given[a.name] for a in op._schema.arguments if a.kwarg_only and a.name in given}


def _val(a: Any) -> Any:
    if isinstance(a, torch.fx.Node):
        return a.meta["val"]
    return type(a)(_val(x) for x in a) if isinstance(a, (list, tuple)) else a
