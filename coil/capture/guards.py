"""Guards: what a captured graph assumed, as one generated Python function.

A :class:`GuardSet` collects boolean Python expressions over :mod:`.source` expressions while a frame is translated,
then :meth:`GuardSet.build` turns them into ``___guard(<args>, ___f)``: one ``if`` per tensor, common source prefixes
read once into locals (:func:`_emit_guards`), tensors of exact type ``Tensor``/``Parameter`` with static sizes checked
in C++ by batch (:meth:`GuardSet._batch`). :meth:`GuardSet.failures` says which guards failed on a recompile.
docs/capture.md ("Guards") gives the design, docs/dynamic_shapes.md ("Shape guards") the symbolic part.
"""
from __future__ import annotations

import ast
import builtins
import types
from typing import Any, Optional

import torch
from torch._prims_common import make_contiguous_strides_for

from coil import trace
from coil.capture.source import iter_rest
from coil.capture.dynamic import _LOCAL, _PROP, readable
from coil.config import config

try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:    # a torch without it: every tensor is checked in Python
    _TensorGuards = None


#: The ``group`` of guards generated after all others, in one ``if`` (a dynamic tensor's
#: ``is_contiguous()``, once its batched C++ check passed)
_AFTER = "___after"
_NEVER = types.SimpleNamespace(check=lambda *tensors: False)  # a memo's `last` before any add


class _ShapeMemo:
    """The exact sizes and strides of the last :data:`SIZE` argument lists that passed a dynamic entry's shape
    guards, each as a C++ ``TensorGuards`` (dtype, device, requires_grad, dispatch keys, sizes and strides). A
    call whose tensors match one skips the Python reading of sizes and the relations: they held for those
    sizes. A miss costs one failing C++ check per kept list, and an add about 2.4 µs; after :data:`ADDS` adds
    (sizes that keep changing: a decode loop's growing length) the memo stops keeping. It keeps a dynamic
    guard's per-call cost near a static one's (``benchmarks/dynamic_guard_cost.py``)."""

    SIZE, ADDS = 4, 16

    def __init__(self):
        self.last, self.kept, self.adds = _NEVER, [], 0

    def hit(self, *tensors) -> bool:
        for c in self.kept:
            if c.check(*tensors):
                self.last = c
                return True
        return False

    def add(self, *tensors) -> None:
        self.adds += 1
        if self.adds > self.ADDS:
            self.last, self.kept = _NEVER, []
            return
        self.last = _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                                  dynamic_dims_strides=[list(t.stride()) for t in tensors])
        self.kept = [self.last] + self.kept[:self.SIZE - 1]


class Guard:
    """One check. ``code`` is what :meth:`GuardSet.failures` evaluates (and names); ``fast`` is an equivalent expression
    the generated function uses instead, valid only after the guards before it in the same ``group`` passed (e.g.
    ``t.is_contiguous()`` for ``t.stride() == (8, 1)`` once ``t.shape == (4, 8)`` held); ``group`` joins the consecutive
    checks of one tensor into one generated ``if``; ``batch`` names the C++ tensor check that replaces it in the
    generated function (None: generated); ``note`` says in words what a failure means (recompile reasons)."""
    __slots__ = ("code", "value_expr", "expected", "src", "fast", "group", "batch", "note")

    def __init__(self, code: str, value_expr: Optional[str], expected: Any, src: Optional[str] = None,
                 fast: Optional[str] = None, group: Optional[str] = None,
                 batch: Optional[str] = None, note: Optional[str] = None):
        self.code, self.value_expr, self.expected, self.src = code, value_expr, expected, src
        self.fast, self.group, self.batch, self.note = fast, group, batch, note


