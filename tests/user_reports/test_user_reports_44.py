"""Regressions from new-user trial 44: training loops, torch.func, parametrizations, dtype
corners, dynamic shapes, Python-level inputs and outputs, more transformers families."""
import dataclasses
from typing import Optional

import pytest
import torch

import coil

transformers = pytest.importorskip("transformers")


@dataclasses.dataclass
class _Out(transformers.utils.ModelOutput):
    logits: Optional[torch.Tensor] = None
    loss: Optional[torch.Tensor] = None
    hidden: Optional[tuple] = None


def _late_loss(x):
    o = _Out(logits=x * 2, hidden=(x, x + 1))
    o.loss = x.sum()   # set after construction: ModelOutput appends the key last
    return o


def _late_none(x):
    o = _Out(logits=x * 2, loss=x.sum())
    o.loss = None      # eager keeps the item, sets only the attribute
    return o


@pytest.mark.parametrize("fn", [_late_loss, _late_none])
def test_model_output_field_set_after_construction_keeps_eager_key_order(fn, coil_reset):
    x = torch.randn(3)
    want, got = fn(x), coil.compile(fn)(x)
    assert list(got.keys()) == list(want.keys())
    assert got.loss is None if want.loss is None else torch.equal(got.loss, want.loss)
    for a, b in zip(want.to_tuple(), got.to_tuple()):
        torch.testing.assert_close(b, a)


def _two_layer():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def test_clip_grad_norm_reads_grads_in_the_graph(coil_reset):
    """``Tensor.grad`` of a graph input is read as an input (torch.compile captures
    ``clip_grad_norm_`` whole; it was a graph break and ran eagerly)."""
    import copy
    m = _two_layer()
    m2 = copy.deepcopy(m)

    def clip(params, max_norm):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    compiled = coil.compile(clip)
    for i, max_norm in enumerate([0.1, 5.0, 0.1]):
        for mm in (m, m2):
            mm.zero_grad()
            mm(torch.full((2, 4), i + 1.0)).sum().backward()
            mm[2].bias.grad = None if i == 2 else mm[2].bias.grad   # a None grad: guarded
        want, got = clip(list(m.parameters()), max_norm), compiled(list(m2.parameters()), max_norm)
        torch.testing.assert_close(got, want)
        for p, q in zip(m.parameters(), m2.parameters()):
            assert (p.grad is None) == (q.grad is None)
            if p.grad is not None:
                torch.testing.assert_close(q.grad, p.grad)
    assert coil.explain(clip, list(m2.parameters()), 1.0).graph_count == 1


def _grad_ops(p):
    p.grad.mul_(2)
    g = p.grad
    p.grad = p.grad * 3
    return g + 1, p.grad + p


def test_grad_mutation_and_rebinding_in_the_frame(coil_reset):
    torch.manual_seed(0)
    a = torch.randn(3, requires_grad=True)
    a.grad = torch.randn(3)
    b = a.detach().clone().requires_grad_()
    b.grad = a.grad.clone()
    want, got = _grad_ops(a), coil.compile(_grad_ops)(b)
    for x, y in zip(want, got):
        torch.testing.assert_close(y, x)
    torch.testing.assert_close(b.grad, a.grad)


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_lstm_training_step_on_cpu(backend, coil_reset):
    """A bidirectional 2-layer LSTM trained with an input that needs no grad: torch's LSTM decomposition picked
    ``mkldnn_rnn_layer``, whose workspace is undefined under the compiled forward's no_grad, and the backward raised
    "Expected a proper Tensor but got None ... 'workspace'" (torch.compile graph-breaks on RNNs)."""
    import copy
    torch.manual_seed(0)
    m = torch.nn.LSTM(6, 8, num_layers=2, batch_first=True, bidirectional=True)
    m2 = copy.deepcopy(m)
    compiled = coil.compile(m2, backend=backend)
    x = torch.randn(2, 5, 6)
    want, got = m(x)[0], compiled(x)[0]
    torch.testing.assert_close(got, want)
    want.pow(2).sum().backward()
    got.pow(2).sum().backward()
    for p, q in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    assert torch._C._get_mkldnn_enabled()


def _popitems(x):
    import collections
    d = collections.OrderedDict(a=x, b=x + 1, c=x * 3)
    first = d.popitem(last=False)
    last = d.popitem()
    return first[0], first[1], last[0], list(d), {"p": x}.popitem()[0]


def test_ordered_dict_popitem_last_false_pops_the_first_item(coil_reset):
    x = torch.randn(2)
    want, got = _popitems(x), coil.compile(_popitems)(x)
    assert (want[0], want[2], want[3], want[4]) == (got[0], got[2], got[3], got[4]) == ("a", "c", ["b"], "p")
    torch.testing.assert_close(got[1], want[1])


def _frozensets(x):
    fs = frozenset([1, 1, 2])
    return fs, fs | {4}, {fs: x + 1}, 2 in fs, sorted(fs)


def test_frozenset_stays_a_frozenset(coil_reset):
    x = torch.randn(2)
    want, got = _frozensets(x), coil.compile(_frozensets)(x)
    assert [type(v) for v in got] == [type(v) for v in want]
    assert got[0] == want[0] and got[1] == want[1] and got[3:] == want[3:]
    torch.testing.assert_close(got[2][frozenset([1, 2])], want[2][frozenset([1, 2])])
