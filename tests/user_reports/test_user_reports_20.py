"""Open defects from a new-user trial of ~1,100 programs (~6,000 program x mode checks: both
CPU backends, static, automatic dynamic, ``dynamic=True``, unbacked sizes, training). What it
found and was fixed has its regression test next to the fix (FINDINGS_20.md lists them); the
defects below were open as strict xfails, now fixed. CPU only."""
import pytest
import torch

import coil


def test_squeeze_of_an_unbacked_dim_that_is_one_at_runtime():
    """``x[mask].squeeze(0)``: the traced size is unbacked, assumed not 1 (size-oblivious), so
    the kept dim is a shape the graph planned; eager squeezes when one row is selected (fixed: a
    squeeze of an unbacked dim is a graph break)."""
    f = lambda x: x[x[:, 0] > 0].squeeze(0) * 1  # noqa: E731
    x = torch.tensor([[1.0, 2.0], [-1.0, 3.0]])
    out = coil.compile(f, options={"capture_dynamic_output_shape_ops": True})(x)
    assert out.shape == f(x).shape


def test_view_of_an_unbacked_size_that_does_not_divide_raises():
    """The ShapeEnv defers the check that 2 divides the unbacked size to runtime; nothing checked it there (fixed:
    the frame's entry checks deferred asserts over dims marked unbacked)."""
    x = torch.randn(5)
    coil.mark_unbacked(x, 0)
    with pytest.raises(RuntimeError):
        coil.compile(lambda x: x.view(-1, 2).sum(1))(x)


def test_torch_check_of_a_dim_marked_unbacked_is_checked_per_call():
    def f(x):
        torch._check(x.shape[0] % 2 == 0)
        return x * 2

    x = torch.randn(4)
    coil.mark_unbacked(x, 0)
    fc = coil.compile(f)
    torch.testing.assert_close(fc(x), f(x))
    with pytest.raises(RuntimeError, match="assertion failed"):
        fc(torch.randn(5))


def test_squeeze_of_an_unbacked_dim_in_torchs_graph_stays_in_it(dynamo_reset, monkeypatch):
    """torch's capture decided the graph: coil's graph break on the squeeze does not apply (no error)."""
    import torch._dynamo
    monkeypatch.setattr(torch._dynamo.config, "capture_dynamic_output_shape_ops", True)
    f = lambda x: x[x[:, 0] > 0].squeeze(0) * 1  # noqa: E731
    x = torch.tensor([[1.0, 2.0], [1.0, 3.0]])
    torch.testing.assert_close(torch.compile(f, backend="coil")(x), f(x))


def test_out_into_a_transposed_tensor_keeps_its_strides():
    """The output, a view of an intermediate written through ``out=``, is rebuilt from that
    intermediate at eager's strides (fixed)."""
    def f(x, y):
        o = torch.empty(4, x.shape[0]).t()
        return torch.add(x, y, out=o)

    def g(x):  # an in-place write into an intermediate, a view of it returned
        y = x * 2
        y.t()[1:3].mul_(3)
        return y.t()[1:], y.sum()

    x, y = torch.randn(5, 4), torch.randn(5, 4)
    out, ref = coil.compile(f)(x, y), f(x, y)
    assert out.stride() == ref.stride()
    torch.testing.assert_close(out, ref)
    out, ref = coil.compile(g)(x), g(x)
    assert out[0].stride() == ref[0].stride() and out[0].storage_offset() == ref[0].storage_offset()
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_index_add_with_a_negative_index_raises(backend):
    """torch's decomposition of index_add to index_put wrapped a negative index; coil's own is a
    scatter_add, which checks it as eager does (fixed)."""
    x, i = torch.arange(7.0), torch.tensor([-1, 2])
    f = lambda x, i: x.index_add(0, i, torch.ones(2), alpha=3)  # noqa: E731
    with pytest.raises(IndexError):
        coil.compile(f, options={"cpu_backend": backend})(x, i)
    i = torch.tensor([4, 4])
    torch.testing.assert_close(coil.compile(f, options={"cpu_backend": backend})(x, i), f(x, i))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_broadcast_of_a_symbolic_size_that_is_one(backend):
    """Dynamic fuzz s301 #886: ``where(log1p(c) == 2.5, log1p(c), c.unflatten(-1, (2, -1)))`` with c of
    2 elements under dynamic=True: the [2, s0 // 2] operand broadcast against [s0] was read at
    column 1 (-0.0 where eager has -2.0)."""
    def fn(c):
        v1 = torch.log1p(c)
        return torch.where(v1 == 2.5, v1, c.unflatten(-1, (2, -1)))

    c = torch.tensor([-2.0, -0.0])
    f = coil.compile(fn, dynamic=True, options={"cpu_backend": backend})
    torch.testing.assert_close(f(c), fn(c), equal_nan=True)
    with pytest.raises(RuntimeError):  # s0 // 2 == 3: neither 1 nor s0, eager raises too
        f(torch.randn(6))

    def g(x):  # the same through add's broadcast and an explicit expand
        v = x.view(2, -1)
        return v + x, v.expand(2, x.shape[0]) * 1
    x = torch.randn(2)
    torch.testing.assert_close(coil.compile(g, dynamic=True, options={"cpu_backend": backend})(x), g(x))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_an_index_out_of_bounds_names_the_users_line(backend):
    """The Triton bounds check named kernel symbols (``0 <= tmp1 < 5``); both backends now
    name the user's source line, as eager's error names the index."""
    def f(x, i):
        y = x * 2
        return y[i] + 1

    with pytest.raises(IndexError, match=r"test_user_reports_20.py:\d+ in f: return y\[i\] \+ 1"):
        coil.compile(f, options={"cpu_backend": backend})(torch.randn(5), torch.tensor([7]))


def test_a_failing_backend_is_reported_once():
    """``BackendCompilerFailed`` wrapped itself: the backend's name, the message and the advice
    came twice."""
    from coil.exc import BackendCompilerFailed

    def bad(gm, example_inputs):
        raise ValueError("nope")

    with pytest.raises(BackendCompilerFailed) as info:
        coil.compile(lambda x: x * 2, backend=bad)(torch.randn(3))
    text = str(info.value)
    assert text.count("failed to compile a graph") == 1 and text.count("what to do") == 1, text
    assert isinstance(info.value.inner, ValueError)


@pytest.mark.parametrize("view", ["split", "chunk", "unbind"])
def test_in_place_on_an_output_of_split_raises_as_eager(view):
    """``a, b = x.split(2); a.mul_(2)`` with x requiring grad: eager refuses an in-place op on
    one of several views an op returned; coil's rebuilt view (an as_strided) allowed it and
    returned gradients. The view is now marked as eager's is; reading it still differentiates."""
    def f(x):
        a, b = getattr(x, view)(2) if view != "unbind" else x.unbind(0)
        a.mul_(2)
        return (a + b).sum()

    def g(x):
        a, b = getattr(x, view)(2) if view != "unbind" else x.unbind(0)
        return (a * b).sum()

    x = torch.randn(4, requires_grad=True) if view != "unbind" else torch.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="returns multiple views"):
        f(x * 1)
    with pytest.raises(RuntimeError, match="returns multiple views"):
        coil.compile(f)(x * 1)
    coil.compile(g)(x * 1).backward()
    ref = x.grad.clone()
    x.grad = None
    g(x * 1).backward()
    torch.testing.assert_close(ref, x.grad)
