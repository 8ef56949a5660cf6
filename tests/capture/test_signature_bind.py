"""``inspect.Signature.bind`` / ``bind_partial`` and ``BoundArguments.apply_defaults`` / ``.args`` / ``.kwargs`` are
traced (inspect's pure-Python classes), not graph breaks: transformers' ``select_hidden_states`` wrapper binds the
forward's signature on every call (FINDINGS_53 #11). A ``BoundArguments`` (a class with ``__slots__``) made in the
frame and returned is rebuilt with its slots."""
import inspect

import pytest
import torch

import coil
import coil.capture


def _scaled(x, scale=2.0, *rest, flag=False, **kw):
    return x * scale


_SIG = inspect.signature(_scaled)


def test_bind_apply_defaults_args_kwargs_in_one_graph():
    def f(x):
        b = _SIG.bind(x, 3, 4, 5, z=1)
        b.apply_defaults()
        b.arguments["scale"] = 5
        return _scaled(*b.args, **b.kwargs) + len(b.args), b

    coil.reset()
    x = torch.ones(2)
    (got, bound), (want, wbound) = coil.compile(f)(x), f(x)
    torch.testing.assert_close(got, want)
    assert type(bound) is inspect.BoundArguments and bound.signature is _SIG
    assert bound.arguments.keys() == wbound.arguments.keys()
    assert bound.kwargs == wbound.kwargs == {"flag": False, "z": 1}
    assert coil.capture.stats["graph_breaks"] == 0 and coil.capture.stats["graphs"] == 1, coil.capture.stats


def test_a_binding_error_is_raised_like_eager():
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        coil.compile(lambda x: _SIG.bind(scale=x))(torch.ones(2))
