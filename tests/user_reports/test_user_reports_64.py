"""Regressions from new-user trial 64 (FINDINGS_64.md): training steps, custom autograd, dynamic shapes, dtype corner
cases and Python control flow, compared with eager on CPU.
"""

import pytest
import torch

import coil


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (fixed; silent wrong gradients): ``torch.autograd.grad(out, x, create_graph=True)`` of a compiled output
# whose backward reads only values the forward computed (``tanh(x)``, not ``x``) gave a gradient that did not require
# grad: a gradient penalty ``out + g.pow(2).sum()`` then backpropagated without its penalty term. Such gradients
# now require grad, as eager's do, and differentiating them raises coil's documented double-backward error.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_create_graph_gradient_of_computed_saved_values_is_not_detached(coil_reset, backend):
    f = lambda x: (x.tanh() ** 2).sum()                           # noqa: E731
    x = torch.arange(1.0, 4.0, requires_grad=True)
    out = coil.compile(f, options={"cpu_backend": backend})(x)
    g, = torch.autograd.grad(out, x, create_graph=True)
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="double backward"):
        (out + g.pow(2).sum()).backward()
    # gradients that read no computed value stay constants, usable as in eager
    h = lambda x: (x * 3).sum()                                   # noqa: E731
    x = torch.arange(1.0, 4.0, requires_grad=True)
    out = coil.compile(h, options={"cpu_backend": backend})(x)
    g, = torch.autograd.grad(out, x, create_graph=True)
    assert not g.requires_grad
    (out + g.pow(2).sum()).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0))


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (fixed; crash): a graph whose only inputs are Python numbers that changed between calls (so became
# symbolic), e.g. ``torch.full((n,), 1.5)`` or ``torch.arange(0, 10, n)``: aot made a fake mode without a ShapeEnv
# (there was no fake tensor to take one from) and make_fx's symbolic trace asserted "shape_env should be set".
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("case", ["full", "arange", "zeros", "tensor"])
def test_graph_of_symbolic_numbers_only(coil_reset, backend, case):
    f = {"full": lambda n: torch.full((n,), 1.5),
         "arange": lambda n: torch.arange(0, 10, n),
         "zeros": lambda n: torch.zeros(n, 2) + n,
         "tensor": lambda n: torch.tensor([n, 1]) * 2}[case]
    cf = coil.compile(f, options={"cpu_backend": backend})
    for n in (2, 3, 4):
        out, ref = cf(n), f(n)
        assert out.dtype == ref.dtype
        torch.testing.assert_close(out, ref)
    if case in ("full", "zeros"):
        with pytest.raises(RuntimeError):
            f(-1)
        with pytest.raises(RuntimeError):
            cf(-1)


# ---------------------------------------------------------------------------------------------------------------
# Finding 3 (fixed; a different exception where eager raises): a singular input to a compiled ``linalg.inv`` /
# ``solve`` / ``cholesky`` raised a plain RuntimeError; eager raises ``torch.linalg.LinAlgError``, which callers
# catch by that name (``except torch.linalg.LinAlgError:`` around the compiled call missed it).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("op", ["inv", "solve", "cholesky"])
def test_singular_input_raises_linalg_error(coil_reset, backend, op):
    f = {"inv": lambda a: torch.linalg.inv(a) * 2,
         "solve": lambda a: torch.linalg.solve(a, torch.ones(2)),
         "cholesky": lambda a: torch.linalg.cholesky(a) + 1}[op]
    cf = coil.compile(f, options={"cpu_backend": backend})
    good = torch.eye(2) * 2
    torch.testing.assert_close(cf(good), f(good))
    bad = torch.zeros(2, 2)
    with pytest.raises(torch.linalg.LinAlgError):
        f(bad)
    with pytest.raises(torch.linalg.LinAlgError):
        cf(bad)
    a = torch.tensor([[1.0, 2.0], [2.0, 1.0]], requires_grad=True)   # the training path (cholesky: not PD)
    if op == "cholesky":
        with pytest.raises(torch.linalg.LinAlgError):
            cf(a)


# ---------------------------------------------------------------------------------------------------------------
# Finding 4 (fixed; a different exception where eager raises): ``x.softmax(d)`` with a ``d`` that changed between
# calls (so became symbolic), then out of range: eager raises IndexError, coil ``BackendCompilerFailed`` (the meta
# kernel accepts any dim; capture's check of it took Python ints only, and aot's decomposition raised instead).
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["softmax", "softmin", "sort"])
def test_symbolic_dim_out_of_range_raises_index_error(coil_reset, op):
    f = {"softmax": lambda x, d: x.softmax(d), "softmin": lambda x, d: torch.nn.functional.softmin(x, d),
         "sort": lambda x, d: x.sort(d)[0]}[op]
    cf = coil.compile(f)
    x = torch.randn(2, 6)
    for d in (0, 1, -2):
        torch.testing.assert_close(cf(x, d), f(x, d))
    for d in (2, -3):
        with pytest.raises(IndexError):
            f(x, d)
        with pytest.raises(IndexError):
            cf(x, d)


