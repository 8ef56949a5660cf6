"""2-D tiling of pointwise kernels whose accesses disagree about the contiguous dim.

When one access of a pointwise group walks memory with ``xindex`` and another with a stride (a transpose,
an NCHW -> NHWC copy), a 1-D kernel coalesces only one of them. :func:`tile_pointwise` re-plans such a
group over ``(Y, X)``, ``X`` the innermost loop range of its first stored buffer: ``[XBLOCK, RBLOCK]``
tiles on a 2-D grid, which Triton's coalescing pass lays out per access (Inductor tiles ``(y, x)`` ranges
the same way). Triton only (event ``tile_2d``); docs/codegen.md."""
from __future__ import annotations

from typing import Optional

import sympy

from coil.ir.symbols import as_size, guard_true, hint, is_static
from coil.schedule.indexing import axis_steps, kernel_deps, kernel_index
from coil.ir.nodes import ScatterBuffer

#: Grid y dimension limit of CUDA (tiles along X must fit in it).
_MAX_GRID_Y = 65535


def _contiguous_axis(e) -> Optional[str]:
    """"x" or "r" for an index expression that steps by 1 along that kernel axis and by
    more along the other, else None (indirect, broadcast, or contiguous in neither)."""
    if (steps := axis_steps(e)) is None:
        return None
    dx, dr = steps
    return "x" if dx == 1 and abs(dr) > 1 else "r" if dr == 1 and abs(dx) > 1 else None


def tile_pointwise(group) -> Optional[tuple]:
    """``(Y, X)`` to run pointwise ``group`` (a scheduler FusedGroup with ``rnumel == 1``)
    as a 2-D tiled kernel, or None when a flat kernel coalesces every access already.

    Tiled when, over ``(Y, X)``, some access is contiguous along x and another along r (each access is a load or store
    with an affine index in the kernel symbols). ``Y`` and ``X`` are ints, or size expressions under dynamic shapes (the
    kernel takes them as ``xnumel`` / ``rnumel``, its grid follows them per call); a symbolic extent counts as long (no
    hint is read), and a symbolic ``X`` is guarded to fit the grid's y limit."""
    if group.rnumel != 1 or not group.nodes or any(isinstance(n, ScatterBuffer) for n in group.nodes):
        return None  # (a scatter's iteration space is its source elements, not a layout)
    try:
        x = as_size(group.nodes[0].get_ranges()[-1])
    except IndexError:
        return None
    if is_static(x) and (x < 8 or -(-x // 16) > _MAX_GRID_Y) or not is_static(x) and hint(x) > 16 * _MAX_GRID_Y:
        return None  # (a symbolic X whose example is this long stays flat)
    y = as_size(sympy.expand(sympy.sympify(group.numel) / x))
    if sympy.denom(y) != 1 or is_static(y) and y < 8:
        return None
    axes = set()
    for n in group.nodes:
        if kernel_index(n, y, x) is None or (deps := kernel_deps(n, y, x)) is None or not deps.in_loop:
            return None
        axes.update(_contiguous_axis(e) for _, e in list(deps.loads) + list(deps.stores))
    if axes - {None} != {"x", "r"}:
        return None
    if not is_static(x):  # a longer call recompiles (the grid's y axis holds X / 16 tiles)
        guard_true(sympy.Le(x, 16 * _MAX_GRID_Y))
    return y, x
