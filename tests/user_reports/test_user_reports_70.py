"""Regressions from new-user trial 70 (FINDINGS_70.md): transformers families outside the bench, training loops,
mixed-dtype numerics; compared with eager.
"""

import warnings

import pytest
import torch

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; a silent wrong value): a float16 intermediate (``h * 19``) lost its float16 rounding in the row
# tail of a C++ kernel that also reduces rows: g++ 12.2 -O3 -march=native on AVX512-FP16 dropped the round trip
# ``(float)(_Float16)v`` in the SLP-vectorized tail. The rounding now goes through the bit pattern (coil_round_f16).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cols", [3, 7, 20, 100])
def test_a_float16_intermediate_keeps_its_rounding_beside_a_row_reduction(coil_reset, cols):
    torch.manual_seed(0)
    h = (torch.randn(2, cols) * 100).half()
    x = torch.zeros(2, cols)
    f = lambda h, x: (x.sum(1), x + h * 19, (h / 3).float().amax(1))  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = coil.compile(f)(h, x)
    for o, r in zip(out, f(h, x)):
        assert torch.equal(o, r)


def test_float16_rounding_of_floats_at_the_edges(coil_reset):
    v = torch.cat([torch.randn(20000) * s for s in (1e-8, 1e-6, 1e-4, 1.0, 100.0, 6e4, 7e4)] + [torch.tensor(
        [65504.0, 65519.99, 65520.0, 65536.0, float("inf"), -float("inf"), 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26])])
    f = lambda v: (v * 1.0001).half().float() + 0.0  # noqa: E731
    assert torch.equal(coil.compile(f)(v), f(v))


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed; a silent wrong value): ``torch.div(a, b, rounding_mode="trunc")`` of float16 / bfloat16 truncated
# the float32 quotient; eager truncates the quotient rounded to the tensor's dtype (1 / 0.1 in bfloat16: 10, not 9).
# Floor mode works in float32 in eager too.
# Finding 3 (fixed): the same of two bool tensors returned a value; eager raises "not implemented for 'Bool'".
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_rounded_division_of_half_dtypes_matches_eager(coil_reset, dtype, mode):
    f = lambda a, b: torch.div(a, b, rounding_mode=mode)  # noqa: E731
    a = torch.tensor([1.0, 3.0, -1.0, 7.0, -3.0], dtype=dtype)
    b = torch.tensor([0.1, 0.3, 0.1, 0.7, 0.3], dtype=dtype)
    assert torch.equal(coil.compile(f)(a, b), f(a, b))
    coil.reset()
    assert torch.equal(coil.compile(f)(a, 0.1), f(a, 0.1))


@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_rounded_division_of_bools_raises_eagers_error(coil_reset, mode):
    x, y = torch.tensor([True, False, True]), torch.tensor([True, True, False])
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        coil.compile(lambda x, y: torch.div(x, y, rounding_mode=mode))(x, y)


# ---------------------------------------------------------------------------------------------------------------
# Finding 4 (fixed; a graph break torch.compile does not have): ``self.register_buffer(...)`` inside ``forward`` read
# ``self.__dict__`` (refused for a module) and then ``self.b`` read the real ``_buffers``, not this frame's write.
# A module's ``__dict__`` is readable like a generic one, and module attribute lookup reads a tracked
# ``_parameters`` / ``_buffers`` / ``_modules`` dict (Llama with dynamic RoPE re-registers ``inv_freq`` this way).
# ---------------------------------------------------------------------------------------------------------------

def test_register_buffer_in_forward_is_one_graph(coil_reset):
    class M(torch.nn.Module):
        def forward(self, x):
            self.register_buffer("b", x.sin() * 2, persistent=False)
            return self.b + 1

    e = coil.explain(M(), torch.randn(3))
    assert (e.graph_count, e.graph_break_count) == (1, 0)
    m = M()
    f = coil.compile(m)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(f(x), x.sin() * 2 + 1)
        torch.testing.assert_close(m.b, x.sin() * 2)
        assert "b" in m._buffers and "b" not in m.state_dict()


def test_a_buffer_replaced_in_forward_is_read_back(coil_reset):
    class N(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv", torch.ones(3))

        def forward(self, x):
            if x.shape[0] > 3:
                self.register_buffer("inv", torch.arange(3.0) * 2, persistent=False)
            return x[:3] * self.inv

    n = N()
    g = coil.compile(n)
    assert torch.equal(g(torch.ones(3)), torch.ones(3))
    assert torch.equal(g(torch.ones(5)), torch.arange(3.0) * 2)
    assert torch.equal(n.inv, torch.arange(3.0) * 2) and "inv" not in n.state_dict()
    assert torch.equal(g(torch.ones(3)), torch.arange(3.0) * 2)