# ---------------------------------------------------------------------------------------------------------------
# Finding 5 (fixed; crash): ``torch.logspace(..., base=-2.0)``: torch's reference decomposition raises
# NotImplementedError for a negative base (eager computes it), so the compile failed. The op now stays whole there.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_logspace_negative_base(coil_reset, backend):
    f = lambda x, b: torch.logspace(0, 3, 4, base=b) + x           # noqa: E731
    cf = coil.compile(f, options={"cpu_backend": backend})
    x = torch.randn(4)
    for b in (-2.0, 2.0, 3.0, -3.0, 0.0):       # constant, then symbolic
        torch.testing.assert_close(cf(x, b), f(x, b), equal_nan=True)


# ---------------------------------------------------------------------------------------------------------------
# Finding 6 (fixed; silent wrong values): ``with torch.autocast("cpu", dtype=torch.bfloat16) as c:`` bound ``c`` to
# None inside compiled code; eager's ``__enter__`` returns the autocast object (``c is None`` was True, ``c is ac``
# False). ``c.fast_dtype`` / ``c.device`` are read as constants.
# ---------------------------------------------------------------------------------------------------------------

def test_autocast_as_target_is_the_autocast_object(coil_reset):
    def f(x):
        ac = torch.autocast("cpu", dtype=torch.bfloat16)
        with ac as c:
            y = x @ x
            dt = c.fast_dtype
        return y, c is None, c is ac, dt, c.device

    x = torch.randn(3, 3)
    out, ref = coil.compile(f)(x), f(x)
    torch.testing.assert_close(out[0], ref[0])
    assert out[0].dtype == ref[0].dtype == torch.bfloat16
    assert out[1:] == ref[1:] == (False, True, torch.bfloat16, "cpu")


def test_inference_mode_off_as_target_is_none(coil_reset):
    def f(x):
        with torch.inference_mode(False) as c:      # (entered in that mode already: a no-op context)
            y = x * 2
        return y, c is None

    x = torch.randn(3)
    out = coil.compile(f)(x)
    assert out[1] is True
    torch.testing.assert_close(out[0], x * 2)


# ---------------------------------------------------------------------------------------------------------------
# Finding 7 (fixed; silent wrong values): an attribute set on the compiled module (``model = coil.compile(model);
# model.scale = 3.0``, or a submodule swapped through it) landed on the wrapper, while the compiled forward reads the
# original module's: the outputs ignored it. Writes (and deletes) other than the wrapper's own now go to the original,
# as torch.compile's OptimizedModule does.
# ---------------------------------------------------------------------------------------------------------------

def test_attribute_set_on_compiled_module_reaches_the_original(coil_reset):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.scale, self.use_relu = 1.0, True

        def forward(self, x):
            y = self.lin(x) * self.scale
            return y.relu() if self.use_relu else y

    m = M()
    cm = coil.compile(m)
    x = torch.randn(2, 4)
    torch.testing.assert_close(cm(x), m(x))
    cm.scale = 3.0
    cm.use_relu = False
    assert m.scale == 3.0 and m.use_relu is False and cm.scale == 3.0
    torch.testing.assert_close(cm(x), m(x))
    cm.lin = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    assert m.lin is cm.lin
    torch.testing.assert_close(cm(x), m(x))
    assert dict(cm.state_dict()).keys() == dict(m.state_dict()).keys()
    cm.extra = 1
    del cm.extra
    assert not hasattr(m, "extra")
    cm.train(False)
    assert m.training is False and cm.training is False


