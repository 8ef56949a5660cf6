"""Resume functions: continue a frame after a graph break.

:func:`make_resume_function` returns a function whose code is the original code object with a prologue
that pushes the stack values it takes as arguments (``PUSH_NULL`` where the stack held a NULL) and jumps
to the break's instruction; keeping the whole original body preserves line numbers, the exception table
and loop structure. It keeps the user's ``co_name``/``co_qualname``/``co_filename``; the compile log names
it by :func:`label`, :func:`origin` gives the user's code. A break inside a resume function resumes from
the user's code (:data:`_POSITIONS`), so a loop makes one resume function, not one per iteration.
:func:`make_call_stub` builds the frame a graph-break call runs in. docs/capture.md, "Graph breaks"."""
from __future__ import annotations

import dis
import sys
import types
from typing import Optional

from bytecode import Bytecode, Instr, Label, TryBegin, TryEnd
from bytecode.instr import CellVar

_CACHE: dict = {}
#: resume code object -> (original user code object, label)
_ORIGIN: "dict" = {}
#: resume code object -> per instruction index, the user's code's index it runs (None: added)
_POSITIONS: dict = {}
_STUBS: dict = {}

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08


def make_resume_code(code: types.CodeType, index: int, null_mask: tuple, local_names: tuple,
                     tail: Optional[tuple] = None) -> types.CodeType:
    """Code for a resume function starting at the ``index``-th instruction (counting
    :func:`dis.get_instructions` entries without EXTENDED_ARG).

    ``tail = (call_index, nulls, cell_names, next_fn, local_names)`` makes a *trampoline* instead (a graph-break call
    inside a ``try``/``with`` block): it starts at ``index`` (the call's first instruction), runs the call instruction
    ``call_index`` under the frame's own exception table (so the user's ``except``/``finally``/``__exit__`` see an
    exception it raises), then leaves the table's range and returns ``next_fn(*<the stack after the call, the NULLs of
    pending calls (True in nulls) left out>, *local_names)`` -- the captured resume function for the rest. Not cached
    (``next_fn`` is new on each compile)."""
    code, index, tail = _in_user_code(code, index, tail)
    key = (code, index, null_mask, local_names)
    if tail is None and (hit := _CACHE.get(key)) is not None:
        return hit
    bc = Bytecode.from_code(code)
    _copy_exception_depths(bc, code)       # before the tail copies a TryBegin
    label, count, insert_at, resume_pos = Label(), -1, None, None
    for pos, ins in enumerate(bc):
        if isinstance(ins, Instr):
            count += 1
            if ins.name == "RESUME" and resume_pos is None:
                resume_pos = pos
            if count == index:
                insert_at = pos
                break
    if insert_at is None or resume_pos is None:
        raise ValueError(f"resume target {index} not found in {code.co_name}")
    lineno = code.co_firstlineno
    stack_names = [f"___stack{i}" for i in range(len(null_mask))]
    prologue = [Instr("PUSH_NULL", lineno=lineno) if is_null else Instr("LOAD_FAST", name, lineno=lineno)
                for name, is_null in zip(stack_names, null_mask)] + [Instr("JUMP_FORWARD", label, lineno=lineno)]
    if sys.version_info[:2] >= (3, 12):
        _two_arg_super(bc)
    new = list(bc[:resume_pos + 1]) + prologue + list(bc[resume_pos + 1:insert_at]) + [label] + list(bc[insert_at:])
    if tail is not None:
        # the frame's cells are plain locals of the resume code (below): pass them on as is
        new = _with_tail(bc, new, tail[:2] + (set(),) + tail[3:])
    new = _cells_as_locals(new, set(bc.cellvars))
    args = [n for n, is_null in zip(stack_names, null_mask) if not is_null] + list(local_names)
    out, root = Bytecode(new), origin(code)
    out.name = root.co_name
    out.filename = code.co_filename
    out.first_lineno = code.co_firstlineno
    out.argnames = args
    out.argcount = len(args)
    out.posonlyargcount = 0
    out.kwonlyargcount = 0
    out.flags = bc.flags & ~(CO_VARARGS | CO_VARKEYWORDS)
    out.cellvars = []
    out.freevars = list(bc.freevars)
    out.docstring = None
    if hasattr(bc, "qualname"):
        out.qualname = getattr(root, "co_qualname", root.co_name)
    # The resume code jumps over the start of any try block it resumes inside, so the bytecode library's flow analysis
    # sees those TryBegins (and their handlers) as dead: their depth would be a sentinel and their stack use uncounted.
    # Depths come from the original exception table (_copy_exception_depths above), stack size from the original code.
    stacksize = code.co_stacksize + len(null_mask) + len(local_names) + 8
    new_code = out.to_code(stacksize=stacksize, compute_exception_stack_depths=False)
    _record_positions(new_code, code, bc, new)
    if tail is None:
        _CACHE[key] = new_code
    _ORIGIN[new_code] = (root, f"__{'resume' if tail is None else 'trampoline'}_at_{index}_{root.co_name}")
    return new_code


