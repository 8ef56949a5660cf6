"""Corpus: documented sharp edges (STYLE.md §7). Each test asserts today's behaviour
of a known limitation or surprising-but-intended behaviour, so a change to one is
visible in review. Silent mismatches with eager rank above raised errors: none of
these may give a wrong answer; they cost recompiles, breaks or eager fallbacks.

When one of these changes on purpose, update the test and its line in STATUS.md.

PYTEST_DONT_REWRITE: the corpus programs must stay plain Python (no assertion rewriting).
"""
import pytest
import torch
import torch.nn as nn

from corpus_harness import ORACLE, C, R, CountingBackend, cases, compile_fn, randn


def x34():
    return (randn(3, 4),)


def f_batch(x):
    return x.relu() * 2


def f_float_arg(x, alpha):
    return x * alpha


def returns_input(x):
    x.add_(1)
    return x


def uses_id(x):
    return x * (id(x) > 0)


def data_ptr_use(x):
    return x * (x.data_ptr() != 0)


def manual_seed_inside(x):
    torch.manual_seed(0)
    return x + torch.rand(3, 4)


def default_dtype_creation(x):
    return torch.ones(3) + x.sum()


def _set_default_float64(f):
    torch.set_default_dtype(torch.float64)
    return (randn(2),)


def tensor_hook_inside(x):
    y = x * 2
    y.register_hook(lambda g: g * 10)
    return y.sum()


class PlainTensorAttr(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.tensor(2.0)  # neither parameter nor buffer

    def forward(self, x):
        return x * self.scale


def plain_tensor_attr():
    return PlainTensorAttr()


def _bump_scale(m):
    m.scale.add_(1.0)  # in place: same object, new value
    return (randn(3),)


_CLOSED = torch.arange(3.0)


def reads_global_tensor(x):
    return x + _CLOSED


def _mutate_global_tensor(f):
    _CLOSED.mul_(2)
    return (randn(3),)


def unrolled_loop_over_dim(x):
    out = []
    for row in x:
        out.append(row.sum())
    return torch.stack(out)


def print_runs_every_call(x, log):
    log.append("before")
    print("every call", end="\r")
    return x + 1


def requires_grad_flip(m):
    m.weight.requires_grad_(False)
    return (randn(2, 4),)


def linear4():
    return nn.Linear(4, 3)


ROWS = [
    R(f_batch, [(lambda n: (lambda f: (randn(n, 4),)))(n) for n in range(1, 11)], graphs=2,
      name="every_new_batch_size_recompiles",
      note="automatic dynamic (dynamic=None): size 1 compiles its own static graph, the first other "
           "size one dynamic graph that serves every later size (2 graphs, as torch)"),
    R(f_float_arg, [(lambda a: (lambda f: (randn(3), a)))(a / 10) for a in range(1, 11)], graphs=2, torch_graphs=(1, 2, 8),
      name="every_new_float_arg_recompiles",
      note="a Python float is a guarded constant at the first compile; after it changed it is a "
           "graph input (a 0-d tensor read with .item()): 2 graphs"),
    C(returns_input, x34, name="returned_mutated_input_is_the_same_object"),
    C(uses_id, x34, graphs=(1, 2), breaks=(0, 1), torch_graphs=1, torch_breaks=0, name="id_of_tensor",
      note="id() of a tensor: torch constant-folds it on the fake; coil may break"),
    C(data_ptr_use, x34, graphs=1, breaks=1, name="data_ptr_is_a_break"),
    C(manual_seed_inside, x34, graphs=(1, 2), breaks=(0, 1), name="manual_seed_inside_frame"),
    R(default_dtype_creation, [lambda f: (randn(2),), _set_default_float64], graphs=(1, 2), name="default_dtype_change", setup=lambda: torch.set_default_dtype(torch.float32),
      note="torch.get_default_dtype() at call time is part of what the graph assumed"),
    C(tensor_hook_inside, lambda: (randn(3, 4, requires_grad=True),), graphs=(1, 2), breaks=(1, 2), torch_breaks=0,
      backward=True, name="tensor_register_hook_inside",
      note="coil breaks at Tensor.register_hook (torch's own code then runs as plain Python); torch traces it"),
    R(plain_tensor_attr, [lambda m: (randn(3),), _bump_scale], graphs=(1, 2), module=True,
      name="plain_tensor_attribute_mutated_in_place",
      note="a tensor attribute that is not a buffer is read as a graph input: in-place changes are seen"),
    R(reads_global_tensor, [lambda f: (randn(3),), _mutate_global_tensor], graphs=1,
      setup=lambda: _CLOSED.copy_(torch.arange(3.0)),
      name="global_tensor_mutated_in_place", note="global tensors are graph inputs: in-place changes are seen"),
    C(unrolled_loop_over_dim, lambda: (randn(6, 4),), name="loop_over_tensor_unrolls"),
    R(print_runs_every_call, [lambda f: (randn(3), []), lambda f: (randn(3), [])], graphs=1, breaks=1,
      name="break_side_effect_runs_every_call"),
    R(linear4, [lambda m: (randn(2, 4),), requires_grad_flip], graphs=2, module=True, name="param_requires_grad_flip"),
]

CASES = cases(*ROWS)


def _restore_default_dtype():
    torch.set_default_dtype(torch.float32)


@pytest.fixture(autouse=True)
def _default_dtype_restored():
    yield
    _restore_default_dtype()


@pytest.mark.parametrize("case", CASES)
def test_sharp_edges(case, check):
    check(case)


def test_returned_input_identity():
    """A compiled frame that mutates and returns its input returns the very same tensor
    object (as eager does), not a copy."""
    counter = CountingBackend()
    compiled = compile_fn(returns_input, counter, C(returns_input))
    x = randn(3, 4)
    out = compiled(x)
    assert out is x


def test_eager_fallback_after_recompile_limit_still_correct():
    """After the recompile limit a frame runs eagerly: answers stay right, no new graphs."""
    counter = CountingBackend()
    compiled = compile_fn(f_float_arg, counter, C(f_float_arg, dynamic=False))
    for k in range(12):
        x = randn(3)
        torch.testing.assert_close(compiled(x, k + 0.5), x * (k + 0.5))
    if not ORACLE:
        assert counter.graphs == 8
