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
