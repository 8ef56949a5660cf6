"""Minimal repros from a new-user trial of ~60 programs (static, dynamic and
``torch.compile(backend="coil")``, both kernel backends): an ``out=`` view that eager
resizes, ``torch.compile``'s ``options=``, the index a C++ bounds check reports, and the
hint of a graph break under ``fullgraph=True``. CPU only."""
import warnings

import pytest
import torch

import coil
from coil.exc import GraphBreakInFullgraph, KernelIndexError

BACKENDS = ["cpp", "triton"]


def _opts(backend):
    return {"cpu_backend": backend}


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_view_that_eager_resizes_runs_eagerly(backend):
    """``torch.mul(x, 2, out=o[:2])`` with 4 results: eager resizes the view over ``o``'s
    storage and writes 4 values (deprecated, it warns); the functionalized graph wrote
    back only the 2-element slice. The op now breaks the graph (runs eagerly); an
    ``out=`` of the right shape or an empty one stays in the graph."""
    def f(x, o):
        torch.mul(x, 2, out=o[:2])
        return o + 0

    def g(x):
        o = torch.empty(0)
        torch.mul(x, 2, out=o)
        return o + 1
    x = torch.arange(4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(coil.compile(f, options=_opts(backend))(x, torch.zeros(4)),
                                   f(x, torch.zeros(4)))
    torch.testing.assert_close(coil.compile(g, options=_opts(backend))(x), g(x))


def test_torch_compile_passes_its_options_to_coil():
    """``torch.compile(fn, backend="coil", options={...})`` raised ``TypeError: ...
    unexpected keyword argument 'options'``; the options are coil.config options for that
    compile, and an unknown one is named."""
    seen = []

    def spy(gm, example_inputs):
        seen.append(coil.config.config.cpu_backend)
        return gm.forward
    from coil.backends import registry
    f = torch.compile(lambda x: x.sin() + 1, backend="coil", options={"cpu_backend": "triton"})
    x = torch.randn(4)
    torch.testing.assert_close(f(x), x.sin() + 1)
    torch._dynamo.reset()
    orig = registry.lookup_backend
    registry.lookup_backend = lambda name: spy
    try:
        torch.compile(lambda x: x.cos(), backend="coil", options={"cpu_backend": "triton"})(x)
    finally:
        registry.lookup_backend = orig
    assert seen == ["triton"]
    torch._dynamo.reset()
    with pytest.raises(Exception, match="cpu_bakend"):
        torch.compile(lambda x: x.tan(), backend="coil", options={"cpu_bakend": "triton"})(x)


def test_cpp_bounds_check_reports_the_index_the_user_gave():
    """``x[idx]`` with ``idx = -6`` and 5 elements: the C++ check named -1 (the index
    after wrapping); eager names -6."""
    def g(x, idx):
        return x[idx] * 2
    cf = coil.compile(g, options=_opts("cpp"))
    cf(torch.randn(5), torch.tensor([0, 4]))
    with pytest.raises(KernelIndexError, match="index -6 is out of bounds"):
        cf(torch.randn(5), torch.tensor([-6]))


def test_fullgraph_break_hint_names_a_fix():
    """Under ``fullgraph=True`` the hint said "it runs outside the graph", which
    ``fullgraph`` forbids; it now names the option that keeps ``.item()`` in the graph
    and the fix for any break."""
    def f(x):
        return x * x.sum().item()
    with pytest.raises(GraphBreakInFullgraph) as ei:
        coil.compile(f, fullgraph=True)(torch.randn(3))
    msg = str(ei.value)
    assert "capture_scalar_outputs" in msg and "fullgraph=False" in msg
