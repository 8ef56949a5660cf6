"""An output that is a view of an input at an offset read with ``.item()`` (``x[i.item()]``
under ``capture_scalar_outputs``): eager returns a view; coil cannot yet rebuild it per call
(the offset is an unbacked symbol the runtime does not bind) and says so plainly."""
import pytest
import torch

import coil
from coil.exc import CoilError


def f(x, i):
    return x[i.item()]


def test_view_at_an_item_offset_names_the_cause_and_the_fix():
    coil.reset()
    cf = coil.compile(f, options={"capture_scalar_outputs": True})
    with pytest.raises(CoilError, match=r"(?s)read from a tensor inside the compiled region.*clone"):
        cf(torch.arange(5.0), torch.tensor(2))


@pytest.mark.xfail(strict=True, reason="unbacked offsets of aliased outputs are not bound at runtime yet")
def test_view_at_an_item_offset_matches_eager():
    coil.reset()
    cf = coil.compile(f, options={"capture_scalar_outputs": True})
    x, i = torch.arange(5.0), torch.tensor(2)
    torch.testing.assert_close(cf(x, i), f(x, i))


def test_view_sized_by_a_float_argument_is_rebuilt_per_call():
    """``x[: int(k * 2)]`` once the float ``k`` became a graph input (a 0-d tensor holding
    ``zf0``): the view's size is read from that input's ``.item()`` each call."""
    coil.reset()

    def g(x, k):
        return x[: int(k * 2)]

    cg = coil.compile(g)
    x = torch.arange(6.0)
    for k in (1.2, 1.6, 2.4, 0.4):
        out = cg(x, k)
        torch.testing.assert_close(out, g(x, k))
        assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # a view, as eager's
