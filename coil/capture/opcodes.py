"""One handler per opcode, registered for the CPython versions it serves.

Each handler is ``handler(tx, inst)`` where ``inst`` is a :class:`dis.Instruction` (``argval`` already decoded by
:mod:`dis`; jump targets are byte offsets). The registry is ``HANDLERS[opname]`` for the running interpreter. To add an
opcode: write the function next to its neighbours and decorate it with ``@op("NAME", versions)``.

Reference: each handler's opcode is documented at https://docs.python.org/3.11/library/dis.html#opcode-NAME (3.12:
https://docs.python.org/3.12/library/dis.html#opcode-NAME); a comment links the page only where the anchor differs."""
from __future__ import annotations

import dis
import importlib
import importlib.util
import operator
import sys

from coil.exc import Unsupported
from coil.capture.variables.base import CellVariable, ConstantVariable, NullVariable
from coil.capture.variables.containers import (DictVariable, ListIteratorVariable, ListVariable,
                                               SetVariable, SliceVariable, TupleVariable)
from coil.capture.variables.functions import BoundMethodVariable, NestedFunctionVariable
from coil.capture.variables.tensor import TensorVariable, UserCodeError
from coil.capture.exceptions import ExceptionVariable
from coil.capture.source import ConstSource
from coil.capture.translator import ReturnValue, const_value
from coil.capture.variables.builder import wrap
from coil.capture.variables.builtins import _hasattr
from coil.capture.variables.objects import UserDefinedClassVariable
from coil.capture.variables.torchfn import ContextManagerVariable

PY = sys.version_info[:2]
HANDLERS: dict = {}
PY311 = ((3, 11),)
PY312 = ((3, 12),)
BOTH = ((3, 11), (3, 12))


def op(name: str, versions=BOTH):
    """Register ``fn`` as the handler of opcode ``name`` on ``versions``."""
    def deco(fn):
        if PY in versions:
            HANDLERS[name] = fn
        return fn
    return deco


def _return(tx, value):
    for g in tx.output.generators if tx.parent is None else ():     # dropped: eager closes them (finally blocks)
        if not g._done:
            g.call_method(tx, "close", [], {})
    raise ReturnValue(value)


# --- no-ops -------------------------------------------------------------------------------
# dis: NOP, RESUME, PRECALL (3.11), CACHE, EXTENDED_ARG, COPY_FREE_VARS (cells set up at entry)
@op("NOP")
@op("RESUME")
@op("PRECALL", PY311)
@op("CACHE")
@op("COPY_FREE_VARS")
@op("EXTENDED_ARG")
def _nop(tx, inst):
    pass


# --- stack manipulation -----------------------------------------------------------------
op("POP_TOP")(lambda tx, inst: tx.pop())
op("PUSH_NULL")(lambda tx, inst: tx.push(NullVariable()))
op("COPY")(lambda tx, inst: tx.push(tx.stack[-inst.arg]))


@op("SWAP")
def SWAP(tx, inst):
    i = inst.arg
    tx.stack[-1], tx.stack[-i] = tx.stack[-i], tx.stack[-1]


op("END_FOR", PY312)(lambda tx, inst: tx.popn(2))


# --- constants, locals, globals, cells ----------------------------------------------
op("LOAD_CONST")(lambda tx, inst: tx.push(ConstantVariable(inst.argval)))
op("RETURN_CONST", PY312)(lambda tx, inst: _return(tx, ConstantVariable(inst.argval)))


@op("LOAD_FAST")
@op("LOAD_FAST_CHECK", PY312)
def LOAD_FAST(tx, inst):
    if (name := inst.argval) not in tx.locals:
        raise UserCodeError(f"UnboundLocalError: local variable '{name}' referenced before assignment")
    tx.push(tx.locals[name])


op("LOAD_FAST_AND_CLEAR", PY312)(lambda tx, inst: tx.push(tx.locals.pop(inst.argval, NullVariable())))


@op("STORE_FAST")
def STORE_FAST(tx, inst):
    if isinstance(v := tx.pop(), NullVariable):
        tx.locals.pop(inst.argval, None)
    else:
        tx.locals[inst.argval] = v


op("DELETE_FAST")(lambda tx, inst: tx.locals.pop(inst.argval, None))