class Hoister:
    """Common-prefix elimination for source expressions in generated code: each distinct source gets a local
    variable, computed from its parent expression's local (hoisted first, recursively), so
    ``self._modules['h']._modules['0']._parameters['weight']`` costs one dict lookup once
    ``self._modules['h']._modules['0']`` is known, and a module tree's parameters cost one lookup per tree
    node, not one walk from the root each (the entry of a MobileNet reads 267 parameters and buffers)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.names: dict[str, str] = {}

    def hoist(self, expr: str, lines: list, indent: str = "    ") -> str:
        if expr in self.names:
            return self.names[expr]
        if expr.isidentifier():
            return expr
        rhs = expr
        try:
            node = ast.parse(expr, mode="eval").body
        except SyntaxError:
            node = None
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            if (parent := ast.get_source_segment(expr, node.value)) is not None and expr.startswith(parent):
                rhs = self.hoist(parent, lines, indent) + expr[len(parent):]
        name = f"{self.prefix}{len(self.names)}"
        lines.append(f"{indent}{name} = {rhs}")
        self.names[expr] = name
        return name


class GuardSet:
    """Ordered, de-duplicated guard expressions plus the namespace they need."""

    def __init__(self, global_ns: dict):
        self.guards: list[Guard] = []
        self._seen: set[str] = set()
        self.ns: dict[str, Any] = {
            "___G": global_ns, "___Tensor": torch.Tensor, "___Parameter": torch.nn.Parameter, "___builtins": builtins,
            "___grad_enabled": torch.is_grad_enabled, "___id": id, "___keys": _dispatch_keys, "___iter_rest": iter_rest,
            "___length_hint": __import__("operator").length_hint,
            "math": __import__("math"), "torch": torch}  # shape guards on floats (math.isnan, torch.sym_float(...))
        self._batched: dict[str, torch.Tensor] = {}   # src -> example tensor, until build
        self._batch_dims: dict[str, tuple] = {}  # src -> (sizes, strides), None: symbolic
        self._notes: dict[str, str] = {}    # src -> comment on its batched check
        self._batch_srcs: dict[str, list] = {}  # batch -> the sources it checks, in order
        self._const_ids: dict[int, str] = {}
        self.locals, self.state = {}, None  # source expression -> guard local; the fast guard's state (kept)
        # shape guards of a dynamic entry (coil/capture/dynamic.py): locals reading sizes,
        # then conditions over them; checked after every other guard
        self.shape_prelude: list[str] = []
        self.shape_exprs: list[str] = []
        self.shape_names: dict[str, str] = {}
        self.contiguous: set = set()    # dynamic tensors checked with is_contiguous()

    def set_shape_guards(self, prelude: list, exprs: list, names: dict) -> None:
        """The ShapeEnv's relations (``2 <= ___z0``, ``___z0 == ___z1``) and the
        ``prelude`` lines reading the sizes they name into locals ``___zN``."""
        self.shape_prelude, self.shape_exprs, self.shape_names = list(prelude), list(exprs), dict(names)

    def const(self, obj: Any) -> str:
        """A namespace name holding ``obj`` (for ``is`` comparisons)."""
        key = id(obj)
        if (name := self._const_ids.get(key)) is None:
            name = f"___c{len(self._const_ids)}"
            self._const_ids[key] = name
            self.ns[name] = obj
        return name

    def add(self, code: str, value_expr: Optional[str] = None, expected: Any = None,
            src: Optional[str] = None, fast: Optional[str] = None,
            group: Optional[str] = None, batch: Optional[str] = None, note: Optional[str] = None) -> None:
        """Add ``code`` (a boolean expression). ``value_expr``/``expected`` describe the guarded value for
        recompile messages; ``src`` is the source expression the code reads (hoisted into a local variable in
        the generated function); ``fast``, ``group``, ``batch`` and ``note``: see :class:`Guard`."""
        if code in self._seen:
            return
        self._seen.add(code)
        self.guards.append(Guard(code, value_expr, expected, src, fast, group, batch, note))

    def source_text(self, argnames: list[str]) -> str:
        """The guard function's source (see :func:`_emit_guards` for what is hoisted)."""
        params = ", ".join(list(argnames) + ["___f"])
        lines = [f"def ___guard({params}):"]
        self.locals = _emit_guards([g for g in self.guards if g.group != _AFTER], lines, self._notes)
        late = [g.code for g in self.guards if g.group == _AFTER]
        memo, ind = self._shape_memo(), "    "
        if late and not memo:  # else under the memo
            lines.append(f"    if not ({' and '.join(late)}): return False")
        if self.shape_exprs:
            if memo:  # sizes and strides that passed before pass again (_ShapeMemo)
                lines.append(f"    if not (___memo.last.check({memo}) or ___memo.hit({memo})):")
                ind = "        "
            if memo and late:
                lines.append(f"{ind}if not ({' and '.join(late)}): return False")
            lines.extend(f"{ind}{ln}" for ln in self.shape_prelude)
            cond = " and ".join(f"({e})" for e in self.shape_exprs)
            lines.append(f"{ind}if not ({cond}): return False")
            if memo:
                lines.append(f"{ind}___memo.add({memo})")
        lines.append("    return True")
        return "\n".join(lines) + "\n"

    def build(self, argnames: list[str], label: str = ""):
        """Compile the guard function; returns ``(fn, source_text)``. With ``config.guard_versions``, ``fn`` is the fast
        guard of :mod:`.guard_versions` (its source is the compile log's artifact ``guards_fast``)."""
        from coil.capture.guard_versions import fast_guard
        if self._batched:
            self._batch()
        src = self.source_text(argnames)
        ns = dict(self.ns)
        fast = fast_guard(src, ns, label) if config.guard_versions else None
        if fast is None:
            exec(compile(src, "<coil guards>", "exec"), ns)
        self.state = ns.get("___vstate")
        return (ns["___guard"] if fast is None else fast), src

    def kept(self, exprs: list) -> dict:
        """``{expr: position in the snapshot cache}`` of the source expressions ``exprs`` the fast guard keeps."""
        at = {n: k for k, n in enumerate(getattr(self.state, "names", ()))}
        return {e: at[self.locals[e]] for e in exprs if self.locals.get(e) in at}

    def _shape_memo(self) -> str:
        """The arguments of the ``___tensors_args`` check (``"x, y"``) when every size the
        shape guards read is a size or stride of one of them (then their truth follows
        from those tensors' exact sizes and strides: :class:`_ShapeMemo`); else ``""``."""
        srcs = self._batch_srcs.get("___tensors_args", [])
        props = [_PROP.match(self.shape_names[n]) for n in set(_LOCAL.findall(" ".join(self.shape_exprs)))]
        if not self.shape_exprs or not srcs or not all(m and m.group(1) in srcs for m in props):
            return ""
        self.ns.setdefault("___memo", _ShapeMemo())
        return ", ".join(srcs)

    def _batch(self) -> None:
        """One ``TensorGuards`` per batch over the batched tensors, in guard order, built from the example
        tensors (then dropped): it checks the exact Python type, the dispatch keys under the thread's dispatch
        state (device type, layout, inference, conj/neg bits, modes), dtype, device index, requires_grad,
        sizes and strides. The keys are also added as a guard after each tensor's others (``___keys(t) ==
        ...``, for recompile reasons). A batch whose check cannot be built, or rejects its own examples, is
        generated in Python as before (logged: ``guard_batch``)."""
        order: dict[str, list[str]] = {}
        for g in self.guards:
            if g.batch is not None and g.src not in order.setdefault(g.batch, []):
                order[g.batch].append(g.src)
        keys: dict[str, tuple] = {}
        for name, srcs in order.items():
            ts = [self._batched[s] for s in srcs]
            dims = [self._batch_dims.get(s, (list(t.shape), list(t.stride()))) for s, t in zip(srcs, ts)]
            try:
                check = _TensorGuards(*ts, dynamic_dims_sizes=[d[0] for d in dims],
                                      dynamic_dims_strides=[d[1] for d in dims])
                why = None if check.check(*ts) else "rejects its example tensors"
            except Exception as e:  # noqa: BLE001 - checked in Python instead
                why = f"{type(e).__name__}: {e}"
            trace.log("guard_batch", stage="capture", batch=name, tensors=len(ts),
                      used=why is None, reason=why or "tensor checks run in C++, one call")
            if why is not None:
                for g in self.guards:
                    if g.batch == name:
                        g.batch = None
                continue
            self.ns[name], self._batch_srcs[name] = check, srcs
            for i, (s, t) in enumerate(zip(srcs, ts)):
                keys[s] = (name, _dispatch_keys(t))
                self._notes[s] = (f"{name}[{i}], {type(t).__name__} {t.dtype} {t.device} {tuple(t.shape)} stride "
                                  f"{t.stride()} requires_grad={t.requires_grad}")
        self._batched.clear()
        last = {g.src: i for i, g in enumerate(self.guards) if g.batch is not None}
        for s in sorted(keys, key=last.get, reverse=True):    # inserting from the end
            name, ks = keys[s]
            code = f"___keys({s}) == {self.const(ks)}"
            self._seen.add(code)
            self.guards.insert(last[s] + 1, Guard(code, f"___keys({s})", ks, s, batch=name))

    def failures(self, argnames: list[str], values: tuple, limit: int = 16) -> list[dict]:
        """The guards that fail for ``values`` (at most ``limit``), each a dict: ``guard`` (its code),
        ``value`` (the expression it checks, or None), ``expected`` and ``got`` (reprs), ``text`` (one line
        for people). A guard that raises counts as failed (``got`` names the exception)."""
        ns = dict(self.ns)
        ns.update(zip(list(argnames) + ["___f"], values))
        out: list[dict] = []
        for g in self.guards:
            try:
                ok = eval(g.code, ns)
            except Exception as e:  # noqa: BLE001 - a failing access is a failed guard
                out.append({"guard": g.code, "value": g.value_expr, "expected": repr(g.expected),
                            "got": f"<raised {type(e).__name__}: {e}>",
                            "text": f"{g.code}  (raised {type(e).__name__}: {e})"})
            else:
                if ok:
                    continue
                text, got = g.code, None
                if g.value_expr is not None:
                    try:
                        got = repr(eval(g.value_expr, ns))
                    except Exception as e:  # noqa: BLE001
                        got = f"<{type(e).__name__}>"
                    text += f"  ({g.value_expr}: expected {g.expected!r}, got {got})"
                if g.note:
                    text += f"  ({g.note})"
                out.append({"guard": g.code, "value": g.value_expr, "expected": repr(g.expected),
                            "got": got, "text": text})
            if len(out) >= limit:
                break
        if len(out) < limit:
            out.extend(self._batch_failures(ns, limit - len(out)))
        if self.shape_exprs and len(out) < limit:
            out.extend(self._shape_failures(ns, limit - len(out)))
        return out

    def _batch_failures(self, ns: dict, limit: int) -> list[dict]:
        """Arguments that are one tensor where the C++ batch check (:meth:`_batch`) was built for distinct ones: it
        refuses a tensor passed twice (``f(a, a)`` after ``f(a, b)``), which no per-tensor guard says."""
        out: list[dict] = []
        for name, srcs in self._batch_srcs.items():
            try:
                vals = [eval(e, ns) for e in srcs]
            except Exception:  # noqa: BLE001 - a failed access is reported by its own guard
                continue
            for j, e in enumerate(srcs):
                first = next((srcs[i] for i in range(j) if vals[i] is vals[j]), None)
                if first is not None and len(out) < limit:
                    text = f"{first} and {e} are the same tensor on this call (they were distinct when compiled)"
                    out.append({"guard": f"{name}.check({', '.join(srcs)})", "value": f"{e} is {first}",
                                "expected": "False", "got": "True", "text": text})
        return out

    def _shape_failures(self, ns: dict, limit: int) -> list[dict]:
        try:
            for ln in self.shape_prelude:
                exec(ln, ns)
        except Exception as e:  # noqa: BLE001 - an earlier guard failed already
            return [{"guard": "shape guards", "value": None, "expected": "True",
                     "got": f"<raised {type(e).__name__}: {e}>",
                     "text": f"shape guards (raised {type(e).__name__}: {e})"}]
        out = []
        for e in self.shape_exprs:
            try:
                ok = eval(e, ns)
            except Exception:  # noqa: BLE001
                ok = False
            if not ok:
                text = readable(e, self.shape_names)
                got = {self.shape_names[n]: ns.get(n) for n in sorted(set(__import__("re").findall(r"___z\d+", e)))}
                out.append({"guard": text, "value": None, "expected": "True", "got": repr(got),
                            "text": f"{text}  (sizes: {got})"})
                if len(out) >= limit:
                    break
        return out


