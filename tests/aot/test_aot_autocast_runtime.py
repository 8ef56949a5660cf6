"""A compiled graph must not be autocast a second time at run time.

Found on an H200: LLaMA's rotary embedding turns autocast off and computes
``inv_freq @ position_ids`` in float32; the traced graph holds that as an fp32 ``bmm``.
Run under the caller's still-active ``torch.autocast``, the extern ``bmm`` came out bf16
(wrong dtype and precision), and a Triton kernel compiled for float32 failed."""
import torch

import coil


def f(x, w, inv):
    y = x @ w  # autocast: bf16
    with torch.autocast("cpu", enabled=False):
        fr = inv.float() @ x.float()[..., :1].transpose(-1, -2)  # float32 on purpose
    return y, fr.cos()


def test_graph_casts_are_not_applied_twice():
    x, w, inv = torch.randn(4, 16, 16), torch.randn(16, 16), torch.randn(8, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = f(x, w, inv)
        for backend in ("aot_eager", "coil"):
            coil.reset()
            out = coil.compile(f, backend=backend)(x, w, inv)
            for o, r in zip(out, ref):
                assert o.dtype == r.dtype, (backend, o.dtype, r.dtype)
                torch.testing.assert_close(o.float(), r.float(), atol=2e-2, rtol=2e-2)


def _break_inside_autocast(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
        print("graph break")
        y = y @ x
    return y


def test_graph_break_inside_autocast_does_not_leak_autocast():
    """The graph before a break inside ``with torch.autocast`` ends with an unmatched
    ``_enter_autocast``; AOT tracing executed it and left autocast on in the caller
    (found by the user-testing pass: tests/user_reports/test_user_reports_2.py)."""
    for backend in ("aot_eager", "coil"):
        coil.reset()
        f = coil.compile(_break_inside_autocast, backend=backend)
        x = torch.randn(4, 4)
        assert f(x).dtype == torch.bfloat16
        assert not torch.is_autocast_enabled("cpu"), backend
        assert (x @ x).dtype == torch.float32


def test_inference_path_outputs_do_not_require_grad():
    """A graph computed entirely under no_grad (capture emits _set_grad_enabled nodes)
    takes the inference path, but its ATen ops ran in the caller's grad mode:
    ``with torch.no_grad(): return x * 2`` came back with requires_grad=True (found by
    the capture helper; capture had worked around it)."""
    import operator
    import torch.fx as fx
    from coil.aot import aot_compile

    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(torch._C._set_grad_enabled, (False,))
    y = g.call_function(operator.mul, (x, 2))
    g.call_function(torch._C._set_grad_enabled, (True,))
    g.output((y,))
    gm = fx.GraphModule(torch.nn.Module(), g)
    x = torch.randn(3, requires_grad=True)
    out = aot_compile(gm, [x], lambda g, a: g)(x)
    assert not out[0].requires_grad
    torch.testing.assert_close(out[0], x.detach() * 2)
