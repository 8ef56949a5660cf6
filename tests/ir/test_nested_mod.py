"""Nested ``%`` / ``//`` of index expressions fold at construction: ``(x % c) % b`` -> ``x % c`` for ``c <= b`` and
``x % b`` for ``b | c``; ``(x % c) // b`` -> 0 for ``c <= b``. Swin-T's window partition and its reverse nested a
dozen ``% 384`` and simplifying them took most of its compile (1.2 s for one index expression)."""
import itertools

import sympy
import torch

import coil
from coil.ir.symbols import XINDEX, FloorDiv, Mod, simplify_index


def _value(e, x: int) -> int:
    """``e`` at ``XINDEX = x`` with Python's floor semantics."""
    if isinstance(e, Mod):
        return _value(e.args[0], x) % _value(e.args[1], x)
    if isinstance(e, FloorDiv):
        return _value(e.args[0], x) // _value(e.args[1], x)
    if e.is_Add:
        return sum(_value(t, x) for t in e.args)
    if e.is_Mul:
        out = 1
        for t in e.args:
            out *= _value(t, x)
        return out
    if e == XINDEX:
        return x
    return int(e)


def test_nested_mod_rules_match_python_for_every_integer():
    x = XINDEX
    for c, b in itertools.product([1, 2, 3, 6, 7, 12, 384, 1536], repeat=2):
        for e, ref in ((Mod(Mod(x, c), b), lambda v: (v % c) % b), (FloorDiv(Mod(x, c), b), lambda v: (v % c) // b),
                       (Mod(Mod(x + 5, c), b), lambda v: ((v + 5) % c) % b)):
            for v in range(-40, 3200, 7):
                assert _value(e, v) == ref(v), (e, c, b, v)


def test_nested_mods_fold():
    x, s = XINDEX, sympy.Symbol("s0", positive=True, integer=True)
    assert Mod(Mod(x, 384), 384) == Mod(x, 384)
    assert Mod(Mod(x, 1536), 384) == Mod(x, 384)
    assert Mod(Mod(x, 384), 1536) == Mod(x, 384)
    assert FloorDiv(Mod(x, 384), 768) == 0
    assert Mod(Mod(x, 4 * s), s) == Mod(x, s) and Mod(Mod(x, s), 2 * s) == Mod(x, s)
    assert FloorDiv(Mod(x, s), s) == 0
    # not folded: 1536 > 384 and 384 does not divide 7
    assert isinstance(FloorDiv(Mod(x, 1536), 384), FloorDiv)
    assert Mod(Mod(x, 7), 3).args[0] == Mod(x, 7)
    e = simplify_index(Mod(Mod(Mod(x, 384), 384), 384) + 384 * FloorDiv(x, 384), {XINDEX: 4096})
    assert e == x


def _windows(x, ws: int = 4, shift: int = 2):
    """Swin's shifted-window partition, a per-window op, and the reverse."""
    b, h, w, c = x.shape
    x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
    win = x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
    win = win.softmax(-1) * 2 + 1
    x = win.view(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
    return torch.roll(x, shifts=(shift, shift), dims=(1, 2)).sum(-1)


def test_shifted_windows_match_eager():
    x = torch.randn(2, 8, 12, 6)
    torch.testing.assert_close(coil.compile(_windows)(x), _windows(x))


def test_relinearized_index_over_floor_div_sizes_folds():
    """A contiguous (N, 16, H, W) buffer with ``H = (s0 - 1) // 2 + 1`` (a stride-2 convolution's output at a dynamic
    size), read at the flat index split into its four coordinates: the size factors ``(s0 - 1) // 2`` counted as part
    of the atoms, so no ``x % b + b * (x // b)`` pair matched and each element paid a dozen run-time divisions (a
    dynamic CNN's BatchNorm + ReLU took 3 ms a call). It folds back to ``x0``."""
    from coil.ir.symbols import sym
    s, t = (sympy.Symbol(n, integer=True, positive=True) for n in ("s0", "s1"))
    h, w, x = FloorDiv(s - 1, 2) + 1, FloorDiv(t - 1, 2) + 1, sym("x0")
    e = Mod(x, w) + w * Mod(FloorDiv(x, w), h) + h * w * Mod(FloorDiv(x, h * w), 16) + 16 * h * w * FloorDiv(x, 16 * h * w)
    assert simplify_index(e, {x: 128 * h * w}) == x