def _dispatch_keys(t: torch.Tensor):
    """``t``'s dispatch keys under this thread's included/excluded keys: what
    ``TensorGuards`` compares (so an inference tensor, or a conj view, differs)."""
    return (torch._C._dispatch_keys(t) | torch._C._dispatch_tls_local_include_set()) - \
        torch._C._dispatch_tls_local_exclude_set()


def tensor_guard(gs: GuardSet, expr: str, t: torch.Tensor, fake=None) -> None:
    """Guard a tensor's type, dtype, device, sizes, strides and requires_grad.

    The six checks stay separate guards (recompile reasons name the one that failed) but are generated as one ``if``
    (``group``). Strides: for an exact ``torch.Tensor`` / ``nn.Parameter`` whose sizes are all >= 2 and whose strides
    are the contiguous ones, the generated code asks ``t.is_contiguous()`` (no tuple built) after the type and shape
    checks passed: with those sizes, "contiguous" holds exactly when every stride is the product of the later sizes
    (c10's ``compute_contiguous``), i.e. the same test. The layout is checked too: an MKLDNN tensor (type
    ``torch.Tensor``) says contiguous with strides ``(1, 0)``.

    An exact ``Tensor``/``Parameter`` of strided layout is batched instead (``batch``: see :meth:`GuardSet._batch`):
    frame arguments and globals and their items (no attribute step in ``expr``) in one check, emitted once the last of
    them is fetched, so a changed input fails before module state is read; the rest in another.

    With symbolic sizes or strides (``fake``), the rank and the static sizes and strides are checked here, the symbolic
    ones by the shape guards (``GuardSet.shape_exprs``, from the ShapeEnv); a contiguous input whose sizes are all >= 2
    (symbols are >= 2 by the shape guards) is checked with ``is_contiguous()``, symbolic sizes or not."""
    sym = fake is not None and _symbolic(fake)
    shape, stride = ((tuple(None if isinstance(s, torch.SymInt) else int(s) for s in v) for v in (fake.shape,
                     fake.stride())) if sym else (tuple(t.shape), tuple(t.stride())))
    exact = type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout is torch.strided
    batch = None
    if exact and _TensorGuards is not None:
        batch = "___tensors_args" if "." not in expr else "___tensors_attrs"
        gs._batched.setdefault(expr, t)
        if sym:     # (the symbolic sizes and strides left unchecked)
            gs._batch_dims[expr] = (list(shape), list(stride))
    kw = dict(src=expr, group=expr, batch=batch)
    gs.add(f"type({expr}) is {gs.const(type(t))}", f"type({expr})", type(t), **kw)
    gs.add(f"{expr}.dtype is {gs.const(t.dtype)}", f"{expr}.dtype", t.dtype, **kw)
    gs.add(f"{expr}.device == {gs.const(t.device)}", f"{expr}.device", t.device, **kw)
    code = f"{expr}.dim() == {len(shape)}" + "".join(
        f" and {expr}.shape[{i}] == {n}" for i, n in enumerate(shape) if n is not None) if sym else \
        f"{expr}.shape == {shape!r}"
    gs.add(code, f"tuple({expr}.shape)", shape, **kw)
    contiguous = t.layout is torch.strided and all(n >= 2 for n in t.shape) and \
        t.stride() == make_contiguous_strides_for(t.shape)
    if not sym:
        fast = f"{expr}.layout is {gs.const(torch.strided)} and {expr}.is_contiguous()" if exact and contiguous \
            else None
        gs.add(f"{expr}.stride() == {stride!r}", f"{expr}.stride()", stride, fast=fast, **kw)
    elif contiguous:    # batched: after the C++ check (which covers the layout by the dispatch keys)
        code = f"{expr}.is_contiguous()" if batch else \
            f"{expr}.layout is {gs.const(torch.strided)} and {expr}.is_contiguous()"
        gs.add(code, f"{expr}.stride()", "contiguous", src=expr, group=_AFTER if batch else expr)
        gs.contiguous.add(expr)
    elif checks := [f"{expr}.stride()[{i}] == {v}" for i, v in enumerate(stride) if v is not None]:
        gs.add(" and ".join(checks), f"{expr}.stride()", stride, **kw)
    gs.add(f"{expr}.requires_grad is {t.requires_grad!r}", f"{expr}.requires_grad", t.requires_grad, **kw)