def _in_user_code(code: types.CodeType, index: int, tail: Optional[tuple]):
    """``(code, index, tail)`` moved to the user's code when ``code`` is a resume code whose
    instruction ``index`` (and the tail's call) map back to it; unchanged otherwise."""
    if (m := _POSITIONS.get(code)) is None or index >= len(m) or m[index] is None:
        return code, index, tail
    if tail is not None:
        if tail[0] >= len(m) or m[tail[0]] is None:
            return code, index, tail
        tail = (m[tail[0]],) + tuple(tail[1:])
    return origin(code), m[index], tail


def _record_positions(new_code: types.CodeType, code: types.CodeType, bc, new: list) -> None:
    """Map ``new_code``'s instructions to the user's code's (kept only if every mapped pair
    has the same opname: the bytecode library keeps instructions one for one)."""
    at = {id(ins): k for k, ins in enumerate(i for i in bc if isinstance(i, Instr))}
    parent = _POSITIONS.get(code)
    m = [k if parent is None or k is None else parent[k] for k in (at.get(id(i)) for i in new if isinstance(i, Instr))]
    user = [i.opname for i in dis.get_instructions(origin(code)) if i.opname != "EXTENDED_ARG"]
    made = [i.opname for i in dis.get_instructions(new_code) if i.opname != "EXTENDED_ARG"]
    if len(made) == len(m) and all(k is None or (k < len(user) and user[k] == op) for k, op in zip(m, made)):
        _POSITIONS[new_code] = m


def _cells_as_locals(new: list, names: set) -> list:
    """The frame's cell variables become plain locals holding the cells themselves. A resume function receives the
    frame's cells as arguments (not their contents), so closures made before the break and code after it share each
    cell, as in eager (a closure may read a variable bound only after the break). ``LOAD_DEREF c`` becomes
    ``c.cell_contents``, ``STORE_DEREF``/``DELETE_DEREF`` set/delete it, ``LOAD_CLOSURE c`` pushes the cell, ``MAKE_CELL
    c`` goes. Reading an empty cell raises ValueError where eager raises NameError."""
    if not names:
        return new
    out = []
    attr = (False, "cell_contents") if sys.version_info[:2] >= (3, 12) else "cell_contents"
    started = False
    for ins in new:
        arg = getattr(ins, "arg", None)
        started = started or (isinstance(ins, Instr) and ins.name == "RESUME")
        if not (isinstance(ins, Instr) and isinstance(arg, CellVar) and arg.name in names):
            out.append(ins)
            continue
        mk = lambda name, a: Instr(name, a, location=ins.location)  # noqa: E731
        load = mk("LOAD_FAST", arg.name)
        if ins.name == "MAKE_CELL":
            if started:  # a fresh cell mid-frame (3.12 inlined comprehension, its local just cleared): a new cell
                out += [Instr("PUSH_NULL", location=ins.location), mk("LOAD_CONST", types.CellType), mk("CALL", 0),
                        mk("STORE_FAST", arg.name)]
            continue
        if ins.name == "LOAD_CLOSURE":
            out.append(load)
        elif ins.name == "LOAD_DEREF":
            out += [load, mk("LOAD_ATTR", attr)]
        elif ins.name == "STORE_DEREF":
            out += [load, mk("STORE_ATTR", "cell_contents")]
        elif ins.name == "DELETE_DEREF":
            out += [load, mk("DELETE_ATTR", "cell_contents")]
        else:
            raise ValueError(f"resume code: {ins.name} of cell variable {arg.name}")
    return out


