"""Custom autograd formulas (``torch.autograd.Function``, ``custom_op`` + ``register_autograd``) with Python side
effects: the graph runs neither forward nor backward's Python per call (AOT traces them once), so capture traces them
first (``objects.probe_autograd``) and a side effect makes the call a graph break, run eagerly: effects happen on every
call, forward's at forward time and backward's at backward time. Pure formulas stay one graph."""
import pytest
import torch

import coil
from coil.testing import assert_same_as_eager

LOG = []
COUNT = 0


class Holder:
    n = 0


HOLDER = Holder()


class Appends(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        LOG.append("fwd")
        return x * 2

    @staticmethod
    def backward(ctx, g):
        LOG.append("bwd")
        return g * 2


class CountsOnClass(torch.autograd.Function):
    n = 0

    @staticmethod
    def forward(ctx, x):
        CountsOnClass.n += 1
        return x * CountsOnClass.n

    @staticmethod
    def backward(ctx, g):
        return g


class GlobalWrite(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        global COUNT
        COUNT += 1
        return x + 1

    @staticmethod
    def backward(ctx, g):
        return g


class AttrWrite(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        HOLDER.n = HOLDER.n + 1
        return x + 1

    @staticmethod
    def backward(ctx, g):
        return g


class BackwardOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        LOG.append("bwd")
        return g * 3


class InSetupContext(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return x * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        LOG.append("setup")

    @staticmethod
    def backward(ctx, g):
        return g * 2


def _state():
    return list(LOG), COUNT, HOLDER.n, CountsOnClass.n


def _reset():
    global COUNT
    LOG.clear()
    COUNT = HOLDER.n = CountsOnClass.n = 0


@pytest.mark.parametrize("fn", [Appends, CountsOnClass, GlobalWrite, AttrWrite, BackwardOnly, InSetupContext])
def test_side_effects_happen_on_every_call_in_order(fn):
    def f(x):
        return fn.apply(x).sin() + 1

    x = torch.randn(4, requires_grad=True)
    _reset()
    want = []
    for _ in range(3):
        y = f(x)
        want.append((y.detach(), _state()))
        y.sum().backward()
        want[-1] += (_state(),)
    eager_grad = x.grad
    x.grad = None
    _reset()
    cf = coil.compile(f)
    for w in want:
        y = cf(x)
        torch.testing.assert_close(y, w[0])
        assert _state() == w[1]             # forward's effects at forward time, backward's not yet
        y.sum().backward()
        assert _state() == w[2]
    torch.testing.assert_close(x.grad, eager_grad)
    assert coil.capture.stats["graph_breaks"] == 1
    assert "side effects" in coil.explain(f, x).break_reasons[0]["reason"]


class Pure(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, k):
        ctx.save_for_backward(x, w)
        ctx.k = k
        return x * w * k, (x > 0)

    @staticmethod
    def backward(ctx, g, g_mask):
        x, w = ctx.saved_tensors
        gx = g * w * ctx.k if ctx.needs_input_grad[0] else None
        return gx, g * x * ctx.k, None


class PureSetup(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.mark_non_differentiable()
        ctx.save_for_backward(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


def test_pure_functions_stay_one_graph():
    def f(x, w):
        y, mask = Pure.apply(x, w, 3.0)
        return (PureSetup.apply(y) * mask).sum()

    x, w = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    ex = coil.explain(f, x, w)
    assert ex.graph_count == 1 and ex.graph_break_count == 0, ex.break_reasons
    assert_same_as_eager(f, (x, w), check_grads=True)


@torch.library.custom_op("coil_test_effects::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@scale.register_fake
def _(x):
    return torch.empty_like(x)


def _scale_setup(ctx, inputs, output):
    LOG.append("setup")


def _scale_backward(ctx, g):
    LOG.append("bwd")
    return g * 2


scale.register_autograd(_scale_backward, setup_context=_scale_setup)


def test_custom_op_autograd_side_effects_run_on_every_call():
    def f(x):
        return scale(x).sin()

    x = torch.randn(3, requires_grad=True)
    _reset()
    cf = coil.compile(f)
    for i in range(1, 4):
        y = cf(x)
        assert LOG == ["setup", "bwd"] * (i - 1) + ["setup"]
        y.sum().backward()
    assert LOG == ["setup", "bwd"] * 3
    with torch.no_grad():           # no autograd formula runs: the op stays in the graph
        _reset()
        torch.testing.assert_close(cf(x), f(x))
        assert LOG == []


SCALE = 2.0


class ReadsGlobal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * SCALE

    @staticmethod
    def backward(ctx, g):
        return g * SCALE


def test_a_global_read_in_forward_is_guarded():
    global SCALE
    cf = coil.compile(lambda x: ReadsGlobal.apply(x) + 1)
    x = torch.ones(2, requires_grad=True)
    torch.testing.assert_close(cf(x), x * 2 + 1)
    SCALE = 5.0
    try:
        torch.testing.assert_close(cf(x), x * 5 + 1)    # was the traced 2.0: the global was not guarded
    finally:
        SCALE = 2.0
    assert coil.capture.stats["graph_breaks"] == 0


class ScalesByConfig(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg, ks):
        assert type(cfg) is dict and type(ks) is tuple
        ctx.k = cfg["k"] * ks[1]
        return x * ctx.k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None, None


CFG = {"k": 2.0, "names": ["a", "b"]}


def test_a_dict_of_constants_argument_stays_in_the_graph_and_is_guarded():
    """YOSO's ``YosoCumulation.apply(..., self.lsh_config)``: a dict / tuple of constants was a graph break; the
    Function gets a real dict and tuple, a changed value recompiles once and is then a symbolic graph input."""
    f = lambda x: ScalesByConfig.apply(x.sin(), CFG, (1, 3)).cos()  # noqa: E731
    cf = coil.compile(f)
    x = torch.randn(3, requires_grad=True)
    assert_same_as_eager(f, (x,), check_grads=True)
    torch.testing.assert_close(cf(x), f(x))
    try:
        for k in (5.0, -1.5):           # the changed float becomes a graph input (automatic dynamic)
            CFG["k"] = k
            got, want = cf(x), f(x)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])
    finally:
        CFG["k"] = 2.0
    assert coil.capture.stats["graph_breaks"] == 0 and coil.capture.stats["recompiles"] == 1, coil.capture.stats
