"""Regressions from new-user trial 52b: adversarial programs against the day's changes (Python random draws as graph
inputs, autograd.Function side effects, AOT's one-run analysis and BatchNorm backward, typing subscripts,
compiled optimizer steps)."""
import random

import pytest
import torch

import coil


@pytest.fixture(autouse=True)
def _keep_random_state():
    state = random.getstate()
    yield
    random.setstate(state)


def _uniform_up_to_item(x):
    return x * random.uniform(0, abs(x.sum().item()))     # the break at item() leaves random.uniform on the stack


class _Owner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rng = random.Random(3)

    def forward(self, x):
        return x * self.rng.uniform(0, abs(x.sum().item()))


def _owner_fn(m):
    return lambda x: m(x)


@pytest.mark.parametrize("which", ["module_random", "random_instance_attr"])
def test_draw_method_live_at_a_break_does_not_recompile(which, coil_reset):
    """A draw's bound method (``random.uniform``, ``self.rng.uniform``) on the stack at a graph break was rebuilt as
    a new bound method each call and its resume function guarded it by identity: a recompile on every call, then
    the recompile limit and the whole frame eager."""
    x = torch.randn(4)
    if which == "module_random":
        fn, ref = _uniform_up_to_item, _uniform_up_to_item
    else:
        fn, ref = _Owner(), _Owner()
    cf = coil.compile(fn)
    random.seed(0)
    want = [ref(x) for _ in range(10)]
    after = random.getstate()
    random.seed(0)
    got = [cf(x) for _ in range(10)]
    assert random.getstate() == after
    if which != "module_random":
        assert fn.rng.getstate() == ref.rng.getstate()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert coil.capture.stats["recompiles"] == 0 and coil.capture.stats["eager_limit"] == 0


def test_monkeypatched_random_function_is_seen(coil_reset):
    cf = coil.compile(lambda x: x * random.random())
    x = torch.randn(3)
    cf(x)
    orig = random.random
    try:
        random.random = lambda: 0.25
        torch.testing.assert_close(cf(x), x * 0.25)
        random.random = random.Random(1).random
        torch.testing.assert_close(cf(x), x * random.Random(1).random())
    finally:
        random.random = orig


_BUF = torch.zeros(3)


class _BumpsGlobalTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        _BUF.add_(1)
        return x * _BUF

    @staticmethod
    def backward(ctx, g):
        return g * _BUF


@pytest.mark.parametrize("grad", [True, False])
def test_autograd_function_mutating_a_global_tensor_runs_once(grad, coil_reset):
    """The forward of a Function mutating a global tensor in place ran for real while capture ran the node on fake
    tensors (FakeTensorMode mutates a real tensor before refusing it), then again at the graph break: the global
    was bumped twice per call (outputs and gradients wrong)."""
    fn = lambda x: _BumpsGlobalTensor.apply(x) + 1     # noqa: E731
    res = {}
    for mode in ("eager", "compiled"):
        _BUF.zero_()
        f = fn if mode == "eager" else coil.compile(fn)
        x = torch.ones(3, requires_grad=grad)
        with torch.set_grad_enabled(grad):
            y = f(x)
        if grad:
            y.sum().backward()
        res[mode] = (y.detach(), x.grad, _BUF.clone())
    for g, w in zip(res["compiled"], res["eager"]):
        torch.testing.assert_close(g, w)


def _arange_of_a_draw(x):
    return torch.arange(random.randint(1, 4)), x[:random.randint(0, 3)] * 2


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_a_drawn_size_of_0_or_1_is_not_pinned(backend, coil_reset):
    """A size drawn as 1 (or 0) on the traced call: the later stages pinned the draw's symbol to it (guards
    ``s < 2``, ``Eq(s, 0)`` that nothing checks on a drawn value), so every later call got that size, silently."""
    seed = next(s for s in range(100) if (random.seed(s), random.randint(1, 4), random.randint(0, 3))[1:] == (1, 0))
    x = torch.randn(5)
    random.seed(seed)
    want = [_arange_of_a_draw(x) for _ in range(8)]
    cf = coil.compile(_arange_of_a_draw, backend=backend)
    random.seed(seed)
    got = [cf(x) for _ in range(8)]
    for g, w in zip(got, want):
        assert g[0].shape == w[0].shape and g[1].shape == w[1].shape
        torch.testing.assert_close(g, w)


def _ones_of_a_draw_minus_one(x):
    return torch.ones(random.randint(2, 5) - 1) + x.sum()


def test_a_size_derived_from_a_draw_is_not_pinned_by_the_backend(coil_reset):
    """``randint(2, 5) - 1`` traced as 1: the backend's guard on it (added after the trace, so no break) pinned every
    later call's size to 1. Such a guard now recaptures the frame with a break at the draw."""
    seed = next(s for s in range(100) if (random.seed(s), random.randint(2, 5))[1] == 2)
    x = torch.randn(3)
    random.seed(seed)
    want = [_ones_of_a_draw_minus_one(x) for _ in range(8)]
    cf = coil.compile(_ones_of_a_draw_minus_one)
    random.seed(seed)
    got = [cf(x) for _ in range(8)]
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w)


def test_a_coin_flip_multiplier_stays_in_the_graph(coil_reset):
    x = torch.randn(3)
    cf = coil.compile(lambda x: x * random.randint(0, 1))
    random.seed(0)
    want = [x * random.randint(0, 1) for _ in range(6)]
    random.seed(0)
    for w in want:
        torch.testing.assert_close(cf(x), w)
    assert coil.capture.stats["graph_breaks"] == 0


_SCALE = [2.0]


class _GlobalInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * _SCALE[0]


@pytest.mark.xfail(strict=True, reason="open (torch.compile gives the same 2.0): the backward's Python reads a global "
                   "when eager runs it; AOT traced it at the forward's compile, and the guard on the global is checked "
                   "at the forward's call, so a change between forward and backward is not seen")
def test_global_changed_between_forward_and_backward(coil_reset):
    cf = coil.compile(lambda x: _GlobalInBackward.apply(x) + 1)
    x = torch.ones(2, requires_grad=True)
    y = cf(x)
    _SCALE[0] = 3.0
    try:
        y.sum().backward()
    finally:
        _SCALE[0] = 2.0
    torch.testing.assert_close(x.grad, torch.full((2,), 3.0))


@pytest.mark.xfail(strict=True, reason="open (torch.compile's aot_eager gives the same): running_mean and running_var "
                   "the same tensor; eager's kernel updates the variance from the already updated mean buffer, the "
                   "functional decomposition writes both from the value before the call")
def test_batch_norm_running_mean_and_var_the_same_tensor(coil_reset):
    fn = lambda x, r, w: torch.nn.functional.batch_norm(x, r, r, w, None, training=True, momentum=0.3)  # noqa: E731
    torch.manual_seed(0)
    x, w = torch.randn(4, 3), torch.randn(3)
    r1, r2 = torch.ones(3), torch.ones(3)
    with torch.no_grad():
        fn(x, r1, w)
        coil.compile(fn)(x, r2, w)
    torch.testing.assert_close(r2, r1)
