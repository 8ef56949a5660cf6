"""``aot_compile``: the driver of coil's ahead-of-time autograd.

    torch-level GraphModule + example inputs
      → fakeify inputs (reuse their FakeTensorMode if already fake)
      → analyze (mutations, aliasing, requires_grad) while tracing the ATen graph (else in a fake run first)
      → inference path: the forward graph → fw_compiler
        training path: the joint graph → partition_fn → fw/bw compilers
      → runtime wrapper (coil.aot.runtime)

A graph holding ``nested_compile_region`` calls is compiled region by region instead
(coil/aot/regions.py): each distinct region once, the ops between calls as segments.

Parameters and buffers that are still attributes of ``gm`` (e.g. a ``torch.fx.symbolic_trace``d module) are lifted to
extra leading inputs, so they get gradients and their mutations (BatchNorm statistics) are replayed."""
from __future__ import annotations

import contextlib
import copy
import functools
import re
import time
from typing import Callable, Optional

import torch
import torch.autograd.forward_ad as fwAD
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensor
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from coil import trace
from coil.config import config, patch as config_patch
from coil.aot.aliasing import RunEagerly, input_groups
from coil.aot.decompositions import get_decompositions
from coil.aot.cse import cse_graph, drop_dead_views
from coil.aot.functional import (is_symbolic, analyze, checkpoint_region, fake_mode_of, fakeify, run_eagerly,
                                 trace_inference, trace_joint, _without_mkldnn)
from coil.aot.partition import (default_partition, drop_undefined_tangents, grad_in_tangents, min_cut_partition,
                                strip_grad_in)
from coil.aot.regions import compile_regional, region_calls
from coil.aot.scalars import tensorize_scalar_reads
from coil.aot.runtime import AUTOCAST_DEVICES, inference_runner, training_runner
from coil.capture.variables.hops import calls_while_loop
from coil.capture.variables.tensor import _is_inplace
from coil.runtime.cudagraph_split import partitioning
from coil.exc import CoilError, warn_user


def _placeholder_fakes(gm: torch.fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def _saved_layouts(bw_fakes: list, fw_strides, start: int, num_saved: int, fake_mode) -> list:
    """The backward's example inputs, the saved ones re-strided to the strides the compiled forward returns them with
    (``fw_strides[start + i]``); unchanged when the forward compiler reports none (e.g. the FX interpreter). Logged
    as ``aot_saved_layouts`` (how many saved tensors changed layout)."""
    if fw_strides is None:
        return bw_fakes
    out, changed = list(bw_fakes), 0
    for i in range(num_saved):
        f, st = out[i], fw_strides[start + i] if start + i < len(fw_strides) else None
        if isinstance(f, torch.Tensor) and st is not None and len(st) == f.dim() and tuple(f.stride()) != tuple(st):
            with fake_mode:
                out[i] = torch.empty_strided(tuple(f.shape), tuple(st), dtype=f.dtype, device=f.device)
            changed += 1
    if changed:
        trace.log("aot_saved_layouts", stage="aot", changed=changed, saved=num_saved)
    return out


def _symbolic_placeholder_values(gm: torch.fx.GraphModule, example_inputs: list,
                                 data_dependent: bool = False) -> Optional[list]:
    """The fake inputs to trace with when the capture's placeholder values (``meta["example_value"]`` or
    ``meta["val"]``) are symbolic (dynamic shapes, or a 0-d tensor holding a Python float the capture made symbolic,
    read with ``.item()``: :func:`coil.aot.functional.item_memo`), else None. Tracing with them keeps sizes symbolic;
    tracing with the real example inputs would specialize the graphs to the first call's sizes. Real example inputs that
    torch's capture recorded are faked again (:func:`_fake_as_at_call`)."""
    vals, symbolic = [], False
    for n in gm.graph.find_nodes(op="placeholder"):
        v = n.meta.get("example_value", n.meta.get("val"))
        if is_symbolic([v]):
            symbolic = True
        elif not isinstance(v, (torch.Tensor, int, float, bool)):
            return None
        vals.append(v)
    if not symbolic and (data_dependent or _has_unbacked(gm)):
        return vals       # nonzero / .item(): trace on the capture's fakes and ShapeEnv
    return _fake_as_at_call(vals, example_inputs) if symbolic else None


def _has_unbacked(gm: torch.fx.GraphModule) -> bool:
    """Whether a value of ``gm`` has a data-dependent (unbacked) size or number, or ``gm`` calls while_loop
    (its trip count is one): the capture's ShapeEnv allowed it, so only the capture's fake mode can trace it."""
    if calls_while_loop(gm):
        return True
    for n in gm.graph.nodes:
        v = n.meta.get("example_value", n.meta.get("val"))
        try:
            if v is not None and free_unbacked_symbols(v):
                return True
        except Exception:  # noqa: BLE001 - a value pytree cannot walk (opaque objects)
            continue
    return False


def _fake_as_at_call(vals: list, example_inputs: list) -> list:
    """``vals`` (the capture's placeholder values) with each tensor replaced by a fake of the real example input, made
    in the FakeTensorMode torch hands backends (``TracingContext.fake_mode``, on the capture's ShapeEnv), with the
    capture's symbols. The capture's placeholder fakes describe the inputs as the program *left* them (after
    ``y.mul_(x)``, ``y``'s fake requires grad and has a ``grad_fn``) and belong to the capture's own FakeTensorMode
    (``make_fx`` refused: "Mixing fake modes NYI"). ``FakeTensorMode.from_tensor`` of a real tensor the capture recorded
    (``TracingContext.tensor_to_context``) reuses the symbols the capture gave it, so the graph's SymInt placeholders
    stay valid. Unchanged (``vals``) outside torch's capture, or when some tensor input was not recorded by it."""
    from torch._guards import TracingContext  # torch's capture → backend seam, not torch._dynamo
    ctx = TracingContext.try_get()
    if (mode := getattr(ctx, "fake_mode", None)) is None or mode.shape_env is None or len(vals) != len(example_inputs):
        return vals
    recorded = ctx.tensor_to_context
    for v, x in zip(vals, example_inputs):
        if isinstance(v, torch.Tensor) and not (
                isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor) and x in recorded):
            return vals
    return [mode.from_tensor(x) if isinstance(v, torch.Tensor) else v for v, x in zip(vals, example_inputs)]


