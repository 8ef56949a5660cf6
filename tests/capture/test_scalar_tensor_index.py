"""Indexing with 0-d integer tensors: traced as aten.index (no .item(), no graph break);
writes through the result (a view in eager) make the frame run eagerly."""
import pytest
import torch

import coil


def reads(x, i, j):
    return x[i], x[:, i], x[..., j], x[1:3, i, None], x[i, j], x[None, -1, j]


def writes(x, i, v):
    y = x.clone()
    y[i] = v
    y[:, i] = 2.0
    return y


@pytest.mark.parametrize("fn,args", [
    (reads, lambda: (torch.randn(4, 5, 6), torch.tensor(2), torch.tensor(-1))),
    (writes, lambda: (torch.randn(4, 4), torch.tensor(1), torch.randn(4))),
])
def test_one_graph_no_break(fn, args):
    a = args()
    e = coil.explain(fn, *a)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    got = coil.compile(fn, backend="eager", fullgraph=True)(*a)
    want = fn(*a)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w)


def test_gradient_through_scalar_tensor_index():
    x = torch.randn(4, 3, requires_grad=True)
    i = torch.tensor(2)
    coil.compile(lambda x, i: (x[i] * x[1]).sum() + x[:, i].exp().sum(), backend="aot_eager")(x, i).backward()
    g = x.grad.clone()
    x.grad = None
    ((x[i] * x[1]).sum() + x[:, i].exp().sum()).backward()
    torch.testing.assert_close(g, x.grad)


def write_through_result(x, i):
    y = x[i]
    y.add_(1)
    return x * 2


def test_write_through_indexed_result_runs_eagerly():
    x = torch.randn(3, 4)
    i = torch.tensor(1)
    want = write_through_result(x.clone(), i)
    got = coil.compile(write_through_result, backend="eager")(x.clone(), i)
    torch.testing.assert_close(got, want)
    assert coil.capture.stats["fallbacks"] == 1


def consumed_before_break(x):
    y = x.sin()
    idx = torch.topk(y.mean(0), 2)[1]
    s = torch.stack([y[:, idx[i]] for i in range(2)], -1)   # the index copies die in the stack
    return y.roll(int(idx[0]), 1) * s.sum()


def live_view_across_break(x):
    y = x.sin()
    idx = torch.topk(y.mean(0), 2)[1]
    v = y[:, idx[0]].unsqueeze(0)      # a view of the copy; in eager a view of y
    n = int(idx[1])                    # graph break
    y.add_(1)                          # eager's v sees this write
    return v * n


def test_break_after_consumed_index_copies_stays_compiled():
    """FINDINGS_50 #3 (Autoformer's attention): the copies were consumed before the break, so the frame is
    captured in graphs around it instead of running eagerly."""
    x = torch.randn(4, 6)
    coil.reset()
    e = coil.explain(consumed_before_break, x)
    assert e.graph_count == 2, e.break_reasons
    torch.testing.assert_close(coil.compile(consumed_before_break)(x), consumed_before_break(x))
    assert coil.capture.stats["fallbacks"] == 0


def test_break_with_live_view_of_index_copy_runs_eagerly():
    x = torch.randn(4, 6)
    coil.reset()
    torch.testing.assert_close(coil.compile(live_view_across_break, backend="eager")(x), live_view_across_break(x))
    assert coil.capture.stats["fallbacks"] == 1


def live_detached_view_across_break(x):
    y = x.sin()
    idx = torch.topk(y.mean(0), 2)[1]
    v = y[:, idx[0]].detach()          # shares the copy's storage without a _base
    n = int(idx[1])
    y.add_(1)
    return v * n


def test_break_with_live_detached_index_copy_runs_eagerly():
    x = torch.randn(4, 6)
    coil.reset()
    want = live_detached_view_across_break(x.clone())
    torch.testing.assert_close(coil.compile(live_detached_view_across_break)(x.clone()), want)
    assert coil.capture.stats["fallbacks"] == 1
