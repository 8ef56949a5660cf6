"""Skipping guards whose inputs did not change: dict version tags (PEP 509).

A module tree's guard mostly re-reads state reached through dicts that almost never change; while every dict it read
through keeps the version tag (``ma_version_tag``) it had at the last full pass, a check of only such values' identity
or immutable value holds again. :func:`fast_guard` splits the generated ``___guard`` into the *full* guard (on success
it records a :class:`_State` snapshot: the objects later checks need, the dicts to watch and their tags) and a *fast*
guard run first: the checks that must run, an identity check of each root dict, and one C call comparing the watched
tags (:data:`_SOURCE`), calling the full guard on a difference. docs/capture.md ("Skipping unchanged guards") lists what
is implied, the limits and the measurements. Off with ``config.guard_versions = False``, on other Pythons and without a
C++ compiler.
"""
from __future__ import annotations

import ast
import collections
import copy
import ctypes
import operator
import sys
import types
from typing import Callable, Optional

from coil import trace

#: compares the tags of n dicts with the snapshot's: one call, no Python per dict
_SOURCE = """
#include <stdint.h>
extern "C" int coil_tags_equal(const uint64_t* const* tags, const uint64_t* expected, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (*tags[i] != expected[i]) return 0;
    return 1;
}
"""
_TAG_OFFSET = 24        # PyDictObject: ob_refcnt, ob_type, ma_used, then ma_version_tag
_IMMUTABLE = (int, float, str, bool, bytes, complex, tuple, type(None))
_STALE_LIMIT = 8        # snapshots in a row without a fast pass before an entry gives up
_helper: list = []      # [the C function or None, the reason it is None]


def _plain_reads(d) -> bool:
    """A dict whose reads the guards use are dict's own (a subclass that only overrides
    writes, like transformers' output registry), so its contents decide them."""
    t = type(d)
    return isinstance(d, dict) and not hasattr(t, "__missing__") and all(
        getattr(t, m) is getattr(dict, m) for m in ("__getitem__", "__contains__", "__len__", "__iter__"))


def _tag(d: dict) -> int:
    return ctypes.c_uint64.from_address(id(d) + _TAG_OFFSET).value


def _load_helper():
    """The C comparison, after checking on this interpreter that a dict's tag changes on
    each kind of write the guards rely on; None (with the reason) where it does not."""
    if _helper:
        return _helper[0]
    fn, why = None, None
    try:
        if sys.version_info[:2] not in ((3, 11), (3, 12)):
            raise RuntimeError(f"Python {sys.version_info[0]}.{sys.version_info[1]} has no dict version tag")
        probe = types.SimpleNamespace(a=1)
        ds = ({}, collections.OrderedDict(), probe.__dict__)
        before = [_tag(x) for x in ds]
        ds[0]["k"], ds[1]["k"], probe.a = 1, 1, 2
        if any(_tag(x) == t for x, t in zip(ds, before)):
            raise RuntimeError("a dict's version tag did not change on a write")
        from coil.runtime import cpp_build
        # called with the GIL held (PyDLL): a few hundred loads need no release, and a release lets another thread
        # run in the middle of the guard (a sampling profiler then charged ~20% of a decoding step to this call)
        fn = ctypes.PyDLL(cpp_build.build(_SOURCE)._name).coil_tags_equal
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    except Exception as e:  # noqa: BLE001 - the full guard runs alone
        fn, why = None, f"{type(e).__name__}: {e}"
    _helper[:] = [fn, why]
    return fn


def _snapshot(ok, cache=(), roots=(), keep=()):
    """One full pass's record: ``ok()`` is True while every watched dict keeps its tag."""
    return types.SimpleNamespace(ok=ok, cache=cache, roots=roots, keep=keep)


_INVALID = _snapshot(lambda: False)


