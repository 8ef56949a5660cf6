"""Regressions from new-user trial 52 (FINDINGS_52.md): models and programs the authors did not write."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import coil


def test_foreach_scalar_that_changes_is_not_frozen(coil_reset):
    """An EMA update with a decay that changes (``torch._foreach_mul_(ema, d)``): from the second value on ``d`` is a
    graph input, but the ATen op takes it as a Scalar, which the wrapper wrote as a constant without a guard; the third
    call multiplied by the second call's ``d``."""
    def ema(avg, params, d):
        torch._foreach_mul_(avg, d)
        torch._foreach_add_(avg, params, alpha=1 - d)

    cf = coil.compile(ema)
    for d in (0.9, 0.91, 0.92, 0.93):
        params = [torch.randn(3), torch.randn(2, 2)]
        want = [torch.ones(3), torch.ones(2, 2)]
        got = [t.clone() for t in want]
        ema(want, params, d)
        cf(got, params, d)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)


def test_module_float_attribute_read_by_a_foreach_op(coil_reset):
    """A temperature kept as a module attribute and changed between calls, read by an op without a lowering (an extern
    kernel): calls 3 and 4 used call 2's value."""
    class Scaled(torch.nn.Module):
        temperature = 1.0

        def forward(self, x):
            return torch._foreach_div([x], self.temperature)[0]

    m = Scaled()
    cm = coil.compile(m)
    for t in (1.0, 0.5, 0.25, 2.0):
        m.temperature = t
        torch.testing.assert_close(cm(torch.ones(2)), torch.full((2,), 1 / t))


def test_foreach_scalar_list_that_changes(coil_reset):
    """The same through a list of Python floats (``_foreach_mul(xs, [a, b])``)."""
    f = lambda x, k: torch._foreach_mul([x, x], [k * 0.5, k * 1.5])[1]  # noqa: E731
    cf = coil.compile(f)
    for k in (2, 3, 4, 6):
        torch.testing.assert_close(cf(torch.ones(3), k), f(torch.ones(3), k))


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_unused_dropout_in_training_still_draws(backend, coil_reset):
    """CanineForSequenceClassification in train(): the final character encoder's dropouts feed only the unused
    sequence output. The partitioner built the forward graph from what its outputs need, which dropped those random
    ops, so the classifier's dropout drew other numbers than eager's (with ``fallback_random``, and under
    ``aot_eager``), and the RNG state after the call differed."""
    w = torch.randn(8, 8, requires_grad=True)

    def f(x):
        unused = F.dropout(x @ w, 0.5)  # noqa: F841
        return F.dropout(x @ w, 0.5)

    x = torch.randn(4, 8)
    cf = coil.compile(f, backend=backend, options={"fallback_random": True} if backend == "coil" else None)
    torch.manual_seed(0)
    want, want_next = f(x), torch.rand(3)
    torch.manual_seed(0)
    got, got_next = cf(x), torch.rand(3)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_next, want_next)


def test_channels_last_global_pool_after_a_size_change_is_compiled(coil_reset):
    """A channels-last conv net's global pool (``adaptive_avg_pool2d(x, 1)``): its kernel restrides the fresh output
    (``as_strided_``); under the symbolic sizes of the recompile after a batch change, the check that a restride stays
    inside its storage gave up ("undecidable"), and the graph ran eagerly on every call (warned)."""
    f = lambda x: F.adaptive_avg_pool2d(x, 1)  # noqa: E731
    cf = coil.compile(f)
    for n in (2, 3, 4):
        x = torch.randn(n, 8, 4, 4).to(memory_format=torch.channels_last).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = cf(x2)
        assert not [w for w in caught if "runs eagerly" in str(w.message)]
        want = f(x)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)
