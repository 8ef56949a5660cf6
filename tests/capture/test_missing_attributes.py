"""``hasattr``/``getattr`` of a name a container's type lacks (dicts, lists, tuples, sets, ModelOutputs).

transformers' ``capture_outputs`` (``output_hidden_states=True``) asks ``hasattr(outputs, "vision_hidden_states")``
of a ``BaseModelOutput``: coil answered True (every attribute of a dict tracker was a bound method), appended the
bound method to the hidden states, and rebuilding it failed with a RecursionError, so the frame ran eagerly."""
import collections
import dataclasses
from typing import Optional

import pytest
import torch

import coil
from coil.capture.frame import stats


@dataclasses.dataclass
class Output(collections.OrderedDict):
    last_hidden_state: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple] = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v


def test_hasattr_of_a_missing_attribute_of_a_model_output_is_false():
    def f(x):
        out = Output(last_hidden_state=x * 2)
        hs = [x]
        if hasattr(out, "vision_hidden_states"):
            hs.append(out.vision_hidden_states)
        elif hasattr(out, "last_hidden_state"):
            hs.append(out.last_hidden_state)
        out["hidden_states"] = tuple(hs)
        return out, getattr(out, "pooler_output", None) is None
    coil.reset()
    x = torch.randn(3)
    got, missing = coil.compile(f, fullgraph=True)(x)
    assert missing is True
    assert list(got.keys()) == ["last_hidden_state", "hidden_states"]
    torch.testing.assert_close(got.hidden_states[1], x * 2)
    assert stats["fallbacks"] == 0


@pytest.mark.parametrize("make", [dict, list, tuple, set, collections.OrderedDict])
def test_hasattr_of_containers_matches_eager(make):
    def f(x):
        c = make()
        return x + 1, hasattr(c, "nope"), hasattr(c, "__len__")
    coil.reset()
    x = torch.randn(2)
    got = coil.compile(f, fullgraph=True)(x)
    assert got[1:] == f(x)[1:]


def test_reading_a_missing_attribute_raises_attribute_error():
    def f(x):
        d = {"a": x}
        return d.nope
    coil.reset()
    with pytest.raises(AttributeError):
        coil.compile(f)(torch.randn(2))
