"""InstructionTranslator: symbolic execution of CPython 3.11/3.12 bytecode.

The translator walks a frame's instructions (from :func:`dis.get_instructions`) with a stack and locals of
:class:`VariableTracker`s; each opcode has one small handler in :mod:`coil.capture.opcodes`. Calls to Python functions
and ``nn.Module.forward`` are inlined by an :class:`InliningTranslator` that shares the
:class:`~coil.capture.output.OutputGraph`.

Graph breaks: when an instruction raises :class:`coil.exc.Unsupported` (directly or anywhere inside an inlined call),
the root translator remembers the offset and restarts from scratch (:class:`RestartAnalysis`); on the second pass it
stops *before* that instruction (:meth:`InstructionTranslator.break_graph`), so the graph holds only what ran before it
and the stack/locals at that point are known exactly.

This module also holds the Python semantics shared by the handlers: binary and unary operators, attribute access, calls,
``nn.Module`` calls with hooks, object construction, iteration and truthiness."""
from __future__ import annotations

import collections
import contextlib
import dis
import functools
import linecache
import operator
import types
from typing import Any, Optional

import torch
from torch.nn.modules import module as _mm

from coil.exc import SourceLocation, Unsupported, optimizer_not_compiled
from coil.capture.source import AttrSource, BuiltinSource, ConstSource, GlobalSource
from coil.capture.variables.base import (CellVariable, ConstantVariable, NumpyArrayVariable, SourcedCellVariable,
                                         VariableTracker)
from coil.capture.variables.builder import wrap, wrap_constant_result
from coil.capture.variables.containers import (BaseListVariable, BoundMethodVariable, DequeVariable, DictVariable,
                                               GeneratorVariable, ListIteratorVariable, ListVariable,
                                               NamedTupleVariable, SetVariable, SizeVariable, TupleVariable)
from coil.capture.variables.functions import (BaseFunctionVariable, TypeErrorInCall,
                                              UserFunctionVariable, UserMethodVariable)
from coil.capture.variables.objects import (AttributeMissing, guard_mro_lookup, DataClassDictVariable,
                                            InFrameModuleVariable, ModuleInitProbe, NewObjectVariable, NNModuleVariable,
                                            ObjectVariableBase, UserDefinedClassVariable, UserDefinedObjectVariable,
                                            is_model_output_class, _static_lookup, _SENTINEL, _DICT_READS, _dict_lookup, _torch_nn)
from coil.capture.variables.tensor import TensorVariable, UserCodeError, call_op
from coil.capture.variables.symbolic import SymNodeVariable
from coil.capture.variables.symbolic import binary as sym_binary, unary as sym_unary
from coil.capture.exceptions import ExceptionVariable, exception_table, exception_tracker
from coil.capture.variables.objects import lookup_attr, static_value
from coil.capture.variables.torchfn import CONTEXT_CLASSES, ContextManagerVariable, make_context
from coil.capture.inspection import frame_unsupported
from coil.capture.resume import is_resume

CO_GENERATOR = 0x20
CO_COROUTINE = 0x80
CO_ASYNC_GENERATOR = 0x200
MAX_INLINE_DEPTH = 48
#: coil modules holding user-level model code (the bench suite's own models) that are
#: traced like user code; the rest of coil is compiler code and runs outside graphs.
TRACED_COIL_MODULES = ("coil.bench.models", "coil.bench.broad", "coil.bench.reduce_overhead")  # the bench's model code
MAX_STEPS = 2_000_000

_CAPTURE_DIR = __file__.rsplit("/", 1)[0] + "/"


def _stack_lines(frames) -> list[str]:
    return [f'File "{f}", line {line}, in {name}' for f, line, name in frames]


def _stack_trace(frames) -> str:
    parts = []
    for f, line, name in frames:
        parts.append(f'  File "{f}", line {line}, in {name}\n')
        if line and (src := linecache.getline(f, line).strip()):
            parts.append(f"    {src}\n")
    return "".join(parts)


#: Modules whose functions are never inlined (a call is a graph break).
SKIP_MODULES = ("logging", "warnings", "inspect", "threading", "traceback", "pdb", "copy",
                "importlib", "os", "sys", "io", "pickle", "weakref", "random", "time")

# pure-Python library classes whose methods are traced though their module is skipped
# (transformers' output capturing binds ``forward``'s signature on every call)
_TRACED_LIBRARY_CLASSES = {"inspect": ("Signature.", "BoundArguments.", "Parameter.")}


def _traced_library_code(mod: str, code) -> bool:
    return code.co_qualname.startswith(_TRACED_LIBRARY_CLASSES.get(mod, "\0"))


_INPLACE_TO_OUT = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                   operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
                   operator.imod: operator.mod, operator.ipow: operator.pow, operator.imatmul: operator.matmul,
                   operator.iand: operator.and_, operator.ior: operator.or_, operator.ixor: operator.xor,
                   operator.ilshift: operator.lshift, operator.irshift: operator.rshift}
_SET_UPDATES = {operator.ior: "update", operator.iand: "intersection_update", operator.isub: "difference_update",
                operator.ixor: "symmetric_difference_update"}   # ``s |= t`` changes s itself


def const_value(v):
    """The Python value of a tracker made only of constants (lists and dicts included)."""
    if isinstance(v, (ListVariable, TupleVariable)) and not isinstance(v, NamedTupleVariable):
        kind = list if isinstance(v, ListVariable) else torch.Size if isinstance(v, SizeVariable) else tuple
        return kind(const_value(i) for i in v.items)
    if isinstance(v, DictVariable):
        return {k: const_value(x) for k, x in v.items.items()}
    if isinstance(v, ListIteratorVariable):
        return [const_value(x) for x in v.items[v.index:]]
    return set(v.items) if isinstance(v, SetVariable) else v.as_python_constant()


#: nn.Module hook dicts a traced module call depends on (per module, and global)
_MODULE_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GLOBAL_HOOKS = tuple("_global" + h for h in _MODULE_HOOKS)


class RestartAnalysis(Exception):
    """Translate the frame again (a graph break was found at a new offset)."""


class BreakInfo:
    """Where and why the root frame breaks: ``offset``, ``reason``, user ``stack``."""

    def __init__(self, offset: int, reason: str, stack: list[str], exc: Unsupported):
        self.offset, self.reason, self.stack, self.exc = offset, reason, stack, exc


class ReturnValue(Exception):
    def __init__(self, value):
        self.value = value


def instructions_of(code: types.CodeType) -> tuple:
    """The instructions of ``code`` without EXTENDED_ARG (cached per code object: a GPT-2 capture inlines
    ~1500 calls of a few dozen functions, and disassembling each call again took 1.6 s of its 3.5 s)."""
    return _decoded(code)[0]


