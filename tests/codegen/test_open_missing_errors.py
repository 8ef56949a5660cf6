"""Open missing errors from the call-sequence campaign of seed 1061 (docs/fuzzing.md): eager raises, coil returns a
value. Strict xfails: fixing one makes its test fail until the mark is removed (then it stays, a plain test)."""
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


# found by hand beside seed 1060, and FINDINGS_76 #2: eager's alpha check (a bool alpha needs a bool result, a float
# alpha a floating one) was skipped by the fake tensors' fast path for add, and by sub's probe for a symbolic alpha
_INT8, _BOOL = lambda: [torch.tensor([13, 10, 45], dtype=torch.int8)], lambda: [torch.tensor([True, False, True])]


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("fn, make", [
    (lambda a: torch.add(a, a, alpha=True), lambda: [torch.ones(2)]),
    (lambda a: torch.add(a, a, alpha=True), _INT8), (lambda a: a.add_(a, alpha=True), _INT8),
    (lambda a: torch.add(a, a, alpha=2.5), _INT8), (lambda a: torch.sub(a, a, alpha=2.5), _INT8),
    (lambda a: torch.add(a, 2, alpha=2.5), _INT8), (lambda a: torch.add(a, a, alpha=0.5), _BOOL)])
def test_alpha_eager_refuses(fn, make, dynamic):
    _raises_as_eager(fn, make, dynamic)
    torch.testing.assert_close(coil.compile(lambda a: torch.add(a, a, alpha=True) * 1, dynamic=dynamic)(*_BOOL()),
                               torch.add(*_BOOL(), *_BOOL(), alpha=True) * 1)