# (3.11/3.12: the low bit of the argument pushes a NULL first)
@op("LOAD_GLOBAL")
def LOAD_GLOBAL(tx, inst):
    if inst.arg & 1:
        tx.push(NullVariable())
    tx.push(tx.load_global(inst.argval))


op("STORE_GLOBAL")(lambda tx, inst: tx.store_global(inst.argval, tx.pop()))


@op("MAKE_CELL")
def MAKE_CELL(tx, inst):
    if (name := inst.argval) in tx.cells:  # already set up (freevar)
        return
    tx.cells[name] = CellVariable(tx.locals.pop(name, None))


op("LOAD_DEREF")(lambda tx, inst: tx.push(tx.load_cell(inst.argval)))
op("STORE_DEREF")(lambda tx, inst: tx.store_cell(inst.argval, tx.pop()))
op("LOAD_CLOSURE")(lambda tx, inst: tx.push(tx.cells[inst.argval]))


@op("LOAD_CLASSDEREF", PY311)
def LOAD_CLASSDEREF(tx, inst):
    raise Unsupported("class body")


# --- attributes -----------------------------------------------------------------------
# 3.11's LOAD_METHOD, and 3.12's LOAD_ATTR with the low bit of the argument ("method load"), push NULL + attribute
@op("LOAD_ATTR")
@op("LOAD_METHOD", PY311)
def LOAD_ATTR(tx, inst):
    obj = tx.pop()
    if inst.opname == "LOAD_METHOD" or PY >= (3, 12) and inst.arg & 1:
        tx.push(NullVariable())
    tx.push(tx.getattr(obj, inst.argval))


# LOAD_SUPER_ATTR (3.12): coil/capture/opcodes312.py


@op("STORE_ATTR")
def STORE_ATTR(tx, inst):
    value, obj = tx.popn(2)
    tx.store_attr(obj, inst.argval, value)


op("DELETE_ATTR")(lambda tx, inst: tx.pop().del_attr(tx, inst.argval))


# --- calls ------------------------------------------------------------------------------
@op("KW_NAMES")
def KW_NAMES(tx, inst):
    tx.kw_names = inst.argval if isinstance(inst.argval, tuple) else tx.code.co_consts[inst.arg]


def split_call(tx, argc: int):
    """Pop a CALL's operands: returns (fn, args, kwargs) (3.11/3.12 layout:
    ``NULL, callable, args`` or ``callable, self, args``)."""
    kw_names = tx.kw_names
    tx.kw_names = ()
    items = tx.popn(argc + 2)
    fn, args = (items[1], items[2:]) if isinstance(items[0], NullVariable) else (items[0], items[1:])
    kwargs = {}
    if kw_names:
        kv, args = args[len(args) - len(kw_names):], args[:len(args) - len(kw_names)]
        kwargs = dict(zip(kw_names, kv))
    return fn, list(args), kwargs


op("CALL")(lambda tx, inst: tx.push(tx.call(*split_call(tx, inst.arg))))


@op("CALL_FUNCTION_EX")
def CALL_FUNCTION_EX(tx, inst):
    kwargs = tx.pop() if inst.arg & 1 else None
    args, fn = tx.pop(), tx.pop()
    if tx.stack and isinstance(tx.stack[-1], NullVariable):
        tx.pop()
    kw = {}
    if kwargs is not None:
        if not isinstance(kwargs, DictVariable):
            raise Unsupported("** of a non-dict")
        kw = dict(kwargs.items)
    tx.push(tx.call(fn, tx.unpack(args), kw))


@op("MAKE_FUNCTION")
def MAKE_FUNCTION(tx, inst):
    code, flags = tx.pop().as_python_constant(), inst.arg
    closure = tx.unpack(tx.pop()) if flags & 0x08 else []
    if flags & 0x04:
        tx.pop()  # annotations
    kwdefaults = dict(tx.pop().items) if flags & 0x02 else {}
    defaults = tx.unpack(tx.pop()) if flags & 0x01 else []
    tx.push(NestedFunctionVariable(code, code.co_name, tx.f_globals, defaults, kwdefaults, closure))


# CALL_INTRINSIC_1/2 and the other 3.12-only opcodes: coil/capture/opcodes312.py


