"""OutputGraph: the FX graph being built, its inputs, the side effects, and the
generated entry function that replaces the frame.

After translation the output is compiled into a :class:`CompiledFrame`:

1. every tensor tracker the frame's results need (return value, values written by
   side effects, and at a graph break the live stack and locals) becomes a graph
   output; the graph goes to the backend with real example inputs;
2. an entry function is generated as Python source (printed into the compile log)::

       def ___entry(x, y, ___f):
           ___o = ___graph(x, y._modules['fc']._parameters['weight'])
           ___G['counter'] = 3                # side effects, in program order
           return (___o[0], {'k': ___o[1]})   # outputs rebuilt from trackers

   At a graph break the entry instead rebuilds the stack and locals, runs the
   instruction that could not be traced (a call, or a branch on a tensor) in plain
   Python, and returns what the generated resume function returns."""
from __future__ import annotations

import contextlib
import inspect
import math
import types
from typing import Any, Optional

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from coil import trace
from coil.exc import Unsupported
from coil.capture.guards import GuardSet
from coil.capture.source import ConstSource
from coil.capture.variables.base import CellVariable, ConstantVariable, SourcedCellVariable, VariableTracker
from coil.capture.variables.symbolic import SymNodeVariable
from coil.capture.variables.tensor import InferenceTensorUse, TensorVariable
from coil.capture.dynamic import DynamicPolicy, SiteRecorder, SymbolSource, _symbol, source_name
from coil.capture.variables.containers import DictVariable, GeneratorVariable, ListVariable, SetVariable


def _inference_copy(t):
    """An inference tensor equal to graph output ``t`` (eager made it inside ``torch.inference_mode()``)."""
    with torch.inference_mode():
        return t.clone()


def _new_object(cls, attrs):
    """A ``cls`` instance made without ``__init__`` (``cls`` an instance: that one) given ``attrs``."""
    obj, cls = (cls.__new__(cls), cls) if isinstance(cls, type) else (cls, type(cls))
    for name in [k for k in attrs if hasattr(cls, "__slots__") and
                 isinstance(inspect.getattr_static(cls, k, None), types.MemberDescriptorType)]:
        object.__setattr__(obj, name, attrs.pop(name))    # ``__slots__`` entries
    if attrs:
        obj.__dict__.update(attrs)
    return obj


class BreakEarlier(Exception):
    """A problem found after the instruction that causes it (a guard added by AOT over a value drawn from random, a
    dict an ``autograd.Function``'s ctx keeps, changed or rebuilt later): the frame is captured again with a break
    at ``offset``."""

    def __init__(self, offset: int, stack: list, exc: Unsupported):
        super().__init__(exc.reason)
        self.offset, self.stack, self.exc = offset, stack, exc


class SideEffects:
    """Mutations of objects that exist outside the frame, in program order."""

    def __init__(self):
        self.order: list[tuple] = []  # ("container", vt) / ("attr", obj_vt, name) / ("global", gname, name) / ("cell", cell_vt)
        self._seen: set = set()
        self.attrs: dict[tuple[int, str], VariableTracker] = {}
        self.globals: dict[tuple[int, str], VariableTracker] = {}
        self.cells: dict[int, VariableTracker] = {}
        self.count = 0          # mutations so far (a traced call that must mutate nothing compares it)
        self.held: dict[int, Unsupported] = {}  # id -> the break at the apply whose ctx keeps this container
        self.read_only: dict[int, str] = {}     # id -> why a write to this container is a graph break

    def _record(self, key: tuple, item: tuple) -> None:
        self.count += 1
        if key not in self._seen:
            self._seen.add(key)
            self.order.append(item)

    def mutated(self, vt) -> None:
        if (held := self.held.get(id(vt))) is not None:
            raise held          # the compiled backward would read the contents of the forward's time
        if (why := self.read_only.get(id(vt))) is not None:
            raise Unsupported(why)
        if vt.source is not None:
            self._record(("container", id(vt)), ("container", vt))

    def store_attr(self, obj_vt, name, value) -> None:
        self.attrs[(id(obj_vt.value), name)] = value
        self._record(("attr", id(obj_vt.value), name), ("attr", obj_vt, name))

    def pending_attr(self, obj, name) -> Optional[VariableTracker]:
        return self.attrs.get((id(obj), name)) if self.attrs else None

    def store_global(self, gdict, gname, name, value) -> None:
        self.globals[(id(gdict), name)] = value
        self._record(("global", id(gdict), name), ("global", gdict, gname, name))

    def pending_global(self, gdict, name) -> Optional[VariableTracker]:
        return self.globals.get((id(gdict), name))

    def store_cell(self, cell_vt, value) -> None:
        self.cells[id(cell_vt)] = value
        self._record(("cell", id(cell_vt)), ("cell", cell_vt))

    def value(self, item: tuple) -> VariableTracker:
        """What ``item`` of :attr:`order` wrote (a mutated container: the container)."""
        if (kind := item[0]) in ("container", "attr"):
            return item[1] if kind == "container" else self.attrs[(id(item[1].value), item[2])]
        return self.globals[(id(item[1]), item[3])] if kind == "global" else self.cells[id(item[1])]

    def values(self) -> list:
        return [self.value(item) for item in self.order]


