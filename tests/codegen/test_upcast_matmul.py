"""``config.matmul_float32_grads`` (coil/ir/upcast_matmul.py): an AMP weight gradient's bf16 product and its float32
cast become one float32-output product. ``aten.mm.dtype`` has CUDA kernels only; these tests give it a CPU kernel
(the float32 product of the bf16 operands, which is what cuBLAS accumulates) and allow the CPU device."""
import copy

import pytest
import torch

import coil
from coil import trace
import coil.ir.upcast_matmul as U


@pytest.fixture
def cpu_mm_dtype(monkeypatch):
    if getattr(torch.ops.aten.mm, "dtype", None) is None:
        pytest.skip("this torch has no aten.mm.dtype")
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("mm.dtype", lambda a, b, dt: torch.mm(a.float(), b.float()).to(dt), "CPU")
    monkeypatch.setattr(U, "DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(coil.config, "matmul_float32_grads", True)
    U._works.cache_clear()
    yield
    lib._destroy()
    U._works.cache_clear()


def _graph(n, users_out_too=False):
    """``_to_copy(mm(a, b), float32)`` over bf16 (16, 8) @ (8, n) fakes, returned (and the product too)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    mm = g.call_function(torch.ops.aten.mm.default, (a, b))
    cast = g.call_function(torch.ops.aten._to_copy.default, (mm,), {"dtype": torch.float32})
    g.output((cast, mm) if users_out_too else (cast,))
    with FakeTensorMode():
        a.meta["val"], b.meta["val"] = torch.empty(16, 8, dtype=torch.bfloat16), torch.empty(8, n, dtype=torch.bfloat16)
        mm.meta["val"] = a.meta["val"] @ b.meta["val"]
        cast.meta["val"] = mm.meta["val"].float()
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    gm.meta["coil_aot_graph"] = "backward"
    return gm


def _step(fn, lin, x):
    lin.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(x)
    out.float().square().mean().backward()
    return out.detach().clone(), lin.weight.grad.clone(), lin.bias.grad.clone()


def test_weight_gradient_is_one_float32_product(cpu_mm_dtype, tmp_path):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    x = torch.randn(32, 64)
    old = trace.trace_dir()
    trace.set_dir(str(tmp_path))
    try:
        got = _step(coil.compile(lin), lin, x)
    finally:
        trace.set_dir(old)
    events = [line for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()
              if '"matmul_float32_out"' in line]
    assert events, "the weight gradient's product was not rewritten"
    eager = _step(lin, lin, x)
    ref64 = copy.deepcopy(lin).double()
    exact = _step(ref64, ref64, x.double())
    for g, e, r in zip(got, eager, exact):
        assert g.dtype == e.dtype and g.shape == e.shape and g.stride() == e.stride()
        assert r.dtype == torch.float64
        err, eager_err = (g.double() - r).pow(2).mean().sqrt(), (e.double() - r).pow(2).mean().sqrt()
        assert err <= 1.5 * eager_err + 1e-6, (err, eager_err)
    # the weight gradient skips the bf16 rounding: closer to the float64 one than eager's (rms)
    assert (got[1].double() - exact[1]).pow(2).mean() < (eager[1].double() - exact[1]).pow(2).mean()


def test_left_alone_when_misaligned_or_read_by_more(cpu_mm_dtype):
    assert U.upcast_matmuls(_graph(24, users_out_too=True)) == 0   # the bf16 product is an output too
    assert U.upcast_matmuls(_graph(20)) == 0                        # N % 8 != 0: cuBLAS's unaligned kernels
    forward = _graph(24)
    forward.meta["coil_aot_graph"] = "forward"                      # a user sees its outputs: eager's rounding
    assert U.upcast_matmuls(forward) == 0
    gm = _graph(24)
    assert U.upcast_matmuls(gm) == 1
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [torch.ops.aten.mm.dtype]


def test_left_alone_where_mm_dtype_fails(monkeypatch):
    """Without a kernel for the device (this torch's CPU build has none), the probe fails and nothing changes."""
    monkeypatch.setattr(U, "DEVICES", ("cuda", "cpu"))
    U._works.cache_clear()
    if getattr(torch.ops.aten.mm, "dtype", None) is None or U._works(torch.device("cpu")):
        pytest.skip("this torch runs aten.mm.dtype on CPU")
    try:
        assert U.upcast_matmuls(_graph(24)) == 0
    finally:
        U._works.cache_clear()
