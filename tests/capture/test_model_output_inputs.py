"""A transformers ``ModelOutput`` passed into a compiled frame (made by eager code outside it,
e.g. an encoder's output handed to a compiled decoder step): its keys, items, ``to_tuple()``
and fields are traced, not graph breaks at ``BaseModelOutput.keys``."""
import pytest
import torch

import coil
from coil.testing import CompileCounter

transformers = pytest.importorskip("transformers")
from transformers.modeling_outputs import BaseModelOutput  # noqa: E402


def _out(x):
    return BaseModelOutput(last_hidden_state=x * 2, hidden_states=(x, x + 1))


def test_to_tuple_keys_items_of_an_input_model_output_one_graph():
    def f(o):
        t = o.to_tuple()
        return (t[0] + 1, list(o.keys()), len(o), o["hidden_states"][1] * 3, o[0] - 1,
                o.attentions is None, [v for k, v in o.items() if k == "last_hidden_state"][0])

    x = torch.randn(3)
    cnt = CompileCounter()
    cf = coil.compile(f, backend=cnt, fullgraph=True)
    got, want = cf(_out(x)), f(_out(x))
    assert cnt.frame_count == 1
    for g, w in zip(got, want):
        if isinstance(g, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w


def test_input_model_output_guards_its_keys_and_none_fields():
    def f(o):
        return sum(v.sum() for v in o.to_tuple() if isinstance(v, torch.Tensor)), o.attentions is None

    x = torch.randn(3)
    cf = coil.compile(f)
    assert cf(BaseModelOutput(last_hidden_state=x)) == f(BaseModelOutput(last_hidden_state=x))
    o = BaseModelOutput(last_hidden_state=x, attentions=x * 5)   # one more key
    torch.testing.assert_close(cf(o)[0], f(o)[0])
    assert cf(o)[1] is False
    o2 = BaseModelOutput(last_hidden_state=x)
    o2.attentions = x   # a field set after construction is an item too
    assert cf(o2)[1] is False


def test_input_model_output_mutated_in_the_frame_matches_eager():
    def f(o, y):
        o.last_hidden_state = o.last_hidden_state + y
        o["hidden_states"] = (y,)
        return o.to_tuple()[0] * 2

    x, y = torch.randn(3), torch.randn(3)
    oa, ob = _out(x), _out(x)
    torch.testing.assert_close(coil.compile(f)(oa, y), f(ob, y))
    torch.testing.assert_close(oa.last_hidden_state, ob.last_hidden_state)
    torch.testing.assert_close(oa["last_hidden_state"], ob["last_hidden_state"])
    torch.testing.assert_close(oa.hidden_states[0], ob.hidden_states[0])
    assert list(oa.keys()) == list(ob.keys())