def _with_tail(bc, new: list, tail: tuple) -> list:
    """Insert the trampoline's tail after the call instruction (see make_resume_code)."""
    call_index, nulls, cell_names, next_fn, local_names = tail
    call_ins = [ins for ins in bc if isinstance(ins, Instr)][call_index]
    pos = next(i for i, ins in enumerate(new) if ins is call_ins)
    active = None
    for ins in new[:pos]:
        if isinstance(ins, TryBegin):
            active = ins
        elif isinstance(ins, TryEnd) and ins.entry is active:
            active = None
    loc = call_ins.location
    mk = lambda name, arg=None: Instr(name, arg, location=loc) if arg is not None else \
        Instr(name, location=loc)  # noqa: E731
    load = "LOAD_FAST_CHECK" if sys.version_info[:2] >= (3, 12) else "LOAD_FAST"
    seq = _pack_stack(mk, nulls)
    seq += [mk("LOAD_DEREF", CellVar(name)) if name in cell_names else mk(load, name) for name in local_names]
    seq += [mk("BUILD_TUPLE", len(local_names)), mk("BINARY_OP", 0),       # NB_ADD
            mk("PUSH_NULL"), mk("SWAP", 2), mk("LOAD_CONST", next_fn), mk("SWAP", 2),
            mk("CALL_FUNCTION_EX", 0), mk("RETURN_VALUE")]
    if active is None:
        return new[:pos + 1] + seq + new[pos + 1:]
    reopen = TryBegin(active.target, active.push_lasti, active.stack_depth)
    for ins in new[pos + 1:]:
        if isinstance(ins, TryEnd) and ins.entry is active:
            ins.entry = reopen
            break
    return new[:pos + 1] + [TryEnd(active)] + seq + [reopen] + new[pos + 1:]


def _pack_stack(mk, nulls: tuple) -> list:
    """Instructions that replace the stack's top ``len(nulls)`` items by one tuple of those that are not NULL. A NULL (a
    pending call's, True in ``nulls``) cannot be put in a tuple: each one is consumed as the NULL of a
    ``CALL_FUNCTION_EX`` of :func:`_join`, which joins the items above it to the tuple so far."""
    if not any(nulls):
        return [mk("BUILD_TUPLE", len(nulls))]
    join = [mk("LOAD_CONST", _join), mk("SWAP", 2), mk("BUILD_TUPLE", 1), mk("CALL_FUNCTION_EX", 0)]
    seq, run = [mk("LOAD_CONST", ())], 0                    # run: items between the tuple so far and the next NULL
    for is_null in reversed(nulls):
        if is_null:
            seq, run = seq + [mk("BUILD_TUPLE", run + 1)] + join, 0
        else:
            run += 1
    return seq + [mk("BUILD_TUPLE", run + 1), mk("PUSH_NULL"), mk("SWAP", 2)] + join


def _join(items: tuple) -> tuple:
    return items[:-1] + items[-1]


def _copy_exception_depths(bc, code: types.CodeType) -> None:
    """Set each ``TryBegin.stack_depth`` of ``bc`` (``Bytecode.from_code(code)``, whose
    TryBegins follow the exception table's order) to the depth CPython recorded."""
    table = dis._parse_exception_table(code)
    if len(tbs := [ins for ins in bc if isinstance(ins, TryBegin)]) != len(table):
        raise ValueError(f"exception table of {code.co_name}: {len(table)} entries, {len(tbs)} TryBegin")
    for tb, entry in zip(tbs, table):
        tb.stack_depth = entry.depth


def origin(code: types.CodeType) -> types.CodeType:
    """The user's code object a resume code object continues (``code`` itself otherwise)."""
    return _ORIGIN.get(code, (code,))[0]