def _refuse_mutated_aliased_inputs(example_inputs: list, mutated: list) -> None:
    """Inputs sharing memory are traced as independent tensors; that is only wrong when one of them is mutated, so
    refuse exactly that case (CoilError). Called at compile time on the example inputs and, through
    :func:`_check_aliasing_per_call`, on every call of a graph that mutates an input (a cache hit may pass aliased
    tensors where the compile saw separate ones)."""
    if not mutated:
        return
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if any(isinstance(x, FakeTensor) for x in tensors):
        # fake example inputs (torch.compile's recompile for new sizes) have no data
        # pointers; aliasing is checked on the real tensors of every call
        return
    if len({x.untyped_storage().data_ptr() for x in tensors}) == len(tensors):
        return  # every storage distinct (the per-call common case: one set, ~0.1 µs a tensor)
    owners: dict = {}
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            if (st := x.untyped_storage()).nbytes() == 0:
                continue  # empty storages all sit at address 0 and hold nothing
            owners.setdefault(st.data_ptr(), []).append(i)
    for group in owners.values():
        if len(group) > 1 and any(i in mutated for i in group):
            raise CoilError(f"coil.aot: graph inputs {group} share memory and input "
                            f"{[i for i in group if i in mutated]} is mutated in place; coil traces inputs "
                            "as independent tensors, so the other views would not see the write.\n"
                            "  what to do: pass only the base tensor (and index it inside the function), "
                            "or clone one of the inputs before the call.")


def _clone_saved_mutated_inputs(fw: torch.fx.GraphModule, info, n_fw: int, num_saved: int) -> None:
    """Save a copy of a mutated input that the backward reads, not the input itself. The backward of ``y.mul_(x)``
    (``y`` mutated, ``x`` requiring grad) reads ``y``'s value before the mutation, which the partitioner saves as the
    forward's input ``y``; the epilogue then overwrites it in place (and its version bump failed every backward); the
    same for a saved view of it (``y[0].mul_(x)`` saves ``select(y)``). Eager autograd saves a clone before the in-place
    op too. A restrided input also: the epilogue's ``as_strided_`` bumps its version (fuzz s1005 #348). Rewrites ``fw``
    in place."""
    places, changed = [n for n in fw.graph.nodes if n.op == "placeholder"], info.mutated_inputs + info.restrided_inputs
    if len(places) != len(info.inputs) or not changed:
        return
    mutated = {places[i] for i in changed}

    def of_mutated(n) -> bool:  # the input itself or a view of it (y[0], y.t(), ...)
        while n.op == "call_function" and getattr(n.target, "is_view", False) and n.args:
            n = n.args[0]
        return n in mutated
    out = next(n for n in fw.graph.nodes if n.op == "output")
    args, changed = list(out.args[0]), []
    for k in range(n_fw, n_fw + num_saved):
        if isinstance(args[k], torch.fx.Node) and of_mutated(args[k]):
            with fw.graph.inserting_before(out):
                c = fw.graph.call_function(torch.ops.aten.clone.default, (args[k],))
            c.meta.update(args[k].meta)
            v = args[k].meta.get("val")
            mode = getattr(v, "fake_mode", None)
            if mode is not None:  # the clone's own strides (dense, in the input's order)
                with mode:
                    c.meta["val"] = torch.ops.aten.clone.default(v)
            changed.append(args[k].name)
            args[k] = c
    if changed:
        out.args = (args,) + tuple(out.args[1:])
        fw.recompile()
        trace.log("aot_clone_saved_mutated_inputs", stage="aot", inputs=changed)


def _storage_objects_preserved() -> bool:
    """Whether a tensor's ``untyped_storage()`` is one Python object per storage, hashed by identity (torch preserves
    a storage's Python object; checked here on two views of one storage)."""
    t, st = torch.empty(2), torch.UntypedStorage
    return t.untyped_storage() is t[1:].untyped_storage() and st.__hash__ is object.__hash__ and \
        st.__eq__ is object.__eq__


#: one key per storage (StorageImpl) of a tensor, for the per-call aliasing check: the storage object itself where
#: torch preserves it (a C getter, half the cost of ``torch._C._storage_id``'s binding: a GPT-2 decoding step passes
#: ~175 tensors), else the storage's id
_storage_key = torch.Tensor.untyped_storage if _storage_objects_preserved() else torch._C._storage_id