def _offset_map(code: types.CodeType) -> dict:
    """Byte offset → instruction index; EXTENDED_ARG → the instruction it extends (jump target). Shared: copy it."""
    return _decoded(code)[1]


@functools.lru_cache(maxsize=8192)
def _decoded(code: types.CodeType) -> tuple:
    """(:func:`instructions_of`, :func:`_offset_map`) of ``code``, from one disassembly."""
    insts, offsets, pending = [], {}, []
    for inst in dis.get_instructions(code):
        if inst.opname == "EXTENDED_ARG":
            pending.append(inst.offset)
            continue
        for off in pending + [inst.offset]:
            offsets[off] = len(insts)
        pending.clear()
        insts.append(inst)
    return tuple(insts), offsets


def _may_suppress(exit_: VariableTracker) -> bool:
    """Whether a with block's ``__exit__`` may swallow an exception: not one of coil's regions (no_grad, autocast), nor
    one that returns only None / False constants, nor a @contextmanager whose generator catches none (no POP_EXCEPT but
    before a re-raise: ``try``/``finally``)."""
    if isinstance(exit_, BoundMethodVariable):
        return not isinstance(exit_.obj, ContextManagerVariable)
    ins = list(dis.get_instructions(fn)) if isinstance(fn := getattr(exit_, "fn", None), types.FunctionType) else []
    if ins and not any(b.opname == "RETURN_CONST" and b.argval or b.opname == "RETURN_VALUE" and (    # (nullcontext)
            b.is_jump_target or not (a.opname == "LOAD_CONST" and not a.argval)) for a, b in zip(ins, ins[1:])):
        return False    # an __exit__ that returns only None / False constants swallows nothing
    gen = getattr(getattr(exit_, "obj", None), "attrs", {}).get("gen")
    if getattr(exit_, "fn", None) is contextlib._GeneratorContextManager.__exit__ and \
            isinstance(gen, GeneratorVariable) and isinstance(gen.fn, UserFunctionVariable):
        ins = list(dis.get_instructions(gen.fn.fn))
        return any(a.opname == "POP_EXCEPT" and b.opname != "RERAISE" for a, b in zip(ins, ins[1:]))
    return True


