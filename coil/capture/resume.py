"""Resume functions: continue a frame after a graph break.

``make_resume_function(fn_code, index, stack_len, null_mask, local_names, ...)``
returns a new function whose code is the original code object with a prologue::

    def __resume_at_<offset>_<name>(___stack0, ..., local_a, local_b):
        <push ___stack0 ...>          # PUSH_NULL where the stack held a NULL
        JUMP_FORWARD to <instruction index>
        <the original bytecode, unchanged>

Keeping the whole original body (only unreachable before the target) preserves
line numbers, the exception table and loop structure without any analysis. The code
object is produced with the ``bytecode`` library. Resume functions are cached per
(code object, target, stack layout, locals) so they are captured and cached like any
other frame.
"""
from __future__ import annotations

import sys
import types
from typing import Optional

from bytecode import Bytecode, Instr, Label
from bytecode.instr import CellVar, FreeVar  # noqa: F401

_CACHE: dict = {}

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08


def make_resume_code(code: types.CodeType, index: int, null_mask: tuple, local_names: tuple,
                     tag: str) -> types.CodeType:
    """Code for a resume function starting at the ``index``-th instruction (counting
    :func:`dis.get_instructions` entries without EXTENDED_ARG)."""
    key = (code, index, null_mask, local_names)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    bc = Bytecode.from_code(code)
    label = Label()
    count = -1
    insert_at = None
    resume_pos = None
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
    prologue = []
    for name, is_null in zip(stack_names, null_mask):
        if is_null:
            prologue.append(Instr("PUSH_NULL", lineno=lineno))
        else:
            prologue.append(Instr("LOAD_FAST", name, lineno=lineno))
    prologue.append(Instr("JUMP_FORWARD", label, lineno=lineno))
    if sys.version_info[:2] >= (3, 12):
        _two_arg_super(bc)
    new = list(bc[:resume_pos + 1]) + prologue + list(bc[resume_pos + 1:insert_at]) + [label] + \
        list(bc[insert_at:])
    args = [n for n, is_null in zip(stack_names, null_mask) if not is_null] + list(local_names)
    out = Bytecode(new)
    out.name = f"__resume_at_{index}_{code.co_name}"
    out.filename = code.co_filename
    out.first_lineno = code.co_firstlineno
    out.argnames = args
    out.argcount = len(args)
    out.posonlyargcount = 0
    out.kwonlyargcount = 0
    out.flags = bc.flags & ~(CO_VARARGS | CO_VARKEYWORDS)
    out.cellvars = list(bc.cellvars)
    out.freevars = list(bc.freevars)
    out.docstring = None
    if hasattr(bc, "qualname"):
        out.qualname = out.name
    new_code = out.to_code()
    _CACHE[key] = new_code
    return new_code


def _two_arg_super(bc) -> None:
    """3.12: turn every zero-argument ``LOAD_SUPER_ATTR`` into its two-argument form.

    Both forms find ``super``, ``__class__`` and ``self`` on the stack, but the
    zero-argument one calls ``super()`` with no arguments, which reads the *frame's first
    local* -- in a resume function that is ``___stack0``, not ``self``. Setting the
    two-argument flag makes it ``super(__class__, self)``, the same lookup.
    (``bytecode`` spells the argument ``(method_load, two_arg, name)``.)
    https://docs.python.org/3.12/library/dis.html#opcode-LOAD_SUPER_ATTR
    """
    for ins in bc:
        if isinstance(ins, Instr) and ins.name == "LOAD_SUPER_ATTR":
            method, two_arg, name = ins.arg
            if not two_arg:
                ins.arg = (method, True, name)


def make_resume_function(fn_globals: dict, closure: Optional[tuple], code: types.CodeType,
                         index: int, null_mask: tuple, local_names: tuple, tag: str = ""):
    new_code = make_resume_code(code, index, null_mask, local_names, tag)
    return types.FunctionType(new_code, fn_globals, new_code.co_name, None, closure)