def _check_aliasing_per_call(runner: Callable, gm: Callable, mutated: list, example_inputs: list) -> Callable:
    """``runner``, except on calls whose inputs share memory with a mutated input (the check of
    :func:`_refuse_mutated_aliased_inputs`, about 0.1 µs per tensor input and only for graphs mutating an input): those
    run ``fn``, the captured program, eagerly, giving eager's values (logged as ``aot_aliased_inputs_eager``). Without
    it ``f(a, a)`` after ``f(x, y)`` hit the compiled graph, which treats its inputs as independent: wrong values."""
    if not mutated:
        return runner
    mutated = list(mutated)
    storage_of, storage_id, tensor = _storage_key, torch._C._storage_id, torch.Tensor
    # all example inputs tensors (parameters, buffers, activations): no per-call test; a call passing something
    # else fails storage_of and takes the full check
    all_tensors = all(isinstance(a, tensor) for a in example_inputs)

    @functools.wraps(runner)  # keeps the runner's attributes (_coil_aot_path, ...)
    def run(*args):
        # every storage distinct: the common case, without the fake-tensor test (C-level maps: a GPT-2 decoding
        # step passes ~175 tensors, and a list comprehension cost ~0.3 µs a tensor more)
        tensors = args if all_tensors or all(map(tensor.__instancecheck__, args)) else \
            [a for a in args if isinstance(a, tensor)]
        try:
            distinct = len(set(map(storage_of, tensors))) == len(tensors)
        except (RuntimeError, TypeError):  # a wrapper subclass has no storage object; a non-tensor where the
            try:                           # example had a tensor fails both: the full check
                distinct = len(set(map(storage_id, tensors))) == len(tensors)
            except (RuntimeError, TypeError):
                distinct = False
        if distinct:
            return runner(*args)
        try:
            _refuse_mutated_aliased_inputs(args, mutated)
        except (CoilError, RuntimeError) as e:  # (RuntimeError: a subclass whose storage cannot be read)
            trace.log("aot_aliased_inputs_eager", stage="aot", reason=str(e).split("\n")[0])
            return gm(*args)
        return runner(*args)
    return run


def _graph_text(gm: torch.fx.GraphModule, header: str) -> Callable[[], str]:
    return lambda: f"# {header}\n" + gm.print_readable(print_output=False)


def aot_compile(gm: Callable, example_inputs: list, fw_compiler: Callable, bw_compiler: Optional[Callable] = None,
                partition_fn: Callable = min_cut_partition, decompositions: Optional[dict] = None) -> Callable:
    """Compile ``gm`` (a torch-level ``torch.fx.GraphModule`` or any traceable
    callable taking tensors positionally) ahead of time, autograd included.

    - ``example_inputs``: real or fake tensors (and ints) matching ``gm``'s placeholders; only their metadata is used.
    - ``fw_compiler(aten_gm, fake_inputs) -> callable`` compiles the forward (or inference) graph, ``bw_compiler``
      (default: ``fw_compiler``) the backward.
    - ``partition_fn(joint_gm, joint_info) -> Partition``: :func:`min_cut_partition` (default; ``config.partitioner ==
      "default"`` switches it to :func:`default_partition`) or your own.
    - ``decompositions``: the table for ``make_fx``; default :func:`coil.aot.decompositions.get_decompositions`.

    Returns a callable with ``gm``'s calling convention. The inference path (one graph) is taken when grad mode is off
    at compile time or no input (or no output) requires grad; otherwise the training path. Shapes are specialized to the
    example inputs unless these are fake tensors with symbolic sizes. Raises :class:`coil.exc.CoilError` for programs it
    cannot handle (metadata mutation of inputs)."""
    bw_compiler = bw_compiler or fw_compiler
    if isinstance(gm, torch.fx.GraphModule) and region_calls(gm):
        # nested_compile_region calls: each region compiled once (coil/aot/regions.py)
        return compile_regional(gm, example_inputs, functools.partial(
            aot_compile, fw_compiler=fw_compiler, bw_compiler=bw_compiler,
            partition_fn=partition_fn, decompositions=decompositions))
    # under CUDA graphs, a graph with un-graphable ops is compiled as pieces around them
    fw_compiler, bw_compiler = partitioning(fw_compiler), partitioning(bw_compiler)
    if partition_fn is min_cut_partition and config.partitioner == "default":
        partition_fn = default_partition
    lifted: list = []
    fn = gm
    symbolic = _symbolic_placeholder_values(gm, list(example_inputs)) if isinstance(gm, torch.fx.GraphModule) else None
    if symbolic is not None:
        example_inputs = symbolic
    if isinstance(gm, torch.nn.Module):
        if named := list(gm.named_parameters(remove_duplicate=False)) + list(gm.named_buffers(remove_duplicate=False)):
            names = [n for n, _ in named]
            lifted = [t for _, t in named]
            n_lift = len(names)

            def fn(*args):
                return torch.func.functional_call(gm, dict(zip(names, args[:n_lift])),
                                                  tuple(args[n_lift:]), tie_weights=False, strict=True)
            # with the capture's fakes (a float's ``item_memo``: an optimizer's lr under torch.compile), the
            # attributes (its parameters) are traced as fakes of the same mode, of static sizes
            mode = fake_mode_of(example_inputs) if symbolic is not None else None
            example_inputs = [mode.from_tensor(t, static_shapes=True) if mode else t for t in lifted] + \
                list(example_inputs)
    t0 = time.perf_counter()
    if torch.is_anomaly_enabled():
        # anomaly mode's NaN check of each backward output reads values (.item()), which a fake trace
        # cannot; the compiled backward runs without it (logged)
        trace.log("aot_anomaly_mode_off", stage="aot", reason="traced without detect_anomaly's value checks")
    # graphs made while tracing (make_fx's, the partition's) generate their Python code only if it is read or
    # they are called: coil's own kernel compiler does neither
    with trace.stage("aot"), preserve_global_state(), torch.autograd.set_detect_anomaly(False), \
            _use_lazy_graph_module(True):
        try:
            run = _compile(fn, list(example_inputs), fw_compiler, bw_compiler, partition_fn, decompositions)
        except DynamicOutputShapeException:
            # a data-dependent op whose capture made no unbacked size (nonzero of an empty
            # tensor): only the capture's fake mode, which allowed it, can trace it
            fakes = _symbolic_placeholder_values(gm, [], True) if not lifted and \
                isinstance(gm, torch.fx.GraphModule) else None
            try:
                if fakes is None or all(a is b for a, b in zip(fakes, example_inputs)):
                    raise
                run = _compile(fn, fakes, fw_compiler, bw_compiler, partition_fn, decompositions)
            except (DynamicOutputShapeException, DataDependentOutputException) as e:
                # a data-dependent size no trace can follow (nn.Embedding(sparse=True, padding_idx=...)'s backward
                # masks rows with nonzero): eager computes it
                run = _eager(fn, f"its joint graph reads an op whose output size depends on data ({e})")
    trace.log("aot_done", stage="aot", path=run._coil_aot_path, compile_ms=(time.perf_counter() - t0) * 1e3)
    run = _dual_inputs_eager(run, fn)
    if not lifted:
        return run

    def run_lifted(*args):
        return run(*lifted, *args)
    run_lifted._coil_aot_path = run._coil_aot_path  # type: ignore[attr-defined]
    return run_lifted