class InstructionTranslatorBase:
    """State and semantics shared by the root and inlining translators."""

    def __init__(self, code: types.CodeType, f_globals: dict, output, symbolic_locals: dict, cells: dict,
                 parent: Optional["InstructionTranslatorBase"] = None, fn_name: str = ""):
        from coil.capture import opcodes
        self.code, self.f_globals, self.output, self.parent = code, f_globals, output, parent
        self.instructions = instructions_of(code)
        self.offset_to_index = dict(_offset_map(code))
        self.ip = 0
        self.stack: list[VariableTracker] = []
        self.locals: dict[str, VariableTracker] = dict(symbolic_locals)
        self.cells: dict[str, Any] = dict(cells)
        self.kw_names: tuple = ()
        self.current = None
        self.depth = 0 if parent is None else parent.depth + 1
        self.handlers = opcodes.HANDLERS
        self.generated: Optional[list] = [] if code.co_flags & CO_GENERATOR else None
        self.fn_name = fn_name or code.co_name
        self.exc_stack: list[VariableTracker] = []     # exceptions being handled
        self.gname = "___G" if f_globals is output.f_globals else output.guards.const(f_globals)

    # --- stack -------------------------------------------------------------------------
    def push(self, v: VariableTracker) -> None:
        self.stack.append(v)

    def pop(self) -> VariableTracker:
        return self.stack.pop()

    def popn(self, n: int) -> list:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump(self, offset: int) -> None:
        self.ip = self.offset_to_index[offset]

    # --- exceptions raised and caught in traced code ---------------------------------
    def handle_exception(self, inst, exc_vt: "ExceptionVariable") -> bool:
        """Route a Python-level exception raised at ``inst`` to this frame's handler (CPython's exception
        table): truncate the stack to the entry's depth, push the raising offset if ``lasti``, push the
        exception, jump. False: no handler here (the caller's frame tries next, at its call instruction)."""
        for entry in exception_table(self.code):
            if entry.start <= inst.offset < entry.end:
                del self.stack[entry.depth:]
                if entry.lasti:
                    self.push(ConstantVariable(inst.offset))
                self.push(exc_vt)
                self.jump(entry.target)
                return True
        return False

    # --- the loop ---------------------------------------------------------------------
    def step(self, inst) -> None:
        self.current = inst
        self.output.current_tx = self
        if (h := self.handlers.get(inst.opname)) is None:
            raise Unsupported(f"opcode {inst.opname} is not supported", hint="add a handler in coil/capture/opcodes.py")
        try:
            h(self, inst)
        except Unsupported as e:
            if self.parent is None and getattr(e, "root_offset", None) is None:
                e.root_offset = inst.offset      # an unhandled raise breaks the graph here
            if (exc_vt := exception_tracker(e)) is not None and self.handle_exception(inst, exc_vt):
                return
            if getattr(e, "user_stack", None) is None:
                e.user_stack = self.user_stack()
                if e.location is None:
                    e.location = self.location()
            raise
        except (ReturnValue, RestartAnalysis):
            raise
        except Exception as e:  # (an internal error) where capture stopped: the fallback warning names it
            if getattr(e, "coil_location", None) is None:
                e.coil_location = self.location()
            raise

    def user_frames(self) -> list[tuple[str, Optional[int], str]]:
        """``(filename, line, function)`` of the user's frames, outermost first (coil's own
        module-call wrapper frame, ``coil/capture/frame.py``, is left out)."""
        frames, tx = [], self
        while tx is not None:
            if tx.code.co_filename.startswith(_CAPTURE_DIR):
                tx = tx.parent
                continue
            inst = tx.current
            line = inst.positions.lineno if inst is not None and inst.positions else None
            if line is None and inst is not None:
                line = inst.starts_line
            frames.append((tx.code.co_filename, line, tx.code.co_name))
            tx = tx.parent
        return list(reversed(frames))

    def user_stack(self) -> list[str]:
        """``File ..., line ..., in ...`` lines, outermost first: the user's frames only."""
        return _stack_lines(self.user_frames())

    def root_site(self) -> tuple:
        """``(offset, user stack)`` of the root frame's current instruction: where a problem found later breaks the
        graph (:class:`~coil.capture.output.BreakEarlier`, an ``Unsupported`` with ``root_offset``)."""
        root = self
        while root.parent is not None:
            root = root.parent
        return root.current.offset, self.user_stack()

    def locate_node(self, node: torch.fx.Node) -> None:
        """Record where the user's code made graph node ``node``: ``meta["stack"]`` (short, innermost frame
        first, for coil's messages) and ``meta["stack_trace"]``, the user's frames as traceback text,
        outermost first (per frame ``  File "m.py", line 5, in f`` and the source line indented by four): the
        key torch.fx's ``print_readable``, ``make_fx`` (which copies it into the ATen graphs) and torch's
        backends read; a kernel's failed bounds check names its innermost line."""
        frames, tx = self.user_frames(), self
        while tx is not None and not self.output.in_try:    # made inside a try block: see frame.py
            off, ins = tx.current.offset if tx.current is not None else -1, tx.instructions
            # (or a with block whose __exit__ may suppress the error, contextlib.suppress: not no_grad / autocast)
            self.output.in_try = any(e.start <= off < e.end and ins[k := tx.offset_to_index[e.target]].opname ==
                                     "PUSH_EXC_INFO" and (ins[k + 1].opname != "WITH_EXCEPT_START" or
                                                          _may_suppress(tx.stack[e.depth - 1]))
                                     for e in exception_table(tx.code)) and self.output.where()
            tx = tx.parent
        node.meta["stack"] = " <- ".join(reversed(_stack_lines(frames)[-3:]))
        if trace := _stack_trace(frames):
            node.meta["stack_trace"] = trace

    def location(self):
        inst = self.current
        line = inst.positions.lineno if inst is not None and inst.positions else self.code.co_firstlineno
        return SourceLocation.of(self.code.co_filename, line or self.code.co_firstlineno)

    # --- loading names ----------------------------------------------------------------
    def load_global(self, name: str) -> VariableTracker:
        if (pending := self.output.side_effects.pending_global(self.f_globals, name)) is not None:
            return pending
        if name in self.f_globals:
            return wrap(self, self.f_globals[name], GlobalSource(name, self.gname))
        builtins_ = self.f_globals.get("__builtins__", __builtins__)
        bdict = builtins_ if isinstance(builtins_, dict) else builtins_.__dict__
        if name in bdict:
            return wrap(self, bdict[name], BuiltinSource(name), guard=False)
        raise UserCodeError(f"NameError: name '{name}' is not defined")

    def store_global(self, name: str, value: VariableTracker) -> None:
        self.output.side_effects.store_global(self.f_globals, self.gname, name, value)

    def load_cell(self, name: str) -> VariableTracker:
        return self.read_cell(self.cells[name], name)

    def read_cell(self, cell, name: str) -> VariableTracker:
        """The content of a cell tracker (``name`` for the NameError of an empty one)."""
        if isinstance(cell, CellVariable):
            if cell.content is None:
                raise UserCodeError(f"NameError: free variable '{name}' referenced before assignment")
            return cell.content
        if (pending := self.output.side_effects.cells.get(id(cell))) is not None:
            return pending
        try:
            value = cell.cell.cell_contents
        except ValueError:
            raise UserCodeError(f"NameError: free variable '{name}' referenced before assignment")
        return wrap(self, value, cell.source, guard=cell.source is not None)

    def store_cell(self, name: str, value: VariableTracker) -> None:
        self.write_cell(self.cells[name], value)

    def write_cell(self, cell, value: VariableTracker) -> None:
        """Set a cell tracker's content (a side effect on a real cell)."""
        if isinstance(cell, CellVariable):
            cell.content = value
        else:
            self.output.side_effects.store_cell(cell, value)

    # --- Python semantics ---------------------------------------------------------------
    def truthy(self, v: VariableTracker) -> bool:
        return v.truthy(self)

    def getattr(self, obj: VariableTracker, name: str) -> VariableTracker:
        return obj.var_getattr(self, name)

    def store_attr(self, obj: VariableTracker, name: str, value: VariableTracker, plain: bool = False) -> None:
        if isinstance(obj, (CellVariable, SourcedCellVariable)) and name == "cell_contents":
            self.write_cell(obj, value)
            return
        if isinstance(obj, NewObjectVariable) and plain:
            obj.attrs[name] = value
            return
        if isinstance(obj, (NewObjectVariable, DataClassDictVariable)):
            obj.set_attr(self, name, value)
            return
        if isinstance(obj, InFrameModuleVariable):
            # rebuilt from its arguments at a graph break: a write would be lost
            raise Unsupported(f"setting attribute {name} on a module created inside the frame")
        if isinstance(obj, ObjectVariableBase) and obj.value is not None and not isinstance(
                obj, UserDefinedClassVariable):
            cls = type(obj.value)
            if isinstance(cls_attr := _static_lookup(cls, name), property) and not plain:
                if cls_attr.fset is None:
                    raise UserCodeError(f"AttributeError: can't set attribute '{name}'")
                self.call(UserFunctionVariable(cls_attr.fset), [obj, value], {})
                return
            if cls_attr is not _SENTINEL and hasattr(type(cls_attr), "__set__") and not plain and \
                    not isinstance(cls_attr, types.MemberDescriptorType):
                raise Unsupported(f"setting data descriptor {name} of {cls.__name__}")
            setattr_fn = _static_lookup(cls, "__setattr__")
            if not plain and setattr_fn not in (object.__setattr__, torch.nn.Module.__setattr__):
                if isinstance(setattr_fn, types.FunctionType):
                    self.call(UserMethodVariable(setattr_fn, obj), [ConstantVariable(name), value], {})
                    return
                raise Unsupported(f"custom __setattr__ of {cls.__name__}")
            if isinstance(obj.value, torch.nn.Module) and isinstance(value, TensorVariable) and \
                    (name in obj.value._parameters):
                raise Unsupported("assigning a tensor to a registered parameter inside the frame")
            self.output.side_effects.store_attr(obj, name, value)
            return
        if isinstance(obj, TensorVariable) and name == "data" and value is obj:
            return      # ``p.data = p``: Module.to() of a dtype and device it already has (``t.to`` returned t)
        if isinstance(obj, TensorVariable):
            raise Unsupported(f"setting attribute {name} on a tensor")
        if hasattr(obj, "set_attr"):    # (an exception's __traceback__)
            return obj.set_attr(self, name, value)
        raise Unsupported(f"setting attribute {name} on {obj}")

    def call(self, fn: VariableTracker, args: list, kwargs: dict) -> VariableTracker:
        return fn.call_function(self, list(args), dict(kwargs))

    def call_dunder(self, obj: VariableTracker, name: str, args: list) -> VariableTracker:
        return obj.call_method(self, name, list(args), {})

    def getitem(self, obj, key):
        if isinstance(obj, UserDefinedClassVariable) or type(getattr(obj, "value", None)).__module__ == "typing" or (
                obj.is_python_constant() and isinstance(obj.as_python_constant(), type)):
            # a class: its __class_getitem__ (list[int]); a typing form (typing.Dict[str, torch.Tensor])
            what = f"subscript of {obj.python_type().__name__} by a value known only at run time"
            return wrap_constant_result(self, static_value(obj, what)[static_value(key, what)])
        if isinstance(obj, ConstantVariable) and isinstance(key, TensorVariable):
            raise Unsupported("indexing a constant with a tensor")
        return obj.call_method(self, "__getitem__", [key], {})

    def get_iter(self, v: VariableTracker) -> VariableTracker:
        if isinstance(v, ListIteratorVariable) and v.kind == "iterator":
            return v
        if isinstance(v, (UserDefinedObjectVariable, NewObjectVariable)):
            it = self.call_dunder(v, "__iter__", [])
            return self.get_iter(it) if not isinstance(it, ListIteratorVariable) else it
        if isinstance(v, ListIteratorVariable):
            return v.iterate()
        if isinstance(v, DequeVariable):
            return v.iterator()
        if type(v) in (ListVariable, DictVariable, SetVariable):
            # CPython semantics on mutation during the loop (see ListIteratorVariable)
            return ListIteratorVariable(self.unpack(v), container=v)
        return ListIteratorVariable(self.unpack(v))

    def unpack(self, v: VariableTracker) -> list:
        return v.unpack(self)

    def contains(self, items: list, v: VariableTracker) -> bool:
        return any(self.values_equal(it, v) for it in items)

    def contains_op(self, container, item) -> VariableTracker:
        if isinstance(container, ConstantVariable) and isinstance(item, ConstantVariable):
            return ConstantVariable(item.value in container.value)
        if isinstance(container, TensorVariable):
            raise Unsupported("`in` on a tensor depends on its data")
        return container.call_method(self, "__contains__", [item], {})

    def values_equal(self, a, b) -> bool:
        return a is b or self.truthy(self.binary_op(operator.eq, a, b))

    def sorted_items(self, items, key, reverse):
        keyed = []
        for it in items:
            k = self.call(key, [it], {}) if key is not None and not (
                isinstance(key, ConstantVariable) and key.value is None) else it
            keyed.append((k.as_python_constant() if k.is_python_constant() else k, it))
        if all(not isinstance(k, VariableTracker) for k, _ in keyed):
            keyed.sort(key=lambda p: p[0], reverse=reverse)
        else:   # keys with traced parts (tuples holding tensors): compared as Python does, with < only
            keyed = [(k if isinstance(k, VariableTracker) else wrap_constant_result(self, k), it) for k, it in keyed]
            keyed.sort(key=functools.cmp_to_key(
                lambda p, q: -1 if self.truthy(self.binary_op(operator.lt, p[0], q[0])) else 0), reverse=reverse)
        return [it for _, it in keyed]

    def is_same(self, a, b) -> bool:
        if a is b:
            return True
        if isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
            return a.value is b.value
        if isinstance(a, ObjectVariableBase) and isinstance(b, ObjectVariableBase):
            return getattr(a, "value", _SENTINEL) is getattr(b, "value", _SENTINEL)
        fa, fb = getattr(a, "fn", _SENTINEL), getattr(b, "fn", _SENTINEL)
        if fa is not _SENTINEL and fa is fb and type(a) is type(b) and not hasattr(a, "obj"):
            return True
        # an in-place op (``y = x.add_(1)``, ``y += 1``) returns the tensor it wrote: a new node, the same fake
        return isinstance(a, TensorVariable) and isinstance(b, TensorVariable) and (a.node is b.node or a.fake is b.fake)

    def binary_op(self, op, a: VariableTracker, b: VariableTracker) -> VariableTracker:
        if isinstance(a, BaseListVariable) and isinstance(b, ConstantVariable) and type(b.value) is tuple:
            b = TupleVariable([ConstantVariable(v) for v in b.value])
        if isinstance(b, BaseListVariable) and isinstance(a, ConstantVariable) and type(a.value) is tuple:
            a = TupleVariable([ConstantVariable(v) for v in a.value])
        if isinstance(a, SetVariable) and op in _SET_UPDATES:
            if isinstance(b, SetVariable) or type(b.as_python_constant_or_none()) is frozenset:
                a.call_method(self, _SET_UPDATES[op], [b], {})
                return a
            op = _INPLACE_TO_OUT[op]    # ``s |= d.keys()``: a new set (dict_keys.__ror__), as in eager
        if isinstance(a, ListIteratorVariable) and a.kind in ("keys", "items") and op in (
                operator.and_, operator.or_, operator.sub, operator.xor):
            a = SetVariable([v.as_python_constant() for v in a.items])
        if isinstance(a, SetVariable) and isinstance(b, (SetVariable, ListIteratorVariable)) and op in (
                operator.and_, operator.or_, operator.sub, operator.xor):
            other = b.as_python_constant() if isinstance(b, SetVariable) else {v.as_python_constant() for v in b.items}
            return SetVariable(op(set(a.items), set(other)))
        from coil.capture.variables.builtins import IdVariable
        if isinstance(a, IdVariable) or isinstance(b, IdVariable):
            if isinstance(a, IdVariable) and isinstance(b, IdVariable) and op in (operator.eq, operator.ne):
                same = self.is_same(a.target, b.target)
                return ConstantVariable(same if op is operator.eq else not same)
            raise Unsupported("id() of a traced value used in arithmetic")
        if isinstance(a, SymNodeVariable) or isinstance(b, SymNodeVariable):
            if (res := sym_binary(self, op, a, b)) is not None:   # sizes stay symbolic (variables/symbolic.py)
                return res
        if op in (operator.is_, operator.is_not):
            return ConstantVariable(self.is_same(a, b) == (op is operator.is_))
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            if isinstance(a, (NNModuleVariable, UserDefinedObjectVariable, NewObjectVariable)) or \
                    isinstance(b, (NNModuleVariable, UserDefinedObjectVariable, NewObjectVariable)):
                if (res := self._user_binary(op, a, b)) is not None:
                    return res
            if op in (operator.eq, operator.ne) and ((isinstance(a, ConstantVariable) and a.value is None)
                                                     or (isinstance(b, ConstantVariable) and b.value is None)):
                return ConstantVariable(op is operator.ne)
            if not isinstance(a, TensorVariable) and op in _INPLACE_TO_OUT:
                op = _INPLACE_TO_OUT[op]
            return call_op(self, "call_function", op, [a, b], {})
        if (isinstance(a, DequeVariable) or isinstance(b, DequeVariable)) and not (
                type(a) is type(b) and op in (operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
                                              operator.ge)):   # a deque is no list: == [..] is False, + keeps maxlen
            raise Unsupported(f"operator {getattr(op, '__name__', op)} on a deque")
        if a.is_python_constant() and b.is_python_constant() and not isinstance(
                a, (BaseFunctionVariable, UserDefinedClassVariable)):
            ca, cb = a.as_python_constant(), b.as_python_constant()
            try:
                return wrap_constant_result(self, op(ca, cb))
            except Exception as e:  # noqa: BLE001
                if isinstance(a, NumpyArrayVariable) or isinstance(b, NumpyArrayVariable):  # (``a += 1``: read-only)
                    raise Unsupported(f"numpy array {getattr(op, '__name__', op)} raised {type(e).__name__}") from None
                raise UserCodeError(f"{type(e).__name__}: {e}") from e
        if isinstance(a, BaseListVariable) and isinstance(b, BaseListVariable):
            if op in (operator.add, operator.iadd) and isinstance(a, ListVariable) == isinstance(b, ListVariable):
                if op is operator.iadd and isinstance(a, ListVariable):
                    return a.call_method(self, "__iadd__", [b], {})
                cls = ListVariable if isinstance(a, ListVariable) else \
                    SizeVariable if SizeVariable in (type(a), type(b)) else TupleVariable
                return cls(a.items + b.items)     # tuple + torch.Size is a torch.Size
            if op in (operator.eq, operator.ne):
                eq = len(a.items) == len(b.items) and all(self.values_equal(x, y) for x, y in zip(a.items, b.items))
                return ConstantVariable(eq if op is operator.eq else not eq)
            if op in (operator.lt, operator.le, operator.gt, operator.ge) and \
                    isinstance(a, ListVariable) == isinstance(b, ListVariable):
                for x, y in zip(a.items, b.items):   # lexicographic: the first pair that differs decides
                    if not self.values_equal(x, y):  # ((1, t) < (2, t), sorted(d.items()) with tensor values)
                        return ConstantVariable(self.truthy(self.binary_op(op, x, y)))
                return ConstantVariable(op(len(a.items), len(b.items)))
        if isinstance(a, ListVariable) and op in (operator.iadd, operator.imul):    # the list itself
            return a.call_method(self, f"__{op.__name__}__", [b], {})
        if isinstance(a, BaseListVariable) and op in (operator.mul, operator.imul) and b.is_python_constant():
            cls = ListVariable if isinstance(a, ListVariable) else TupleVariable
            return cls(a.items * b.as_python_constant())
        if isinstance(a, DictVariable) and isinstance(b, DictVariable) and op in (operator.or_, operator.ior):
            if op is operator.ior:
                a.call_method(self, "update", [b], {})
                return a
            return DictVariable({**a.items, **b.items}, a.user_cls)
        if isinstance(a, DictVariable) and isinstance(b, DictVariable) and op in (operator.eq, operator.ne):
            plain = (dict.__eq__, collections.OrderedDict.__eq__)
            if _static_lookup(a.user_cls, "__eq__") not in plain or _static_lookup(b.user_cls, "__eq__") not in plain:
                raise Unsupported(f"operator {op.__name__} on a {a.user_cls.__qualname__} (its own __eq__)")
            ordered = all(issubclass(d.user_cls, collections.OrderedDict) for d in (a, b))
            eq = (list(a.items) == list(b.items) if ordered else a.items.keys() == b.items.keys()) and all(
                self.is_same(v, b.items[k]) or self.values_equal(v, b.items[k]) for k, v in a.items.items())
            return ConstantVariable(eq if op is operator.eq else not eq)   # as dict.__eq__: identity, then ==
        if (res := self._user_binary(op, a, b)) is not None:
            return res
        if op in (operator.eq, operator.ne):
            for v in (a, b):    # identity is == only for objects whose class keeps object's __eq__/__ne__:
                cls = type(v.value) if isinstance(v, NumpyArrayVariable) else self._object_class(v)  # (elementwise)
                if cls is not None and (_static_lookup(cls, "__eq__") is not object.__eq__
                                        or _static_lookup(cls, "__ne__") is not object.__ne__):
                    raise Unsupported(f"operator {op.__name__} on {cls.__qualname__} objects (their own __eq__)")
            same = self.is_same(a, b)
            if same or not (isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable)):
                return ConstantVariable(same if op is operator.eq else not same)
        raise Unsupported(f"operator {op.__name__} on {a} and {b}")

    @staticmethod
    def _object_class(v) -> Optional[type]:
        """The class of a traced user object (None for other trackers)."""
        if isinstance(v, NewObjectVariable):
            return v.cls
        return type(v.value) if isinstance(v, (UserDefinedObjectVariable, NNModuleVariable)) else None

    _DUNDER = {operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"),
               operator.mul: ("__mul__", "__rmul__"), operator.truediv: ("__truediv__", "__rtruediv__"),
               operator.matmul: ("__matmul__", "__rmatmul__"), operator.eq: ("__eq__", "__eq__"),
               operator.ne: ("__ne__", "__ne__"), operator.lt: ("__lt__", "__gt__"), operator.gt: ("__gt__", "__lt__"),
               operator.le: ("__le__", "__ge__"), operator.ge: ("__ge__", "__le__"),
               operator.floordiv: ("__floordiv__", "__rfloordiv__"), operator.mod: ("__mod__", "__rmod__"),
               operator.pow: ("__pow__", "__rpow__"), operator.iadd: ("__iadd__", "__radd__"),
               operator.imul: ("__imul__", "__rmul__"), operator.isub: ("__isub__", "__rsub__"),
               operator.and_: ("__and__", "__rand__"), operator.or_: ("__or__", "__ror__")}

    def _user_binary(self, op, a, b):
        if (names := self._DUNDER.get(op)) is None:
            return None
        for obj, other, name in ((a, b, names[0]), (b, a, names[1])):
            if (cls := self._object_class(obj)) is None:
                continue
            if (fn := _static_lookup(cls, name)) is _SENTINEL and op is operator.iadd:
                fn = _static_lookup(cls, "__add__")
            if isinstance(fn, types.FunctionType):
                res = self.call(UserMethodVariable(fn, obj), [other], {})
                if not (isinstance(res, ConstantVariable) and res.value is NotImplemented):
                    return res
            elif op is operator.ne and fn is object.__ne__ and isinstance(eq := _static_lookup(cls, "__eq__"),
                                                                         types.FunctionType):
                res = self.call(UserMethodVariable(eq, obj), [other], {})   # object.__ne__ negates __eq__
                if not (isinstance(res, ConstantVariable) and res.value is NotImplemented):
                    return ConstantVariable(not self.truthy(res))
        return None

    def unary_op(self, op, a: VariableTracker) -> VariableTracker:
        if op in (operator.not_,):
            return ConstantVariable(not self.truthy(a))
        if op is operator.truth:
            return ConstantVariable(self.truthy(a))
        if isinstance(a, TensorVariable):
            return call_op(self, "call_function", op, [a], {})
        if isinstance(a, SymNodeVariable) and (op in (operator.neg, operator.pos, operator.abs) or (
                op is operator.invert and isinstance(a.value, torch.SymInt))):
            return sym_unary(self, op, a)
        if a.is_python_constant():
            try:
                return wrap_constant_result(self, op(a.as_python_constant()))
            except Exception as e:  # noqa: BLE001
                raise UserCodeError(f"{type(e).__name__}: {e}") from e
        name = {operator.neg: "__neg__", operator.pos: "__pos__", operator.invert: "__invert__",
                operator.abs: "__abs__"}.get(op)
        if name is not None:
            return self.call_dunder(a, name, [])
        raise Unsupported(f"unary {op.__name__} on {a}")

    # --- calls ----------------------------------------------------------------------
    def inline_call(self, fn: BaseFunctionVariable, args: list, kwargs: dict) -> VariableTracker:
        if getattr(inner := getattr(fn, "fn", None), "_coil_compiled", False) and \
                isinstance(fn, (UserFunctionVariable, UserMethodVariable)):
            # a coil-compiled function called from compiled code: its own function is inlined (as torch.compile
            # nests), not coil's wrapper, whose frame machinery would be captured
            src = fn.source and AttrSource(fn.source, "__wrapped__")
            fn = UserFunctionVariable(inner.__wrapped__, src) if isinstance(fn, UserFunctionVariable) else \
                UserMethodVariable(inner.__wrapped__, fn.obj, src)
        code = fn.get_code()
        if self.depth >= MAX_INLINE_DEPTH:
            raise Unsupported("inlining too deep (recursion?)")
        if code.co_flags & (CO_COROUTINE | CO_ASYNC_GENERATOR):
            raise Unsupported("call to a coroutine function")
        mod = fn.get_globals().get("__name__", "") or ""
        if mod.startswith("torch.optim") and getattr(getattr(fn, "fn", None), "__name__", "") == "step" and \
                isinstance(opt := getattr(getattr(fn, "obj", None), "value", None), torch.optim.Optimizer):
            e = Unsupported(optimizer_not_compiled(f"{type(opt).__name__}.step"))
            e.optimizer_step = True      # (warned, once per frame: frame._build_entry)
            raise e
        if mod.split(".")[0] in SKIP_MODULES and not _traced_library_code(mod, code) or (
                mod.startswith(("torch._dynamo", "coil.")) and not mod.startswith(TRACED_COIL_MODULES)):
            obj = getattr(fn, "fn", None)
            wrapped = getattr(obj, "__wrapped__", None)
            if mod.startswith("torch._dynamo") and callable(wrapped):  # torch.compiler.disable(f)
                raise frame_unsupported(f"call to {getattr(wrapped, '__qualname__', wrapped)}, disabled "
                                        "with torch.compiler.disable", obj,
                                        hint="a disabled function runs outside the graph")
            raise frame_unsupported(f"call to {mod}.{fn.fn_name()} (not traced)", obj,
                                    hint="functions from this module run outside the graph")
        try:
            bound = fn.bind_args(self, list(args), dict(kwargs))
        except TypeErrorInCall as e:
            raise UserCodeError(f"TypeError: {e}") from e
        cells = fn.closure_cells(self)
        if code.co_flags & CO_GENERATOR:
            # lazy: the body runs yield by yield as it is iterated (GeneratorVariable)
            def start(tx):
                return InliningTranslator(code, fn.get_globals(), tx.output, bound, cells,
                                          parent=tx, fn_name=fn.fn_name())
            return GeneratorVariable(self, fn, args, kwargs, start)
        sub = InliningTranslator(code, fn.get_globals(), self.output, bound, cells, parent=self, fn_name=fn.fn_name())
        return sub.run_inline()

    def call_module(self, mod_vt: NNModuleVariable, args: list, kwargs: dict) -> VariableTracker:
        m = mod_vt.value
        from coil.api import OptimizedModule
        if type(m) is OptimizedModule:  # a coil-compiled module called from compiled code: the original is traced
            mod_vt = wrap(self, m._orig_mod, mod_vt.source and AttrSource(mod_vt.source, "_orig_mod"))
            m = mod_vt.value
        if (cls := type(m)).__call__ is not torch.nn.Module.__call__:
            return self.call(UserMethodVariable(cls.__call__, mod_vt), args, kwargs)
        gs = self.output.guards
        # hooks registered later must be seen: the hook dicts are guarded (a new hook
        # recompiles, the recompile event naming the dict)
        glob = [g for g in _GLOBAL_HOOKS if hasattr(_mm, g)]
        if any(getattr(_mm, g) for g in glob):
            raise Unsupported("global nn.Module hooks are registered")
        mm = gs.const(_mm)
        gs.add(" and ".join(f"not {mm}.{g}" for g in glob),
               f"sum(map(len, ({''.join(f'{mm}.{g}, ' for g in glob)})))", 0)
        if m._backward_hooks or getattr(m, "_backward_pre_hooks", None):
            raise Unsupported("module backward hooks")
        if (src := mod_vt.source) is not None:
            e = src.expr()
            names = [h for h in _MODULE_HOOKS if hasattr(m, h)]
            # hook dicts live in the instance __dict__: read there (half the cost of
            # an attribute load on a class with __getattr__)
            dicts = [f"{e}.__dict__[{h!r}]" if h in m.__dict__ else f"{e}.{h}" for h in names]
            if not any(getattr(m, h) for h in names):
                gs.add(" and ".join(f"not {d}" for d in dicts),
                       f"sum(map(len, ({''.join(f'{d}, ' for d in dicts)})))", 0, src=e)
            for hname, d in zip(names, dicts):
                if hooks := getattr(m, hname):      # the same hooks (handle ids), not just as many
                    gs.add(f"tuple({d}) == {tuple(hooks)!r}", f"tuple({d})", tuple(hooks), src=e)
                elif any(getattr(m, h) for h in names):   # (all empty: one guard, above)
                    gs.add(f"not {d}", f"len({d})", 0, src=e)
        for hid, hook in list(m._forward_pre_hooks.items()):
            hook_vt = wrap(self, hook, ConstSource(gs.const(hook)))
            if hid in m._forward_pre_hooks_with_kwargs:
                res = self.call(hook_vt, [mod_vt, TupleVariable(args), DictVariable(kwargs)], {})
                if not (isinstance(res, ConstantVariable) and res.value is None):
                    a, k = self.unpack(res)
                    args, kwargs = self.unpack(a), dict(k.items)
            else:
                res = self.call(hook_vt, [mod_vt, TupleVariable(args)], {})
                if not (isinstance(res, ConstantVariable) and res.value is None):
                    args = self.unpack(res) if isinstance(res, TupleVariable) else [res]
        if (inst_forward := m.__dict__.get("forward")) is not None:
            # ``m.forward = f`` shadows the class's forward, as in Module.__call__; guarded on that object
            if src is not None:
                e = src.expr()
                gs.add(f"{e}.__dict__.get('forward') is {gs.const(inst_forward)}",
                       f"{e}.__dict__.get('forward')", inst_forward, src=e)
            out = self.call(wrap(self, inst_forward, ConstSource(gs.const(inst_forward))), args, kwargs)
        else:
            if src is not None:  # a forward assigned on the module later recompiles
                e = src.expr()
                gs.add(f"'forward' not in {e}.__dict__", f"'forward' in {e}.__dict__", False, src=e)
            if not isinstance(forward := _static_lookup(cls, "forward"), types.FunctionType):
                raise Unsupported(f"{cls.__name__}.forward is not a Python function")
            if src is not None:  # one guard per class: a forward replaced on it recompiles
                gs.add(f"{gs.const(cls)}.forward is {gs.const(forward)}")
            out = self.call(UserMethodVariable(forward, mod_vt), args, kwargs)
        for hid, hook in list(m._forward_hooks.items()):
            hook_vt = wrap(self, hook, ConstSource(gs.const(hook)))
            with_kwargs = [DictVariable(kwargs)] if hid in m._forward_hooks_with_kwargs else []
            res = self.call(hook_vt, [mod_vt, TupleVariable(args), *with_kwargs, out], {})
            if not (isinstance(res, ConstantVariable) and res.value is None):
                out = res
        return out

    def construct_object(self, cls_vt: UserDefinedClassVariable, args: list, kwargs: dict):
        if (cls := cls_vt.value) in CONTEXT_CLASSES:
            return make_context(self, cls, args, kwargs)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            return ExceptionVariable(cls, args)
        if is_model_output_class(cls):
            return DataClassDictVariable.create(self, cls, args, kwargs)
        if isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
            values, defaults = {**dict(zip(cls._fields, args)), **kwargs}, getattr(cls, "_field_defaults", {})
            for f in cls._fields:
                if f not in values and f not in defaults:
                    raise UserCodeError(f"TypeError: missing field {f}")
            return NamedTupleVariable([values[f] if f in values else wrap_constant_result(self, defaults[f])
                                       for f in cls._fields], cls)
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            return InFrameModuleVariable.create(self, cls, args, kwargs)
        if isinstance(cls, type) and issubclass(cls, torch.Tensor):
            raise Unsupported(f"constructing {cls.__name__} inside the frame")
        if cls is torch.Size and len(args) == 1 and not kwargs and not args[0].is_python_constant():
            return SizeVariable(self.unpack(args[0]))    # torch.Size([s0, 4]) stays symbolic
        if cls in (torch.device, torch.Size, torch.finfo, torch.iinfo, torch.dtype) or \
                (isinstance(cls, type) and issubclass(cls, __import__("enum").Enum)):
            c = [const_value(a) for a in args]
            return wrap_constant_result(self, cls(*c, **{k: const_value(v) for k, v in kwargs.items()}))
        if cls is types.MethodType and len(args) == 2 and not kwargs and type(args[0]) is UserFunctionVariable and \
                not (isinstance(args[1], ConstantVariable) and args[1].value is None):   # ExitStack's exit wrapper
            return UserMethodVariable(args[0].fn, args[1])
        if cls is collections.deque and len(args) + len(kwargs) <= 2 and set(kwargs) <= {"iterable", "maxlen"}:
            items = args[0] if args else kwargs.get("iterable")
            maxlen = args[1] if len(args) > 1 else kwargs.get("maxlen")
            maxlen = None if maxlen is None else const_value(maxlen)
            if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
                raise Unsupported("deque with a maxlen that is not a non-negative int (raised by user code)")
            return DequeVariable(list(self.unpack(items)) if items is not None else [], maxlen)
        if cls is collections.defaultdict:
            d = DictVariable({}, cls)
            d.default_factory = args[0] if args else None
            if len(args) > 1:
                d.call_method_base(self, "update", args[1:], kwargs)
            return d
        if isinstance(cls, type) and issubclass(cls, dict) and (
                cls.__init__ in (dict.__init__, collections.OrderedDict.__init__)):
            d = DictVariable({}, cls)
            d.call_method_base(self, "update", args, kwargs)
            return d
        new = _static_lookup(cls, "__new__")
        if (new.__func__ if isinstance(new, staticmethod) else new) not in (object.__new__, _SENTINEL):
            raise Unsupported(f"constructing {cls.__qualname__} (custom __new__)")
        if not all(isinstance(k.__dict__.get("__init__", object.__init__), types.FunctionType) or
                   "__init__" not in k.__dict__ for k in cls.__mro__[:-1]):
            raise Unsupported(f"constructing {cls.__qualname__} (C __init__)")
        obj = NewObjectVariable(cls)
        if isinstance(init := _static_lookup(cls, "__init__"), types.FunctionType):
            self.call(UserMethodVariable(init, obj), args, kwargs)
        elif args or kwargs:
            raise UserCodeError(f"TypeError: {cls.__name__}() takes no arguments")
        return obj

    def make_super(self, args):
        if args:
            cls, obj = args[0].as_python_constant(), args[1]
        else:
            if "__class__" not in self.cells:
                raise Unsupported("super() without __class__ cell")
            cls = self.load_cell("__class__").as_python_constant()
            first = self.code.co_varnames[0]
            if is_resume(self.code):
                # a resume function's first arguments are stack slots (___stackN); the
                # method's own first argument comes after them
                first = next((n for n in self.code.co_varnames if not n.startswith("___stack")), first)
            if (obj := self.locals.get(first)) is None and first in self.cells:
                obj = self.load_cell(first)
        return SuperVariable(cls, obj)

    def wrap(self, value, source):
        return wrap(self, value, source)