class OutputGraph:
    """The graph and bookkeeping shared by the root translator and everything it inlines."""

    def __init__(self, f_globals: dict, argnames: list[str], scalar_outputs: bool = False,
                 dynamic_output_shapes: bool = False):
        self.graph = torch.fx.Graph()
        # sizes of dynamic inputs are symbols of this ShapeEnv (coil/capture/dynamic.py);
        # data-dependent outputs stay graph breaks unless the options allow them
        # (capture_scalar_outputs, capture_dynamic_output_shape_ops: unbacked symbols)
        self.shape_env = ShapeEnv(allow_scalar_outputs=scalar_outputs,
                                  allow_dynamic_output_shape_ops=dynamic_output_shapes)
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env)
        self.dynamic, self.sites = DynamicPolicy(None), SiteRecorder()
        self.current_tx = None          # the translator running an instruction (where())
        self.symbol_nodes: dict = {}    # sympy symbol -> SymInt placeholder
        self.scalar_floats: list = []   # (source expr, SymFloat) of float inputs
        self.draws: list = []   # (method text, args, kwargs) of each draw from random, in order (dynamic.random_draw)
        self.guards = GuardSet(f_globals)
        self.f_globals, self.argnames = f_globals, argnames
        self.inputs: list[tuple[Any, Any, torch.fx.Node]] = []  # (source, real, node)
        self.layouts_at_call: list = []  # (fake, sizes, strides, offset) of each tensor input
        self.input_vts: dict[int, TensorVariable] = {}
        self.wrapped: dict[int, tuple[Any, VariableTracker]] = {}
        self.side_effects = SideEffects()
        self.sourced_cells: dict[int, SourcedCellVariable] = {}
        self.open_contexts: list = []
        self.generators: list = []      # generators started in traced code (closed at the frame's return, as eager)
        self.in_try = False             # where an op was made inside a try block (frame.py)
        self.index_copies: list = []  # (fake, root offset, user stack) of x[i] with 0-d int tensors, copies (tensor.py)
        self.switches: dict = {}    # (setter, *args) -> (getter, value at the call) of torch switches set in traced code
        self.switch_final: list = []    # ((setter, *args), value) each was left at (restore_global_state)
        self.inference_depth = 0    # inside a traced ``torch.inference_mode()`` block (as no_grad)
        self.inference_made: dict[int, Any] = {}  # id -> fake of each tensor eager makes an inference tensor
        self.subgraphs: dict = {}   # name -> GraphModule of a higher-order op (hops.py)
        self.initial_grad = torch.is_grad_enabled()
        self._last_placeholder = None
        self._placeholder_names: set = set()
        self.guards.add(f"___grad_enabled() is {self.initial_grad!r}", "___grad_enabled()", self.initial_grad)
        self.final_grad = self.initial_grad
        inference = torch.is_inference_mode_enabled()
        self.guards.ns["___inference_mode"] = torch.is_inference_mode_enabled
        self.guards.add(f"___inference_mode() is {inference!r}", "___inference_mode()", inference)
        # factories and Python-float promotion read the default dtype (torch.ones(2) + x.sum())
        default = torch.get_default_dtype()
        self.guards.ns["___default_dtype"] = torch.get_default_dtype
        self.guards.add(f"___default_dtype() is {self.guards.const(default)}", "___default_dtype()", default)
        # torch function modes change what torch calls do: ``with torch.device(d)`` / set_default_device is traced
        # into factories (guarded); under any other mode the frame runs eagerly (frame.py _miss)
        modes = torch._C._is_torch_function_mode_enabled()
        self.guards.ns["___fn_modes"] = torch._C._is_torch_function_mode_enabled
        self.guards.add(f"___fn_modes() is {modes!r}", "___fn_modes()", modes)
        if modes:
            device = torch.get_default_device()
            self.guards.ns["___default_device"] = torch.get_default_device
            self.guards.add(f"___default_device() == {self.guards.const(device)}", "___default_device()", device)
        for dev in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
            state = torch.is_autocast_enabled(dev)
            self.guards.ns["___autocast_enabled"] = torch.is_autocast_enabled
            self.guards.add(f"___autocast_enabled({dev!r}) is {state!r}", f"___autocast_enabled({dev!r})", state)
            if state:  # the graph was traced in this autocast dtype (bf16 vs fp16)
                dtype, const = torch.get_autocast_dtype(dev), f"___autocast_dtype_{dev}"
                self.guards.ns["___autocast_dtype"] = torch.get_autocast_dtype
                self.guards.ns[const] = dtype
                self.guards.add(f"___autocast_dtype({dev!r}) is {const}", f"___autocast_dtype({dev!r})", dtype)

    # --- inputs --------------------------------------------------------------------
    def _placeholder(self, name: str):
        base = "L_" + ("".join(c if c.isalnum() else "_" for c in name).strip("_")[-60:] or "arg")
        if base in self._placeholder_names:
            base = f"{base}_{len(self._placeholder_names)}"
        self._placeholder_names.add(base)
        # after the last placeholder; the first one at the start of the graph (inserting_before(None))
        last = self._last_placeholder
        with self.graph.inserting_after(last) if last is not None else self.graph.inserting_before(None):
            node = self._last_placeholder = self.graph.placeholder(base)
        return node

    def add_input(self, tx, value: torch.Tensor, source) -> TensorVariable:
        if (hit := self.input_vts.get(id(value))) is not None:
            return hit
        expr = source.expr()
        is_param = isinstance(value, torch.nn.Parameter) or "._buffers[" in expr or isinstance(source, ConstSource)
        fake = self.dynamic.fake_input(self.fake_mode, expr, value, is_param, tx.location() if tx is not None else None)
        node = self._placeholder(expr)
        node.meta["example_value"] = fake
        node.meta["source"] = expr
        self.layouts_at_call.append((fake, tuple(fake.shape), fake.stride(), fake.storage_offset()))
        vt = TensorVariable(node, fake, source, cls=type(value))
        self.inputs.append((source, value, node))
        self.input_vts[id(value)] = vt
        return vt

    def restore_input_layouts(self) -> None:
        """Give the input fakes back the sizes, strides and offsets they had at the call. Tracing ran the program on
        them, so after ``x.t_()`` / ``squeeze_`` / ``unsqueeze_`` they describe the input as the program left it; the
        backend must trace from the input as it is at the call (a stale layout gave wrong input types, size mismatches,
        and a segfault in functionalization for ``squeeze_`` of a symbolic dim). Called once the graph is complete."""
        for fake, size, stride, offset in self.layouts_at_call:
            if (tuple(fake.shape), fake.stride(), fake.storage_offset()) != (size, stride, offset):
                with self.fake_mode, torch.no_grad():
                    torch.ops.aten.as_strided_.default(fake, size, stride, offset)

    def symbol_input(self, value) -> Optional[torch.fx.Node]:
        """The SymInt placeholder for ``value`` when it is a bare symbol named by an input's size or stride
        (made once per symbol; the entry passes ``x.size()[0]``), else None."""
        if (sym := _symbol(value)) is None:
            return None
        if (node := self.symbol_nodes.get(sym)) is not None:
            return node
        if not (srcs := self.shape_env.var_to_sources.get(sym)):
            return None
        text, node = source_name(srcs[0]), self._placeholder(str(sym))
        node.meta["example_value"] = value
        node.meta["source"] = text
        if (vals := getattr(self.shape_env, "backed_var_to_val", None)) is None:
            vals = self.shape_env.var_to_val
        self.inputs.append((SymbolSource(text), int(vals[sym]), node))
        self.symbol_nodes[sym] = node
        return node

    def where(self) -> str:
        """``file:line`` of the user code being translated (for specialization logs)."""
        if not (frames := self.current_tx.user_frames() if self.current_tx is not None else None):
            return "?"
        f, line, name = frames[-1]
        return f"{f}:{line} in {name}"

    def lift_constant_tensor(self, tx, value: torch.Tensor) -> TensorVariable:
        """A real tensor with no source (made at compile time): an input the entry passes from its namespace."""
        return self.add_input(tx, value, ConstSource(self.guards.const(value)))

    def sourced_cell(self, cell, source) -> SourcedCellVariable:
        if (hit := self.sourced_cells.get(id(cell))) is None:
            hit = self.sourced_cells[id(cell)] = SourcedCellVariable(cell, source)
        return hit

    # --- global state ----------------------------------------------------------------
    def set_grad_mode(self, tx, mode: bool) -> None:
        tx.locate_node(self.graph.create_node("call_function", torch._C._set_grad_enabled, (mode,), {}))
        torch._C._set_grad_enabled(mode)

    def torch_switch(self, getter, setter, args: tuple, is_set: bool) -> ConstantVariable:
        """A traced read or write of one of torch's global switches in ``torch._C`` (``_get_cudnn_enabled``,
        ``_set_fp32_precision_setter(backend, op, value)``): no graph op, as they choose kernels, not values. A read is
        a constant, guarded unless traced code set it; a write is done now (later reads in the trace see it), undone
        when the trace ends, and the entry sets the value it was left at before the graph break or return, as eager
        leaves it (``torch.backends.cudnn.flags``, a ``@contextmanager`` that sets them and restores them)."""
        if not is_set:
            value, text = getter(*args), f"{self.guards.const(getter)}(*{args!r})"
            if (setter, *args) not in self.switches:
                self.guards.add(f"{text} == {value!r}", text, value)
            return ConstantVariable(value)
        self.switches.setdefault((setter, *args[:-1]), (getter, getter(*args[:-1])))
        trace.log("torch_switch", stage="capture", call=f"{setter.__name__}{args!r}", user_line=self.where(),
                  decision="not a graph op: set now, and by the entry at the break or return")
        setter(*args)
        return ConstantVariable(None)

    def restore_global_state(self) -> None:
        self.switch_final = [(key, getter(*key[1:])) for key, (getter, _) in self.switches.items()]
        for (setter, *args), (_, value) in reversed(self.switches.items()):
            setter(*args, value)
        self.final_grad = torch.is_grad_enabled()   # the entry sets it (backends may not)
        torch._C._set_grad_enabled(self.initial_grad)
        self.left_open = list(self.open_contexts)   # (the graph closes them; the entry: frame._balance_modes)
        for ctx in reversed(self.open_contexts):
            with contextlib.suppress(Exception):
                ctx.real.__exit__(None, None, None)
        self.open_contexts.clear()

    def root_module(self) -> torch.nn.Module:
        """The root of the captured GraphModule: holds the subgraphs of higher-order
        operators as attributes (``get_attr`` targets)."""
        root = torch.nn.Module()
        for name, sub in self.subgraphs.items():
            setattr(root, name, sub)
        return root

    def count_calls(self) -> int:
        return sum(1 for n in self.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


class EntryCodegen:
    """Builds the entry function's Python source (see module docstring)."""

    def __init__(self, output: OutputGraph, graph_outputs: list[TensorVariable]):
        self.output = output
        self.ns = dict(output.guards.ns)
        self.ns.update(___make_function=types.FunctionType, ___new_object=_new_object, ___make_cell=types.CellType,
                       ___MethodType=types.MethodType, ___partial=__import__("functools").partial)
        self.lines: list[str] = []
        self.memo: dict[int, str] = {}
        self._tmp = 0
        self.out_index = {id(t.node): i for i, t in enumerate(graph_outputs)}
        self._const_ids: dict[int, str] = {}
        #: lines the entry runs first, before the graph: the draws from ``random``, then reads of input sizes that
        #: symbolic outputs name (:meth:`symbol_local`)
        self.early = [f"___rnd{i} = {fn}(*{self.const_expr(a)}, **{self.const_expr(kw)})"
                      for i, (fn, a, kw) in enumerate(output.draws)]
        self._symbol_locals: dict[str, str] = {}

    def symbol_local(self, source_text: str) -> str:
        """A local holding ``source_text`` (an input's size, ``x.size()[0]``) as read at the entry's start: the graph
        may change the input's sizes (``x.t_()``), while a symbol means the size at the call."""
        if (name := self._symbol_locals.get(source_text)) is None:
            name = self._symbol_locals[source_text] = f"___z{len(self._symbol_locals)}s"
            self.early.append(f"{name} = {source_text}")
        return name

    def tmp(self) -> str:
        self._tmp += 1
        return f"___t{self._tmp}"

    def const_expr(self, value) -> str:
        if value is None or type(value) in (bool, str, bytes, int) or type(value) is float and math.isfinite(value) \
                or type(value) is tuple and all(type(v) in (int, str, bool, type(None)) for v in value):
            return repr(value)
        if (name := self._const_ids.get(id(value))) is None:
            name = f"___k{len(self._const_ids)}"
            self._const_ids[id(value)] = name
            self.ns[name] = value
        return name

    def source_expr(self, source) -> str:   # read at the entry's start: side effects may rebind it (s.q = s.r)
        e = source.expr()
        return e if e.isidentifier() else self.symbol_local(e)

    def graph_output(self, t: TensorVariable) -> str:
        if t.node.op == "placeholder" and t.source is not None:
            return self.source_expr(t.source)
        if (idx := self.out_index.get(id(t.node))) is None:
            raise Unsupported("internal: tensor missing from graph outputs")
        if id(t.fake) in self.output.inference_made:    # made in torch.inference_mode(): an inference tensor
            if t.fake._is_view():
                raise InferenceTensorUse("a view of a tensor made in torch.inference_mode() leaves the graph: the "
                                         "frame runs eagerly (a copy would not alias its base)")
            return self.bind(t, f"{self.const_expr(_inference_copy)}(___o[{idx}])")
        return f"___o[{idx}]"

    def reconstruct(self, vt: VariableTracker) -> str:
        if (key := id(vt)) in self.memo:
            return self.memo[key]
        if isinstance(vt, ConstantVariable) and type(vt.value) in (tuple, frozenset, torch.Size):
            # one object per tracker, so identity (``id``/``is``) survives a graph break
            return self.bind(vt, vt.reconstruct(self))
        return vt.reconstruct(self)

    def bind(self, vt, expr: str) -> str:
        name = self.tmp()
        self.lines.append(f"{name} = {expr}")
        self.memo[id(vt)] = name
        return name

    def reconstruct_container(self, vt) -> str:
        if (held := self.output.side_effects.held.get(id(vt))) is not None:   # (it leaves the frame: may change)
            raise BreakEarlier(held.root_offset, held.user_stack, held)
        return self.source_expr(vt.source) if vt.source is not None else self.bind(vt, vt.build_expr(self))

    def reconstruct_cell(self, cell) -> str:
        if isinstance(cell, SourcedCellVariable):
            return self.cell_expr(cell)
        if isinstance(cell, CellVariable):
            if id(cell) in self.memo:
                return self.memo[id(cell)]
            content = self.reconstruct(cell.content) if cell.content is not None else ""
            return self.bind(cell, f"___make_cell({content})")
        raise Unsupported("unknown cell")

    def cell_expr(self, cell) -> str:
        """The real cell a ``SourcedCellVariable`` stands for, reached through its source
        (``<src>.cell_contents`` is its content's source); the traced object otherwise."""
        if cell.source is not None and (expr := cell.source.expr()).endswith(".cell_contents"):
            return expr[:-len(".cell_contents")]
        return self.const_expr(cell.cell)

    def side_effect_lines(self, se: SideEffects) -> None:
        for item in se.order:
            if (kind := item[0]) == "container":
                vt = item[1]
                src = self.source_expr(vt.source)
                if isinstance(vt, ListVariable):
                    self.lines.append(f"{src}[:] = {vt.build_expr(self)}")
                elif isinstance(vt, DictVariable):
                    body = "{" + ", ".join(f"{self.const_expr(k)}: {self.reconstruct(v)}"
                                           for k, v in vt.items.items()) + "}"
                    t = self.tmp()
                    self.lines += [f"{t} = {body}", f"{src}.clear(); {src}.update({t})"]
                elif isinstance(vt, SetVariable):
                    self.lines.append(f"{src}.clear(); {src}.update({vt.build_expr(self)})")
                else:
                    raise Unsupported(f"mutation of {vt}")
            elif kind == "attr":    # (a custom __setattr__ was traced: its object.__setattr__ is what is left)
                own = type(item[1].value).__setattr__ in (object.__setattr__, torch.nn.Module.__setattr__)
                obj, setter = self.reconstruct(item[1]), "setattr" if own else self.const_expr(object.__setattr__)
                self.lines.append(f"{setter}({obj}, {item[2]!r}, {self.reconstruct(se.value(item))})")
            elif kind == "global":
                self.lines.append(f"{item[2]}[{item[3]!r}] = {self.reconstruct(se.value(item))}")
            else:
                self.lines.append(f"{self.cell_expr(item[1])}.cell_contents = {self.reconstruct(se.value(item))}")
        for (setter, *args), value in self.output.switch_final:
            self.lines.append(f"{self.const_expr(setter)}(*{(*args, value)!r})")


def collect_tensors(vts: list, out: list, seen: set, data_dependent: list | None = None,
                    started: list | None = None) -> None:
    """Tensor trackers reachable from ``vts`` (graph outputs), in first-seen order; symbolic numbers over a
    data-dependent symbol (no input source: ``.item()``, a ``nonzero`` size) go to ``data_dependent``, generators
    started in traced code to ``started``."""
    stack, visited = list(reversed(vts)), set()
    while stack:
        if (v := stack.pop()) is None or id(v) in visited:
            continue
        visited.add(id(v))
        if isinstance(v, TensorVariable):
            if v.node.op != "placeholder" and id(v.node) not in seen:
                seen.add(id(v.node))
                out.append(v)
            continue
        if data_dependent is not None and isinstance(v, SymNodeVariable) and v.needs_graph_output():
            data_dependent.append(v)
            continue
        if isinstance(v, CellVariable):
            stack.append(v.content)
            continue
        if started is not None and isinstance(v, GeneratorVariable) and v.site is not None:
            started.append(v)
        stack.extend(reversed(v.children() if isinstance(v, VariableTracker) else []))
        if cl := getattr(v, "closure", None):
            stack.extend(cl)
        for attr in ("obj", "fn"):
            if isinstance(sub := getattr(v, attr, None), VariableTracker):
                stack.append(sub)
        if isinstance(defaults := getattr(v, "defaults", None), list):
            stack.extend(defaults)