@contextlib.contextmanager
def saved_tensors_hooks_aside():
    """The caller's saved-tensor hooks (a non-reentrant checkpoint's, ``save_on_cpu``) set aside while capture and aot
    trace: they are for the program's run, not for the fake tensors of a trace (a compiled module called inside
    ``checkpoint(..., use_reentrant=False)`` failed to compile, then the checkpoint counted the trace's saves)."""
    hooks, autograd = [], torch._C._autograd
    while (top := autograd._top_saved_tensors_default_hooks(True)) is not None:
        hooks.append(top)
        autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(hooks):
            autograd._push_saved_tensors_default_hooks(pack, unpack)


@contextlib.contextmanager
def preserve_global_state():
    """Restore grad mode and every device's autocast state (enabled, dtype, nesting) after tracing, which executes a
    graph's ``_enter_autocast`` for real: one with no exit (torch's capture, at a break inside the block; coil's
    graphs close theirs) or a trace that raised between them left the caller's code after the compile in low
    precision (or fp32 for an ``enabled=False`` island). Sets the caller's saved-tensor hooks aside too."""
    grad = torch.is_grad_enabled()
    saved = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in AUTOCAST_DEVICES]
    cache, nesting = torch.is_autocast_cache_enabled(), torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    try:
        with saved_tensors_hooks_aside():
            yield
    finally:
        torch.set_grad_enabled(grad)
        for d, enabled, dtype in saved:
            torch.set_autocast_enabled(d, enabled)
            torch.set_autocast_dtype(d, dtype)
        torch.set_autocast_cache_enabled(cache)
        now = torch.autocast_increment_nesting() - 1
        torch.autocast_decrement_nesting()
        while now > nesting:
            now = torch.autocast_decrement_nesting()
        while now < nesting:
            now = torch.autocast_increment_nesting()


#: decompositions for the forward of _tensorized_forward: ops whose float argument has no Tensor overload
_FLOAT_DECOMPS = {torch.ops.aten.dist.default: torch._decomp.decomposition_table[torch.ops.aten.dist.default],
                  torch.ops.aten._foreach_lerp.Scalar: lambda xs, ys, w: [torch.ops.aten.lerp.Scalar(x, y, w)
                                                                           for x, y in zip(xs, ys)]}


def _autograd_beyond_ops(n: torch.fx.Node) -> bool:
    """Whether node ``n`` of a torch-level graph does more for autograd than the ATen ops it runs, which the forward
    ATen graph (traced under no_grad) forgets: a grad-mode switch (a ``no_grad`` region), ``detach`` (``.data``), an
    autograd or functorch API, or an ``autograd.Function`` or higher-order operator (their own backward)."""
    if n.op == "call_method":
        return n.target in ("detach", "detach_", "requires_grad_")
    module = getattr(n.target, "__module__", None) or ""
    return n.op == "call_function" and (n.target in _AUTOGRAD_TARGETS or isinstance(
        n.target, torch._ops.HigherOrderOperator) or module.startswith(_AUTOGRAD_MODULES))


def _given_a_float(decomps: dict) -> dict:
    """``decomps`` applied only to a call given a symbolic float (``celu(x, alpha)``, ``vector_norm(x, ord)``): its
    float then reaches ops with Tensor overloads. Other ops stay whole in the tensorized forward, so that the joint
    differentiates them by their own formulas, not their decompositions (``special.log_ndtr``'s decomposition
    differentiated gave NaN gradients of very negative inputs; ``fill``'s none: a compile error)."""
    def given(d):
        return lambda *a, **kw: d(*a, **kw) if any(isinstance(v, torch.SymFloat) for v in pytree.tree_leaves(
            (a, kw))) else NotImplemented
    return {op: given(d) for op, d in decomps.items()}


_AUTOGRAD_TARGETS = {torch._C._set_grad_enabled, torch.detach, torch.Tensor.detach, torch.Tensor.detach_,
                     torch.Tensor.requires_grad_, torch.ops.aten.detach, torch.ops.aten.detach.default,
                     torch.ops.aten.detach_, torch.ops.aten.detach_.default}
#: modules of autograd APIs (``torch._C._autograd._get_data_attr`` is torch's capture of ``.data``); capture's
#: ``autograd.Function`` calls are functions of ``coil.capture.autograd_function``
_AUTOGRAD_MODULES = ("torch.autograd", "torch._C._autograd", "torch._functorch", "torch._C._functorch",
                     "coil.capture.autograd_function")


