"""Torch functions that capture records as a checked equivalent written with other ops.

Some ops check their arguments' *values* in eager but lose the check once traced on
fake tensors. ``F.one_hot(i, n)`` raises for a class outside ``[0, n)`` in eager; traced,
it becomes ``i.unsqueeze(-1) == arange(n)``, which returns an all-zero row instead (a
label bug became a zero target, user report 16). The substitute computes the same
values with an op whose generated kernels check the index (``index_select``: an
IndexError on the CPU backends, a device assert under Triton's debug mode), and keeps
fusing: the identity matrix it gathers from is pointwise, so
``one_hot(i, n).float() * 2`` is still one kernel.

:func:`substitute` is applied to every ``call_function`` target capture records.
"""
from __future__ import annotations

from typing import Callable

import torch


def one_hot(x: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """``F.one_hot`` (int64, shape ``x.shape + (num_classes,)``) with the class index
    bounds-checked by ``index_select``. ``num_classes=-1`` (read from the data) is
    ``F.one_hot`` itself."""
    if not isinstance(num_classes, int) or num_classes < 0 or x.dtype != torch.int64:
        return torch.nn.functional.one_hot(x, num_classes)
    if num_classes == 0 and x.numel() != 0:
        # every class is out of range, and the gather below would be empty (no check)
        raise RuntimeError("Class values must be smaller than num_classes.")
    iota = torch.arange(num_classes, device=x.device)
    eye = (iota.unsqueeze(1) == iota).long()
    return torch.index_select(eye, 0, x.reshape(-1)).reshape(*x.shape, num_classes)


#: torch function -> the function capture records in its place
SUBSTITUTES: dict[Callable, Callable] = {torch.nn.functional.one_hot: one_hot}


def substitute_graph(gm: torch.fx.GraphModule) -> None:
    """Apply :func:`substitute` to a torch-level FX graph from another capture
    (``torch.compile(backend="coil")``), in place."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function":
            new = substitute(node.target)
            if new is not node.target:
                node.target, changed = new, True
    if changed:
        gm.recompile()


def substitute(target):
    """The function to record for ``call_function`` target ``target``."""
    try:
        return SUBSTITUTES.get(target, target)
    except TypeError:  # unhashable target
        return target
