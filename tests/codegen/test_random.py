"""In-kernel RNG: distribution checks (the stream differs from eager by design)."""
import torch
import torch.nn.functional as F

from codegen_helpers import compile_fn


def test_rand_randn_bernoulli_native():
    def f(x):
        return torch.rand_like(x), torch.randn(64, 64), torch.bernoulli(torch.full_like(x, 0.3))
    x = torch.randn(64, 64)
    c = compile_fn(f, x)
    assert not c.fallbacks, c.fallbacks
    u, n, b = c(x)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.03
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05
    assert set(b.unique().tolist()) <= {0.0, 1.0} and abs(b.mean().item() - 0.3) < 0.03
    u2 = c(x)[0]
    assert not torch.equal(u, u2), "a fresh seed per call"


def test_dropout_fused_and_scaled():
    def f(x):
        return F.dropout(x.relu(), 0.25, training=True) * 2
    x = torch.rand(128, 32) + 0.5
    c = compile_fn(f, x)
    (y,) = c(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.03
    torch.testing.assert_close(y[kept], (x.relu() / 0.75 * 2)[kept])
    assert c.kernel_count == 1


def test_fallback_random_uses_aten():
    x = torch.randn(8, 8)
    c = compile_fn(lambda x: torch.rand_like(x) + x, x, fallback_random=True)
    assert "aten.rand_like.default" in c.fallbacks