def _symbolic(fake) -> bool:
    return any(isinstance(s, torch.SymInt) for s in (*fake.shape, *fake.stride()))


# --- generating the guard function -------------------------------------------------------
# Every guard becomes ``if not (<code>): return False`` in the order it was added, with source expressions read through
# locals. A guard's code is parsed (``ast``) to find its *chains*: ``name``, ``.attr`` and ``[constant]`` steps
# (``self._modules['h']._parameters ['w']``). The chain a guard evaluates first, unconditionally (the left operand of
# its first comparison, ``type(X)``'s argument, the object of ``X.stride()``), and every prefix of it, is safe to
# compute one line earlier: it is hoisted into a local when it is the guard's ``src`` or when more than one chain in the
# function starts with it. Any other chain (read only if an earlier ``and`` operand held) is not computed earlier; only
# its longest prefix that is already a local is replaced. So each guard evaluates what it did before, in the same order,
# each shared prefix once.


def _chain_steps(node) -> Optional[list]:
    """The nodes of a chain, root first (a Name, then Attribute / Subscript-by-constant
    steps), or None if ``node`` is not a chain."""
    steps = []
    while True:
        steps.append(node)
        if isinstance(node, ast.Name):
            return steps[::-1]
        if isinstance(node, ast.Attribute) or (isinstance(node, ast.Subscript)
                                               and isinstance(node.slice, ast.Constant)):
            node = node.value
        else:
            return None