# --- operators -----------------------------------------------------------------------
_BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
           "%": operator.mod, "**": operator.pow, "@": operator.matmul, "&": operator.and_, "|": operator.or_,
           "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift, "+=": operator.iadd, "-=": operator.isub,
           "*=": operator.imul, "/=": operator.itruediv, "//=": operator.ifloordiv, "%=": operator.imod,
           "**=": operator.ipow, "@=": operator.imatmul, "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor,
           "<<=": operator.ilshift, ">>=": operator.irshift}
_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">": operator.gt, ">=": operator.ge}
op("BINARY_OP")(lambda tx, inst: tx.push(tx.binary_op(_BINARY[dis._nb_ops[inst.arg][1]], *tx.popn(2))))
op("COMPARE_OP")(lambda tx, inst: tx.push(tx.binary_op(_COMPARE[inst.argval], *tx.popn(2))))
op("IS_OP")(lambda tx, inst: tx.push(tx.binary_op(operator.is_not if inst.arg else operator.is_, *tx.popn(2))))


@op("CONTAINS_OP")
def CONTAINS_OP(tx, inst):
    item, container = tx.popn(2)
    res = tx.contains_op(container, item)
    if inst.arg:
        res = ConstantVariable(not tx.truthy(res))
    tx.push(res)


def _unary(fn):
    return lambda tx, inst: tx.push(tx.unary_op(fn, tx.pop()))


op("UNARY_NEGATIVE")(_unary(operator.neg))
op("UNARY_POSITIVE", PY311)(_unary(operator.pos))
op("UNARY_NOT")(_unary(operator.not_))
op("UNARY_INVERT")(_unary(operator.invert))


# --- subscripts and slices --------------------------------------------------------------
op("BINARY_SUBSCR")(lambda tx, inst: tx.push(tx.getitem(*tx.popn(2))))


@op("STORE_SUBSCR")
def STORE_SUBSCR(tx, inst):
    value, obj, key = tx.popn(3)
    tx.call_dunder(obj, "__setitem__", [key, value])


@op("DELETE_SUBSCR")
def DELETE_SUBSCR(tx, inst):
    obj, key = tx.popn(2)
    tx.call_dunder(obj, "__delitem__", [key])


@op("BINARY_SLICE", PY312)
def BINARY_SLICE(tx, inst):
    obj, start, end = tx.popn(3)
    tx.push(tx.getitem(obj, SliceVariable([start, end])))


@op("STORE_SLICE", PY312)
def STORE_SLICE(tx, inst):
    value, obj, start, end = tx.popn(4)
    tx.call_dunder(obj, "__setitem__", [SliceVariable([start, end]), value])


op("BUILD_SLICE")(lambda tx, inst: tx.push(SliceVariable(tx.popn(inst.arg))))


# --- building containers ------------------------------------------------------------------
op("BUILD_TUPLE")(lambda tx, inst: tx.push(TupleVariable(tx.popn(inst.arg))))
op("BUILD_LIST")(lambda tx, inst: tx.push(ListVariable(tx.popn(inst.arg))))
op("BUILD_SET")(lambda tx, inst: tx.push(SetVariable([v.as_python_constant() for v in tx.popn(inst.arg)])))
op("BUILD_CONST_KEY_MAP")(lambda tx, inst: tx.push(DictVariable(dict(zip(tx.pop().as_python_constant(),
                                                                        tx.popn(inst.arg))))))
op("BUILD_STRING")(lambda tx, inst: tx.push(ConstantVariable("".join(p.as_python_constant()
                                                                       for p in tx.popn(inst.arg)))))


@op("BUILD_MAP")
def BUILD_MAP(tx, inst):
    items = tx.popn(2 * inst.arg)
    tx.push(DictVariable({DictVariable.key_of(k): v for k, v in zip(items[::2], items[1::2])}))


def _build_target(tx, inst, above: int = 1):
    """The container a LIST_APPEND-style instruction adds to, under the ``above`` values it adds (still on the stack):
    normally built in this frame; in a 3.12 resume function continuing an inlined comprehension it is a ``___stack``
    input, so record the mutation to replay it (py3.12)."""
    target = tx.stack[-inst.arg - above]
    tx.output.side_effects.mutated(target)
    return target


