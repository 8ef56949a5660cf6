"""Regression tests for trial 79 (tests/user_reports/FINDINGS_79.md): capture."""
import dataclasses
import warnings

import pytest
import torch

import coil

G = 2.0


def _times_global(x):
    return x * G


def test_f12_a_float_global_turned_tensor_warns_nothing():
    """A float global that became a graph input (automatic dynamic), later rebound to a tensor: reading the old
    entry's input sizes called ``torch.tensor`` on the tensor, and torch's copy-construct warning reached the user
    from ``<string>:1``."""
    global G
    cf, x = coil.compile(_times_global), torch.randn(3)
    try:
        cf(x)
        G = 3.0
        cf(x)
        G = torch.tensor(5.0)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.testing.assert_close(cf(x), x * G)
        assert not seen, [str(w.message) for w in seen]
    finally:
        G = 2.0


@dataclasses.dataclass
class _Cfg:
    act: str
    k: int = 2


class _Point:
    __match_args__ = ("a", "b")

    def __init__(self):
        self.a, self.b = 3, 4


def _matches(x, cfg, d, p):
    match x.shape:
        case (b, t, c):
            x = x.reshape(b * t, c).relu()
        case (n, c):
            x = x.relu()
    match d:
        case {"act": "gelu", **rest}:
            x = x * 2 + len(rest)
        case {"act": _}:
            x = x - 1
    match cfg:
        case _Cfg(act="gelu", k=k):
            x = x * k
        case _Cfg():
            x = x + 100
    match p:
        case _Point(a, b=b):
            x = x + a * 10 + b
    match x:
        case (u, v):            # a tensor is not a sequence to a pattern
            x = None
        case torch.Tensor():
            x = x + 0.5
    return x


def test_f8b_match_statements_are_captured():
    """``match`` with sequence, mapping and class patterns: MATCH_SEQUENCE / MATCH_MAPPING / MATCH_KEYS / MATCH_CLASS
    were unsupported opcodes, and the frame ran eagerly from the ``match`` on."""
    for args in ((torch.randn(2, 3, 4), _Cfg("gelu", 3), {"act": "gelu", "z": 1}, _Point()),
                 (torch.randn(3, 4), _Cfg("relu"), {"act": "relu"}, _Point())):
        ex = coil.explain(_matches, *args)
        assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex
        torch.testing.assert_close(coil.compile(_matches)(*args), _matches(*args))


_SCALARS = {"capture_scalar_outputs": True}


def _set_at_argmax(x):
    i = x.argmax().item()
    x[i] = 0
    return x


def _read_at_negative(x):
    i = x.argmin().item() - 6
    return x[i] * 2 + x.sum()


def _write_fresh_at_argmax(x):
    i = x.argmax().item()
    y = x * 3
    y[i] = -1
    return y.sum(), y


def _column_at_argmax(x):
    return x[:, x[0].argmax().item()].sum() + x.max()


@pytest.mark.parametrize("fn, shape", [(_set_at_argmax, (6,)), (_read_at_negative, (6,)),
                                       (_write_fresh_at_argmax, (6,)), (_column_at_argmax, (6, 6))])
def test_f9_index_from_item_is_generated_code(fn, shape):
    """#9: ``x[i] = 0`` with ``i = x.argmax().item()``. select_scatter's lowering guarded on ``u < 0`` and the graph
    ran in the FX interpreter (warned). It now wraps at run time. Then a kernel using ``u`` was fused into the kernel
    computing the argmax ``u`` is read from (a step using a symbol did not depend on the extern binding it), and an
    extern ``select(x, 0, u - 6)`` ran before ``u`` was bound."""
    x = torch.randn(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = coil.compile(fn, options=_SCALARS)(x.clone())
    torch.testing.assert_close(got, fn(x.clone()))


def test_f9_index_from_item_out_of_range_raises():
    def f(x):
        return x[x.argmax().item() + 10] * 2
    with pytest.raises(IndexError):
        coil.compile(f, options=_SCALARS)(torch.randn(6))