class SuperVariable(VariableTracker):
    """``super()`` / ``super(cls, obj)``: looks attributes up after ``cls`` in the MRO."""

    def __init__(self, cls, obj):
        super().__init__(None)
        self.cls, self.obj = cls, obj

    def var_getattr(self, tx, name):
        mro = self.obj.python_type().__mro__ if not isinstance(self.obj, UserDefinedClassVariable) \
            else self.obj.value.__mro__
        idx = mro.index(self.cls) + 1
        guard_mro_lookup(tx, mro[idx:], name)   # a method later replaced or added on a class recompiles
        for klass in mro[idx:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if attr is object.__init__ or (name == "__init__" and isinstance(self.obj, ModuleInitProbe)
                                               and _torch_nn(klass)):
                    return _NoOp()
                if attr is torch.nn.Module.__getattr__:
                    return _ModuleGetattr(self.obj)
                if isinstance(attr, classmethod):
                    return UserMethodVariable(attr.__func__, UserDefinedClassVariable(type(self.obj.value)))
                if isinstance(attr, staticmethod):
                    return wrap(tx, attr.__func__, None)
                if isinstance(attr, types.FunctionType):
                    return UserMethodVariable(attr, self.obj)
                if isinstance(attr, property):
                    return tx.call(UserFunctionVariable(attr.fget), [self.obj], {})
                if isinstance(self.obj, DictVariable) and klass in (dict, __import__("collections").OrderedDict):
                    return _BaseMethod(self.obj, name)
                if klass is dict and name in _DICT_READS and isinstance(self.obj, UserDefinedObjectVariable):
                    return _BaseDictRead(self.obj, name)
                if attr is object.__setattr__:
                    return _ObjectSetattr(self.obj)
                if attr is object.__getattribute__ and isinstance(self.obj, (ObjectVariableBase, NewObjectVariable)):
                    return _ObjectGetattribute(self.obj)
                if attr is dict.__init__:
                    raise Unsupported(f"super().{name} (C slot)")
                raise Unsupported(f"super().{name} of type {type(attr).__name__}")
        raise AttributeMissing(name)

    def call_method(self, tx, name, args, kwargs):
        return tx.call(self.var_getattr(tx, name), args, kwargs)


class _SuperSlot(VariableTracker):
    """Base of what ``super().name`` of ``obj`` finds when it is no Python function."""

    def __init__(self, obj, name=None):
        super().__init__(None)
        self.obj, self.name = obj, name


class _BaseMethod(_SuperSlot):
    """``super().name`` resolving to the builtin container's own method."""

    def call_function(self, tx, args, kwargs):
        return self.obj.call_method_base(tx, self.name, args, kwargs)


class _BaseDictRead(_SuperSlot):
    """``super().__getitem__(k)`` (``get``, ``__contains__``) inside a dict subclass's
    override, on a dict that existed before the frame: read from the real dict."""

    def call_function(self, tx, args, kwargs):
        if (found := _dict_lookup(tx, self.obj, self.name, args, kwargs, base=True)) is None:
            raise Unsupported(f"super().{self.name} of a {type(self.obj.value).__name__} "
                              "(traced key, tensor value or missing key)")
        return found


class _ObjectSetattr(_SuperSlot):
    """``object.__setattr__(obj, name, value)`` reached through ``super()``."""

    def call_function(self, tx, args, kwargs):
        tx.store_attr(self.obj, args[0].as_python_constant(), args[1], plain=True)
        return ConstantVariable(None)


class _ObjectGetattribute(_SuperSlot):
    """``object.__getattribute__(obj, name)`` reached through ``super()`` (a class with
    its own ``__getattribute__`` reading past it: transformers' configs)."""

    def call_function(self, tx, args, kwargs):
        if isinstance(self.obj, NewObjectVariable):
            return self.obj.var_getattr(tx, args[0].as_python_constant(), generic=True)
        return lookup_attr(tx, self.obj, args[0].as_python_constant(), generic=True)


class _NoOp(VariableTracker):
    def call_function(self, tx, args, kwargs):
        return ConstantVariable(None)


class _ModuleGetattr(_SuperSlot):
    def call_function(self, tx, args, kwargs):
        return self.obj.var_getattr(tx, args[0].as_python_constant())


class InliningTranslator(InstructionTranslatorBase):
    """Translates a called function's frame into the caller's graph."""

    def _run(self, to_yield: bool):
        """Step until the frame returns (raising ``ReturnValue``) or, with ``to_yield``, yields: ``(value,)``."""
        try:
            for _ in range(MAX_STEPS + 1):
                inst = self.instructions[self.ip]
                self.ip += 1
                self.step(inst)
                if to_yield and inst.opname == "YIELD_VALUE":
                    return (self.generated[-1],)
            raise Unsupported("too many instructions (infinite loop?)")
        except Unsupported as e:
            if self.generated is not None and exception_tracker(e) is not None:
                # a generator run eagerly (at its creation, or yield by yield): Python raises at the iteration
                # that reaches the raise, so no handler around the call may see it
                raise Unsupported(f"{e.reason} escaping a generator") from e
            raise

    def run_inline(self) -> VariableTracker:
        try:
            self._run(False)
        except ReturnValue as r:
            return r.value if self.generated is None else ListIteratorVariable(self.generated)

    def run_until_yield(self):
        """Generator bodies: run to the next ``yield``; ``(value,)`` or None at return."""
        try:
            return self._run(True)
        except ReturnValue:
            return None


class InstructionTranslator(InstructionTranslatorBase):
    """The root frame's translator; owns the OutputGraph and handles graph breaks."""

    def __init__(self, code, f_globals, output, symbolic_locals, cells, break_at: dict, fullgraph: bool):
        super().__init__(code, f_globals, output, symbolic_locals, cells)
        self.break_at, self.fullgraph = break_at, fullgraph
        self.result = None          # ("return", vt) or ("break", BreakInfo, inst)

    def run(self) -> None:
        try:
            for _ in range(MAX_STEPS + 1):
                if (inst := self.instructions[self.ip]).offset in self.break_at:
                    self.current = inst
                    self.result = ("break", self.break_at[inst.offset], inst)
                    return
                self.ip += 1
                try:
                    self.step(inst)
                except Unsupported as e:
                    if self.fullgraph:
                        raise
                    # an exception caught and re-raised in this frame breaks where it
                    # was first raised (the handler then runs in plain Python)
                    off = getattr(e, "root_offset", None)
                    off = inst.offset if off is None else off
                    stack = getattr(e, "user_stack", None) or self.user_stack()
                    self.break_at[off] = BreakInfo(off, e.reason, stack, e)
                    raise RestartAnalysis() from e
            raise Unsupported("too many instructions (infinite loop?)")
        except ReturnValue as r:
            self.result = ("return", r.value)