# ---------------------------------------------------------------------------------------------------------------
# Finding 8 (fixed; silent wrong values, with ``capture_scalar_outputs``): ``.item()`` of a 0-d tensor *input* lost
# every check on its value: ``torch._check(v < 10)`` did not raise, ``x.view(n.item(), -1)`` of 6 elements gave shape
# (4, 1) for n = 4 (eager raises), and ``x.view(n.item(), 3)`` returned (2, 3) for n = 3. aot read the capture's
# symbol for the input (its fake's item_memo) without recording which node binds it, so torch's pass placing the
# ShapeEnv's deferred asserts found no node for them, and a symbol pinned to a number had no value to check.
# (``.item()`` of a computed value, e.g. ``x.sum().item()``, was checked already.)
# ---------------------------------------------------------------------------------------------------------------

SCALAR_OPTS = {"capture_scalar_outputs": True}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_item_of_an_input_keeps_its_checks(coil_reset, backend):
    def checked(x, n):
        v = n.item()
        torch._check(v < 10)
        return x * v

    opts = dict(SCALAR_OPTS, cpu_backend=backend)
    x = torch.randn(6)
    cf = coil.compile(checked, options=opts)
    torch.testing.assert_close(cf(x, torch.tensor(2)), checked(x, torch.tensor(2)))
    with pytest.raises(RuntimeError):
        checked(x, torch.tensor(12))
    with pytest.raises(RuntimeError):
        cf(x, torch.tensor(12))

    view = lambda x, n: x.view(n.item(), -1)                      # noqa: E731
    cf = coil.compile(view, options=opts)
    for n in (3, 2):
        assert cf(x, torch.tensor(n)).shape == view(x, torch.tensor(n)).shape
    for n in (4, 0):
        with pytest.raises(RuntimeError):
            view(x, torch.tensor(n))
        with pytest.raises(RuntimeError):
            cf(x, torch.tensor(n))

    pinned = lambda x, n: x.view(n.item(), 3)                     # noqa: E731  (n must be 2)
    cf = coil.compile(pinned, options=opts)
    assert cf(x, torch.tensor(2)).shape == (2, 3)
    with pytest.raises(RuntimeError):
        pinned(x, torch.tensor(3))
    with pytest.raises(RuntimeError):
        cf(x, torch.tensor(3))


def test_compiled_container_module_is_indexed_and_iterated_as_the_original(coil_reset):
    """(with finding 7) ``len`` / ``[i]`` / ``iter`` of a compiled Sequential raised TypeError."""
    seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    cs = coil.compile(seq)
    assert len(cs) == 2 and cs[0] is seq[0] and list(cs) == list(seq) and bool(cs)
    assert bool(coil.compile(torch.nn.Linear(2, 2))) and not bool(coil.compile(torch.nn.Sequential()))
    with pytest.raises(TypeError):
        len(coil.compile(torch.nn.Linear(2, 2)))
    x = torch.randn(3, 4)
    torch.testing.assert_close(cs(x), seq(x))


# ---------------------------------------------------------------------------------------------------------------
# Finding 9 (fixed; crash): a compiled function or module called inside ``torch.utils.checkpoint.checkpoint(...,
# use_reentrant=False)`` (or under any ``saved_tensors_hooks``, e.g. ``save_on_cpu``) failed to compile: the user's
# pack hooks ran on capture's and aot's fake tensors (the checkpoint's read their data). With that fixed, the
# checkpoint's recomputation raised "a different number of tensors was saved" (the first call's trace had saved
# some). Capture and aot now set the caller's hooks aside while they trace.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ctx", ["checkpoint", "save_on_cpu", "hooks"])
def test_compiled_call_under_saved_tensors_hooks(coil_reset, ctx):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    f = lambda t: (torch.nn.functional.gelu(lin(t)) * 2).sum()     # noqa: E731
    cf = coil.compile(f)
    packed = []

    def pack(t):
        packed.append(1)
        return t

    def run(fn, x):
        if ctx == "checkpoint":
            return torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)
        with (torch.autograd.graph.save_on_cpu() if ctx == "save_on_cpu" else
              torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)):
            return fn(x)

    x0 = torch.randn(3, 4)
    grads = []
    for fn in (f, cf, cf):
        x = x0.clone().requires_grad_()
        lin.zero_grad()
        run(fn, x).backward()
        grads.append((x.grad, lin.weight.grad.clone()))
    for g in grads[1:]:
        torch.testing.assert_close(g[0], grads[0][0])
        torch.testing.assert_close(g[1], grads[0][1])


