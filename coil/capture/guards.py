"""Guards: what a captured graph assumed, as one generated Python function.

A :class:`GuardSet` collects boolean Python expressions over :mod:`.source`
expressions while a frame is translated (each ``wrap`` of a real value adds the
checks its use relies on), then :meth:`GuardSet.build` turns them into::

    def ___guard(x, y, ___f):
        if not (type(x) is ___Tensor): return False
        if not (x.dtype is ___c0 and x.shape == (4, 8) and ...): return False
        ...
        return True

The function is printed into the compile log (``artifact guards``) and can be
called on its own. Objects the guards compare against live in the function's
namespace as ``___cN`` (classes, dtypes, devices, code objects). Functions and
modules are compared by ``id`` (no strong reference is kept).

:meth:`GuardSet.first_failure` re-evaluates guards one by one to say which one
failed on a recompile, with the new value of the guarded expression.
"""
from __future__ import annotations

import builtins
from typing import Any, Optional

import torch


class Guard:
    __slots__ = ("code", "value_expr", "expected", "src")

    def __init__(self, code: str, value_expr: Optional[str], expected: Any, src: Optional[str] = None):
        self.code = code
        self.value_expr = value_expr
        self.expected = expected
        self.src = src


class Hoister:
    """Common-prefix elimination for source expressions in generated code: each distinct
    source gets a local variable, computed from the longest already-hoisted prefix, so
    ``self._modules['h']._modules['0']._parameters['weight']`` costs one dict lookup once
    ``self._modules['h']._modules['0']`` is known."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.names: dict[str, str] = {}

    def hoist(self, expr: str, lines: list, indent: str = "    ") -> str:
        if expr in self.names:
            return self.names[expr]
        if expr.isidentifier():
            return expr
        rhs = expr
        for i in range(len(expr) - 1, 0, -1):
            if expr[i] in ".[" and expr[:i] in self.names:
                rhs = self.names[expr[:i]] + expr[i:]
                break
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
            "___G": global_ns,
            "___Tensor": torch.Tensor,
            "___Parameter": torch.nn.Parameter,
            "___builtins": builtins,
            "___grad_enabled": torch.is_grad_enabled,
            "___id": id,
        }
        self._const_ids: dict[int, str] = {}

    def const(self, obj: Any) -> str:
        """A namespace name holding ``obj`` (for ``is`` comparisons)."""
        key = id(obj)
        name = self._const_ids.get(key)
        if name is None:
            name = f"___c{len(self._const_ids)}"
            self._const_ids[key] = name
            self.ns[name] = obj
        return name

    def add(self, code: str, value_expr: Optional[str] = None, expected: Any = None,
            src: Optional[str] = None) -> None:
        """Add ``code`` (a boolean expression). ``value_expr``/``expected`` describe the
        guarded value for recompile messages; ``src`` is the source expression the code
        reads (hoisted into a local variable in the generated function)."""
        if code in self._seen:
            return
        self._seen.add(code)
        self.guards.append(Guard(code, value_expr, expected, src))

    def source_text(self, argnames: list[str]) -> str:
        params = ", ".join(list(argnames) + ["___f"])
        lines = [f"def ___guard({params}):"]
        hoister = Hoister("___v")
        for g in self.guards:
            code = g.code
            if g.src is not None and not g.src.isidentifier():
                var = hoister.hoist(g.src, lines)
                code = code.replace(g.src, var)
            lines.append(f"    if not ({code}): return False")
        lines.append("    return True")
        return "\n".join(lines) + "\n"

    def build(self, argnames: list[str]):
        """Compile the guard function; returns ``(fn, source_text)``."""
        src = self.source_text(argnames)
        ns = dict(self.ns)
        exec(compile(src, "<coil guards>", "exec"), ns)
        return ns["___guard"], src

    def first_failure(self, argnames: list[str], values: tuple) -> Optional[str]:
        """Describe the first guard that fails for ``values`` (the bound frame arguments
        followed by the function), with the old and new value."""
        fails = self.failures(argnames, values, limit=1)
        return fails[0]["text"] if fails else None

    def failures(self, argnames: list[str], values: tuple, limit: int = 16) -> list[dict]:
        """The guards that fail for ``values`` (at most ``limit``), each a dict:
        ``guard`` (its code), ``value`` (the expression it checks, or None),
        ``expected`` and ``got`` (reprs), ``text`` (one line for people). A guard that
        raises counts as failed (``got`` names the exception)."""
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
                out.append({"guard": g.code, "value": g.value_expr, "expected": repr(g.expected),
                            "got": got, "text": text})
            if len(out) >= limit:
                break
        return out


def tensor_guard(gs: GuardSet, expr: str, t: torch.Tensor) -> None:
    """Guard a tensor's type, dtype, device, sizes, strides and requires_grad."""
    gs.add(f"type({expr}) is {gs.const(type(t))}", f"type({expr})", type(t), src=expr)
    gs.add(f"{expr}.dtype is {gs.const(t.dtype)}", f"{expr}.dtype", t.dtype, src=expr)
    gs.add(f"{expr}.device == {gs.const(t.device)}", f"{expr}.device", t.device, src=expr)
    gs.add(f"{expr}.shape == {tuple(t.shape)!r}", f"tuple({expr}.shape)", tuple(t.shape), src=expr)
    gs.add(f"{expr}.stride() == {tuple(t.stride())!r}", f"{expr}.stride()", tuple(t.stride()),
           src=expr)
    gs.add(f"{expr}.requires_grad is {t.requires_grad!r}", f"{expr}.requires_grad", t.requires_grad,
           src=expr)