op("LIST_APPEND")(lambda tx, inst: _build_target(tx, inst).items.append(tx.pop()))
op("SET_ADD")(lambda tx, inst: _build_target(tx, inst).items.add(tx.pop().as_python_constant()))
op("LIST_EXTEND")(lambda tx, inst: _build_target(tx, inst).items.extend(tx.unpack(tx.pop())))
op("SET_UPDATE")(lambda tx, inst: _build_target(tx, inst).items.update(x.as_python_constant()
                                                                        for x in tx.unpack(tx.pop())))


@op("MAP_ADD")
def MAP_ADD(tx, inst):
    target = _build_target(tx, inst, 2)
    k, v = tx.popn(2)
    target.items[DictVariable.key_of(k)] = v


@op("DICT_UPDATE")
@op("DICT_MERGE")
def DICT_UPDATE(tx, inst):
    v, target = tx.pop(), tx.stack[-inst.arg]
    if isinstance(v, DictVariable):
        target.items.update(v.items)
    else:
        for k in tx.unpack(v):
            target.items[DictVariable.key_of(k)] = tx.getitem(v, k)


op("LIST_TO_TUPLE", PY311)(lambda tx, inst: tx.push(TupleVariable(tx.unpack(tx.pop()))))


@op("UNPACK_SEQUENCE")
def UNPACK_SEQUENCE(tx, inst):
    if len(items := tx.unpack(tx.pop())) != inst.arg:
        raise UserCodeError(f"ValueError: expected {inst.arg} values to unpack, got {len(items)}")
    tx.stack.extend(reversed(items))