def _first_chain(node):
    """The chain node ``node`` evaluates before anything else, if any."""
    while True:
        if isinstance(node, ast.Expression):
            node = node.body
        elif isinstance(node, ast.BoolOp):
            node = node.values[0]
        elif isinstance(node, ast.Compare):
            node = node.left
        elif isinstance(node, ast.UnaryOp):
            node = node.operand
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                if not node.args or isinstance(node.args[0], ast.Starred):
                    return None
                node = node.args[0]
            elif isinstance(node.func, ast.Attribute):
                node = node.func.value       # x.stride(): x first, the bound method is not kept
            else:
                return None
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            return node if _chain_steps(node) is not None else None
        else:
            return None


class _Parsed:
    """One guard's code: its text (UTF-8, for ast's byte offsets), maximal chains as
    lists of prefix texts with their byte spans, and the first-evaluated chain."""
    __slots__ = ("raw", "chains", "first")

    def __init__(self, code: str):
        self.raw = code.encode("utf-8")
        tree = ast.parse(code, mode="eval")
        inner: set = set()
        func_attrs: set = set()
        nodes = list(ast.walk(tree))    # walked twice: once here
        for n in nodes:
            if isinstance(n, (ast.Attribute, ast.Subscript)):
                inner.add(id(n.value))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                func_attrs.add(id(n.func))
        first = _first_chain(tree)
        self.first = None
        self.chains = []     # [(start, [(prefix_text, end), ...])], prefixes shortest first
        for n in nodes:
            if id(n) in inner or not isinstance(n, (ast.Attribute, ast.Subscript)):
                continue
            if (steps := _chain_steps(n)) is None:
                continue
            if id(n) in func_attrs:      # a method: the chain is its object
                steps = steps[:-1]
            if len(steps) < 2:
                continue
            start = steps[0].col_offset
            prefixes = [(self.raw[start:s.end_col_offset].decode("utf-8"), s.end_col_offset) for s in steps[1:]]
            entry = (start, prefixes)
            self.chains.append(entry)
            if first is not None and (first is n or (id(n) in func_attrs and first is n.value)):
                self.first = entry


