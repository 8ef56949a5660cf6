"""index_put's lowering computes ``x[indices]``'s shape itself (adjacent index dims in place, others in front;
the indices broadcast), so it stays native under symbolic sizes; values as eager, static and dynamic."""
import pytest
import torch

import coil


def _cases():
    i = torch.tensor([2, 0, 3])
    j = torch.tensor([1, 1, 0])
    return [
        ("first", lambda x, v: x.index_put_((i,), v), (5, 4, 3), (3, 4, 3)),
        ("middle", lambda x, v: x.index_put_((torch.arange(x.shape[0])[:, None], i[None, :]), v),
         (5, 4, 3), (5, 3, 3)),
        ("adjacent pair", lambda x, v: x.__setitem__((slice(None), i, j), v) or x, (2, 4, 3), (2, 3)),
        ("non-adjacent", lambda x, v: x.__setitem__((i, slice(None), j), v) or x, (5, 4, 3), (3, 4)),
        ("broadcast", lambda x, v: x.__setitem__((i[:, None], j[None, :]), v) or x, (5, 4, 3), (3, 3, 3)),
        ("accumulate", lambda x, v: x.index_put_((i.repeat(2),), v, accumulate=True), (5, 4), (6, 4)),
    ]


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name,f,xs,vs", _cases(), ids=[c[0] for c in _cases()])
def test_index_put_matches_eager(name, f, xs, vs, dynamic):
    torch.manual_seed(0)
    x, v = torch.randn(xs), torch.randn(vs)

    def g(x, v):
        y = x.clone()
        return f(y, v) * 2

    cf = coil.compile(g, dynamic=dynamic)
    torch.testing.assert_close(cf(x, v), g(x, v))
    if dynamic:  # another size of the leading dim
        x2 = torch.randn((xs[0] + 2,) + xs[1:])
        v2 = torch.randn((vs[0] + 2,) + vs[1:]) if name in ("middle", "adjacent pair") else v
        torch.testing.assert_close(cf(x2, v2), g(x2, v2))
