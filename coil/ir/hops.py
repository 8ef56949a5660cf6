"""Higher-order operators in the IR: wrapper-level control flow over separately compiled subgraphs.

``cond``, ``while_loop``, ``map_impl`` and ``scan`` in an ATen graph each lower to one extern call (:func:`run_cond`,
:func:`run_while_loop`, :func:`run_map`, :func:`run_scan`) over subgraphs compiled on their own with
:func:`coil.codegen.compile_aten_graph`; the parent's wrapper reads predicates with ``.item()``. A subgraph whose
compilation fails runs through the FX interpreter (event ``hop_branch_fallback``), never silently. docs/hops.md, "IR".
"""
from __future__ import annotations

import traceback
from typing import Any, Callable

import torch

from coil import trace
from coil.exc import refuse_fallback


def _contiguous(values) -> list:
    """Tensor operands of a subgraph as it was compiled (:func:`_fakes`): contiguous. The wrapper may hand an extern a
    value realized with other strides than the ATen graph's (a permuted slice it materialized alone), and a compiled
    subgraph reads its inputs with the strides it was compiled for."""
    return [v.contiguous() if isinstance(v, torch.Tensor) else v for v in values]


def _fakes(values) -> list:
    """Example inputs to compile a subgraph for: each tensor's ``meta["val"]`` made contiguous (:func:`_contiguous`)."""
    return [torch.empty_like(v, memory_format=torch.contiguous_format) if isinstance(v, torch.Tensor) else v
            for v in (a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in values)]


def run_cond(pred: torch.Tensor, true_fn: Callable, false_fn: Callable, operands) -> Any:
    """The wrapper's cond: one host read of ``pred`` (a bool under torch's capture), then one branch's graph."""
    operands = _contiguous(operands)
    return true_fn(*operands) if pred else false_fn(*operands)


def _compile_branch(gm: torch.fx.GraphModule, fakes: list, device, name: str) -> Callable:
    from coil.codegen import compile_aten_graph  # looked up per call: tests count the compiles
    try:
        with trace.stage("hop_branch"):
            trace.artifact(f"hop_subgraph {name}", lambda: gm.print_readable(print_output=False), kind="python")
            return compile_aten_graph(gm, fakes, device)
    except Exception as e:  # noqa: BLE001 - stay correct and say so
        trace.log("hop_branch_fallback", stage="lowering", branch=name,
                  error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        refuse_fallback("hop_branch_fallback", e)  # config.strict_codegen: an error instead
        return gm


def _compile_hop(lowering, op: str, gms: list, names: list, fakes: list) -> list:
    """Each subgraph of higher-order op ``op`` compiled (:func:`_compile_branch`), logged."""
    compiled = [_compile_branch(gm, fakes, lowering.device, n) for gm, n in zip(gms, names)]
    trace.log("hop_lowered", stage="lowering", op=op, branches=names,
              compiled=[not isinstance(c, torch.fx.GraphModule) for c in compiled])
    return compiled


def run_while_loop(cond_fn: Callable, body_fn: Callable, carried, additional) -> tuple:
    """The wrapper's while_loop: the compiled body runs while the compiled cond_fn's scalar (read on the host) is true.
    Zero iterations return copies of the carried inputs (a graph output never aliases an input here)."""
    state, additional = _contiguous(carried), _contiguous(additional)
    ran = False
    while c[0] if isinstance(c := cond_fn(*state, *additional), (tuple, list)) else c:
        state = _contiguous(body_fn(*state, *additional))
        ran = True
    return tuple(state) if ran else tuple(t.clone() for t in state)


def run_map(body_fn: Callable, xs, args) -> tuple:
    """The wrapper's map: the compiled body once per leading index of ``xs``; each output stacked."""
    args = _contiguous(args)
    outs = [body_fn(*_contiguous([x[i] for x in xs]), *args) for i in range(xs[0].shape[0])]
    return tuple(torch.stack([o[k] for o in outs]) for k in range(len(outs[0])))


def run_scan(body_fn: Callable, init, xs, additional) -> tuple:
    """The wrapper's scan: the compiled combine function once per leading index of ``xs``, threading the carry; returns
    the last carry, then each output stacked. The carry is made contiguous before each call (the body is compiled for
    that layout: an initial carry can be expanded, e.g. the gradient of a sum, the next ones not)."""
    carry, ys, additional = _contiguous(init), [], _contiguous(additional)
    for i in range(xs[0].shape[0]):
        out = body_fn(*carry, *_contiguous([x[i] for x in xs]), *additional)
        carry, y = [c.contiguous() for c in out[:len(carry)]], out[len(carry):]
        ys.append(y)
    return tuple(carry) + tuple(torch.stack([y[k] for y in ys]) for k in range(len(ys[0])))


def _lowering(run: Callable, op: str, sliced=()) -> Callable:
    """The lowering of higher-order op ``op``: each GraphModule argument compiled apart (:func:`_compile_hop`) for the
    values of the node's list arguments (one leading slice of each list at a position in ``sliced``: what a map or scan
    body is called with), and one extern call of ``run`` (the loop or the branch choice, in the wrapper) with the
    compiled subgraphs in their places."""
    def lower(lowering, args: tuple, kwargs: dict):
        node = lowering.current_node
        subs = [i for i, a in enumerate(args) if isinstance(a, torch.fx.GraphModule)]
        fakes = _fakes([v.meta["val"][0] if i in sliced else v for i, a in enumerate(node.args)
                        if isinstance(a, (list, tuple)) for v in a])
        compiled = _compile_hop(lowering, op, [args[i] for i in subs], [node.args[i].target for i in subs], fakes)
        run_args = [compiled[subs.index(i)] if i in subs else list(a) if isinstance(a, (list, tuple)) else a
                    for i, a in enumerate(args)]
        return lowering.make_extern(run, tuple(run_args), {})
    return lower


LOWERINGS = {torch.ops.higher_order.cond: _lowering(run_cond, "cond"),
             torch.ops.higher_order.while_loop: _lowering(run_while_loop, "while_loop"),
             torch.ops.higher_order.map_impl: _lowering(run_map, "map", sliced=(1,)),
             torch.ops.higher_order.scan: _lowering(run_scan, "scan", sliced=(2,))}
