"""Corpus: tensor indexing and setitem (slices, ellipsis, None, ints, bool and tensor indices).

PYTEST_DONT_REWRITE: the corpus programs must stay plain Python (no assertion rewriting).
"""
import pytest
import torch

from corpus_harness import C, cases, randint, randn


def x345():
    return (randn(3, 4, 5),)


def int_index(x):
    return x[0], x[-1], x[1, 2], x[2, -1, 0]


def slices(x):
    return x[1:], x[:, :2], x[::2], x[:, 1:3, ::2], x[-2:, :, -3:]


def step_slices(x):
    return x[::2, ::3], x[1::2], x[:, ::1]


def ellipsis(x):
    return x[..., 0], x[0, ...], x[..., 1:3], x[1, ..., 2]


def none_index(x):
    return x[None], x[:, None], x[..., None], x[None, 1, None, :, 2]


def mixed_index(x):
    return x[1, :, None, 2:4], x[..., None, ::2], x[:1, ..., -1]


def tensor_index(x, idx):
    return x[idx], x[:, idx], x[idx, idx], x[..., idx[:2]]


def list_index(x):
    return x[[0, 2]], x[:, [1, 3]], x[[0, 1], [2, 3]]


def bool_mask_const_shape(x):
    m = torch.tensor([True, False, True])
    return x[m]


def bool_scalar_index(x):
    return x[True], x[False], x[None, True]


def index_select(x, idx):
    return x.index_select(1, idx), torch.index_select(x, 0, idx[:2]), x.narrow(2, 1, 3), x.select(0, 1)


def setitem_int(x):
    y = x.clone()
    y[0] = 1.5
    y[1, 2] = -2.0
    y[-1, -1, -1] = 7.0
    return y


def setitem_slice_tensor(x, v):
    y = x.clone()
    y[:, 1:3] = v
    y[::2, 0] = v[:2, 0] * 2
    return y


def setitem_ellipsis(x):
    y = x.clone()
    y[..., 0] = 0.25
    y[0, ...] = y[1, ...] * 3
    return y


def setitem_on_input(x):
    x[0] = x[1] + 1
    x[:, :, 2] *= 3
    return x.sum()


def setitem_mask(x):
    y = x.clone()
    y[y > 0] = 0.0
    return y


def setitem_mask_tensor_value(x, v):
    y = x.clone()
    y[x < 0] = v
    return y


def setitem_tensor_index(x, idx, v):
    y = x.clone()
    y[idx] = v
    return y


def setitem_list_index(x):
    y = x.clone()
    y[[0, 2], 1] = 9.0
    return y


def setitem_broadcast(x):
    y = torch.zeros(3, 4, 5)
    y[:] = x
    y[1] = x[0, 0]
    return y


def index_put(x, idx):
    y = x.clone()
    y.index_put_((idx,), torch.ones(2, 4, 5) * 3)
    return y, x.index_put((idx,), x[idx] * 2, accumulate=True)


def index_add_copy(x, idx):
    return x.index_add(0, idx, x[idx]), x.index_copy(0, idx, x[idx] * 0.5), x.index_fill(1, idx, -1.0)


def masked_ops(x):
    m = x > 0
    return x.masked_fill(m, 0.5), torch.masked_fill(x, ~m, -0.5), x.masked_scatter(m, x * 2), x * m


def masked_select(x):
    return torch.masked_select(x, x > 0)


def bool_mask_index(x):
    return x[x > 0]


def nonzero(x):
    return torch.nonzero(x > 0)


def shape_from_index(x):
    n = x[0].shape[0]
    return x[:n - 1] * n


def index_with_int_tensor_scalar(x, i):
    return x[i], x[:, i]


def view_write_through(x):
    y = x.clone()
    v = y[0]
    v.mul_(10)
    w = y[:, 1]
    w += 1
    return y, v, w


def diagonal_ops(x):
    s = x[0, :4, :4]
    return s.diagonal(), torch.diag(s), s.diag_embed(), torch.diag(s.diagonal())


def unfold_strides(x):
    return x[0].unfold(1, 2, 1), x.as_strided((2, 2), (1, 2)), x[:, 0].t()


def negative_dims(x):
    return x.sum(-1), x.softmax(-2), x.transpose(-1, -3)[..., -1]


def getitem_in_loop(x):
    out = x[0]
    for i in range(1, x.shape[0]):
        out = out + x[i] * i
    return out


def setitem_in_loop(x):
    y = torch.zeros_like(x)
    for i in range(x.shape[0]):
        y[i] = x[i] * (i + 1)
    return y


def dim_slicing_by_shape(x):
    h = x.shape[-1] // 2
    return x[..., :h], x[..., h:]


def slice_objects(x):
    s = slice(1, None)
    return x[s], x[:, slice(None, 2)], x[(0, slice(None), 1)]


CASES = cases(
    C(int_index, x345),
    C(slices, x345),
    C(step_slices, x345),
    C(ellipsis, x345),
    C(none_index, x345),
    C(mixed_index, x345),
    C(tensor_index, lambda: (randn(4, 4, 3), randint(0, 4, 3))),
    C(list_index, lambda: (randn(4, 4),)),
    C(bool_mask_const_shape, x345, breaks=1, note="a bool-tensor index is data-dependent even when the mask is a constant"),
    C(bool_scalar_index, x345),
    C(index_select, lambda: (randn(3, 4, 5), randint(0, 3, 3))),
    C(setitem_int, x345),
    C(setitem_slice_tensor, lambda: (randn(3, 4, 5), randn(3, 2, 5))),
    C(setitem_ellipsis, x345),
    C(setitem_on_input, x345),
    C(setitem_mask, x345),
    C(setitem_mask_tensor_value, lambda: (randn(3, 4, 5), torch.tensor(0.75))),
    C(setitem_tensor_index, lambda: (randn(4, 3), randint(0, 4, 2), randn(2, 3))),
    C(setitem_list_index, lambda: (randn(3, 4),)),
    C(setitem_broadcast, lambda: (randn(4, 5),)),
    C(index_put, lambda: (randn(4, 4, 5), torch.tensor([0, 2]))),
    C(index_add_copy, lambda: (randn(4, 3), torch.tensor([1, 3]))),
    C(masked_ops, x345),
    C(masked_select, x345, graphs=1, breaks=1,
      note="data-dependent output shape: a graph break at the op (static shapes)"),
    C(bool_mask_index, x345, graphs=1, breaks=1,
      note="data-dependent output shape: a graph break at the op (static shapes)"),
    C(nonzero, x345, graphs=1, breaks=1,
      note="data-dependent output shape: a graph break at the op (static shapes)"),
    C(shape_from_index, x345),
    C(index_with_int_tensor_scalar, lambda: (randn(4, 4), torch.tensor(2))),
    C(view_write_through, x345),
    C(diagonal_ops, lambda: (randn(2, 5, 5),)),
    C(unfold_strides, lambda: (randn(2, 3, 4),)),
    C(negative_dims, x345),
    C(getitem_in_loop, x345),
    C(setitem_in_loop, x345),
    C(dim_slicing_by_shape, lambda: (randn(2, 6),)),
    C(slice_objects, x345),
)


@pytest.mark.parametrize("case", CASES)
def test_indexing(case, check):
    check(case)