# ---------------------------------------------------------------------------------------------------------------
# Finding 10 (fixed; silent wrong values): ``torch.rand(n, dtype=torch.bfloat16)`` / ``rand_like`` of a half or
# bfloat16 tensor returned exactly 1.0 for about 0.2% (bf16) / 0.02% (fp16) of the elements; eager's are in [0, 1).
# The kernel drew a float32 in [0, 1) and rounded it to the output dtype (``(torch.rand(n, dtype=bf16) * k).long()``
# then indexed out of range). The draw is now capped at the largest value below 1 in that dtype.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_rand_stays_below_one(coil_reset, backend, dtype):
    opts = {"cpu_backend": backend}
    n = 50000 if backend == "cpp" else 20000
    out = coil.compile(lambda: torch.rand(n, dtype=dtype), options=opts)()
    like = coil.compile(lambda x: torch.rand_like(x), options=opts)(torch.empty(n, dtype=dtype))
    for t in (out, like):
        assert t.dtype == dtype
        assert t.max().item() < 1.0 and t.min().item() >= 0.0
        assert 0.45 < t.float().mean().item() < 0.55


# ---------------------------------------------------------------------------------------------------------------
# Finding 11 (fixed; silent wrong values): a global module hook (``nn.modules.module.register_module_forward_hook``,
# as profilers and activation-statistics tools install) fired twice for a compiled module: for the original inside
# the compiled code and again for the OptimizedModule wrapper, so an output hook ``o * 3`` gave ``o * 9``. (torch's
# OptimizedModule does the same, with a warning.) The wrapper's call skips ``nn.Module.__call__`` unless hooks are
# registered on the wrapper itself.
# ---------------------------------------------------------------------------------------------------------------

def test_global_module_hooks_fire_once_for_a_compiled_module(coil_reset):
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 4)
    cm = coil.compile(m)
    x = torch.randn(2, 4)
    cm(x)
    seen = []
    h1 = torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: (seen.append(type(mod).__name__), out * 3)[1])
    h2 = torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, args: seen.append("pre"))
    try:
        ref = m(x)
        assert seen == ["pre", "Linear"]
        seen.clear()
        out = cm(x)
        assert seen == ["pre", "Linear"]
    finally:
        h1.remove()
        h2.remove()
    torch.testing.assert_close(out, ref)
    wrapped = []
    cm.register_forward_hook(lambda mod, args, out: wrapped.append(1))    # a hook on the wrapper still runs
    cm(x)
    assert wrapped == [1]


# ---------------------------------------------------------------------------------------------------------------
# Finding 12 (fixed; a value where eager raises): ``F.celu(x, alpha=0.0)``: eager raises "ZeroDivisionError: alpha
# cannot be 0 for CELU"; coil returned values (the meta kernel accepts it and the decomposition divides by a Python
# 0 as inf). Also an ``alpha`` that changed between calls and then became 0 (guarded nonzero).
# ---------------------------------------------------------------------------------------------------------------

def test_celu_alpha_zero_raises(coil_reset):
    x = torch.randn(5)
    for f in (lambda x: torch.nn.functional.celu(x, 0.0), lambda x: torch.nn.CELU(alpha=0)(x)):
        with pytest.raises(RuntimeError, match="alpha cannot be 0"):
            f(x)
        with pytest.raises(RuntimeError, match="alpha cannot be 0"):
            coil.compile(f)(x)
    g = lambda x, a: torch.nn.functional.celu(x, a)                # noqa: E731
    cg = coil.compile(g)
    for a in (1.0, 2.0, -0.5):
        torch.testing.assert_close(cg(x, a), g(x, a))
    with pytest.raises(RuntimeError, match="alpha cannot be 0"):
        cg(x, 0.0)


