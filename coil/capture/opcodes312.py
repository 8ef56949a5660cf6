"""CPython 3.12-only opcode handlers (registered through :func:`coil.capture.opcodes.op`).

3.12 moved several operations into "intrinsic" calls: ``CALL_INTRINSIC_1 n`` applies the n-th entry of
``opcode._intrinsic_1_descs`` to the top of the stack (``f(*args)`` ends with ``INTRINSIC_LIST_TO_TUPLE``, unary ``+x``
is ``INTRINSIC_UNARY_POSITIVE``); ``CALL_INTRINSIC_2`` takes two operands (``except*`` and generic type parameters).
:mod:`dis` in 3.12 leaves ``argval`` as the raw number, so the names come from :mod:`opcode`
(``opcode._intrinsic_1_descs``), the table :mod:`dis` itself uses for ``argrepr``.

Generator delegation (``SEND``/``END_SEND``) and class bodies (``LOAD_FROM_DICT_OR_*``) are graph breaks with a
reason rather than "unknown opcode". This module is imported at the end of :mod:`coil.capture.opcodes`, so its
registrations win over any same-named one there. It registers nothing on 3.11.

Reference: https://docs.python.org/3.12/library/dis.html#opcode-CALL_INTRINSIC_1"""
from __future__ import annotations

import opcode as _opcode
import operator

from coil.exc import Unsupported
from coil.capture.exceptions import ExceptionVariable
from coil.capture.opcodes import PY312, op
from coil.capture.variables.base import NullVariable
from coil.capture.variables.containers import TupleVariable

_INTRINSIC_1 = tuple(getattr(_opcode, "_intrinsic_1_descs", ()))
_INTRINSIC_2 = tuple(getattr(_opcode, "_intrinsic_2_descs", ()))


def intrinsic_name(table: tuple, arg: int) -> str:
    """Name of intrinsic ``arg`` (e.g. ``"INTRINSIC_LIST_TO_TUPLE"``), or ``"intrinsic <n>"``
    when this interpreter's table does not know it."""
    return table[arg] if 0 <= arg < len(table) else f"intrinsic {arg}"


@op("CALL_INTRINSIC_1", PY312)
def CALL_INTRINSIC_1(tx, inst):
    if (name := intrinsic_name(_INTRINSIC_1, inst.arg)) == "INTRINSIC_LIST_TO_TUPLE":
        tx.push(TupleVariable(tx.unpack(tx.pop())))
    elif name == "INTRINSIC_UNARY_POSITIVE":
        tx.push(tx.unary_op(operator.pos, tx.pop()))
    elif name == "INTRINSIC_STOPITERATION_ERROR":   # (another exception leaves the generator as it is: close())
        if not isinstance(tx.stack[-1], ExceptionVariable) or issubclass(tx.stack[-1].cls, StopIteration):
            raise Unsupported("StopIteration inside a generator (INTRINSIC_STOPITERATION_ERROR)")
    else:
        raise Unsupported(f"CALL_INTRINSIC_1 {name}")


@op("CALL_INTRINSIC_2", PY312)
def CALL_INTRINSIC_2(tx, inst):
    raise Unsupported(f"CALL_INTRINSIC_2 {intrinsic_name(_INTRINSIC_2, inst.arg)}")


@op("SEND", PY312)
@op("END_SEND", PY312)
def _send(tx, inst):
    raise Unsupported(f"{inst.opname}: yield from / await")


@op("LOAD_FROM_DICT_OR_DEREF", PY312)
@op("LOAD_FROM_DICT_OR_GLOBALS", PY312)
@op("LOAD_LOCALS", PY312)
def _class_body(tx, inst):
    raise Unsupported(f"{inst.opname}: class body or annotation scope")


# https://docs.python.org/3.12/library/dis.html#opcode-LOAD_SUPER_ATTR Stack (bottom to top): global
# ``super``, ``cls`` (the ``__class__`` cell or the explicit class), ``self``. Bit 0 of the argument: method
# load (push NULL first, like LOAD_ATTR); bit 1: the two-argument form. Both forms mean ``super(cls, self)``;
# the name is ``co_names[arg >> 2]`` (already decoded into ``argval`` by dis).
@op("LOAD_SUPER_ATTR", PY312)
def LOAD_SUPER_ATTR(tx, inst):
    glob_super, cls, self_ = tx.popn(3)
    sup = tx.call(glob_super, [cls, self_], {})
    if inst.arg & 1:
        tx.push(NullVariable())
    tx.push(tx.getattr(sup, inst.argval))