class _State:
    """The fast guard's current snapshot (``cur``) and how many full passes in a row found the previous one stale."""

    def __init__(self, label: str, exact: tuple, names: tuple = (), root_args: tuple = ()):
        self.cur, self.stale, self.label, self.exact = _INVALID, 0, label, exact
        self.names, self.root_args = names, root_args  # the locals a snapshot's cache holds; each root's argument

    def cached(self, *roots):
        """The snapshot's ``cache`` while it holds for these root dicts (each value is what its guard expression gives
        now), else None: the entry's inputs (frame.py, ``_entry_inputs``)."""
        s = self.cur
        return s.cache if s.ok() and len(roots) == len(s.roots) and all(map(operator.is_, roots, s.roots)) else None

    def _give_up(self, reason: str) -> bool:
        """Stop snapshotting for good (logged with ``reason``); True, the guard's result."""
        self.stale, self.cur = _STALE_LIMIT, _INVALID
        trace.log("guard_versions", stage="capture", frame=self.label, used=False, reason=reason)
        return True

    def snap(self, cache: tuple, roots: tuple, watched: tuple) -> bool:
        """Called by the full guard when it passes; returns True (the guard's result)."""
        if self.stale >= _STALE_LIMIT:
            return True
        self.stale += 1
        if self.stale == _STALE_LIMIT:
            return self._give_up(f"the watched state changed before {_STALE_LIMIT} calls in a row")
        # an OrderedDict's key order moves without its tag (move_to_end): its key list is implied only below 2 keys
        if bad := [type(d).__name__ for i, d in enumerate(watched) if not _plain_reads(d) and (
                   type(d) is not collections.OrderedDict or i in self.exact and len(d) > 1)]:
            return self._give_up(f"a guard reads through a {bad[0]}, which has no version tag")
        n = len(watched)
        addrs = (ctypes.c_void_p * n)(*[id(d) + _TAG_OFFSET for d in watched])
        tags = (ctypes.c_uint64 * n)(*[_tag(d) for d in watched])
        fn = _helper[0]
        self.cur = _snapshot(lambda: fn(addrs, tags, n), cache, roots, (watched, addrs, tags))
        return True

    def hit(self) -> None:
        self.stale = 0


# --- splitting the generated guard function -----------------------------------------------


class _Split:
    """Classifies the guard function's top-level statements (see the module docstring)."""

    def __init__(self, fn: ast.FunctionDef, ns: dict):
        self.ns = ns
        self.args = {a.arg for a in fn.args.args}
        self.stable: set = set()        # locals reached only through watched dicts
        self.roots: list = []           # locals `= arg.__dict__`, identity-checked
        self.root_args: list = []       # their arguments
        self.watch: dict = {}           # expression text -> needs a plain dict

    def value(self, e) -> bool:
        """Whether ``e``'s value is fixed while the watched dicts keep their tags."""
        if isinstance(e, ast.Constant):
            return True
        if isinstance(e, ast.Name):
            return e.id in self.stable or (e.id.startswith("___c") and e.id in self.ns)
        if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and self.dict_value(e.value):
            self.add_watch(e.value)
            return True
        if isinstance(e, ast.Attribute) and e.attr == "__dict__":
            return self.value(e.value)      # a module's or an object's own dict
        return False

    def dict_value(self, e) -> bool:
        if isinstance(e, ast.Name) and e.id.startswith("___c"):
            v = self.ns.get(e.id)
            return _plain_reads(v) or type(v) is collections.OrderedDict
        return self.value(e)

    def add_watch(self, e, exact: bool = False) -> None:
        text = ast.unparse(e)
        self.watch[text] = self.watch.get(text, False) or exact

    def assign(self, st: ast.Assign) -> bool:
        """Marks the local stable if it is; True when the statement can be left out."""
        name, rhs = st.targets[0].id, st.value
        if isinstance(rhs, ast.Attribute) and rhs.attr == "__dict__" and isinstance(rhs.value, ast.Name):
            if rhs.value.id in self.args:
                self.roots.append(name)
                self.root_args.append(rhs.value.id)
                self.stable.add(name)
                return False
            if rhs.value.id in self.stable:
                self.stable.add(name)
                return True
        if self.value(rhs) and not isinstance(rhs, (ast.Constant, ast.Name)):
            self.stable.add(name)
            return True
        return False

    def conjunct(self, c, immutable: set) -> bool:
        """Whether one ``and`` operand of a check holds by the tags alone."""
        if isinstance(c, ast.UnaryOp) and isinstance(c.op, ast.Not):
            return self.container(c.operand)
        if not isinstance(c, ast.Compare):
            return self.container(c)
        if len(c.ops) != 1:
            return False
        op, left, right = c.ops[0], c.left, c.comparators[0]
        if isinstance(op, (ast.Is, ast.IsNot)):
            if _call_of(left, "type") and self.value(left.args[0]):
                t = self.ns.get(right.id) if isinstance(right, ast.Name) else None
                t = t or getattr(__import__("builtins"), getattr(right, "id", ""), None)
                if t in _IMMUTABLE:
                    immutable.add(ast.unparse(left.args[0]))
                    return True
                return False
            return self.value(left) and self.value(right)
        if isinstance(op, (ast.In, ast.NotIn)):
            return isinstance(left, ast.Constant) and self.container(right)
        if isinstance(op, (ast.Eq, ast.NotEq)):
            if _call_of(left, "list"):
                return self.container(left.args[0], exact=True)
            if _call_of(left, "len"):
                return self.container(left.args[0])
            return ast.unparse(left) in immutable and self.value(left) and _literal(right, self.ns)
        return False

    def container(self, e, exact: bool = False) -> bool:
        if self.value(e):
            self.add_watch(e, exact)
            return True
        return False


