"""Code generation: ``compile_aten_graph(gm, example_inputs, device) -> callable``.

The whole of coil's Inductor role in one call (docs/codegen.md):

1. :class:`coil.ir.graph.GraphLowering` lowers the ATen graph to loop IR;
2. :class:`coil.schedule.Scheduler` fuses buffers into kernel groups;
3. a :class:`coil.codegen.backend.KernelBackend` (Triton for CUDA tensors; ``config.cpu_backend`` for CPU: "cpp" or
   "triton" under the interpreter) writes and loads one kernel per group;
4. :class:`coil.codegen.wrapper.WrapperCodegen` writes the Python wrapper, which is exec'd and returned. The returned
   callable takes the placeholders positionally and returns a tuple of what the graph returns.

Everything goes to the compile log: the loop IR, fusion decisions, kernel sources, the wrapper."""
from __future__ import annotations

import dataclasses
from collections import Counter
import re
from typing import Callable

import torch

from coil import trace
from coil.codegen.backend import GeneratedKernel, get_kernel_backend
from coil.codegen.common import KernelPlan, layout_key
from coil.codegen.tiling import tile_pointwise
from coil.config import config
from coil.exc import LINALG_ERROR_MESSAGE, ZERO_DIVISION_MARK, CoilError, KernelCompileError, refuse_fallback, warn_user
from coil.ir.nodes import ComputedBuffer, ExternKernel, ScatterBuffer
from coil.ir.symbols import shape_env_scope
from coil.codegen.wrapper import WrapperCodegen, _alias_roots
from coil.ir.graph import GraphLowering
from coil.ir.upcast_matmul import upcast_matmuls
from coil.schedule.scheduler import FusedGroup, Scheduler

__all__ = ["compile_aten_graph", "CompiledGraph"]


@dataclasses.dataclass
class _Kernel:
    plan: KernelPlan
    generated: GeneratedKernel


class CompiledGraph:
    """The callable ``compile_aten_graph`` returns; ``.source`` is the wrapper text,
    ``.kernels`` the generated kernels, ``.fallbacks`` the ops run as extern kernels."""

    def __init__(self, call, source, kernels, fallbacks, scheduler, gm=None, output_strides=None):
        self.call, self.source, self.kernels = call, source, kernels
        self.fallbacks, self.scheduler, self.gm = fallbacks, scheduler, gm
        #: per graph output, the strides it is returned with (None: not a tensor); aot
        #: compiles a backward for the saved outputs' real strides (ir/graph.py)
        self.output_strides = output_strides
        #: size guards code generation added to the ShapeEnv (dynamic shapes)
        self.guards: list = []
        #: ``call_boxed(list of inputs)`` (it empties the list and releases each input
        #: after its last use), where the wrapper was generated with one, else None
        self.call_boxed = None
        #: indices of the inputs the graph writes in place (ir/graph.py: _write_inputs_in_place)
        self.writes_inputs: tuple = ()
        self._called = False

    def __call__(self, *args):
        if self.writes_inputs and not self._called:
            # the first call compiles the kernels: it writes copies, so that a kernel that fails to compile
            # leaves the inputs as they were for the ATen re-run below (the epilogue copies the new values in)
            # (at the input's strides: clone() makes one with gaps contiguous, and the kernels index by its strides)
            from coil.runtime.triton_runtime import scratch_copies  # (the autotuner's copies; imported when needed)
            args = scratch_copies(args, frozenset(self.writes_inputs))
        try:
            out = self.call(*args)
            self._called = True
            return out
        except KernelCompileError as e:
            # A generated kernel that the GPU compiler rejects (found on first launch, where kernels are compiled). The
            # graph is functional, so running it again from the start with ATen ops gives the right result.
            if self.gm is None:
                raise
            if self._called and self.writes_inputs:
                raise CoilError(f"coil: a generated kernel failed to compile ({str(e)[:500]}) in a graph that "
                                f"already wrote its inputs {list(self.writes_inputs)} in place, so it cannot be "
                                "re-run with ATen ops. Please report this bug; coil.config.inplace_input_writes = "
                                "False avoids it.") from e
            trace.log("kernel_compile_fallback", stage="runtime", error=str(e)[:4000])
            refuse_fallback("kernel_compile_fallback", e)  # config.strict_codegen
            warn_user(f"coil: a generated kernel failed to compile ({str(e)[:500]}); "
                      "running this graph with ATen ops instead (slower, same results)")
            gm, strides = self.gm, self.output_strides

            def run_aten(*a):
                # outputs in the strides this graph promised (the backward may have been
                # compiled for a saved tensor's channels-last layout)
                outs = tuple(gm(*a))
                return outs if strides is None else tuple(
                    torch.empty_strided(o.shape, st, dtype=o.dtype, device=o.device).copy_(o)
                    if isinstance(o, torch.Tensor) and st is not None and o.dim() == len(st) and tuple(o.stride()) != st
                    else o for o, st in zip(outs, strides))
            self.call = run_aten
            return self.call(*args)
        except Exception as e:
            _note_origin(e, self.source)
            if type(e) is RuntimeError and str(e).endswith(LINALG_ERROR_MESSAGE):   # (aot's check of a linalg op)
                err = torch.linalg.LinAlgError(str(e))
                err.__notes__ = getattr(e, "__notes__", [])
                raise err from None
            if type(e) is RuntimeError and str(e).startswith(ZERO_DIVISION_MARK):  # (capture's, of an unbacked divisor)
                raise ZeroDivisionError(str(e)[len(ZERO_DIVISION_MARK):]) from None
            raise

    @property
    def kernel_count(self) -> int:
        return len(self.kernels)


