"""Minimal repros from the twelfth round of user testing: eager strides for zero-element
graph outputs (``coil/ir/graph.py`` ``_empty_eager``, used by ``GraphLowering.output``),
``fallback_random``'s memory-order bernoulli (``_BernoulliInLayout`` in ``make_extern``)
and aot's training path under no_grad (``coil/aot/compile.py`` ``_compile``,
``coil/aot/runtime.py`` ``training_runner``); see FINDINGS_12.md.

Each failure is the smallest program that showed a defect (``xfail(strict=True)`` with the
diagnosis, so it flips when fixed); the plain tests are compact versions of what was
verified to match eager (values, strides, gradients, grad mode). CPU only.
"""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil

from report_helpers import (assert_args_match, assert_grads_match, assert_outputs_match,
                            backward_both, run_on_copies)

BACKENDS = ["cpp", "triton"]




def _gen(seed):
    g = torch.Generator().manual_seed(seed)
    return lambda *s, grad=False: torch.randn(*s, generator=g).requires_grad_(grad)  # noqa: E731


def _strides(o, r):
    return all(a == b for a, b, n in zip(o.stride(), r.stride(), r.shape) if n != 1)


# == 1. zero-element outputs take eager's strides ==========================================

# -- verified to work -----------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_outputs_match_eager_strides(backend):
    """Elementwise, index_select, gather, mm/bmm, cat/stack, views, aliases of inputs,
    in-place on an input, channels-last and 3-d permutations, several dtypes."""
    r = _gen(0)
    idx = torch.zeros(0, dtype=torch.long)

    def f(x, y, cl, z, b, i):
        return (x.t().contiguous() + 1, x.t() + 1, cl * 2, z.permute(1, 2, 0) * 3,
                y.t().index_select(0, i) + 1, torch.gather(x, 1, i.view(0, 1)),
                torch.bmm(z.transpose(1, 2), r(3, 4, 2)), torch.cat([x.t(), x.t()]),
                torch.stack([x.t(), x.t()], dim=2), (x.t() + 1).view(-1), x, x.t(), x[:, 1:],
                (b.t() | b.t()), (b.t().int() * 2), y.t()[:, :0] + 1)

    args = (r(0, 17), r(5, 4), r(2, 3, 0, 4).to(memory_format=torch.channels_last), r(3, 4, 0),
            torch.zeros(0, 5, dtype=torch.bool), idx)
    out, ref, a_out, a_ref = run_on_copies(f, args, backend)
    assert_outputs_match(out, ref, atol=0, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_outputs_training_backward(backend):
    r = _gen(1)

    def f(x, w, y):
        return x.t().contiguous() * 2, (x @ w).t(), (x.t() * y.t()).exp(), x.sum()

    args = (r(0, 17, grad=True), r(17, 5, grad=True), r(0, 17, grad=True))
    out, ref, a_out, a_ref = run_on_copies(f, args, backend)
    assert_outputs_match(out, ref, atol=1e-5, rtol=1e-5)
    backward_both(out, ref)
    assert_grads_match(a_ref, a_out, atol=1e-5, rtol=1e-5)


# -- failures -------------------------------------------------------------------------------

# (fixed: _empty_eager stands a small non-empty operand in at its fake strides)
def test_empty_output_with_0d_tensor_operand():
    r = _gen(2)
    out, ref, _, _ = run_on_copies(lambda x, s: (x.t() * s, torch.where(x.t() > 0, x.t(), 0.)),
                          (r(0, 17), torch.tensor(3.0)))
    assert_outputs_match(out, ref, atol=0, rtol=0)


def test_empty_output_with_nonempty_broadcast_operand():
    r = _gen(3)
    out, ref, _, _ = run_on_copies(lambda x, y: x.t() * y, (r(0, 17), r(17, 1)))
    assert_outputs_match(out, ref, atol=0, rtol=0)


@pytest.mark.xfail(strict=True, reason=(
    "_empty_eager only reruns OpOverloads: the outputs of a tuple op (operator.getitem "
    "of sort/topk/...) keep fake strides: torch.sort(x.t(), 1) of a (0, 17) x gave "
    "(1, 1), eager (1, 17)"))
def test_empty_tuple_op_outputs():
    r = _gen(4)
    out, ref, _, _ = run_on_copies(lambda x: tuple(torch.sort(x.t(), dim=1)), (r(0, 17),))
    assert_outputs_match(out, ref, atol=0, rtol=0)


@pytest.mark.xfail(strict=True, reason=(
    "torch.empty_like(x.t()) is decomposed at trace time to empty_permuted with fake's "
    "permutation ([0, 1]: fake takes the empty tensor as contiguous); rerunning that "
    "node for real cannot recover eager's (1, 3)"))
def test_empty_like_of_empty_transposed():
    r = _gen(5)
    out, ref, _, _ = run_on_copies(lambda x: torch.empty_like(x.t()).fill_(1), (r(0, 3),))
    assert_outputs_match(out, ref, atol=0, rtol=0)


@pytest.mark.xfail(strict=True, reason=(
    "_empty_eager recurses once per producer node (plus a dict comprehension frame): "
    "a chain of ~500 ops on an empty tensor raises RecursionError, code generation "
    "fails and the graph runs in the FX interpreter (the same chain on a non-empty "
    "tensor compiles)"))
def test_long_op_chain_on_empty_tensor_compiles():
    def f(x):
        for _ in range(600):
            x = x + 1
        return x

    coil.reset()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = coil.compile(f)(torch.randn(0, 17))
    assert out.shape == (0, 17)
    msgs = [str(m.message) for m in w if "code generation failed" in str(m.message)]
    assert not msgs, msgs[0][:200]


# == 2. fallback_random: bernoulli in memory order ==========================================

def _layouts(r):
    return {"contiguous": r(6, 8), "transposed": r(8, 6).t(),
            "channels_last": r(2, 3, 4, 5).to(memory_format=torch.channels_last),
            "permuted": r(4, 5, 6).permute(2, 0, 1)}


# -- verified to work -----------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["contiguous", "transposed", "channels_last", "permuted"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_dropouts_match_eager_under_seed_with_grads(backend, layout):
    r = _gen(6)
    x = _layouts(r)[layout].detach().requires_grad_()

    def f(x):
        outs = [F.dropout(x, 0.3), F.dropout(x * 2, 0.4) + 1, F.alpha_dropout(x, 0.3, True),
                x * torch.bernoulli(torch.full_like(x, 0.7))]
        if x.dim() == 4:
            outs += [F.dropout2d(x, 0.3), F.feature_alpha_dropout(x, 0.3, True)]
        # last: a random op reading a computed value before a dropout is reordered
        # (test_random_op_order_with_dropout_after)
        return tuple(outs + [torch.bernoulli(x.sigmoid()),
                             torch.empty_like(x).bernoulli_(x.sigmoid())])

    out, ref, a_out, a_ref = run_on_copies(f, (x,), backend, seed=7, fallback_random=True)
    assert_outputs_match(out, ref, atol=1e-5, rtol=1e-5)
    backward_both(out, ref)
    assert_grads_match(a_ref, a_out, atol=1e-5, rtol=1e-5)


# -- failures -------------------------------------------------------------------------------

@pytest.mark.xfail(strict=True, reason=(
    "an in-place bernoulli_ on a non-empty_* tensor (x.clone(), x * 1, zeros_like(x)) is "
    "traced as functional bernoulli.p of that tensor, which _BernoulliInLayout does not "
    "match (args[0] not in _EMPTY_OPS): it draws in logical order into a contiguous "
    "buffer, eager draws in the tensor's memory order: other mask and strides"))
@pytest.mark.parametrize("op", ["clone", "zeros_like"])
def test_inplace_bernoulli_of_nonempty_transposed(op):
    r = _gen(8)
    f = {"clone": lambda x: x.clone().bernoulli_(0.4),
         "zeros_like": lambda x: torch.zeros_like(x).bernoulli_(0.4)}[op]
    out, ref, _, _ = run_on_copies(f, (r(8, 6).t(),), seed=0, fallback_random=True)
    assert_outputs_match(out, ref, atol=0, rtol=0)


@pytest.mark.xfail(strict=True, reason=(
    "x.bernoulli_(p) on a transposed input: functionalized to bernoulli.p(x) (not an "
    "empty_* buffer), drawn in logical order and copied back: the mutated input differs "
    "from eager's memory-order draw"))
def test_inplace_bernoulli_of_transposed_input():
    r = _gen(9)
    out, ref, a_out, a_ref = run_on_copies(lambda x: x.bernoulli_(0.3), (r(8, 6).t(),), seed=0,
                                  fallback_random=True)
    assert_args_match(a_ref, a_out, atol=0, rtol=0)


def test_inplace_bernoulli_of_empty_like_strides():
    """Fixed (trial 62, finding 3): ``torch.empty_like(x).bernoulli_(p)`` of a transposed x returns eager's
    empty_like strides (1, 6); a returned intermediate the program wrote in place is copied into eager's strides."""
    r = _gen(10)
    out, ref, _, _ = run_on_copies(lambda x: torch.empty_like(x).bernoulli_(0.3), (r(8, 6).t(),),
                          seed=0, fallback_random=True)
    assert_outputs_match(out, ref, atol=0, rtol=0)


@pytest.mark.xfail(strict=True, reason=(
    "functional torch.empty_like(x).bernoulli(p) (no underscore) is bernoulli.p of an "
    "empty_like node too, so _BernoulliInLayout rewrites it to a memory-order fill; eager's "
    "functional bernoulli allocates contiguous and draws in logical order: other mask"))
def test_functional_bernoulli_of_empty_like_transposed():
    r = _gen(11)
    out, ref, _, _ = run_on_copies(lambda x: torch.empty_like(x).bernoulli(0.3), (r(8, 6).t(),),
                          seed=0, fallback_random=True)
    assert_outputs_match(out, ref, atol=0, rtol=0)


def test_random_op_order_with_dropout_after():
    """Fixed (trial 56, finding 6): the scheduler keeps extern random draws in program order."""
    r = _gen(20)
    out, ref, _, _ = run_on_copies(lambda x: (torch.rand_like(x.sigmoid()), F.dropout(x, 0.3)),
                          (r(6, 8),), seed=0, fallback_random=True)
    assert_outputs_match(out, ref, atol=0, rtol=0)


# == 3. aot's training path under no_grad ===================================================

def _check_grad_outputs(out, ref):
    for i, (o, e) in enumerate(zip(out, ref)):
        assert o.requires_grad == e.requires_grad, (i, o.requires_grad, e.requires_grad)
        assert (o.grad_fn is None) == (e.grad_fn is None), (i, o.grad_fn, e.grad_fn)


# -- verified to work -----------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_enable_grad_regions_under_no_grad(backend):
    """Fixed (session 5): under the caller's no_grad, aot traces the joint graph in that grad mode and training_runner turns grad on (coil/aot/compile.py _compile). Mixed outputs, nested no_grad, set_grad_enabled, a buffer mutated outside and
    inside the region, an input returned as is."""
    r = _gen(12)

    def f(x, b):
        b.add_(1)
        with torch.set_grad_enabled(True):
            y = x.exp() * b
            with torch.no_grad():
                z = y * 2
            w = y + z
        return w, z, x * 3, x

    args = (r(4, grad=True), r(4))
    out, ref, a_out, a_ref = run_on_copies(f, args, backend, ctx=torch.no_grad)
    assert_outputs_match(out, ref, atol=1e-5, rtol=1e-5)
    assert_args_match(a_ref, a_out, atol=1e-6, rtol=1e-6)
    _check_grad_outputs(out, ref)
    assert out[3] is a_out[0]
    backward_both(out, ref)
    assert_grads_match(a_ref, a_out, atol=1e-5, rtol=1e-5)


def test_enable_grad_region_graph_break_and_modes():
    """Fixed (session 5): under the caller's no_grad, aot traces the joint graph in that grad mode and training_runner turns grad on (coil/aot/compile.py _compile)."""
    r = _gen(13)

    def f(x):
        with torch.enable_grad():
            y = x * 2
            print("graph break")
            z = y.sin()
        return z, x * 3

    x = r(4, grad=True)
    coil.reset()
    cf = coil.compile(f)
    with torch.no_grad():
        a = cf(x)
    b = cf(x)
    with torch.inference_mode():
        c = cf(x)
    assert [t.requires_grad for t in a] == [True, False]
    assert [t.requires_grad for t in b] == [True, True]
    assert [t.requires_grad for t in c] == [False, False]
    a[0].sum().backward()
    torch.testing.assert_close(x.grad, 2 * torch.cos(2 * x.detach()))


# -- failures -------------------------------------------------------------------------------

def test_no_grad_value_used_inside_enable_grad_region():
    """Fixed (session 5): under the caller's no_grad, aot traces the joint graph in that grad mode and training_runner turns grad on (coil/aot/compile.py _compile)."""
    r = _gen(14)

    def f(x):
        a = x * 2
        with torch.enable_grad():
            b = a * x
        return b

    out, ref, a_out, a_ref = run_on_copies(f, (r(4, grad=True),), ctx=torch.no_grad)
    backward_both(out, ref)
    assert_grads_match(a_ref, a_out, atol=1e-5, rtol=1e-5)


def test_frozen_layer_before_enable_grad_head_gets_no_grad():
    """Fixed (session 5): under the caller's no_grad, aot traces the joint graph in that grad mode and training_runner turns grad on (coil/aot/compile.py _compile)."""
    torch.manual_seed(15)
    lin, head = nn.Linear(4, 4), nn.Linear(4, 2)

    def f(x):
        h = lin(x)
        with torch.enable_grad():
            return head(h.relu()).sin().sum()

    x = torch.randn(3, 4)
    with torch.no_grad():
        ref = f(x)
    ref.backward()
    ref_grads = [p.grad.clone() for p in head.parameters()]
    assert lin.weight.grad is None
    for p in (*lin.parameters(), *head.parameters()):
        p.grad = None
    coil.reset()
    with torch.no_grad():
        out = coil.compile(f)(x)
    out.backward()
    assert lin.weight.grad is None
    for g, e in zip([p.grad for p in head.parameters()], ref_grads):
        torch.testing.assert_close(g, e)


# fixed: the epilogue makes aliased outputs that require grad with grad enabled
# (coil/aot/runtime.py, _make_epilogue)
def test_view_of_input_inside_enable_grad_region():
    r = _gen(16)

    def f(x):
        with torch.enable_grad():
            y = x.t()
        return y

    out, ref, a_out, a_ref = run_on_copies(f, (r(3, 4, grad=True),), ctx=torch.no_grad)
    _check_grad_outputs(out, ref)
    backward_both(out, ref)
    assert_grads_match(a_ref, a_out, atol=0, rtol=0)


def test_view_of_enable_grad_value_as_only_output():
    """Crashed compilation with a first version of the enable_grad-under-no_grad path; that joint trace now falls back to the inference path (detached output) when it fails."""
    r = _gen(17)

    def f(x):
        with torch.enable_grad():
            y = x * 2
        return y.view(-1)

    out, ref, _, _ = run_on_copies(f, (r(3, 4, grad=True),), ctx=torch.no_grad)
    assert_outputs_match(out, ref, atol=0, rtol=0)


def test_saved_input_mutated_after_region_compiles():
    """Crashed compilation with a first version of the enable_grad-under-no_grad path; that joint trace now falls back to the inference path (detached output) when it fails."""
    r = _gen(18)

    def f(x, w):
        with torch.enable_grad():
            y = x * w
        w.add_(1)
        return y

    out, ref, a_out, a_ref = run_on_copies(f, (r(4, grad=True), r(4, grad=True)), ctx=torch.no_grad)
    assert_outputs_match(out, ref, atol=1e-6, rtol=1e-6)
    assert_args_match(a_ref, a_out, atol=1e-6, rtol=1e-6)