def _call_of(e, fname: str) -> bool:
    return (isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == fname
            and len(e.args) == 1 and not e.keywords)


def _literal(e, ns: dict) -> bool:
    """Whether ``e`` is a constant of immutable scalars (a literal or a namespace name)."""
    try:
        v = ns.get(e.id, e) if isinstance(e, ast.Name) else ast.literal_eval(e)
    except ValueError:
        return False
    return _immutable(v)


def _immutable(v) -> bool:
    return type(v) in _IMMUTABLE and (type(v) is not tuple or all(_immutable(x) for x in v))


_MODULE_DICTS = ("_modules", "_parameters", "_buffers")


def _module_dicts_as_items(fn: ast.FunctionDef, lines: list, ns: dict) -> ast.FunctionDef:
    """``m._modules`` (``_parameters``, ``_buffers``: what capture's ModuleDictSource writes) read as
    ``m.__dict__['_modules']``, the same dict of an nn.Module, so that a module tree reached from an argument is reached
    through watched dicts: an argument's ``__dict__`` becomes a root local at the top. Before, every check
    under ``self._modules`` ran on each call (a 12-layer GPT-2's module walk). ``lines``: the source's lines; ``ns``: its
    namespace. Only names the guard checks to be of an nn.Module class (``type(x) is C``) are rewritten: an object of
    another class (a Signature's ``_parameters`` is a ``__slots__`` attribute) is read as it is."""
    args = {a.arg for a in fn.args.args}
    roots: dict = {}
    import torch
    modules = {n.left.args[0].id for n in ast.walk(fn) if isinstance(n, ast.Compare) and isinstance(n.left, ast.Call)
               and getattr(n.left.func, "id", None) == "type" and n.left.args and isinstance(n.left.args[0], ast.Name)
               and isinstance(n.ops[0], ast.Is) and isinstance(n.comparators[0], ast.Name)
               and isinstance(c := ns.get(n.comparators[0].id), type) and issubclass(c, torch.nn.Module)}

    class Rewrite(ast.NodeTransformer):
        def visit_Attribute(self, node):
            self.generic_visit(node)
            if node.attr not in _MODULE_DICTS or not isinstance(node.ctx, ast.Load):
                return node
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in modules):
                return node
            if owner.id in args:
                owner = at(ast.Name(roots.setdefault(owner.id, f"___d_{owner.id}"), ast.Load()), node)
            else:
                owner = at(ast.Attribute(owner, "__dict__", ast.Load()), node)
            # (an object whose attribute of that name is not in its __dict__ raises: a guard miss, never a pass)
            return at(ast.Subscript(owner, at(ast.Constant(node.attr), node), ast.Load()), node)
    at = ast.copy_location      # (new nodes only: the tree is compiled as it is, not walked for locations)
    for st in fn.body:          # (only the statements whose text names one: most do not)
        if any(a in line for line in lines[st.lineno - 1:st.end_lineno] for a in _MODULE_DICTS):
            Rewrite().visit(st)
    top = fn.body[0]
    fn.body[:0] = [at(ast.Assign([at(ast.Name(r, ast.Store()), top)], at(ast.Attribute(
        at(ast.Name(a, ast.Load()), top), "__dict__", ast.Load()), top)), top) for a, r in roots.items()]
    return fn