def _tensorized_forward(fn, fake_args, info, decomps, fake_mode):
    """``fn`` as its forward ATen graph with its Python-float reads tensorized (docs/aot.md, "Scalar reads"), where
    ``fn`` reads a symbolic float and returns only new values: the joint trace then differentiates ``lerp.Tensor``,
    not ``lerp.Scalar``, whose C++ formula reads the float as a number (a guard on its value, a recompile per value);
    the backward reads the 0-d tensor, a graph input like the forward's. Else ``fn``. Returns ``(fn or the tensorized
    forward, fn's own joint trace when one was made and ``fn`` is returned, else None)``."""
    if info.mutated_inputs or info.base_sources or info.restrided_inputs or not isinstance(fn, torch.fx.GraphModule) \
            or not fn.graph.find_nodes(op="call_method", target="item") or any(map(_autograd_beyond_ops, fn.graph.nodes)):
        return fn, None
    own = None
    if any(n.op in ("call_function", "call_method") and (_is_inplace(n.op, n.target, n.kwargs) or
                                                         n.kwargs.get("inplace") is True) for n in fn.graph.nodes):
        # the functional forward forgets the writes, so autograd's check of a saved value overwritten in place
        # ((x * s).relu_().exp_(): eager's backward raises) runs only in the joint of fn itself (FINDINGS_74 5)
        try:
            own = trace_joint(fn, fake_args, info, decomps, fake_mode)
        except Exception:  # noqa: BLE001 - the caller's own trace of fn meets it again and decides
            return fn, None
    try:
        # traced as the joint trace runs fn (grad on, oneDNN off), or it recorded ops without a backward: coil's
        # sdpa, an inference LSTM without workspace, a forward-only embedding_bag (FINDINGS_74 2, 3)
        with torch.enable_grad(), _without_mkldnn():
            fw = trace_inference(fn, fake_args, info, {**_given_a_float(decomps), **_FLOAT_DECOMPS}, fake_mode)
    except Exception:  # noqa: BLE001 - optional: the joint of fn itself (specialized) is the fallback
        return fn, own
    if fw.graph.find_nodes(op="call_function", target=torch.ops.aten.rrelu_with_noise_functional.default) or \
            not tensorize_scalar_reads(fw, "forward")["tensorized"]:
        # (torch's derivative of the functional rrelu reads the noise before its kernel writes it: all-zero
        # gradients from the graph's own forward, FINDINGS_74 1)
        return fn, own

    def run(*args):
        flat = [None] * (max(info.graph_outputs, default=-1) + 1)
        for k, v in zip(info.graph_outputs, fw(*args)):
            flat[k] = v
        return flat
    return run, None


