"""Regressions from a new-user trial of transformers families coil's bench does not build
(OLMo, Cohere, Starcoder2, Qwen2-MoE, Mamba, Mamba2, RWKV, XLNet, Funnel, MPNet, Longformer,
BigBird, LED, ProphetNet, CLIP, SigLIP, DINOv2, ConvNeXtV2, Segformer, LeViT, SEW,
Wav2Vec2-Conformer), random weights, CPU float32."""
import torch
from torch._higher_order_ops import scan
from torch._higher_order_ops.associative_scan import associative_scan

import coil


def _scan_body(c, x):
    n = c * x
    return n, n.clone()


def test_scan_over_permuted_slice_of_computed_value():
    # the wrapper realized the permuted slice with its own strides; the scan body was compiled
    # for the ATen graph's strides and read garbage (Mamba's associative_scan became this)
    def f(a):
        xs = torch.movedim(a.exp(), 2, 0)[1:]
        return scan(_scan_body, torch.ones(2, 3), xs)[1]

    a = torch.randn(2, 3, 5, 4)[..., 0]
    coil.reset()
    torch.testing.assert_close(coil.compile(f)(a), f(a))


def _ssm_combine(left, right):
    return left[0] * right[0], right[0] * left[1] + right[1]


def test_associative_scan_generic_is_captured():
    # transformers' Mamba calls associative_scan when compiling: a graph break per frame on the stack
    def f(a, b):
        _, s = associative_scan(_ssm_combine, (a.exp(), b), dim=2, combine_mode="generic")
        return (s * 2).sum(-1), s

    a = torch.randn(2, 3, 5, 4, requires_grad=True)
    b = torch.randn(2, 3, 5, 4, requires_grad=True)
    coil.reset()
    e = coil.explain(f, a, b)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e
    coil.reset()
    ref, out = f(a, b), coil.compile(f)(a, b)
    torch.testing.assert_close(out, ref)
    gr = torch.autograd.grad(ref[0].sum() + ref[1].sum(), (a, b))
    go = torch.autograd.grad(out[0].sum() + out[1].sum(), (a, b))
    torch.testing.assert_close(go, gr)


def test_associative_scan_reverse_and_length_one():
    def f(x, y):
        return (associative_scan(lambda u, v: u + v, x, dim=0, reverse=True, combine_mode="generic"),
                associative_scan(lambda u, v: u * v, y, dim=1, combine_mode="generic"))

    x, y = torch.randn(6, 3), torch.randn(3, 1)
    coil.reset()
    torch.testing.assert_close(coil.compile(f)(x, y), f(x, y))


def test_scan_length_stays_symbolic():
    # the compile log's int(length) specialized the scan's length: one compile per
    # sequence length (torch.compile: 2); values and gradients at each length
    from coil.testing import CompileCounter

    def g(a, b):
        return associative_scan(_ssm_combine, (a.sigmoid(), b), dim=1, combine_mode="generic")[1]

    coil.reset()
    cnt = CompileCounter()
    cf, cc = coil.compile(g, backend=cnt), coil.compile(g)
    for n in (5, 7, 9):
        a = torch.randn(2, n, 3, requires_grad=True)
        b = torch.randn(2, n, 3, requires_grad=True)
        r = g(a, b)
        torch.testing.assert_close(cf(a, b), r)
        o = cc(a, b)
        torch.testing.assert_close(o, r)
        torch.testing.assert_close(torch.autograd.grad(o.square().sum(), (a, b)),
                                   torch.autograd.grad(r.square().sum(), (a, b)))
    assert cnt.frame_count == 2


def test_circular_padding_conv_has_no_graph_break():
    # nn.Conv1d(padding_mode="circular") calls _single(0) = tuple(itertools.repeat(0, 1)):
    # a graph break per convolution in transformers' Informer (torch.compile: none)
    conv = torch.nn.Conv1d(3, 4, 3, padding=1, padding_mode="circular")
    g = lambda t: conv(t.relu()) * 2  # noqa: E731
    x = torch.randn(2, 3, 8)
    coil.reset()
    assert coil.explain(g, x).graph_break_count == 0
    coil.reset()
    torch.testing.assert_close(coil.compile(g)(x), g(x))
    f = lambda t: t * len(list(__import__("itertools").repeat(t, 3)))  # noqa: E731
    coil.reset()
    torch.testing.assert_close(coil.compile(f)(x), f(x))


def test_hasattr_of_a_constant_is_answered():
    # torch.overrides.is_tensor_like(3.0) (torch.distributions' broadcast_all) asked
    # hasattr(3.0, "__torch_function__"): a graph break instead of False
    def f(x):
        return x * 2 if torch.overrides.is_tensor_like(3.0) or hasattr("s", "upper") else x - 1

    x = torch.randn(3)
    coil.reset()
    assert coil.explain(f, x).graph_break_count == 0
    coil.reset()
    torch.testing.assert_close(coil.compile(f)(x), f(x))
