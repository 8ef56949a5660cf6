"""Python numbers that change every call: an optimizer's ``betas`` tuple and a cosine schedule.

A compiled training step with ``OneCycleLR`` (``cycle_momentum``) recompiled on every step: the ``betas`` tuple of
floats was guarded as one constant (automatic dynamic only made lone ints/floats graph inputs), and then ``math.cos``
of the symbolic step count specialized it. Once symbolic, the learning rate the step writes back to the
optimizer's param group was printed from its sympy expression, which sympy had reassociated: one ulp off eager's
Python float (``0.05 + (0.002 - 0.05) / 2.0 * c`` became ``0.026 - 0.024*c``)."""
import math

import pytest
import torch

import coil
from coil.capture.frame import stats


def test_a_changing_float_in_a_tuple_is_a_graph_input_after_one_recompile():
    group = {"lr": 0.1, "betas": (0.9, 0.999)}

    def f(x):
        b1, b2 = group["betas"]
        return x * b1 + b2 * group["lr"]
    coil.reset()
    c = coil.compile(f)
    x = torch.randn(3)
    for i in range(6):
        group["betas"] = (0.9 - 0.01 * i, 0.999)
        group["lr"] = 0.1 / (i + 1)
        torch.testing.assert_close(c(x), f(x))
    assert stats["recompiles"] == 1


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_math_functions_of_a_symbolic_float_stay_symbolic(backend):
    def f(x, p):
        c = math.cos(p * 0.5)
        if c > 0.0:
            return x * c
        return x - math.sin(p) + math.sqrt(p) + math.tanh(p / 3)
    coil.reset()
    cf = coil.compile(f, options={"cpu_backend": backend})
    x = torch.ones(2, dtype=torch.float64)
    for p in [1.0, 1.5, 2.0, 4.0, 5.0, 0.5, 7.0]:
        assert torch.equal(cf(x, p), f(x, p)), p
    assert stats["recompiles"] == 2     # static 1.0, symbolic cos > 0, symbolic cos <= 0


def test_a_symbolic_float_written_back_is_eagers_python_float():
    d = {}

    def f(x, p):
        c = math.cos(math.pi * (p + 1) / 5.0) + 1
        d["v"] = 0.05 + (0.002 - 0.05) / 2.0 * c
        d["w"] = 0.05 + (0.002 - 0.05) / 2.0 * ((p + 1) / 5.0 + 1)
        s = 0.05 + (0.002 - 0.05) / 2.0 * ((p + 1) / 5.0 + 1)
        return x * 2, s
    coil.reset()
    cf = coil.compile(f)
    for p in range(1, 6):
        _, s_e = f(torch.ones(1), p)
        want = dict(d)
        _, s_c = cf(torch.ones(1), p)
        assert d == want and s_c == s_e, (p, d, want)   # exactly, not to an ulp
    assert stats["recompiles"] == 1


def test_one_cycle_schedule_in_a_compiled_step_recompiles_only_at_its_phase_change():
    def make():
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 2)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        return m, opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=20)

    def step(m, opt, sched, x):
        opt.zero_grad()
        m(x).pow(2).sum().backward()
        opt.step()
        sched.step()
    coil.reset()
    a, b = make(), make()
    c = coil.compile(step)
    for i in range(8):
        x = torch.randn(3, 4)
        step(*a, x)
        c(*b, x)
        assert a[2].get_last_lr() == b[2].get_last_lr()
        assert a[1].param_groups[0]["betas"] == b[1].param_groups[0]["betas"]
        torch.testing.assert_close(b[0].weight, a[0].weight)
    assert stats["eager_limit"] == 0
    assert stats["recompiles"] <= 6     # it was one per step, each frame after the optimizer's break