def _compile(fn, example_inputs, fw_compiler, bw_compiler, partition_fn, decompositions):
    decomps = get_decompositions() if decompositions is None else decompositions
    if decompositions is None and isinstance(fn, torch.fx.GraphModule) and any(
            n.target is torch.ops.higher_order.scan for n in fn.graph.nodes):
        # torch's scan autograd partitions the body's joint graph itself and refuses saved
        # values that alias the body's inputs: detach decomposed to alias makes them
        decomps = {k: v for k, v in decomps.items() if k is not torch.ops.aten.detach.default}
    fake_mode, fake_args = fakeify(example_inputs)
    grad, user_fn = torch.is_grad_enabled(), fn
    try:
        if isinstance(fn, torch.fx.GraphModule) and fn.graph.find_nodes(
                op="call_function", target=torch.autograd.grad_mode._enter_inference_mode):
            raise RunEagerly("torch.inference_mode() in torch's graph: a compiled graph cannot make inference tensors")
        one = trace_joint(fn, fake_args, None, decomps, fake_mode, grad) if not grad or not is_symbolic(
            fake_args) and any(isinstance(a, torch.Tensor) and a.requires_grad for a in fake_args) else None
        info, fw_gm = (one[1].program, None if grad else one[0]) if one else (
            analyze(fn, fake_args, fake_mode, grad), None)
        if (groups := input_groups(fake_args, info.mutated_inputs)) is not None:
            fn = groups.wrap(fn)  # inputs sharing memory with a mutated one: traced through synthetic bases
            fake_args = groups.fake_args(fake_args, fake_mode)
            example_inputs = fake_args
            info, one, fw_gm = analyze(fn, fake_args, fake_mode, grad), None, None
    except (RunEagerly, RuntimeError) as e:
        # also: functionalization refuses a write through as_strided of a restrided input, or (its replay under
        # autograd) of a non-contiguous input that requires grad (s1003 #733: "only supported for contiguous inputs"),
        # or a write through a view of an overlapping view (x.unfold(0, 3, 1)[0].add_(1); eager allows it), or
        # through as_strided of a strided input of symbolic size (its fake's storage holds only numel elements)
        if not isinstance(e, RunEagerly) and not re.search(r"as_strided(\(\) is non-compos|_scatter is curr)|mutated "
                                                           r"that has internal overlap|out of bounds for storage", str(e)):
            raise
        trace.log("aot_overlapping_write_eager", stage="aot", reason=str(e))
        return _eager(user_fn, "functionalization refuses its writes: " + str(e).split("\n")[0])
    written = dict(zip(info.mutated_inputs, info.fw_out_requires_grad))
    if grad and any(info.inputs[i].requires_grad or written.get(i) for i in info.restrided_inputs):
        # an input whose metadata the program changes and that requires grad (or is written differentiably): a view
        # of it taken before (or a multi-output one after: split) is an autograd view of a base whose metadata
        # changed under it, which the joint trace regenerates in the new layout (s1003 #154, #875: shape errors;
        # #524: backward refused), as is its new value in the input's original layout
        trace.log("aot_restrided_grad_eager", stage="aot", inputs=info.restrided_inputs)
        return _eager(user_fn, "it changes the shape or strides of an input that requires grad in place")
    trace.log("aot_analysis", stage="aot", runs=1 if one else 2, mutated_inputs=info.mutated_inputs,
              outputs=[(o.kind, o.index) for o in info.outputs], fw_out_requires_grad=info.fw_out_requires_grad)
    try:  # several dtypes or symbolic layouts on one storage (no synthetic base); a graph break makes them of one
        _refuse_mutated_aliased_inputs(example_inputs, info.mutated_inputs)  # input (a.view(torch.int32): s251 #414)
    except CoilError as e:
        return _eager(user_fn, str(e).split(";")[0].removeprefix("coil.aot: "))
    needs_grad = any(x.requires_grad for x in info.inputs) and any(info.fw_out_requires_grad)
    training = grad and needs_grad
    # Under the caller's no_grad, an output that requires grad in the fake run comes from the program's own
    # ``torch.enable_grad()`` region: the training path, with the joint graph traced in the caller's grad mode
    # so that values computed outside the region are not differentiated. If that trace fails (autograd's
    # checks see what eager only meets at backward time), the inference path runs it with detached outputs.
    joint, jinfo = one or (None, None)
    if needs_grad and not grad and not torch.is_inference_mode_enabled():
        try:
            joint, jinfo = trace_joint(fn, fake_args, info, decomps, fake_mode, grad=False)
            training = True
        except Exception as e:  # noqa: BLE001 - optional: the inference path is the fallback
            trace.log("aot_enable_grad_region_fallback", stage="aot", error=str(e)[:2000])
    if not training:
        try:
            fw_gm = fw_gm if fw_gm is not None else trace_inference(fn, fake_args, info, decomps, fake_mode)
        except RunEagerly as e:
            return _eager(user_fn, str(e))
        tensorize_scalar_reads(fw_gm, "inference")
        drop_dead_views(fw_gm)
        cse_graph(fw_gm)
        trace.artifact("aot_inference_graph", _graph_text(fw_gm, "aot inference graph (ATen)"), kind="python")
        fw_gm.meta["coil_aot_graph"] = "inference"
        fw_gm.meta["coil_free_layout_outputs"] = info.free_layout_outputs
        if config.inplace_input_writes:  # output k is the new value of input mutated[k] (ir/graph.py)
            fw_gm.meta["coil_mutated_inputs"] = dict(enumerate(info.mutated_inputs))
        compiled = fw_compiler(fw_gm, _placeholder_fakes(fw_gm))
        run = _check_aliasing_per_call(inference_runner(compiled, info), fn, info.mutated_inputs, fake_args)
        run = _check_offsets_per_call(run, fw_gm, fake_args, fn, info.mutated_inputs)
        return run if groups is None else _with_input_groups(run, groups, user_fn)
    if joint is None and groups is None:
        fn, own = _tensorized_forward(fn, fake_args, info, decomps, fake_mode)
        joint, jinfo = own or (None, None)
    try:
        joint, jinfo = (joint, jinfo) if joint is not None else trace_joint(fn, fake_args, info, decomps, fake_mode)
    except (RuntimeError, ZeroDivisionError) as e:  # y = x.exp(); y.add_(1): eager raises it at backward only, a
        # forward must run (also a formula's gradient of the wrong shape: scatter's of a src larger than its index,
        # s1035 #1689; or floor_divide's missing derivative, whose value only a write into an empty slice of an
        # input reads: s321 #256); or a backward divides by a symbolic size that is 0 at these sizes, where eager's gradients
        # are inf/NaN (var(correction=2) of 2 elements under dynamic=True: s1006 #112)
        if not isinstance(e, (ZeroDivisionError, RunEagerly)) and \
                not re.search("modified by an inplace operation|returned an invalid gradient|derivative for .* is "
                              "not implemented", str(e)):
            raise
        trace.log("aot_backward_error_eager", stage="aot", reason=str(e))
        return _eager(user_fn, "its backward cannot be traced (" + str(e).split("\n")[0].split(" Hint:")[0]
                      + "); it runs eagerly, where autograd's own backward decides whether that error happens")
    if _reentrant_checkpoint_writes_input(user_fn, joint, info):
        return _eager(user_fn, "a use_reentrant checkpoint body writes an input in place (BatchNorm's running "
                      "statistics): eager's backward runs the body again, writing it twice")
    tensorize_scalar_reads(joint, "joint")
    _zero_fill_evenly_distributed(joint)
    trace.artifact("aot_joint_graph", _graph_text(joint, "aot joint graph (ATen)"), kind="python")
    part = partition_fn(joint, jinfo)
    cse_graph(part.fw)
    cse_graph(part.bw)
    trace.artifact("aot_forward_graph", _graph_text(part.fw, "aot forward graph (ATen)"), kind="python")
    trace.artifact("aot_backward_graph", _graph_text(part.bw, "aot backward graph (ATen)"), kind="python")
    # what the graph is, for compilers that choose layouts: a forward's saved outputs
    # and a backward's inputs must keep the strides the joint graph was traced with
    part.fw.meta["coil_aot_graph"] = "forward"
    part.bw.meta["coil_aot_graph"] = "backward"
    # forward outputs [n_fw, n_fw + num_saved) are saved for the backward (the slice training_runner hands it): a
    # compiler returning them in a layout other than traced reports it (output_strides): the backward is built for it
    n_fw = info.num_fw_outputs
    _clone_saved_mutated_inputs(part.fw, info, n_fw, part.num_saved)
    part.fw.meta["coil_saved_outputs"] = (n_fw, n_fw + part.num_saved)
    part.fw.meta["coil_free_layout_outputs"] = info.free_layout_outputs
    if config.inplace_input_writes:  # new values of mutations autograd does not see: may be stored over the input
        part.fw.meta["coil_mutated_inputs"] = {k: j for k, j in enumerate(info.mutated_inputs) if
                                               info.inputs[j].mutation_hidden and not info.fw_out_requires_grad[k]}
    compiled_fw = fw_compiler(part.fw, _placeholder_fakes(part.fw))
    bw_fakes = _saved_layouts(_placeholder_fakes(part.bw), getattr(compiled_fw, "output_strides", None),
                              n_fw, part.num_saved, fake_mode)
    pristine = _make_graph_module(part.bw, copy.deepcopy(part.bw.graph))  # (a compiler may change part.bw)
    reach = grad_in_tangents(pristine, part.num_saved)    # (tangents entering a custom Function's backward)
    strip_grad_in(part.bw)
    # static shapes: the backward is compiled at the first backward call, like one for a call whose tangents are
    # partly None (a step whose loss leaves an output without gradient, HF's ``labels=`` loss beside its logits,
    # never runs the full one); now with symbolic ones (the guards it adds join the frame's) or CUDA graphs
    lazy_bw = not config.cudagraphs and not is_symbolic([n.meta.get("val") for n in part.bw.graph.nodes])
    opts, cid = config.as_dict(), trace.current_compile_id()

    def bw_for(missing, reached=()):  # the backward for calls whose tangents ``missing`` are None (``reached``:
        # those of them the backward pass reached, drop_undefined_tangents), as the compile would make it
        from coil.capture.frame import _gc_paused  # (not its lock: autograd may run this on a device thread)
        with _gc_paused(), config_patch(**opts), _use_lazy_graph_module(True), \
                trace.compile_context(*cid.split("/")) if cid else contextlib.nullcontext():
            if not missing:
                return bw_compiler(part.bw, bw_fakes), [False] * len(jinfo.grad_inputs)
            gm, none = drop_undefined_tangents(pristine, part.num_saved, missing, reached)
            gm.meta["coil_aot_graph"] = "backward"  # (CUDA graphs' kind, upcast_matmuls)
            return bw_compiler(gm, bw_fakes), none
    run = _check_aliasing_per_call(training_runner(compiled_fw, None if lazy_bw else bw_compiler(part.bw, bw_fakes),
                                                   info, jinfo, part.num_saved, bw_for, reach,
                                                   _computed_saved_need_grad(part.fw, jinfo.grad_inputs, n_fw,
                                                                             part.num_saved)), fn, info.mutated_inputs,
                                  fake_args)
    run = _check_offsets_per_call(run, part.fw, fake_args, fn, info.mutated_inputs)
    return run if groups is None else _with_input_groups(run, groups, user_fn)