def _note_origin(e: BaseException, source: str) -> None:
    """Add a note naming the user's line to an exception an extern op of the wrapper raised (eager's error for
    arguments the fake kernels accepted, ``mm`` of float and double): the wrapper's comment on the line says."""
    tb, line = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<coil wrapper>":
            line = tb.tb_lineno
        tb = tb.tb_next
    text = source.splitlines()[line - 1] if line and line <= len(source.splitlines()) else ""
    if (m := re.search(r"# \S+ \(from (.*)\)$", text)) and hasattr(e, "add_note"):
        e.add_note(f"coil: raised by the compiled code of {m.group(1)}")


def _pick_backend(device: torch.device):
    be = get_kernel_backend(config.cpu_backend) if device.type == "cpu" else None
    return be if be is not None else get_kernel_backend("triton")


def atomic_add_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype in which the kernel backend for ``device`` can accumulate into a ``dtype`` buffer: ``dtype``
    itself where it adds atomically in it, else int32 (8/16-bit ints: converting the sum back wraps as eager's
    adds do; bool: nonzero is eager's True + True = True) or fp32 (bf16)."""
    ok = _pick_backend(device).atomic_add_dtypes
    return dtype if ok is None or dtype in ok else torch.float32 if dtype.is_floating_point else torch.int32


def _tiling(group, backend):
    """(Y, X) when ``group`` runs as a 2-D tiled pointwise kernel (Triton only), else None."""
    if backend.name != "triton" or not isinstance(group, FusedGroup):
        return None
    if (tiled := tile_pointwise(group)) is not None:
        trace.log("tile_2d", stage="codegen", group=group.names, y=tiled[0], x=tiled[1])
    return tiled


def compile_aten_graph(gm: torch.fx.GraphModule, example_inputs: list, device) -> Callable:
    """Compile one functional ATen graph to generated kernels (see module docstring).

    ``example_inputs``: fake or real tensors (shapes, strides, dtypes, devices are used, values are not). Raises
    whatever lowering/codegen raises (the "coil" backend catches it and falls back to the FX interpreter)."""
    device = torch.device(device)
    env = _shape_env(example_inputs) or _unbacked_shape_env(gm)
    n_guards = len(env.guards) if env is not None else 0
    with shape_env_scope(env):
        out = _compile(gm, example_inputs, device, env)
    if env is not None:
        # what code generation relied on about sizes (each one a guard the capture
        # checks per call); ideally none: a guard here narrows the graph's sizes
        new = env.guards[n_guards:]
        out.guards = [str(g.expr) for g in new]
        trace.log("codegen_guards", stage="codegen", guards=out.guards,
                  where=[str(getattr(g, "sloc", "")) for g in new])
    return out


def _shape_env(example_inputs: list):
    """The ShapeEnv of symbolic example inputs (SymInts, fake tensors with SymInt sizes or strides); None if static."""
    for x in example_inputs:
        vals = [x] if isinstance(x, torch.SymInt) else [*x.shape, *x.stride()] if isinstance(x, torch.Tensor) else []
        if (s := next((v for v in vals if isinstance(v, torch.SymInt)), None)) is not None:
            return s.node.shape_env
    return None


def _unbacked_shape_env(gm):
    """The ShapeEnv of a graph with static inputs whose values have symbolic sizes: data-dependent
    (unbacked) ones (``nonzero``, ``unique``), or ones computed from a symbolic number that a 0-d
    tensor input holds (``x[:int(f)]`` for a dynamic float ``f``), or None."""
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        for s in [v] if isinstance(v, torch.SymInt) else list(v.shape) if isinstance(v, torch.Tensor) else []:
            if isinstance(s, torch.SymInt) and s.node.expr.free_symbols:
                return s.node.shape_env
    return None


def _ownable_buffers(graph, out_names: set) -> set:
    """Buffers a kernel may store an output over once no later step reads them: outputs of this graph's own kernels
    and of extern ATen ops whose results alias no argument, that are not graph outputs, scatter targets, padded
    matmul results or the base of an extern view (KernelPlan.inplace)."""
    keep = set(out_names)
    keep |= {r for rs in _alias_roots(graph.buffers).values() for r in rs}
    keep |= {b.target.get_name() for b in graph.buffers if isinstance(b, ScatterBuffer)}
    return {b.get_name() for b in graph.buffers if b.get_name() not in keep and (
        type(b) is ComputedBuffer or isinstance(b, ExternKernel) and isinstance(b.op, torch._ops.OpOverload)
        and b.layout is not None and not getattr(b, "padded_matmul", False)
        and not any(r.alias_info is not None for r in b.op._schema.returns))}


def _input_targets(gm, graph, out_names: set) -> dict:
    """{input name: buffer name} for the inputs aot lets the graph write (``gm.meta["coil_mutated_inputs"]``, output k
    is the new value of input j: in a training forward, mutations hidden from autograd such as BatchNorm's running
    statistics) whose new value a kernel computes, in the input's layout, and no other output shares. The kernel that
    alone reads such an input may store the value over it (KernelPlan.inplace): the epilogue copies nothing back."""
    if not config.inplace_buffers:
        return {}
    counts = Counter(o.name for o in graph.outputs)
    targets = {}
    for k, j in (gm.meta.get("coil_mutated_inputs") or {}).items():
        o, name = graph.outputs[k], graph.placeholder_names[j]
        b, inp = graph.name_to_buffer.get(o.name), graph.graph_inputs.get(name)
        if o.kind == "buffer" and type(b) is ComputedBuffer and counts[o.name] == 1 and inp is not None and \
                name not in out_names and layout_key(b.layout) == layout_key(inp.layout):
            targets[name] = o.name
    return targets


def _compile(gm, example_inputs, device, env) -> "CompiledGraph":
    if config.matmul_float32_grads:
        upcast_matmuls(gm)
    with trace.stage("codegen_graph"):
        graph = GraphLowering(gm, example_inputs, device).lower()
        sched = Scheduler(graph)
        backend = _pick_backend(device)
        readers: dict[str, set] = {}
        for s in sched.steps:
            for n in s.read_names():
                readers.setdefault(n, set()).add(id(s))
        out_names = {o.name for o in graph.outputs if o.name is not None}
        ownable = _ownable_buffers(graph, out_names) if config.inplace_buffers else set()
        targets = _input_targets(gm, graph, out_names)
        kernels: dict[int, _Kernel] = {}
        ki = 0
        with trace.stage("kernels"):
            for s in sched.steps:
                if not isinstance(s, FusedGroup):
                    continue
                live = {n for n in s.names if n in out_names or readers.get(n, set()) - {id(s)}}
                dead = {n: targets.get(n) for n in s.read_names() if (n in ownable or targets.get(n) in s.names)
                        and readers.get(n) == {id(s)}}
                # a CPU group in a GPU graph (``torch.rand([])`` for layerdrop) gets the CPU
                # backend: Triton would run it in its interpreter, ~10 ms a launch
                gdev = s.nodes[0].get_device()
                be = backend if gdev is None or gdev.type == device.type else _pick_backend(gdev)
                if (tiled := _tiling(s, be)) is not None:
                    # a 2-D tiled pointwise kernel: planned like a persistent reduction kernel without reductions over
                    # (Y, X); the Triton backend gives it a 2-D grid instead of a loop (codegen/tiling.py)
                    plan = KernelPlan(FusedGroup(s.nodes, tiled[0], tiled[1], s.order), graph, live, tiled=True,
                                      dead_inputs=dead)
                else:
                    plan = KernelPlan(s, graph, live, be.persistent_rnumel, dead_inputs=dead)
                kind = "til" if tiled is not None else "poi" if plan.rnumel == 1 else \
                    "per" if plan.persistent else "red"
                name = f"{be.name}_{kind}_{ki}_{'_'.join(s.names[:3])}"
                gen = be.generate(plan, name)
                kernels[id(s)] = _Kernel(plan, gen)
                ki += 1
                if trace.enabled():
                    trace.artifact(f"kernel {name}", lambda g=gen: g.source, kind=be.name)
        for k in kernels.values():  # join background builds (C++): failures surface here
            if (wait := getattr(k.generated.launcher, "wait", None)) is not None:
                wait()
        # a backward recorded as a CUDA graph may release the forward's saved
        # activations as it goes (runtime/cudagraph_trees.py: Tree._lend_saved)
        boxed = config.cudagraphs and gm.meta.get("coil_aot_graph") == "backward" and not gm.meta.get("coil_aot_piece")
        # recorded as a CUDA graph, the wrapper's host time is not replayed: each buffer is freed after its last reader
        # and the caching allocator places the next (holding it for a later step of its layout fragments the pool)
        reuse = not (config.cudagraphs and getattr(graph.device, "type", None) == "cuda")
        source, glb = WrapperCodegen(graph, sched.steps, kernels, boxed=boxed, reuse=reuse).generate()
        if trace.enabled():
            trace.artifact("wrapper", lambda: source, kind="python")
        exec(compile(source, "<coil wrapper>", "exec"), glb)
        call = glb["call"]
    compiled = CompiledGraph(call, source, [k.generated for k in kernels.values()],
                             dict(graph.fallbacks), sched, gm, graph.output_strides)
    compiled.call_boxed = glb.get("call_boxed")
    stored_over = {n for k in kernels.values() for n in k.plan.inplace.values()}
    compiled.writes_inputs = tuple(graph.inputs_written) + tuple(
        j for j, n in enumerate(graph.placeholder_names) if n in targets and n in stored_over)
    if len(compiled.writes_inputs) > len(graph.inputs_written):
        trace.log("inputs_written_in_place", stage="codegen", inputs=list(compiled.writes_inputs))
    return compiled
