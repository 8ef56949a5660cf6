"""Parameter-free ``torch.nn`` modules constructed inside a compiled function
(``nn.CrossEntropyLoss(ignore_index=-100)(logits, y)`` in HF heads, ``nn.ReLU()(x)``)
are traced without a graph break (user report 16, defect 6); a tensor constructor
argument, a module with parameters, or a user subclass stay graph breaks, and results
match eager either way."""
import pytest
import torch
import torch.nn as nn

import coil


def _check(fn, *args):
    """Compiled ``fn`` gives eager's value and eager's grads for every input that
    requires grad; returns ``coil.explain(fn, *args)``."""
    runs = []
    for f in (fn, coil.compile(fn)):
        a = [t.detach().clone().requires_grad_(t.requires_grad) for t in args]
        torch.manual_seed(0)
        out = f(*a)
        out.backward()
        runs.append((out, [t.grad for t in a if t.requires_grad]))
    (oe, ge), (oc, gc) = runs
    torch.testing.assert_close(oc, oe)
    for c, e in zip(gc, ge):
        torch.testing.assert_close(c, e)
    return coil.explain(fn, *args)


def _logits_labels(v=7):
    labels = torch.randint(0, v, (3, 4))
    labels[0, 1] = -100
    return torch.randn(3, 4, v, requires_grad=True), labels


def test_hf_style_loss_is_one_graph():
    def head(logits, labels):
        loss_fct = nn.CrossEntropyLoss(ignore_index=-100)
        return loss_fct(logits.view(-1, logits.shape[-1]), labels.view(-1))

    ex = _check(head, *_logits_labels())
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), str(ex)[:400]


def test_activations_losses_and_shape_modules():
    def f(x, y):
        h = nn.Flatten()(nn.Identity()(x))
        h = nn.GELU(approximate="tanh")(h) + nn.ReLU()(h) + nn.Tanh()(h)
        h = nn.Dropout(0.0)(h)
        return (nn.Softmax(dim=-1)(h) * y).sum() + nn.MSELoss(reduction="sum")(h, y) + \
            nn.SmoothL1Loss()(h, y)

    ex = _check(f, torch.randn(2, 3, 4, requires_grad=True), torch.randn(2, 12))
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), str(ex)[:400]


def test_dropout_created_inside_is_in_training_mode():
    def f(x):
        return nn.Dropout(0.5)(x)

    x = torch.ones(1000)
    torch.manual_seed(0)
    out = coil.compile(f)(x)
    assert (out == 0).any() and (out == 2).any()
    assert coil.explain(f, x).graph_break_count == 0


def test_module_created_in_a_loop():
    def f(x, y):
        total = 0
        for p in (0.0, 0.0, 0.0):
            x = nn.Dropout(p)(nn.LeakyReLU(0.1)(x))
            total = total + nn.L1Loss()(x, y)
        return total

    ex = _check(f, torch.randn(5, 3, requires_grad=True), torch.randn(5, 3))
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), str(ex)[:400]


def test_weight_tensor_argument_still_breaks_and_is_correct():
    def f(logits, labels, w):
        return nn.CrossEntropyLoss(weight=w)(logits, labels) * 2

    logits, labels = torch.randn(6, 5, requires_grad=True), torch.randint(0, 5, (6,))
    ex = _check(f, logits, labels, torch.rand(5))
    assert ex.graph_break_count == 1
    assert "CrossEntropyLoss" in str(ex.break_reasons[0]["reason"])


def test_module_with_parameters_still_breaks_and_keeps_the_rng():
    def f(x):
        return nn.Linear(4, 4)(x).sum()

    ex = _check(f, torch.randn(2, 4, requires_grad=True))
    assert ex.graph_break_count == 1
    assert "parameters or buffers" in str(ex.break_reasons[0]["reason"])


def test_user_subclass_is_traced_and_a_constructor_with_effects_breaks():
    class MyLoss(nn.MSELoss):            # only forward: torch.nn's constructor
        def forward(self, a, b):
            return super().forward(a, b) * 3

    class OwnInit(nn.MSELoss):           # a pure user constructor: traced, then built
        def __init__(self):
            super().__init__()
            self.scale = 3

    log = []

    class Logging(OwnInit):               # a user constructor with a side effect
        def __init__(self):
            super().__init__()
            log.append(1)

        def forward(self, a, b):
            return super().forward(a, b) * self.scale

    def f(x, y):
        return MyLoss()(x, y)

    def g(x, y):
        return OwnInit()(x, y)

    ex = _check(f, torch.randn(3, requires_grad=True), torch.randn(3))
    assert ex.graph_break_count == 0
    def h(x, y):
        return Logging()(x, y)

    ex = _check(g, torch.randn(3, requires_grad=True), torch.randn(3))
    assert ex.graph_break_count == 0
    ex = _check(h, torch.randn(3, requires_grad=True), torch.randn(3))
    assert ex.graph_break_count == 1 and "Logging module inside the frame" in str(ex.break_reasons[0]["reason"])


@pytest.mark.filterwarnings("ignore")
def test_module_live_at_a_break_and_returned_is_a_fresh_instance():
    def f(x):
        m = nn.Softplus(beta=2.0)
        y = m(x)
        print(end="")
        return m(y), m

    x = torch.randn(4)
    cf = coil.compile(f)
    (oc, mc), (oe, _) = cf(x), f(x)
    torch.testing.assert_close(oc, oe)
    assert type(mc) is nn.Softplus and mc.beta == 2.0
    assert cf(x)[1] is not mc


def test_attribute_write_on_it_breaks_and_stays_correct():
    def f(x):
        m = nn.ELU()
        m.alpha = 0.5
        return m(x)

    x = torch.randn(6)
    torch.testing.assert_close(coil.compile(f)(x), f(x))


def test_constructor_effects_the_trace_cannot_see_stay_breaks():
    """A mutable default argument appended to, or a cached function with a side effect, in a user ``__init__``:
    invisible to the traced purity probe, they ran at compile time only (eager: a new value every call)."""
    import functools
    log = []

    @functools.lru_cache(None)
    def scale_for(n):
        log.append(n)
        return float(len(log))

    class Defaults(nn.Module):
        def __init__(self, seen=[]):  # noqa: B006
            super().__init__()
            seen.append(1)
            self.k = len(seen)

        def forward(self, x):
            return x * self.k

    class Cached(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = scale_for(len(log))

        def forward(self, x):
            return x * self.k

    for cls in (Defaults, Cached):
        def f(x):
            return cls()(x)
        x = torch.ones(1)
        want = [f(x).item() for _ in range(3)]
        Defaults.__init__.__defaults__[0].clear()
        log.clear()
        scale_for.cache_clear()
        coil.reset()
        g = coil.compile(f)
        assert [g(x).item() for _ in range(3)] == want, cls