def test_torch_dynamo_marks_are_honored():
    """A program written for torch.compile marks dims with ``torch._dynamo.mark_dynamic`` / ``maybe_mark_dynamic`` /
    ``mark_static``: coil read only its own marks, so the first call compiled static and the next size recompiled."""
    import torch._dynamo

    def f(x):
        return x.sum(0) * x.shape[0]

    for mark, dynamic, compiles in ((torch._dynamo.mark_dynamic, None, 1), (torch._dynamo.maybe_mark_dynamic, None, 1),
                                    (torch._dynamo.mark_static, True, 3)):
        coil.reset()
        c = coil.compile(f, dynamic=dynamic)
        for n in (3, 4, 5):
            x = torch.randn(n, 2)
            mark(x, 0)
            torch.testing.assert_close(c(x), f(x))
        assert stats["frames"] == compiles, mark

    def g(x):
        return x.view(4, -1)      # forces the dim to 4: an error for mark_dynamic, not for maybe_mark_dynamic
    coil.reset()
    x = torch.randn(4, 2)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    torch.testing.assert_close(coil.compile(g)(x), g(x))
    coil.reset()
    torch._dynamo.mark_dynamic(x, 0, min=2, max=8)
    with pytest.raises(coil.exc.UserError, match="marked dynamic"):
        coil.compile(g)(x)
    y = torch.randn(9, 2)
    torch._dynamo.mark_dynamic(y, 0, min=2, max=8)
    with pytest.raises(coil.exc.UserError, match="outside the range"):
        coil.compile(f)(y)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_min_max_abs_of_a_changing_float_do_not_recompile_each_call(backend):
    """``x * min(p, 2.0)``, ``max``, ``abs(-p)`` of an automatic-dynamic float: ``abs`` was folded as a constant (it
    asked for the float's value) and the IR lowering pinned ``sym_min``/``sym_max`` results (no 0-d tensor rewrite in
    coil/aot/scalars.py): a recompile per call. The Python numbers the entry returns are eager's exactly."""
    def f(x, p, n):
        a = x.shape[0] / 3.0 + p ** 0.5
        b = float(n) * 1e-3 - p
        c = max(p, 0.5) + min(b, 2.0)
        d = -p * abs(b) + math.sqrt(p) * math.floor(p) + math.ceil(p * 1.5)
        return x * a * c * d * abs(-p), a, b, c, d, int(p * 7) + n // 2, 0.1 * n + 0.2 * n + 0.3
    coil.reset()
    cf = coil.compile(f, options={"cpu_backend": backend})
    for i in range(6):
        x = torch.randn(3 + i, dtype=torch.float64)
        p, n = 0.37 + 0.113 * i, 5 + 3 * i
        got, want = cf(x, p, n), f(x, p, n)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:] and [type(v) for v in got[1:]] == [type(v) for v in want[1:]], i
    assert stats["recompiles"] == 1


def test_a_float_zero_guard_tells_its_sign():
    """``x * p`` compiled for ``p = 0.0`` was reused for ``p = -0.0`` (``-0.0 == 0.0`` passed the guard), giving +0.0
    where eager gives -0.0; the same for a zero inside a tuple."""
    x = torch.ones(3)
    for f, p, q in ((lambda x, p: x * p, 0.0, -0.0), (lambda x, t: x * t[1][0], (1, (-0.0,)), (1, (0.0,)))):
        coil.reset()
        c = coil.compile(f)
        for v in (p, q, p):
            assert torch.equal(c(x, v).signbit(), f(x, v).signbit()), v


def test_a_symbolic_float_specialized_at_zero_keeps_its_sign():
    """Under ``dynamic=True`` a float argument of -0.0 was a symbol whose hint (a sympy Float, no -0.0) read +0.0:
    ``math.copysign(1.0, p)`` specialized to 1.0 and the guard ``p == 0`` let -0.0 through. A float zero stays a
    constant guarded with its sign (as the ints 0 and 1 stay constants)."""
    def f(x, p):
        return x * math.copysign(1.0, p)
    x = torch.ones(2)
    for first in (0.0, -0.0):
        coil.reset()
        c = coil.compile(f, dynamic=True)
        for p in (first, -first, 2.0, -0.0, 0.0, -3.0):
            assert torch.equal(c(x, p), f(x, p)), (first, p)


def test_zero_times_a_symbolic_float_keeps_the_product_sign():
    """``x + 0.0 * p`` with ``x = -0.0``: sympy folded ``0.0 * p`` to +0 for a symbolic ``p``; eager's zero has the
    product's sign (-0.0 for a negative ``p``). Also ``p * 0`` and a negative zero constant."""
    x = -torch.zeros(2)
    for f in (lambda x, p: x + 0.0 * p, lambda x, p: x + p * 0, lambda x, p: x + (-0.0) * p,
              lambda x, p: torch.full((2,), 0.0 * p) + x):
        coil.reset()
        c = coil.compile(f, dynamic=True)
        for p in (-3.0, 2.0, -1.5, 0.0, -0.0):
            assert torch.equal(c(x, p).signbit(), f(x, p).signbit()), p
        for p in (math.inf, -math.inf, math.nan):  # 0 * inf is NaN: the symbol's guard sends these to a constant
            assert c(x, p).isnan().all(), p