# nn.Module's own dicts (``ModuleDictSource``): read from the module's ``__dict__`` once
# that is a local (a dict lookup, not an attribute load on a class with __getattr__)
_MODULE_DICTS = ("_modules", "_parameters", "_buffers")


def _emit_guards(guards: list, lines: list, notes: dict) -> dict:
    parsed: list = []
    counts: dict[str, int] = {}
    for g in guards:
        code = g.fast if g.fast is not None else g.code
        try:
            p = _Parsed(code) if "\n" not in code else None
        except (SyntaxError, ValueError):
            p = None
        parsed.append(p)
        if p is not None:
            for _, prefixes in p.chains:
                for text, _ in prefixes:
                    counts[text] = counts.get(text, 0) + 1
    names: dict[str, str] = {}
    pending: list = []          # conditions of the current group, joined into one ``if``
    pending_group = [None]
    batches: dict[str, dict] = {}   # batch -> {src: local}, in the order TensorGuards has
    last = {g.batch: i for i, g in enumerate(guards) if g.batch is not None}

    def flush():
        if pending:
            cond = pending[0] if len(pending) == 1 else " and ".join(f"({c})" for c in pending)
            lines.append(f"    if not ({cond}): return False")
            pending.clear()
        pending_group[0] = None

    def local(text: str, rhs: str) -> str:
        flush()
        name = f"___v{len(names)}"
        lines.append(f"    {name} = {rhs}")
        names[text] = name
        return name
    for i, (g, p) in enumerate(zip(guards, parsed)):
        code = g.fast if g.fast is not None else g.code
        if p is None and g.batch is None:   # not parseable as expected: the plain text
            flush()
            lines.append(f"    if not ({code}): return False")
            continue
        # hoist the first-evaluated chain's shared prefixes (and the src itself)
        if p is not None and p.first is not None:
            prev_name, prev_end = None, None
            for text, end in p.first[1]:
                if text not in names and (counts.get(text, 0) >= 2 or text == g.src):
                    base, _, attr = text.rpartition(".")
                    d = names.get(f"{base}.__dict__") if attr in _MODULE_DICTS else None
                    rhs = f"{d}[{attr!r}]" if d else text if prev_name is None else \
                        prev_name + p.raw[prev_end:end].decode("utf-8")
                    local(text, rhs)
                if text in names:
                    prev_name, prev_end = names[text], end
        if g.batch is not None:     # fetched here (hoisted above), checked with its batch
            args = batches.setdefault(g.batch, {})
            if g.src not in args:
                args[g.src] = names.get(g.src, g.src)
                flush()
                lines.append(f"    # {args[g.src]}: {notes.get(g.src, '')}")
            if i == last[g.batch]:
                flush()
                vals = list(args.values())
                rows = ",\n            ".join(", ".join(vals[k:k + 8]) for k in range(0, len(vals), 8))
                lines.append(f"    if not {g.batch}.check({rows}): return False")
            continue
        # replace each chain's longest hoisted prefix, right to left (byte offsets)
        raw = p.raw
        for start, prefixes in sorted(p.chains, key=lambda c: c[0], reverse=True):
            for text, end in reversed(prefixes):
                if text in names:
                    raw = raw[:start] + names[text].encode("utf-8") + raw[end:]
                    break
        cond = raw.decode("utf-8")
        if g.group is None or g.group != pending_group[0]:
            flush()
        pending.append(cond)
        pending_group[0] = g.group
        if g.group is None:
            flush()
    flush()
    return names