def _computed_saved_need_grad(fw: torch.fx.GraphModule, grad_inputs: list, start: int, num_saved: int) -> bool:
    """Whether the forward computes a floating saved value from an input that requires grad: eager's counterpart has
    a history, so gradients that read it require grad under ``create_graph=True`` (runtime's ``detached_saved``)."""
    places = [n for n in fw.graph.nodes if n.op == "placeholder"]
    dep = {places[i] for i in grad_inputs}
    for n in fw.graph.nodes:
        if n.op == "call_function" and any(a in dep for a in n.all_input_nodes):
            dep.add(n)
    saved = fw.graph.output_node().args[0][start:start + num_saved]
    return any(isinstance(s, torch.fx.Node) and s.op != "placeholder" and s in dep and isinstance(
        v := s.meta.get("val"), torch.Tensor) and (v.is_floating_point() or v.is_complex()) for s in saved)


def _check_offsets_per_call(runner: Callable, gm: torch.fx.GraphModule, fake_args: list, fn: Callable,
                            mutated: list) -> Callable:
    """``runner``, except on calls where an input that the graph reads through ``as_strided`` (directly or through
    views; any ``mutated`` one, whose new value it may read so: ``x[2:4].copy_(c)`` then ``as_strided`` at offset 1
    reads an old element, ``x[0:3]`` only new ones) starts at another storage offset than the compiled one:
    ``as_strided``'s offset is absolute in the storage, so the graph means something else for such a call, which runs
    ``fn`` eagerly (``aot_storage_offset_eager``). Capture does not guard storage offsets. So does a call whose input
    has fewer storage bytes than such a read reaches (eager's "out of bounds for storage" error; fake tensors do not
    check it, and the kernel read past the storage: s403 #29)."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    strided = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.as_strided.default]
    found: dict = {k: fake_args[k].storage_offset() for k in mutated} if strided else {}
    need: dict = {}  # input -> storage bytes its as_strided reads reach
    for n in strided:
        src = n.args[0]
        while src.op == "call_function" and getattr(src.target, "is_view", False):
            src = src.args[0]
        if src in places and (k := places.index(src)) < len(fake_args) and isinstance(fake_args[k], torch.Tensor):
            found[k] = fake_args[k].storage_offset()
            size, stride, off = n.args[1], n.args[2], (n.args[3:] or [None])[0]
            off = n.args[0].meta["val"].storage_offset() if off is None else off
            if all(type(v) is int for v in (*size, *stride, off)) and 0 not in size:
                last = off + sum((a - 1) * b for a, b in zip(size, stride)) + 1
                need[k] = max(need.get(k, 0), last * n.meta["val"].element_size())
    if not all(isinstance(v, int) for v in found.values()):
        found = {}
    if not found and not need:
        return runner
    checks = sorted(found.items())
    trace.log("aot_storage_offset_checks", stage="aot", inputs=checks, storage_bytes=sorted(need.items()))
    eager = fn.forward if isinstance(fn, torch.fx.GraphModule) else fn  # (FX's call wrapper prints a traceback)

    @functools.wraps(runner)
    def run(*args):
        for k, off in checks:
            if args[k].storage_offset() != off:
                trace.log("aot_storage_offset_eager", stage="aot", input=k,
                          offset=args[k].storage_offset(), compiled=off)
                return eager(*args)
        for k, nbytes in need.items():
            if args[k].untyped_storage().nbytes() < nbytes:
                trace.log("aot_storage_offset_eager", stage="aot", input=k, storage_bytes=nbytes)
                return eager(*args)
        return runner(*args)
    return run


def _dual_inputs_eager(runner: Callable, fn: Callable) -> Callable:
    """``runner``, except on calls under a forward-AD level with an input that carries a tangent (a dual tensor):
    compiled kernels drop tangents, so those run ``fn`` eagerly (``aot_dual_inputs_eager``)."""
    @functools.wraps(runner)
    def run(*args):
        if fwAD._current_level >= 0 and any(isinstance(a, torch.Tensor) and fwAD.unpack_dual(a).tangent is not None
                                            for a in args):
            trace.log("aot_dual_inputs_eager", stage="aot", reason="an input is a forward-AD dual tensor")
            return fn(*args)
        return runner(*args)
    return run


def _zero_fill_evenly_distributed(joint: torch.fx.GraphModule) -> None:
    """The backward of ``min()``/``max()``/``median()`` over all elements, traced, is ATen's formula for CUDA and
    tensor subclasses, ``mask * (grad / mask.sum())``: NaN where the mask is False and the gradient is inf or NaN.
    Eager's CPU formula fills zeros there (``zeros.masked_fill_(mask, grad / count)``; s1004 #188, ``min(x) * inf``).
    Such a product in the backward (it reads a tangent) becomes ``where(mask, grad / count, 0)``."""
    aten, grads = torch.ops.aten, set(joint.graph.find_nodes(op="placeholder"))
    grads = {n for n in grads if n.name.startswith("tangents")}
    for n in joint.graph.nodes:
        if n not in grads and any(isinstance(a, torch.fx.Node) and a in grads for a in n.all_input_nodes):
            grads.add(n)
        m, d = (n.args + (None, None))[:2] if n.target is aten.mul.Tensor else (None, None)
        s = d.args[1] if isinstance(d, torch.fx.Node) and d.target is aten.div.Tensor else None
        if n in grads and isinstance(s, torch.fx.Node) and s.target in (aten.sum.default, aten.sum.dim_IntList) \
                and s.args[0] is m and not s.kwargs.get("keepdim", s.args[2:3] == (True,)) and d.args[0] in grads \
                and getattr(m.meta.get("val"), "dtype", None) == torch.bool:
            n.target, n.args = aten.where.ScalarOther, (m, d, 0.0)
    joint.recompile()


def _reentrant_checkpoint_writes_input(fn, joint: torch.fx.GraphModule, info) -> bool:
    """A mutated input's new value is computed inside a ``use_reentrant=True`` checkpoint region of ``fn`` (capture's
    ``ac_reentrant``; make_fx copies only the region id onto the joint's nodes) and some output needs grad."""
    if not info.mutated_inputs or not any(info.fw_out_requires_grad) or not isinstance(fn, torch.fx.GraphModule):
        return False
    ids = {checkpoint_region(n) for n in fn.graph.nodes if n.meta.get("ac_reentrant")} - {None}
    out = next(n for n in reversed(joint.graph.nodes) if n.op == "output").args[0]
    return bool(ids) and any(isinstance(v, torch.fx.Node) and checkpoint_region(v) in ids
                             for v in out[:len(info.mutated_inputs)])


