"""CSE of functional ATen graphs (coil/aot/cse.py)."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.aot.cse import cse_graph


def test_duplicate_mask_chains_merge():
    """GPT-2 built the same sliced causal mask once per layer: 12 copies in the graph."""
    def f(x, mask):
        out = x
        for _ in range(4):
            m = mask[:, :, :8, :8].expand(2, 1, 8, 8)
            out = out.masked_fill(m, 0.0) + 1
        return out

    x, mask = torch.randn(2, 1, 8, 8), torch.rand(1, 1, 16, 16) > 0.5
    gm = make_fx(f)(x, mask)
    before = len(gm.graph.nodes)
    assert cse_graph(gm) >= 6
    assert len(gm.graph.nodes) < before
    torch.testing.assert_close(gm(x, mask), f(x, mask))


def test_random_ops_and_outputs_are_not_merged():
    def f(x):
        return torch.rand_like(x) + torch.rand_like(x), x.sum(), x.sum()

    gm = make_fx(f)(torch.randn(4))
    cse_graph(gm)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten.rand_like.default) == 2
    assert targets.count(torch.ops.aten.sum.default) == 2


def test_compiled_outputs_stay_distinct_and_right():
    def f(x):
        a, b = x.sum(0), x.sum(0)
        return a, b, (x * 2).sin() + (x * 2).sin()

    x = torch.randn(5, 3, requires_grad=True)
    for backend in ("aot_eager", "coil"):
        coil.reset()
        out = coil.compile(f, backend=backend)(x)
        ref = f(x)
        assert out[0] is not out[1]
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r)
        out[2].sum().backward()
        g = x.grad.clone()
        x.grad = None
        ref[2].sum().backward()
        torch.testing.assert_close(g, x.grad)
        x.grad = None


def test_layer_norm_of_transposed_input_returns_contiguous():
    """User report 2: F.layer_norm of a transposed input came back with the input's
    transposed strides (the decomposition's pointwise ops follow the input layout);
    eager's layer_norm result is contiguous, and out.view(-1) after the call raised."""
    import torch.nn.functional as F

    x, w, b = torch.randn(7, 3, 100), torch.randn(100), torch.randn(100)

    def f(x):
        return F.layer_norm(x.transpose(0, 1), (100,), w, b)

    for backend in ("aot_eager", "coil"):
        coil.reset()
        out = coil.compile(f, backend=backend)(x)
        ref = f(x)
        assert out.stride() == ref.stride(), (backend, out.stride(), ref.stride())
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        out.view(-1)


def test_scalars_of_opposite_zero_sign_are_not_merged():
    """``torch.where(c, -0.0, 0.0)`` gave all +0.0: CSE keyed the two ``scalar_tensor`` nodes by ``0.0 == -0.0``."""
    c = torch.tensor([True, False, True])
    x = torch.randn(3)

    def f(c, x):
        return torch.where(c, -0.0, 0.0), x.masked_fill(c, -0.0).masked_fill(~c, 0.0)

    for backend in ("aot_eager", "coil"):
        coil.reset()
        for o, r in zip(coil.compile(f, backend=backend)(c, x), f(c, x)):
            assert torch.equal(o.signbit(), r.signbit()), (backend, o, r)
