"""Regression tests for trial 79 (tests/user_reports/FINDINGS_79.md)."""
import copy

import pytest
import torch

import coil


# ---- finding #0: nested_compile_region in training, strided inputs and outputs --------------------------------------

@torch.compiler.nested_compile_region
def _f0_double(x):
    return x * 2


@torch.compiler.nested_compile_region
def _f0_slice_out(x):
    return (x * 2)[:, :2]   # a strided view of the region's own intermediate


@torch.compiler.nested_compile_region
def _f0_t_out(x):
    return (x * 2).t()


@torch.compiler.nested_compile_region
def _f0_expand_out(x):
    return x.sum(1, keepdim=True).expand(-1, 3)


def _f0_check(fn, x, events, **kw):
    """``fn`` compiled (regions cut, not inlined) against eager: values, strides and the gradient of ``x``."""
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref, out = fn(xe), coil.compile(fn, **kw)(xc)
    assert torch.equal(out, ref) and out.stride() == ref.stride()
    g = torch.randn_like(ref)
    ref.backward(g)
    out.backward(g)
    torch.testing.assert_close(xc.grad, xe.grad)
    assert events("region_split") and not events("region_inlined")


@pytest.mark.parametrize("view", [
    lambda x: x[:, :2], lambda x: x[1:, 1:], lambda x: x.diagonal(), lambda x: x[:1].expand(3, 3),
    lambda x: (x * 1)[:, :2], lambda x: _f0_double(x)[:, :2]],
    ids=["cols", "corner", "diagonal", "expand", "slice_of_intermediate", "slice_of_region_output"])
def test_f0_strided_view_into_region_in_training(view, trace_events):
    """A sliced, diagonal or expanded view passed into a region in training was read as if contiguous: the region's
    input fakes (non-leaves requiring grad) were made by ``clone()``, which lays a non-dense tensor out contiguously,
    so the region was compiled for strides its real input does not have."""
    _f0_check(lambda x: _f0_double(view(x)), torch.arange(9.).view(3, 3), trace_events)


@pytest.mark.parametrize("fn", [lambda x: _f0_slice_out(x) * 1, lambda x: _f0_t_out(_f0_expand_out(x))],
                         ids=["slice_out_then_mul", "expand_out_into_t_region"])
def test_f0_strided_region_output_consumed_by_next_op(fn, trace_events):
    """A strided region output read by the next piece: that piece was compiled for a contiguous input and read memory
    the region never wrote."""
    _f0_check(fn, torch.arange(6.).view(2, 3), trace_events)


@pytest.mark.parametrize("kw", [{"options": {"cpu_backend": "triton"}}, {"dynamic": True}], ids=["triton", "dynamic"])
def test_f0_slice_into_region_triton_and_dynamic(kw, trace_events, monkeypatch):
    if "options" in kw:
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    fn = lambda x: _f0_double(x[:, :2]) + _f0_slice_out(x)   # noqa: E731
    _f0_check(fn, torch.arange(6.).view(2, 3), trace_events, **kw)
    if "dynamic" in kw:   # another size through the same symbolic graph
        _f0_check(fn, torch.arange(20.).view(4, 5), trace_events, **kw)


class _F0Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(3, 3)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        return self.l(x)


def test_f0_linear_region_on_sliced_activations(trace_events):
    """The findings' realistic form: a decorated layer applied to ``h[:, :, :3]``; values and every gradient."""
    torch.manual_seed(0)
    m = _F0Layer()
    ref_m = copy.deepcopy(m)
    h = torch.randn(2, 4, 5)
    he, hc = h.clone().requires_grad_(), h.clone().requires_grad_()
    ref, out = ref_m(he[:, :, :3]), coil.compile(lambda t: m(t[:, :, :3]))(hc)
    torch.testing.assert_close(out, ref)
    ref.sum().backward()
    out.sum().backward()
    torch.testing.assert_close(hc.grad, he.grad)
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert not trace_events("region_inlined")

# ---- end of finding #0 ---------------------------------------------------------------------------------------------