def is_resume(code: types.CodeType) -> bool:
    return code in _ORIGIN


def label(code: types.CodeType) -> str:
    """Name for logs: ``__resume_at_<index>_<name>`` for resume code, else ``co_name``."""
    return _ORIGIN.get(code, (code, code.co_name))[1]


def make_call_stub(code: types.CodeType, lineno: Optional[int], local_names: tuple, fn_globals: dict):
    """The function a graph-break call runs in, standing in for the user's frame.

    ``stub(fn, args, kwargs, *locals)`` returns ``fn(*args, **kwargs)`` from a frame whose code has the user's
    ``co_name``, ``co_qualname``, ``co_filename`` and ``co_firstlineno``, whose current line is the call's line
    ``lineno``, whose ``f_globals`` are the frame's globals and whose ``f_locals`` are exactly the live locals (the
    three helper arguments are deleted before the call). So ``sys._getframe()``, ``inspect.currentframe()`` (and
    ``.f_code.co_name``, ``.f_lineno``, ``.f_locals``), ``warnings.warn`` and logging locations and tracebacks of an
    exception raised by the call look as in eager. ``f_back`` is coil's entry function (as torch.compile's frames sit
    under its own wrapper)."""
    code = origin(code)
    first = code.co_firstlineno
    line = lineno if lineno is not None and lineno >= first else first
    key = (code, line, local_names)
    if (hit := _STUBS.get(key)) is None:
        # (a local whose name is no identifier, pytest's ``@py_assert0``: a placeholder, renamed in the code below)
        params = ", ".join(("___fn", "___args", "___kwargs") +
                           tuple(n if n.isidentifier() else f"___v{i}" for i, n in enumerate(local_names)))
        body = "return ___fn(*___args, **___kwargs)"
        if line == first:
            src = "\n" * (first - 1) + f"def ___stub({params}): {body}\n"
        else:
            src = "\n" * (first - 1) + f"def ___stub({params}):\n" + "\n" * (line - first - 1) + f"    {body}\n"
        ns: dict = {}
        exec(compile(src, code.co_filename, "exec"), ns)
        bc = Bytecode.from_code(ns["___stub"].__code__)
        bc.argnames[3:] = local_names
        for pos, ins in enumerate(bc):
            if isinstance(ins, Instr) and ins.name == "CALL_FUNCTION_EX":
                bc[pos:pos] = [Instr("DELETE_FAST", n, lineno=ins.lineno) for n in ("___fn", "___args", "___kwargs")]
                break
        stub_code = bc.to_code().replace(co_name=code.co_name)
        if hasattr(code, "co_qualname"):
            stub_code = stub_code.replace(co_qualname=code.co_qualname)
        hit = _STUBS[key] = stub_code
    return types.FunctionType(hit, fn_globals, code.co_name)


def _two_arg_super(bc) -> None:
    """3.12: turn every zero-argument ``LOAD_SUPER_ATTR`` into its two-argument form. Both forms find ``super``,
    ``__class__`` and ``self`` on the stack, but the zero-argument one calls ``super()`` with no arguments, which reads
    the *frame's first local* -- in a resume function that is ``___stack0``, not ``self``. Setting the two-argument flag
    makes it ``super(__class__, self)``, the same lookup. (``bytecode`` spells the argument ``(method_load, two_arg,
    name)``.) https://docs.python.org/3.12/library/dis.html#opcode-LOAD_SUPER_ATTR"""
    for ins in bc:
        if isinstance(ins, Instr) and ins.name == "LOAD_SUPER_ATTR":
            method, two_arg, name = ins.arg
            if not two_arg:
                ins.arg = (method, True, name)


def make_resume_function(fn_globals: dict, closure: Optional[tuple], code: types.CodeType,
                         index: int, null_mask: tuple, local_names: tuple, tail: Optional[tuple] = None):
    new_code = make_resume_code(code, index, null_mask, local_names, tail)
    return types.FunctionType(new_code, fn_globals, new_code.co_name, None, closure)