# ---------------------------------------------------------------------------------------------------------------
# Finding 13 (fixed; values where eager raises): probabilities outside [0, 1]. ``torch.bernoulli(p)`` of a tensor
# ``p`` with an element 1.2, ``x.bernoulli_(1.5)`` and ``F.binary_cross_entropy`` of an input or target > 1 raise in
# eager (its kernels check the values); coil drew with clamped probabilities or returned a loss. The checks are now
# in the graph (``aten._assert_async``, the decompositions of bernoulli and binary_cross_entropy) or, for a Python
# number ``p``, made by capture.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_probabilities_outside_unit_interval_raise(coil_reset, backend):
    opts = {"cpu_backend": backend}
    bce = coil.compile(lambda x, t: torch.nn.functional.binary_cross_entropy(x, t), options=opts)
    x, t = torch.tensor([0.2, 0.9]), torch.tensor([0.0, 1.0])
    torch.testing.assert_close(bce(x, t), torch.nn.functional.binary_cross_entropy(x, t))
    for bad in ((x + 1, t), (x, t + 1), (torch.tensor([float("nan"), 0.5]), t)):
        with pytest.raises(RuntimeError, match="should be between 0 and 1"):
            torch.nn.functional.binary_cross_entropy(*bad)
        with pytest.raises(RuntimeError, match="should be between 0 and 1"):
            bce(*bad)
    xg = x.clone().requires_grad_()
    bce(xg, t).backward()
    assert xg.grad is not None
    draw = coil.compile(lambda p: torch.bernoulli(p), options=opts)
    out = draw(torch.tensor([0.0, 1.0, 1.0]))
    assert torch.equal(out, torch.tensor([0.0, 1.0, 1.0]))
    with pytest.raises(RuntimeError, match="p_in >= 0"):
        draw(torch.tensor([0.5, 1.2]))
    with pytest.raises(RuntimeError, match=r"expects p to be in \[0, 1\]"):
        coil.compile(lambda x: x.bernoulli_(1.5), options=opts)(torch.zeros(3))


# Observation (fixed since): torch.bernoulli of an integer or bool tensor (its own probabilities) has no eager kernel
# (NotImplementedError); the graph drew values. x.bernoulli_(0.5) and bernoulli(x, 0.5) of such a tensor stay valid.
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_bernoulli_of_an_integer_tensor_raises_as_eager(coil_reset, dtype):
    x = torch.ones(3, dtype=dtype)
    for fn in (lambda x: torch.bernoulli(x) + 1, lambda x: x.bernoulli() * 2):
        with pytest.raises(NotImplementedError):
            fn(x)
        with pytest.raises(NotImplementedError):
            coil.compile(fn)(x)
    assert coil.compile(lambda x: x.bernoulli_(0.5))(x.clone()).dtype == dtype
    assert coil.compile(lambda x: torch.bernoulli(x, 0.5))(x).dtype == dtype


# Observation (fixed since): an integer scatter of a Python number that changed between calls and then did not fit the
# dtype wrapped it (300 -> 44 in int8); eager raises "value cannot be converted ... without overflow" (an unsigned
# type also takes values down to -max, as c10's overflows does). An empty index converts nothing: no error.
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_integer_scatter_of_a_symbolic_value_out_of_range_raises(coil_reset, dtype):
    i, empty = torch.tensor([0]), torch.tensor([], dtype=torch.long)
    for fn in (lambda x, v: x.scatter(0, i, v), lambda x, v: torch.scatter(x, 0, i, value=v),
               lambda x, v: x.clone().scatter_(0, i, v, reduce="add"), lambda x, v: x.scatter(0, empty, v)):
        coil.reset()
        cf, x = coil.compile(fn), torch.zeros(3, dtype=dtype)
        for v in (3, 5, 300, -1, -300, 7):
            try:
                want = fn(x, v)
            except RuntimeError:
                with pytest.raises(RuntimeError, match="without overflow"):
                    cf(x, v)
                continue
            torch.testing.assert_close(cf(x, v), want)
