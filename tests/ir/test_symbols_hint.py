"""``coil.ir.symbols.hint`` of expressions with unbacked symbols on a ShapeEnv without
``optimization_hint`` (torch 2.11, the GPU machine's torch): ``size_hint`` raised
GuardOnDataDependentSymNode there, and graphs with nonzero/.item() sizes fell back to
the FX interpreter."""
import sympy
import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from coil.ir import symbols


class _OldShapeEnv:
    """A ShapeEnv seen as torch 2.11 shows it: no ``optimization_hint``, and
    ``size_hint`` returns None (allow_none) when unbacked symbols remain."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        if name == "optimization_hint":
            raise AttributeError(name)
        return getattr(self._env, name)

    def size_hint(self, e, *, allow_none=False):
        e = e.xreplace(self._env.replacements).xreplace(self._env.var_to_val)
        if e.free_symbols:
            assert allow_none, "size_hint of an unbacked expression without allow_none"
            return None
        return e


def test_hint_of_unbacked_expression_without_optimization_hint():
    env = ShapeEnv()
    s = env.create_symbol(5, source=torch._dynamo.source.ConstantSource("x_size_0"))
    u = env.create_unbacked_symint().node.expr
    with symbols.shape_env_scope(_OldShapeEnv(env)):
        assert symbols.hint(2 * s + 1) == 11
        assert symbols.hint(2 * u) == 2 * symbols._UNBACKED_GUESS
        assert symbols.hint(s * u + sympy.Integer(3)) == 5 * symbols._UNBACKED_GUESS + 3


def test_floor_division_by_a_symbolic_size_keeps_a_fractional_quotient():
    """``s*(2*M + h) // (2*s)`` is not ``M + h/2``: sympy's denominator of that sum is 1,
    which read as "divides exactly" and dropped the ``h/2`` (MHA's backward, dynamic)."""
    s, m, h = sympy.symbols("s m h", integer=True, positive=True)
    e = symbols.FloorDiv(s * (2 * m + h), 2 * s)
    assert e != m + h / 2 and isinstance(e, symbols.FloorDiv)
    for sv, mv, hv in [(3, 1, 1), (5, 2, 3), (4, 7, 0)]:
        assert e.subs({s: sv, m: mv, h: hv}) == (sv * (2 * mv + hv)) // (2 * sv)
    assert symbols.FloorDiv(2 * s * m + 4 * s, 2 * s) == m + 2
    assert symbols.Mod(2 * s * m, 2 * s) == 0 and symbols.Mod(s * h, 2 * s) != 0
