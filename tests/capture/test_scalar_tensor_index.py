"""Indexing with 0-d integer tensors: traced as aten.index (no .item(), no graph break); a write after it, or its
result (a view in eager) live at a graph break, captures the frame again with the indexing as a graph break."""
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


def _same(fn, *args):
    """fn compiled vs eager on clones: values, dtypes, strides and the (mutated) inputs; no fallback."""
    coil.reset()
    eager_args = [a.clone() for a in args]
    got, want = coil.compile(fn)(*args), fn(*eager_args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got + tuple(args), want + tuple(eager_args)):
        torch.testing.assert_close(g, w)    # (a compiled sum may round differently)
        assert g.stride() == w.stride() and g.dtype == w.dtype, (g, w)
    assert coil.capture.stats["fallbacks"] == 0


def test_write_through_indexed_result_breaks_at_the_index():
    x = torch.randn(3, 4)
    _same(write_through_result, x, torch.tensor(1))
    e = coil.explain(write_through_result, x, torch.tensor(1))
    assert e.graph_break_count == 1 and "in-place add_" in e.break_reasons[0]["reason"], e.break_reasons


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


def live_detached_view_across_break(x):
    y = x.sin()
    idx = torch.topk(y.mean(0), 2)[1]
    v = y[:, idx[0]].detach()          # shares the copy's storage without a _base
    n = int(idx[1])
    y.add_(1)
    return v * n


def argmax_pick_then_int(x):
    """FINDINGS_75 #4: the frame ran eagerly (IndexCopyAliasing)."""
    i = x.argmax()
    return x.view(-1)[i], x.view(-1)[: int(i) + 1].sum()


def pick_of_input_mutated_after_break(x):
    i = x.argmax()
    y = x.view(-1)[i]       # a view of the input in eager
    n = int(i)
    y.mul_(2)               # writes x
    return x + n, y


def _pick(x, i):
    return x[i]


def pick_in_callee_mutated_after_break(x):
    i = x.argmax()
    v = _pick(x.view(-1), i)    # the callee runs uncaptured: captured, it would return a copy
    n = int(i)
    x.add_(1)                   # eager's v sees this write
    return v * n


def augmented_assign_at_scalar_index(x):
    i = x.argmax() // 6
    x[i] += 1                   # resumed: x[i] = <a view of x>, an index_put_ of overlapping memory unless cloned
    return x * int(i)


@pytest.mark.parametrize("fn", [live_view_across_break, live_detached_view_across_break, argmax_pick_then_int,
                                pick_of_input_mutated_after_break, pick_in_callee_mutated_after_break,
                                augmented_assign_at_scalar_index])
def test_index_copy_live_at_break_breaks_at_the_index(fn):
    """The frame is captured again with the indexing a graph break (eager's view), not run eagerly."""
    x = torch.randn(4, 6)
    _same(fn, x)
    e = coil.explain(fn, x)
    assert e.graph_break_count == 2 and "0-d integer tensor" in e.break_reasons[0]["reason"], e.break_reasons


def test_index_copy_live_at_break_gradients():
    x = torch.randn(3, 4, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    f = lambda x: (lambda y, i: y[i] * int(i) + y.sum())(x * 3, x.detach().argmax())   # noqa: E731
    coil.reset()
    coil.compile(f)(x).sum().backward()
    f(x2).sum().backward()
    assert torch.equal(x.grad, x2.grad)