@op("UNPACK_EX")
def UNPACK_EX(tx, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    if len(items := tx.unpack(tx.pop())) < before + after:
        raise UserCodeError("ValueError: not enough values to unpack")
    mid = len(items) - after
    tx.stack.extend(reversed(items[:before] + [ListVariable(items[before:mid])] + items[mid:]))


@op("FORMAT_VALUE")
def FORMAT_VALUE(tx, inst):
    fmt = tx.pop().as_python_constant() if (inst.arg & 0x04) else ""
    v, conv = tx.pop(), inst.arg & 0x03
    if isinstance(v, TensorVariable):
        raise Unsupported("formatting a tensor into a string reads its data")
    value = const_value(v)      # (a list or dict of constants too: f"{cfg.tags}")
    value = {0: value, 1: str(value), 2: repr(value), 3: ascii(value)}[conv]
    tx.push(ConstantVariable(format(value, fmt)))


op("GET_LEN")(lambda tx, inst: tx.push(tx.call_dunder(tx.stack[-1], "__len__", [])))
# ``match``: whether the subject's type is a sequence (mapping) to a pattern is its Py_TPFLAGS_SEQUENCE (_MAPPING) bit
op("MATCH_SEQUENCE")(lambda tx, inst: tx.push(ConstantVariable(bool(tx.stack[-1].python_type().__flags__ & 32))))
op("MATCH_MAPPING")(lambda tx, inst: tx.push(ConstantVariable(bool(tx.stack[-1].python_type().__flags__ & 64))))


@op("MATCH_KEYS")
def MATCH_KEYS(tx, inst):
    subject, keys = tx.stack[-2], [ConstantVariable(k) for k in tx.stack[-1].as_python_constant()]
    found = all(const_value(tx.call_dunder(subject, "__contains__", [k])) for k in keys)
    tx.push(TupleVariable([tx.getitem(subject, k) for k in keys]) if found else ConstantVariable(None))


@op("MATCH_CLASS")
def MATCH_CLASS(tx, inst):
    n_kw, cls, subject = len(names := tx.pop().as_python_constant()), tx.pop().as_python_constant(), tx.pop()
    if not issubclass(subject.python_type(), cls):
        return tx.push(ConstantVariable(None))
    if inst.arg and cls in (bool, bytearray, bytes, dict, float, frozenset, int, list, set, str, tuple):
        return tx.push(TupleVariable([subject]))      # ``case int(n):`` matches the subject itself
    names = tuple(getattr(cls, "__match_args__", ())[:inst.arg]) + names
    if len(set(names)) != inst.arg + n_kw:
        raise Unsupported("a class pattern Python rejects (too many positional patterns, an attribute twice)")
    found = all(const_value(_hasattr(tx, [subject, ConstantVariable(n)], {})) for n in names)
    tx.push(TupleVariable([tx.getattr(subject, n) for n in names]) if found else ConstantVariable(None))


# --- control flow -----------------------------------------------------------------------
op("RETURN_VALUE")(lambda tx, inst: _return(tx, tx.pop()))


@op("JUMP_FORWARD")
@op("JUMP_BACKWARD")
@op("JUMP_BACKWARD_NO_INTERRUPT")
@op("JUMP", PY312)
def JUMP(tx, inst):
    tx.jump(inst.argval)


def _pop_jump(test):
    """The handler of ``POP_JUMP_*_IF_<test>``: pop the value, jump when ``test(tx, value)``."""
    def handler(tx, inst):
        if test(tx, tx.pop()):
            tx.jump(inst.argval)
    return handler


_POP_JUMP_TESTS = {"TRUE": lambda tx, v: tx.truthy(v), "FALSE": lambda tx, v: not tx.truthy(v),
                   "NONE": lambda tx, v: isinstance(v, ConstantVariable) and v.value is None,
                   "NOT_NONE": lambda tx, v: not (isinstance(v, ConstantVariable) and v.value is None)}
for _test, _fn in _POP_JUMP_TESTS.items():
    # https://docs.python.org/3.11/library/dis.html#opcode-POP_JUMP_FORWARD_IF_TRUE
    op(f"POP_JUMP_FORWARD_IF_{_test}", PY311)(_pop_jump(_fn))
    op(f"POP_JUMP_BACKWARD_IF_{_test}", PY311)(_pop_jump(_fn))
    # https://docs.python.org/3.12/library/dis.html#opcode-POP_JUMP_IF_TRUE
    op(f"POP_JUMP_IF_{_test}", PY312)(_pop_jump(_fn))


def _jump_or_pop(jump_if_true: bool):
    def handler(tx, inst):
        if tx.truthy(tx.stack[-1]) == jump_if_true:
            tx.jump(inst.argval)
        else:
            tx.pop()
    return handler


# https://docs.python.org/3.11/library/dis.html#opcode-JUMP_IF_TRUE_OR_POP
op("JUMP_IF_TRUE_OR_POP", PY311)(_jump_or_pop(True))
op("JUMP_IF_FALSE_OR_POP", PY311)(_jump_or_pop(False))


op("GET_ITER")(lambda tx, inst: tx.push(tx.get_iter(tx.pop())))


# 3.11: exhausted -> pop the iterator, jump to the target.
# 3.12: exhausted -> pop the iterator, jump past the END_FOR at the target.
@op("FOR_ITER")
def FOR_ITER(tx, inst):
    if not isinstance(it := tx.stack[-1], ListIteratorVariable):
        raise Unsupported(f"iteration over {it}")
    if (v := it.next(tx)) is None:
        tx.pop()
        tx.jump(inst.argval)
        if PY >= (3, 12):
            tx.ip += 1
    else:
        tx.push(v)


# --- generators (inlined generator functions collect what they yield) -----------------------
@op("RETURN_GENERATOR")
def RETURN_GENERATOR(tx, inst):
    if tx.generated is None:
        raise Unsupported("generator in the root frame")
    tx.push(ConstantVariable(None))


@op("YIELD_VALUE")
def YIELD_VALUE(tx, inst):
    if tx.generated is None:
        raise Unsupported("yield in the root frame")
    tx.generated.append(tx.pop())
    tx.push(ConstantVariable(None))


# --- with blocks, exceptions, asserts ---------------------------------------------------
@op("BEFORE_WITH")
def BEFORE_WITH(tx, inst):
    if isinstance(ctx := tx.pop(), ContextManagerVariable):
        tx.push(BoundMethodVariable(ctx, "__exit__"))
        tx.push(ctx.enter(tx))
        return
    exit_, enter = tx.getattr(ctx, "__exit__"), tx.getattr(ctx, "__enter__")
    tx.push(exit_)
    tx.push(tx.call(enter, [], {}))


op("LOAD_ASSERTION_ERROR")(lambda tx, inst: tx.push(UserDefinedClassVariable(AssertionError)))


# --- exceptions raised and handled inside traced code ----------------------------------
# A raise goes through InstructionTranslatorBase.step: the frame's exception table (dis._parse_exception_table) names
# the handler; without one the caller's frame tries at its call instruction; an exception no traced frame handles is a
# graph break where it was first raised. tx.exc_stack holds the exceptions being handled (sys.exc_info()).
def _exception_of(tx, v):
    if isinstance(v, ExceptionVariable):
        return v
    if isinstance(v, UserDefinedClassVariable) and isinstance(v.value, type) and issubclass(v.value, BaseException):
        if isinstance(exc := tx.call(v, [], {}), ExceptionVariable):
            return exc
    raise Unsupported(f"raise of {v}", hint="the exception is raised outside the graph")


@op("RAISE_VARARGS")
def RAISE_VARARGS(tx, inst):
    if inst.arg == 0:
        if not tx.exc_stack:
            raise Unsupported("bare raise outside an except block")
        tx.exc_stack[-1].raise_()
    _exception_of(tx, tx.popn(inst.arg)[0]).raise_()      # ``raise e from cause``: the cause is not kept


@op("PUSH_EXC_INFO")
def PUSH_EXC_INFO(tx, inst):
    exc = tx.pop()
    tx.push(tx.exc_stack[-1] if tx.exc_stack else ConstantVariable(None))
    tx.push(exc)
    tx.exc_stack.append(exc)


@op("POP_EXCEPT")
def POP_EXCEPT(tx, inst):
    tx.pop()
    if tx.exc_stack:
        tx.exc_stack.pop()


@op("CHECK_EXC_MATCH")
def CHECK_EXC_MATCH(tx, inst):
    want = tx.pop()
    if not isinstance(exc := tx.stack[-1], ExceptionVariable):
        raise Unsupported(f"except clause matching {exc}")
    try:
        cls = const_value(want)
        tx.push(ConstantVariable(issubclass(exc.cls, tuple(cls) if isinstance(cls, list) else cls)))
    except (TypeError, NotImplementedError) as e:
        raise Unsupported(f"except clause with {want}") from e


@op("RERAISE")
def RERAISE(tx, inst):
    exc = tx.pop()
    if inst.arg:
        tx.pop()
    _exception_of(tx, exc).raise_()


# Stack: [..., __exit__, lasti, previous exception, exception]; push __exit__(type, value, tb).
@op("WITH_EXCEPT_START")
def WITH_EXCEPT_START(tx, inst):
    if not isinstance(exc := tx.stack[-1], ExceptionVariable):
        raise Unsupported(f"with block exiting on {exc}")
    tx.push(tx.call(tx.stack[-4], [UserDefinedClassVariable(exc.cls), exc, ConstantVariable(None)], {}))


@op("CLEANUP_THROW", PY312)
def _exception_path(tx, inst):
    raise Unsupported("exception handling path")


# --- imports -------------------------------------------------------------------------
@op("IMPORT_NAME")
def IMPORT_NAME(tx, inst):
    fromlist, level = tx.pop().as_python_constant(), tx.pop().as_python_constant()
    name = inst.argval
    if level:   # ``from . import x`` / ``from ..m import y``: the absolute name, from the module's package
        g = tx.f_globals
        name = importlib.util.resolve_name("." * level + name, g.get("__package__") or g["__name__"].rpartition(".")[0])
    if name not in sys.modules:
        raise Unsupported(f"import of {name} (not imported yet)")
    mod = importlib.import_module(name)
    if missing := [n for n in fromlist or () if n != "*" and n not in vars(mod) and f"{name}.{n}" not in sys.modules
                   and getattr(mod, "__path__", None) and importlib.util.find_spec(f"{name}.{n}")]:
        raise Unsupported(f"import of {name}.{missing[0]} (not imported yet)")    # (eager's import loads it)
    if not fromlist:
        mod = sys.modules[name.split(".")[0]]
    # held by identity, so what is read through it is guarded (mod.K, from mod import cfg)
    tx.push(wrap(tx, mod, ConstSource(tx.output.guards.const(mod))))


op("IMPORT_FROM")(lambda tx, inst: tx.push(tx.getattr(tx.stack[-1], inst.argval)))


# 3.12-only handlers register themselves (last, so they win on 3.12).
from coil.capture import opcodes312  # noqa: E402,F401