def fast_guard(src: str, ns: dict, label: str) -> Optional[Callable]:
    """The fast guard for the guard function ``src`` (``def ___guard(...)``) and its namespace ``ns`` (extended in place
    with the full guard and the state; the fast guard's source goes to the compile log, artifact ``guards_fast``); None
    when tags are not available here or too little would be skipped."""
    if _load_helper() is None:
        return None
    fn = _module_dicts_as_items(ast.parse(src).body[0], src.splitlines(), ns)
    split = _Split(fn, ns)
    params = ", ".join(a.arg for a in fn.args.args)
    head, tail, skipped = [], [], 0     # fast statements before / after the snapshot check
    for st in fn.body[:-1]:             # the last one is `return True`
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            if split.assign(st):
                skipped += 1
                continue
        elif (isinstance(st, ast.If) and not st.orelse and isinstance(st.test, ast.UnaryOp)
              and isinstance(st.test.op, ast.Not) and isinstance(st.body[0], ast.Return)):
            test = st.test.operand
            parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
            immutable: set = set()
            if not (keep := [p for p in parts if not split.conjunct(p, immutable)]):
                skipped += 1
                continue
            if len(keep) < len(parts):
                st = ast.If(test=ast.UnaryOp(ast.Not(), ast.BoolOp(ast.And(), keep) if len(keep) > 1
                                             else keep[0]), body=st.body, orelse=[])
        reads = {n.id for n in ast.walk(st) if isinstance(n, ast.Name)}
        root = isinstance(st, ast.Assign) and getattr(st.targets[0], "id", None) in split.roots
        # (a root is read by the snapshot check, so it is assigned before it)
        (tail if not root and (reads & (split.stable - set(split.roots)) or tail) else head).append(st)
    if skipped < 8 or not split.watch:
        return None
    needed = sorted({n.id for st in tail for n in ast.walk(st) if isinstance(n, ast.Name)}
                    & (split.stable - set(split.roots)))
    watched = list(split.watch)
    exact = tuple(i for i, w in enumerate(watched) if split.watch[w])
    ns["___vstate"] = state = _State(label, exact, tuple(needed), tuple(split.root_args))
    tup = lambda xs: f"({', '.join(xs)}{',' if len(xs) == 1 else ''})"  # noqa: E731
    # the full guard, compiled from its tree (not printed and parsed again): its last line returns the snapshot
    snap = ast.parse(f"return ___vstate.snap({tup(needed)}, {tup(split.roots)}, {tup(watched)})").body
    ast.increment_lineno(snap[0], fn.body[-1].lineno - 1)
    full = copy.copy(fn)
    full.name, full.body = "___guard_full", fn.body[:-1] + snap
    exec(compile(ast.Module([full], []), "<coil guards>", "exec"), ns)
    lines = [f"def ___guard({params}):"]
    lines += ["    " + ast.unparse(st).replace("\n", "\n    ") for st in head]
    lines.append("    ___s = ___vstate.cur")
    checks = ["___s.ok()"] + [f"{r} is ___s.roots[{i}]" for i, r in enumerate(split.roots)]
    lines.append(f"    if not ({' and '.join(checks)}): return ___guard_full({params})")
    if needed:
        lines.append(f"    {', '.join(needed)}{',' if len(needed) == 1 else ''} = ___s.cache")
    lines += ["    " + ast.unparse(st).replace("\n", "\n    ") for st in tail]
    lines += ["    ___vstate.hit()", "    return True"]
    fast_src = "\n".join(lines) + "\n"
    exec(compile(fast_src, "<coil guards (fast)>", "exec"), ns)
    trace.artifact("guards_fast", fast_src, kind="python", frame=label)
    trace.log("guard_versions", stage="capture", frame=label, used=True, skipped=skipped,
              kept=len(head) + len(tail), watched=len(watched), cached=len(needed))
    return ns["___guard"]
