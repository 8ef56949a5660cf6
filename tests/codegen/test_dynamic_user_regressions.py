"""Dynamic-shape programs written as a user would, each the smallest input of a bug
found that way (docs/dynamic_shapes.md), on both CPU code generators, against eager."""
import pytest
import torch

import coil

BACKENDS = ["cpp", "triton"]


def _compiled(fn, backend, options=(), **kw):
    coil.reset()
    return coil.compile(fn, dynamic=True, options={"cpu_backend": backend, **dict(options)}, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sum_of_last_chunk_of_a_dynamic_dim(backend):
    """The last chunk's length ``L - 2*((L+2)//3)`` is a reduction's row length: the C++
    tail loop printed ``L - 2*((L+2)/3) % 8`` (``%`` before ``-``) and summed the wrong
    elements for L = 10 and 11; on Triton, L = 7 (a row of 1) launched without RBLOCK."""
    fn = lambda x: x.chunk(3, dim=1)[2].sum(1)  # noqa: E731
    f = _compiled(fn, backend)
    for n in (7, 8, 10, 11):
        x = torch.arange(2.0 * n).view(2, n)
        torch.testing.assert_close(f(x), fn(x))


def test_shape_guard_on_a_float_of_a_size_accepts_its_own_sizes():
    """``x.shape[0] * 0.3 > 1.0`` guards ``0.3*torch.sym_float(x.size()[0]) > 1.0``: the
    guard function had no ``torch``, raised NameError, and every call recompiled."""
    from coil.testing import CompileCounter

    def fn(x):
        if x.shape[0] * 0.3 > 1.0:
            return x * 2
        return x * 3

    coil.reset()
    cnt = CompileCounter()
    f = coil.compile(fn, backend=cnt, dynamic=True)
    for n in (4, 5, 4, 5, 2, 6):
        x = torch.randn(n)
        torch.testing.assert_close(f(x), fn(x))
    assert cnt.frame_count == 2  # one entry for n > 3.33, one for n = 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernels_after_a_boolean_mask_are_generated(backend):
    """A kernel over ``x[x > 0]`` has a data-dependent length ``u0``: Triton's int32 index
    check guarded ``u0 < 2**31 - 1``, which cannot be decided, and the whole graph fell
    back to the FX interpreter (with a warning). It now indexes such kernels in int64."""
    import warnings

    fn = lambda x: x[x > 0].exp() * 2  # noqa: E731
    f = _compiled(fn, backend, options={"capture_scalar_outputs": True,
                                        "capture_dynamic_output_shape_ops": True})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (5, 8, 13):
            x = torch.randn(n, 4)
            torch.testing.assert_close(f(x), fn(x))
    assert not [w for w in caught if "code generation failed" in str(w.message)]


def _counted(fn, backend):
    """``fn`` compiled with ``dynamic=True`` on the ``coil`` backend, and the list of the
    graphs that backend is given."""
    from coil.backends import lookup_backend

    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return lookup_backend("coil")(gm, example_inputs)

    coil.reset()
    return coil.compile(fn, backend=counting, dynamic=True, options={"cpu_backend": backend}), graphs


@pytest.mark.parametrize("backend", BACKENDS)
def test_floats_computed_from_sizes_are_not_specialized(backend):
    """``1.0 / x.shape[0]``, ``math.sqrt(x.shape[1])`` and ``n / (n - 1)`` are SymFloats
    of sizes: the code generator wrote each as a constant (guard ``== 0.25``), so every
    new size compiled again. AOT computes them as float64 0-d tensors instead."""
    import math

    fn = lambda x: (x * (1.0 / x.shape[0]) + x / math.sqrt(x.shape[1]),  # noqa: E731
                    x.var(0) * (x.shape[0] / (x.shape[0] - 1)))
    f, graphs = _counted(fn, backend)
    for n in (4, 6, 5, 7, 6):
        x = torch.randn(n, n + 1)
        torch.testing.assert_close(f(x), fn(x))
    assert len(graphs) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_norm_training_one_graph_for_every_batch_size(backend):
    """BatchNorm's running variance is updated with ``var * n / (n - 1)``: one graph per
    batch size until the recompile limit (then eager), now one for all."""
    bn_c, bn_e = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    f, graphs = _counted(bn_c, backend)
    for n in (4, 6, 5, 7, 6, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(f(x), bn_e(x))
        torch.testing.assert_close(bn_c.running_var, bn_e.running_var)
    assert len(graphs) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_size_as_a_scalar_operand_is_read_in_the_kernel(backend, tmp_path):
    """``x.sum(0) / x.shape[0]``, ``torch.full((3,), n)`` and ``x.mean(1)``: a lowering
    that needed the number ran the ATen op instead (``dynamic_lowering_fallback``); the
    kernel now reads the size argument."""
    import json

    fn = lambda x: (x.sum(0) / x.shape[0], torch.full((3,), x.shape[1]) + 1, x.mean(1))  # noqa: E731
    coil.trace.set_dir(str(tmp_path))
    try:
        f = _compiled(fn, backend)
        for n in (4, 6, 5):
            x = torch.randn(n, n + 2)
            torch.testing.assert_close(f(x), fn(x))
    finally:
        coil.trace.set_dir(None)
    events = [json.loads(line)["event"] for p in tmp_path.glob("*.jsonl") for line in p.open()]
    assert "stage" in events and "dynamic_lowering_fallback" not in events


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_negative_floor_division_of_sizes_as_a_number(backend):
    """``(-n) // 3`` is a Python floor division: a kernel reading it printed C/Triton's
    truncating ``//`` and ``%`` and was off by one (n = 5, 8); they print floor_safe's."""
    fn = lambda x: torch.arange(x.shape[1]) + (-x.shape[1]) // 3 + (x.shape[1] - 7) % 3  # noqa: E731
    f = _compiled(fn, backend)
    for n in (5, 8, 13):
        x = torch.randn(2, n)
        torch.testing.assert_close(f(x), fn(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_size_stored_in_a_narrow_integer_raises_as_eager(backend):
    """``torch.full((2,), n * 1000, dtype=torch.int16)`` raises in eager when the value
    does not fit; read in the kernel, n = 40 wrapped to -25536 silently."""
    fn = lambda x: torch.full((2,), x.shape[0] * 1000, dtype=torch.int16) + x.shape[0]  # noqa: E731
    f = _compiled(fn, backend)
    x = torch.randn(4, 2)
    torch.testing.assert_close(f(x), fn(x))
    with pytest.raises(RuntimeError, match="overflow"):
        f(torch.randn(40, 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mean_over_an_unbacked_dim_generates_kernels(backend):
    """``mark_unbacked(x, 0)`` then ``x.mean(0)``: the output-layout check asked whether
    ``u0 != 1`` (undecidable) and the whole graph ran in the FX interpreter (a codegen
    fallback); an undecidable size now counts as not 1 there (only "not dense" follows)."""
    from coil.exc import fallback_counts

    fn = lambda x: x.mean(0) * 2  # noqa: E731
    before = sum(fallback_counts.values())
    f = _compiled(fn, backend)
    for n in (5, 1, 9):
        x = torch.randn(n, 8)
        coil.mark_unbacked(x, 0)
        torch.testing.assert_close(f(x), fn(x))
    assert sum(fallback_counts.values()) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_of_a_strided_slice_gets_its_size_symbol(backend):
    """``lin(x[:, ::2])`` with a dynamic length: the backward graph reads only tensors of
    ``(L + 1) // 2`` rows, so ``L`` itself could not be bound from its inputs and code
    generation fell back to the FX interpreter. The partitioner now saves ``L`` (a
    ``sym_size`` of the input) for the backward; gradients match eager, no fallback."""
    from coil.exc import fallback_counts
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)

    def fn(x):
        return lin(x[:, ::2]).sum()
    coil.reset()
    f = coil.compile(fn, options={"cpu_backend": backend})  # automatic dynamic from 9 on
    before = dict(fallback_counts)
    for t in (6, 9, 12):
        x = torch.randn(2, t, 8)  # only the weights' gradients: x's size is not needed
        f(x).backward()
        grads = [p.grad.clone() for p in lin.parameters()]
        lin.zero_grad()
        fn(x).backward()
        torch.testing.assert_close(grads, [p.grad for p in lin.parameters()])
        lin.zero_grad()
    assert dict(fallback_counts) == before


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("start", [0, 1])
def test_backward_of_a_slice_with_an_int_step(backend, start):
    """``x[start::k] * 2`` with ``k`` an int argument (a SymInt from its second value on): the backward's
    ``slice_scatter`` took Python's ``%`` of the step (sympy's ``Mod(-1, k)``, which no printer prints), and the
    wrapper solved ``k`` from the size ``8 // k + 1`` by putting ``k = 0`` in it (ZeroDivisionError): both graphs ran
    in the FX interpreter. Values and gradients match eager, no fallback."""
    from coil.exc import fallback_counts

    fn = lambda x, k: x[start::k] * 2  # noqa: E731
    coil.reset()
    f = coil.compile(fn, options={"cpu_backend": backend})
    before = dict(fallback_counts)
    for k in (1, 2, 3):
        x = torch.randn(9, 4, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        out, ref = f(x, k), fn(xe, k)
        out.sum().backward(), ref.sum().backward()
        torch.testing.assert_close((out, x.grad), (ref, xe.grad))
    assert dict(fallback_counts) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_pool_and_mean_over_symbolic_sizes_generate_kernels(backend, tmp_path):
    """A CNN at a changing image size: ``max_pool2d`` took ``int()`` of its symbolic extents, and ``mean`` over the
    ``(H + 1) // 2`` rows of a strided view would not read a size with ``//`` in the kernel: both ran the ATen op
    (``dynamic_lowering_fallback``). Values and gradients match eager."""
    import json

    fn = lambda x: torch.nn.functional.max_pool2d(x[:, :, ::2], 3, 2, 1, ceil_mode=True).mean((2, 3))  # noqa: E731
    coil.trace.set_dir(str(tmp_path))
    try:
        f = _compiled(fn, backend)
        for h, w in ((8, 8), (11, 7)):
            x = torch.randn(2, 3, h, w, requires_grad=True)
            xe = x.detach().clone().requires_grad_()
            out, ref = f(x), fn(xe)
            out.sum().backward(), ref.sum().backward()
            torch.testing.assert_close((out, x.grad), (ref, xe.grad))
    finally:
        coil.trace.set_dir(None)
    events = [json.loads(line)["event"] for p in tmp_path.glob("*.jsonl") for line in p.open()]
    assert "stage" in events and not {"dynamic_lowering_fallback", "codegen_fallback"} & set(events)
    assert events.count("max_pool_lowered") == 2  # forward and backward


_NEGATIVE_DIVISIONS = {
    "ceil_slice": lambda x: x[:, : -(-x.shape[1] // 2)],
    "pad_to_multiple_ceil": lambda x: torch.nn.functional.pad(x, (0, -(-x.shape[1] // 8) * 8 - x.shape[1])),
    "pad_to_multiple_mod": lambda x: torch.nn.functional.pad(x, (0, (-x.shape[1]) % 8)),
    "center_pad": lambda x: torch.nn.functional.pad(x, ((8 - x.shape[1]) // 2, (9 - x.shape[1]) // 2)),
    "mixed_sign_slice": lambda x: x[:, (x.shape[1] - 7) // 2:],
    "ceil_repeat": lambda x: x.repeat(1, -(-8 // x.shape[1]))[:, :8],
    "select_negative": lambda x: x.t().select(0, -(x.shape[1] // 2)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(_NEGATIVE_DIVISIONS))
def test_floor_division_of_a_negative_size_expression(backend, name):
    """``-(-n // 8)`` and ``(-n) % 8`` in sizes: kernels printed them with C++'s and
    Triton's truncating ``/`` and ``%`` (loops of half the output, garbage rows, SIGFPE);
    a numerator <= 0 is now rewritten over a non-negative one, one of unknown sign
    (``(n - 7) // 2``) gets the floor remainder. No graph falls back (strict): Triton's
    index-width check handed ``(-n) % 8`` to torch's ``Mod``, which asserts ``a >= 0``."""
    fn = _NEGATIVE_DIVISIONS[name]
    f = _compiled(fn, backend, {"strict_codegen": True})
    for n in (7, 9, 4, 6, 5, 11):
        x = torch.arange(2.0 * n).view(2, n)
        out, ref = f(x), fn(x)
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref)


_DATA_DEPENDENT = {"capture_scalar_outputs": True, "capture_dynamic_output_shape_ops": True}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dim_marked_unbacked_that_broadcasting_pinned_raises_as_torch_compile(backend):
    """``x + y`` with x's dim 0 marked unbacked and y of 3 rows: the graph assumes x has 3
    rows. A call with 1 row (eager broadcasts) or 2 (eager raises) read out of bounds and
    returned garbage; it raises a runtime assertion now, as torch.compile does."""
    coil.reset()
    f = coil.compile(lambda x, y: x + y, options={"cpu_backend": backend})
    y = torch.zeros(3, 4)
    x = torch.randn(3, 4)
    coil.mark_unbacked(x, 0)
    torch.testing.assert_close(f(x, y), x + y)
    for n in (1, 2):
        x = torch.randn(n, 4)
        coil.mark_unbacked(x, 0)
        with pytest.raises(RuntimeError, match="runtime assertion failed"):
            f(x, y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_data_dependent_size_the_graph_pinned_is_checked(backend):
    """``x.nonzero().squeeze(1).float() + y`` assumes the count of nonzeros is ``len(y)``
    (the ShapeEnv replaced it by y's size), and ``arange(x.sum().item()) + y`` likewise:
    other counts returned garbage, and the second raised UnboundLocalError in the wrapper
    (the item rebound y's size symbol)."""
    for fn in (lambda x, y: x.nonzero().squeeze(1).float() + y,
               lambda x, y: torch.arange(x.sum().item()).float() + y):
        f = _compiled(fn, backend, _DATA_DEPENDENT)
        y = torch.zeros(3)
        x = torch.tensor([1, 1, 1, 0])
        torch.testing.assert_close(f(x, y), fn(x, y))
        for x in (torch.tensor([1, 0, 0, 0]), torch.tensor([1, 1, 0, 0])):
            with pytest.raises(RuntimeError, match="runtime assertion failed"):
                f(x, y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_boolean_mask_of_an_empty_tensor(backend):
    """``x[x > 0]`` of a (0, 3) tensor: its capture made no unbacked size, so AOT traced
    without a ShapeEnv and nonzero raised DynamicOutputShapeException."""
    fn = lambda x: x[x > 0]  # noqa: E731
    coil.reset()
    f = coil.compile(fn, options={"cpu_backend": backend, **_DATA_DEPENDENT})
    x = torch.randn(0, 3)
    assert f(x).shape == fn(x).shape == (0,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reshape_of_a_sliced_dynamic_dim_generates_kernels(backend):
    """``x[:, 1:].reshape(-1, 5).mean()``: unflattening the copy divided the whole size
    product by the earlier sizes, and sympy left ``5*(s - 1)/(5*s - 5)`` in the index,
    which no printer prints: the graph ran in the FX interpreter."""
    fn = lambda x: x[:, 1:].reshape(-1, 5).mean()  # noqa: E731
    f = _compiled(fn, backend, {"strict_codegen": True})
    for n in (6, 7, 9):
        x = torch.randn(2, n, 5)
        torch.testing.assert_close(f(x), fn(x))


@pytest.mark.parametrize("dynamic", [None, True])
def test_resize_of_an_input_runs_outside_the_graph(dynamic):
    """``x.resize_(2 * n)``: functionalization cannot grow a tensor, so the graph failed
    to compile (static) or hit an internal assert (dynamic). It is a logged graph break,
    as in torch.compile."""
    def fn(x):
        x.resize_(x.shape[0] * 2)
        return x.shape[0], x[:3] * 2

    coil.reset()
    f = coil.compile(fn, dynamic=dynamic)
    x = torch.randn(3)
    n, head = f(x)
    assert n == 6 and x.shape == (6,)
    torch.testing.assert_close(head, x[:3] * 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_write_at_a_position_compiles_twice(backend):
    """``kcache[:, pos] = q`` in a decode loop: torch's C++ indexing pins a symbolic
    ``pos`` to its value, so every position compiled again until the recompile limit (as
    in torch.compile). Symbolic ints in a basic index are ``select`` views now: one static
    and one dynamic graph; negative positions and reads ``x[..., i]`` too."""
    from coil.backends import lookup_backend

    def decode(q, kcache, pos):
        kcache[:, pos] = q
        return (q.unsqueeze(1) * kcache[:, : pos + 1]).sum(-1).softmax(-1), kcache[0, pos], kcache[..., -pos]

    graphs = []

    def counted(gm, example_inputs):
        graphs.append(gm)
        return lookup_backend("coil")(gm, example_inputs)

    coil.reset()
    f = coil.compile(decode, backend=counted, options={"cpu_backend": backend})
    ke, kc = torch.zeros(2, 16, 8), torch.zeros(2, 16, 8)
    for pos in range(1, 9):
        q = torch.randn(2, 8)
        for a, b in zip(decode(q, ke, pos), f(q, kc, pos)):
            torch.testing.assert_close(b, a)
        torch.testing.assert_close(kc, ke)
    assert len(graphs) == 2


def test_attention_output_is_contiguous_on_the_cpu_as_in_eager():
    """The dynamic graph's ``coil::sdpa`` fake gave CUDA's (B, L, H, D) memory order on
    the CPU too, where eager's kernels return it contiguous: ``o.view(2, -1)`` raised."""
    import torch.nn.functional as F
    fn = lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True)  # noqa: E731
    coil.reset()
    f = coil.compile(fn)
    for n in (5, 7, 9):
        q = torch.randn(2, 2, n, 8)
        out, ref = f(q), fn(q)
        assert out.stride() == ref.stride()
        torch.testing.assert_close(out.view(2, -1), ref.view(2, -1))


def test_attention_of_transposed_heads_has_eager_flash_layout_on_the_cpu():
    """The dynamic graph's ``coil::sdpa`` fake was contiguous on the CPU, where eager's flash kernel (equal head dims)
    returns q's layout: for heads split by a transpose ((B, L, H, D) memory) the strides differed from eager's."""
    import torch.nn.functional as F
    from coil.testing import assert_same_as_eager
    q, k, v = (torch.randn(2, 2, 2, 2).transpose(1, 2) for _ in range(3))
    with coil.config.patch(dynamic=True):
        assert_same_as_eager(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v))


def test_truth_of_a_size_does_not_pin_it():
    """``x * 2 if x.shape[0] else x * 3`` (also ``len(x)``, ``x.numel()``) pinned the size
    to its value: one graph per size. Sizes are >= 2 in a dynamic graph, so the truth is
    known; 0 and 1 have their own entries."""
    from coil.backends import lookup_backend

    for fn in (lambda x: x * 2 if x.shape[0] else x * 3, lambda x: x * 2 if len(x) else x * 3,
               lambda x: x * 2 if bool(x.numel()) else x * 3):
        graphs = []
        coil.reset()
        f = coil.compile(fn, backend=lambda gm, ex: graphs.append(gm) or lookup_backend("coil")(gm, ex))
        for n in (3, 5, 7, 4, 9, 0, 1):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), fn(x))
        assert len(graphs) == 4  # static 3, dynamic, 0, 1


_PINNED_BY_ATEN = {
    "max_pool1d": lambda x, s: torch.nn.functional.max_pool1d(x, 2),
    "max_pool1d_strided_padded": lambda x, s: torch.nn.functional.max_pool1d(x, 3, 2, 1, ceil_mode=True),
    "linspace": lambda x, s: torch.linspace(0, 1, x.shape[-1]) * x,
    "linspace_float64": lambda x, s: torch.linspace(-3, 5.5, x.shape[-1], dtype=torch.float64) + x,
    "sdpa_scale": lambda x, s: torch.nn.functional.scaled_dot_product_attention(
        x.mT, x.mT, x.mT, scale=s),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(_PINNED_BY_ATEN))
def test_sizes_and_floats_that_aten_pinned_stay_symbolic(backend, name):
    """``max_pool1d`` (ATen's C++ composite), ``linspace`` of a size and SDPA's ``scale=``
    float compiled once per length or value (fresh-user trial): two graphs now."""
    from coil.backends import lookup_backend

    fn, graphs = _PINNED_BY_ATEN[name], []
    coil.reset()
    f = coil.compile(fn, backend=lambda gm, ex: graphs.append(gm) or lookup_backend("coil")(gm, ex),
                     options={"cpu_backend": backend})
    for n in (3, 5, 7, 4, 9):
        x = torch.randn(1, 2, n, 4)[..., 0]
        torch.testing.assert_close(f(x, 0.1 * n), fn(x, 0.1 * n))
    assert len(graphs) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_sizes_only_a_data_dependent_view_or_a_merged_op_says(backend):
    """``y[:x.item()]``: the slice's length is a new unbacked size that no extern bound, and
    two ``masked_select`` of one mask (merged by CSE) left the second's size unbound: both
    ran in the FX interpreter (fresh-user trial). Strict codegen: no fallback now."""
    fns = (lambda x, y: y[:x.item()] * 2,
           lambda x, y: x.masked_select(x > 0).sum() + x.masked_select(x > 0).shape[0] + y.sum())
    for fn in fns:
        coil.reset()
        f = coil.compile(fn, options={"cpu_backend": backend, "strict_codegen": True, **_DATA_DEPENDENT})
        for v in (3, 5, 0, 8):
            x, y = torch.tensor(v) if fn is fns[0] else torch.randn(v + 1), torch.randn(8)
            torch.testing.assert_close(f(x, y), fn(x, y))


@pytest.mark.parametrize("backend", BACKENDS)
def test_matmul_over_an_unbacked_inner_dim(backend):
    """``x @ w`` with the inner dim marked unbacked on both: handing the operands to the
    extern ``mm`` sorted their strides, which cannot be ordered (``Eq(u1, 1)``), and the
    graph ran in the FX interpreter (fresh-user trial). Strict codegen: no fallback now."""
    coil.reset()
    f = coil.compile(lambda x, w: x @ w, options={"cpu_backend": backend, "strict_codegen": True})
    for n in (3, 5, 1):
        x, w = torch.randn(2, n), torch.randn(n, 2)
        coil.mark_unbacked(x, 1)
        coil.mark_unbacked(w, 0)
        torch.testing.assert_close(f(x, w), x @ w)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_interpolate_by_a_fractional_scale_factor(backend, mode, monkeypatch):
    """``interpolate(x, scale_factor=1.5)``'s output size is ``TruncToInt(1.5*ToFloat(s0))``:
    kernels could not print it and the graph ran in the FX interpreter (a warning). It is
    now a precomputed size (``ps0``) the wrapper computes in Python: one compiled graph
    for every size, eager's values and shapes, through strict codegen."""
    import torch.nn.functional as F
    import coil.codegen
    from coil.ir.symbols import PRECOMPUTED

    graphs, orig = [], coil.codegen.compile_aten_graph
    monkeypatch.setattr(coil.codegen, "compile_aten_graph", lambda *a: graphs.append(orig(*a)) or graphs[-1])
    fn = lambda x: F.interpolate(x, scale_factor=(1.5, 0.7), mode=mode) * 2  # noqa: E731
    f = _compiled(fn, backend, options={"strict_codegen": True})
    for n in (5, 7, 11, 16):
        x = torch.randn(2, 3, n, n + 1)
        got, exp = f(x), fn(x)
        assert got.shape == exp.shape
        torch.testing.assert_close(got, exp)
    assert len(graphs) == 1 and isinstance(graphs[0], coil.codegen.CompiledGraph), graphs
    assert any(type(e).__name__ == "TruncToInt" for e in PRECOMPUTED.values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_select_at_a_negative_index_of_a_computed_dynamic_tensor(backend):
    """``x.sin()[-1]``: the select's index is ``s0 - 1``, which the view's reindex passed
    to ``sympy.Integer``; code generation failed and the graph ran in the FX interpreter."""
    from coil.config import patch

    fns = [lambda x: x.sin()[-1], lambda x: (x.cos() * 2)[:, -1], lambda x: x.sin().unbind(0)[-1]]
    with patch(strict_codegen=True):
        for fn in fns:
            f = _compiled(fn, backend)
            for n in (3, 4, 6):
                x = torch.randn(n, 3)
                torch.testing.assert_close(f(x), fn(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_bound_from_an_item_across_a_graph_break(backend):
    """``n = int(x.max().item()); x[:n] * 3``: after the break, ``n`` is ``TruncToInt`` of the
    float the resume graph reads from a 0-d tensor input (a precomputed size). Code generation
    found no ShapeEnv (the graph's inputs have static sizes), then no binding for the float's
    symbol; the wrapper now reads it with ``.item()``. Values were right (FX interpreter)."""
    from coil.config import patch

    def f(x):
        n = int(x.max().item())
        return x[:n] * 3

    coil.reset()
    with patch(strict_codegen=True):
        cf = coil.compile(f, options={"cpu_backend": backend})
        for v in (2.0, 3.0, 1.0, 4.0, 2.5):
            x = torch.tensor([v, 1.0, 0.5, 0.2])
            torch.testing.assert_close(cf(x), f(x))


def _transposed_reshapes(g):
    B, _, T = g.shape
    return g.reshape(B * 2, T).t().reshape(T, B, 2) * 1


def _cat_merge_split(x):
    y = torch.cat([x, x * 3], -1)
    y = y.reshape(y.shape[0] * 4, y.shape[2])
    return y.reshape(4, y.shape[0] // 4, y.shape[1]) * 1


def _merge_then_cat_of_transposes(x):
    x = x.reshape(x.shape[0] * 2, x.shape[2])
    return torch.cat([x.t(), x.t() * 3], -1) * 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,make", [
    (_transposed_reshapes, lambda B, T: torch.arange(B * T * 2.).reshape(B, T, 2).transpose(1, 2)),
    (_cat_merge_split, lambda B, T: torch.arange(B * 4 * T, dtype=torch.float32).reshape(B, 4, T)),
    (_merge_then_cat_of_transposes,
     lambda B, T: torch.arange(B * 2 * T, dtype=torch.float32).reshape(2, B, T).permute(1, 0, 2)),
])
def test_view_chains_over_symbolic_and_static_sizes(fn, make, backend):
    """Index simplification took ``s*(2*M + h) // (2*s)`` for ``M + h/2`` (sympy's denominator of
    a sum is 1): wrong elements and reads past the end at the automatic-dynamic recompile, and
    an index ``1/2`` the C++ code generator could not print (a fallback) or Triton mis-typed."""
    from coil.config import patch

    coil.reset()
    with patch(strict_codegen=True):
        f = coil.compile(fn, options={"cpu_backend": backend})
        for B, T in [(2, 3), (3, 5), (4, 2)]:
            x = make(B, T)
            assert torch.equal(f(x), fn(x)), (B, T)


@pytest.mark.parametrize("backend", BACKENDS)
def test_multihead_attention_gradients_at_a_new_length(backend):
    """nn.MultiheadAttention's backward at a symbolic length packed q/k/v gradients with a
    wrongly simplified index: in_proj_weight.grad 2.6e30 off at T = 4, NaN at T = 5."""
    import copy

    torch.manual_seed(0)
    m1 = torch.nn.MultiheadAttention(8, 2, batch_first=True, bias=False)
    m2 = copy.deepcopy(m1)
    coil.reset()
    f = coil.compile(lambda x: m2(x, x, x, need_weights=False)[0], options={"cpu_backend": backend})
    for T in (3, 4, 5):
        x = torch.randn(2, T, 8)
        m1(x, x, x, need_weights=False)[0].pow(2).sum().backward()
        f(x).pow(2).sum().backward()
        torch.testing.assert_close(m2.in_proj_weight.grad, m1.in_proj_weight.grad, atol=1e-5, rtol=1e-4)
        m1.zero_grad()
        m2.zero_grad()


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [None, torch.float32])
def test_arange_with_a_symbolic_start_and_step(backend, dtype):
    """``arange(n, x.numel(), x.shape[1])`` under ``dynamic=True`` (reached through
    ``nn.EmbeddingBag`` with per-sample weights): the lowering took ``int(step)`` of a size
    expression and the graph fell back to the FX interpreter (user report 22)."""
    def fn(x):
        return torch.arange(x.shape[0], x.numel(), x.shape[1], dtype=dtype) * 2

    f = _compiled(fn, backend, {"strict_codegen": True})
    for shape in ((3, 4), (5, 2), (7, 3)):
        x = torch.zeros(shape)
        out = f(x)
        assert out.dtype == fn(x).dtype and torch.equal(out, fn(x)), shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_arange_with_a_negative_step_over_a_symbolic_size(backend):
    """``arange(n - 1, -1, -2)``'s length is ``(-n - 1) // -2``; the kernel's bound was
    rewritten for truncating division as if the divisor were positive (``-(s / -2) - 1``,
    3 for n = 8 where 4 is right) and the tail of the output stayed uninitialized."""
    def idx(x):
        return x[torch.arange(x.shape[0] - 1, -1, -2)]

    def count(x, n, step):
        return torch.arange(n, 0, step) + x

    f, g = _compiled(idx, backend), _compiled(count, backend)
    for n in (5, 7, 8, 9):
        x = torch.arange(float(n))
        torch.testing.assert_close(f(x), idx(x))
        for step in (-2, -3):
            torch.testing.assert_close(g(torch.zeros(()), n, step), count(torch.zeros(()), n, step))


def test_floor_safe_with_a_negative_divisor_matches_python():
    """floor_safe's rewrite of FloorDiv/Mod by a negative constant, evaluated with C's
    truncating ``/`` and ``%``, equals Python's floor semantics for numerators of both signs."""
    import sympy
    from coil.ir.symbols import FloorDiv, Mod, TruncDiv, TruncMod, floor_safe

    def c_eval(e, env):  # as a kernel prints it: FloorDiv and Mod as C's / and %
        if isinstance(e, (TruncDiv, FloorDiv)):
            a, b = c_eval(e.args[0], env), c_eval(e.args[1], env)
            return abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)
        if isinstance(e, (TruncMod, Mod)):
            a, b = c_eval(e.args[0], env), c_eval(e.args[1], env)
            return a - b * (abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1))
        if e.is_Integer:
            return int(e)
        if e.is_Symbol:
            return env[e]
        args = [c_eval(a, env) for a in e.args]
        out = args[0]
        for v in args[1:]:
            out = out + v if e.is_Add else out * v
        return out

    s = sympy.Symbol("s", integer=True, nonnegative=True)
    for num in (-s - 1, s - 7, s + 3):
        for b in (-2, -3):
            for kind, py in ((FloorDiv, lambda a, d: a // d), (Mod, lambda a, d: a % d)):
                e = floor_safe(kind(num, sympy.Integer(b)))
                for v in range(0, 12):
                    a = int(num.subs(s, v))
                    assert c_eval(e, {s: v}) == py(a, b), (kind.__name__, num, b, v, e)


@pytest.mark.parametrize("backend", BACKENDS)
def test_size_from_a_float_read_with_item(backend):
    """``zeros(int(x.sum().item()))`` under capture_scalar_outputs: the size is a precomputed
    symbol over the unbacked float ``zuf0``, which the wrapper bound at the call's start,
    before the ``.item()`` that defines it ran (a codegen fallback to the FX interpreter)."""
    from coil.exc import fallback_counts

    def fn(x):
        return torch.zeros(int(x.sum().item())) + x.mean()

    coil.reset()
    f = coil.compile(fn, options={"cpu_backend": backend, "capture_scalar_outputs": True})
    before = sum(fallback_counts.values())
    for vals in ([1.0, 2.0], [0.25, 0.5], [2.5, 3.4], [0.0, 0.0]):
        x = torch.tensor(vals)
        torch.testing.assert_close(f(x), fn(x))
    assert sum(fallback_counts.values()) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_from_a_float_argument_wraps_when_negative(backend):
    """``x[int(k)]`` once the float ``k`` became a graph input: the index is a precomputed
    symbol ``ps0 = trunc(zf0)``, which was assumed non-negative, so eager's wrap of a
    negative index was decided away without a guard and the kernel read ``x[-1]`` (out of
    bounds) for ``k = -1.5``."""
    def f(x, k):
        return x[int(k)] * 1, x[:, int(k)] * 1

    coil.reset()
    cf = coil.compile(f, options={"cpu_backend": backend})
    x = torch.arange(12.0).view(3, 4)
    for k in (1.2, 2.6, -1.5, -2.5, -3.0, 0.5):
        got, exp = cf(x, k), f(x, k)
        torch.testing.assert_close(got[0], exp[0])
        torch.testing.assert_close(got[1], exp[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_power_of_an_int_argument_is_computed_by_the_wrapper(backend):
    """``2 ** s`` (``PowByNatural``) could not be printed ('cannot print index expression 2**s') and the graph ran in
    the FX interpreter; it is now a precomputed size. A value past int64 (``3 ** 40``) recompiles and, as a Python
    int eager keeps exact, runs in the interpreter (warned)."""
    import warnings

    f = lambda x, s: x * 2 ** s + x.sum() * 3 ** s  # noqa: E731
    cf = coil.compile(f, options={"cpu_backend": backend})
    coil.reset()
    x = torch.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in (2, 3, 5, 20):
            torch.testing.assert_close(cf(x, s), f(x, s))
        assert not [w for w in caught if "code generation failed" in str(w.message)]
        torch.testing.assert_close(cf(x, 40), f(x, 40))
    assert coil.capture.stats["recompiles"] == 2, coil.capture.stats


def test_a_blocked_neighbour_gather_keeps_its_kernels_small(tmp_path):
    """BigBird's block-sparse attention (user report 68, finding 3): ``x.view(b, n // 16, -1, d)`` has a block
    size ``n // (n // 16)`` that the program pins to 16 (a guard), and the ``16 * (n // 16)`` of a view back is ``n``
    only under the guards. Kept apart, every view of a view of a ``cat`` added a layer of ``//`` and ``%`` (one
    kernel of BigBird was 11 MB, its graph compiled 100 s, ran 40x slower than static). The recompile at a second
    length now uses the pinned 16 and writes ``n`` as ``16 * (n // 16)``: 11,378 kernel characters before, 4,854."""
    import json

    def fn(x):
        b, n, d = x.shape
        xb = x.view(b, n // 16, -1, d)
        if xb.shape[2] != 16:
            raise ValueError("block size")
        nb = torch.cat([xb[:, :-2], xb[:, 1:-1], xb[:, 2:]], dim=2)
        s = (xb[:, 1:-1] @ nb.transpose(-1, -2)).softmax(-1) @ nb
        return torch.cat([xb[:, :1], s, xb[:, -1:]], dim=1).reshape(b, n, d) + x

    coil.reset()
    coil.trace.set_dir(str(tmp_path))
    try:
        f = coil.compile(fn, options={"cpu_backend": "cpp"})   # automatic dynamic: 256 static, then symbolic
        for n in (256, 320, 384):
            x = torch.randn(2, n, 8)
            torch.testing.assert_close(f(x), fn(x))
    finally:
        coil.trace.set_dir(None)
    records = [json.loads(line) for p in tmp_path.glob("*.jsonl") for line in p.open()]
    dynamic = [r["text"] for r in records if r["event"] == "artifact" and r.get("kind") == "cpp"
               and r["compile_id"].endswith("/1")]
    assert dynamic and sum(map(len, dynamic)) < 7000
