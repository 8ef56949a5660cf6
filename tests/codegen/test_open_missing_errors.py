"""Open missing errors from the call-sequence campaign of seed 1061 (docs/fuzzing.md): eager raises, coil returns a
value. Strict xfails: fixing one makes its test fail until the mark is removed."""
import pytest
import torch

import coil


def _raises_as_eager(fn, make, dynamic):
    with pytest.raises(Exception) as eager:
        fn(*make())
    with pytest.raises(type(eager.value)):
        coil.compile(fn, dynamic=dynamic)(*make())


@pytest.mark.xfail(strict=True, reason="open (s1061 #562): one tensor passed for two arguments, squeeze_ through one "
                   "name: eager's index_select through the other sees the squeezed tensor (IndexError)")
@pytest.mark.parametrize("dynamic", [False, True])
def test_squeeze_through_one_name_of_a_tensor_passed_twice(dynamic):
    def fn(a, b):
        b.squeeze_()
        return torch.index_select(a, 1, torch.tensor([0]))

    def make():
        a = torch.tensor([[-0.0]])
        return [a, a]
    _raises_as_eager(fn, make, dynamic)


@pytest.mark.xfail(strict=True, reason="open (s1061 #1627): index_select of an empty input checks its indices in "
                   "eager (index 2 of a dim of 2); coil's kernel has nothing to read")
@pytest.mark.parametrize("dynamic", [False, True])
def test_index_select_out_of_range_on_an_empty_input(dynamic):
    _raises_as_eager(lambda a: torch.index_select(a, 2, torch.tensor([0, 2])),
                     lambda: [torch.empty((3, 0, 2), dtype=torch.bool)], dynamic)


@pytest.mark.xfail(strict=True, reason="open (s1061 #1330): under dynamic=True, view(4, -1) of a (3, 1, 4) input "
                   "with strides (12, 4, 1) (a [:, 1:3:2] slice) is not refused as eager's view is")
def test_view_across_a_strided_dim_under_dynamic_shapes():
    _raises_as_eager(lambda a: a.view(4, -1) * 2, lambda: [torch.ones(3, 3, 4)[:, 1:3:2]], True)


@pytest.mark.xfail(strict=True, reason="open (found by hand beside seed 1060): a bool alpha for a float result raises "
                   "in eager (and torch's aot_eager); coil adds as with alpha=1")
def test_bool_alpha_of_a_float_add():
    _raises_as_eager(lambda a: torch.add(a, a, alpha=True), lambda: [torch.ones(2)], False)