def _no_coil_warnings(caught) -> None:
    assert not [w for w in caught if str(w.message).startswith("coil")], [str(w.message) for w in caught]


def test_ema_with_a_decay_that_changes_every_step_compiles_twice():
    """``torch._foreach_mul_(avg, d); torch._foreach_add_(avg, params, alpha=1 - d)`` with ``d`` new every step: the
    foreach ops run as extern kernels, which specialized the symbolic ``d`` (a guard on its value), so every step
    recompiled until the recompile limit (8) ran the function eagerly. The extern now reads the Python float the
    graph computes (``d.item()``, ``1 - d``) at run time: one compile for the first value, one symbolic."""
    import warnings

    def ema(avg, params, d):
        torch._foreach_mul_(avg, d)
        torch._foreach_add_(avg, params, alpha=1 - d)

    coil.reset()
    cf = coil.compile(ema)
    want = [torch.randn(3), torch.randn(2, 2)]
    got = [t.clone() for t in want]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(12):
            d = 0.9 + 0.0075 * step
            params = [torch.randn(3), torch.randn(2, 2)]
            ema(want, params, d)
            cf(got, params, d)
            for g, w in zip(got, want):
                assert torch.equal(g, w), step   # the ATen op gets eager's Python float
    _no_coil_warnings(caught)
    assert stats["frames"] == 2 and stats["eager_limit"] == 0


@pytest.mark.parametrize("op", ["scalar_list", "lerp", "pow", "add_scalar", "sub_scalar", "addcmul", "clamp_min",
                                "div_scalar", "mul_tensor_scalar"])
def test_foreach_ops_reading_a_changing_float_stay_symbolic(op):
    """Each foreach overload with a Scalar (or a list of Scalars) reads the float at run time: the values are eager's,
    and a new value needs no recompile."""
    import warnings

    def f(xs, ys, k):
        if op == "scalar_list":
            return torch._foreach_mul(xs, [k * 0.5, k * 1.5])
        if op == "lerp":
            return torch._foreach_lerp(xs, ys, k)
        if op == "pow":
            return torch._foreach_pow(xs, k)
        if op == "add_scalar":
            return torch._foreach_add(xs, k)
        if op == "sub_scalar":
            return torch._foreach_sub(xs, k)
        if op == "addcmul":
            return torch._foreach_addcmul(xs, ys, ys, value=-k)
        if op == "clamp_min":
            return torch._foreach_clamp_min(xs, k)
        if op == "div_scalar":
            return torch._foreach_div(xs, k / 3)
        return torch._foreach_mul(xs, ys[0].sum() * k)    # the Tensor overload, k times a 0-d tensor

    coil.reset()
    cf = coil.compile(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            xs, ys = [torch.rand(3) + 0.5, torch.rand(2, 2) + 0.5], [torch.randn(3), torch.randn(2, 2)]
            k = 0.25 + 0.3 * i
            for g, w in zip(cf(xs, ys, k), f(xs, ys, k)):
                torch.testing.assert_close(g, w, rtol=0, atol=0)
    _no_coil_warnings(caught)
    assert stats["frames"] == 2 and stats["eager_limit"] == 0


def test_a_negative_changing_float_to_an_integer_power_stays_compiled():
    """``s ** 3`` of a float argument that became a graph input: torch's symbolic pow requires a base >= 0, and a
    negative ``s`` ran the frame eagerly ('Expected cond to be True'). Now ``-((-s) ** 3)``, the sign guarded: one
    more compile when it flips, values exactly eager's."""
    f = lambda x, s: x * s ** 3 + s ** -2 + s ** 2.0  # noqa: E731
    coil.reset()
    cf = coil.compile(f)
    x = torch.ones(3, dtype=torch.float64)
    for s in (0.3, -0.4, -1.7, 0.6, 2.5, -3.1):
        torch.testing.assert_close(cf(x, s), f(x, s), rtol=0, atol=0)
    assert coil.capture.stats["fallbacks"] == 0 and coil.capture.stats["recompiles"] == 2, coil.capture.stats