def _eager(fn: Callable, why: str) -> Callable:
    """``fn`` run eagerly on every call (a GraphModule through its ``forward``, whose call wrapper would print FX's
    "Call using an FX-traced Module" traceback to stderr before the user's own error). Warned, and logged as an
    ``eager_fallback`` the report counts with the codegen fallbacks: the user sees that this graph is not compiled."""
    trace.log("eager_fallback", stage="aot", reason=why)
    warn_user(f"coil: a captured graph runs eagerly on every call, not compiled ({why}); results are eager's")
    run = functools.partial(run_eagerly(fn) if isinstance(fn, torch.fx.GraphModule) else fn)
    run._coil_aot_path = "eager"  # type: ignore[attr-defined]
    return run


def _with_input_groups(runner: Callable, groups, fn: Callable) -> Callable:
    """``runner`` (compiled over the kept inputs and the synthetic bases of ``groups``, :mod:`coil.aot.aliasing`) called
    with the user's inputs; a call whose inputs share memory otherwise than the compiled ones runs ``fn`` eagerly
    (``aot_input_groups_eager``)."""

    @functools.wraps(runner)
    def run(*args):
        if (new := groups.call_args(args)) is None:
            trace.log("aot_input_groups_eager", stage="aot",
                      reason="inputs share memory otherwise than in the compiled call")
            return fn(*args)
        out = runner(*new)
        for i, (size, stride, off) in groups.restrides.items():
            args[i].as_strided_(size, stride, off)  # the program's restride of a member
        if groups.returned:
            leaves, spec = pytree.tree_flatten(out)
            for k, i in groups.returned.items():
                leaves[k] = args[i]
            out = pytree.tree_unflatten(leaves, spec)
        return out
    return run
