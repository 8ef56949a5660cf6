"""The generated guard function (one ``if`` per tensor, hoisted source prefixes,
``is_contiguous()`` for contiguous strides) decides exactly what the guard list
decides: it fails on every single change the list checks (dtype, device, shape,
stride, requires_grad, a hook on a submodule, a swapped parameter of other metadata),
passes on a swapped parameter of the same metadata, and recompile reasons still name
the failing condition (``GuardSet.failures`` evaluates the individual guards)."""
import torch
import torch.nn as nn

import coil
from coil.capture.frame import _caches


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 6)
        self.bn = nn.BatchNorm1d(6)
        self.blk = nn.Sequential(nn.Linear(6, 1), nn.ReLU())   # weight (1, 6): a size-1 dim

    def forward(self, x):
        return self.blk(self.bn(self.fc(x)))


def _compiled():
    coil.reset()
    m = Net().eval()
    cm = coil.compile(m, backend="eager")
    x = torch.randn(4, 8)
    with torch.no_grad():
        cm(x)
    code = cm._compiled_call._coil_code
    entry = _caches[code].entries[0]
    fn = cm._compiled_call._coil_fn
    return m, cm, x, entry, fn


def _check(entry, fn, m, args):
    """The generated function and the guard-by-guard evaluation agree; returns
    (passes, failure texts)."""
    bound = (m, tuple(args), {})
    with torch.no_grad():                # the mode the frame was compiled in (guarded)
        try:
            ok = bool(entry.guard(*bound, fn))
        except Exception:  # noqa: BLE001 - the wrapper counts a raising guard as a miss
            ok = False
        fails = entry.guards.failures(entry.argnames, bound + (fn,))
    assert ok == (not fails), (ok, fails)
    return ok, [f["guard"] for f in fails]


def test_baseline_passes_and_source_is_combined():
    m, _, x, entry, fn = _compiled()
    assert _check(entry, fn, m, [x]) == (True, [])
    src = entry.guard_src
    lines = src.splitlines()
    # one if per tensor; contiguous strides of sizes >= 2 are read as is_contiguous()
    fc_w = [ln for ln in lines if ".shape == (6, 8)" in ln]
    assert len(fc_w) == 1
    assert all(k in fc_w[0] for k in ("type(", ".dtype is", ".device ==", ".shape ==",
                                      ".is_contiguous()", ".requires_grad is True"))
    assert ".stride() == (8, 1)" not in src
    # the guard list still holds the stride check itself (recompile reasons name it)
    assert any(g.code.endswith(".stride() == (8, 1)") for g in entry.guards.guards)
    # Linear(6, 1).weight is (1, 6): a size-1 dim, so its stride is compared as a tuple
    blk_w = [ln for ln in lines if ".shape == (1, 6)" in ln]
    assert len(blk_w) == 1 and ".stride() == (6, 1)" in blk_w[0]
    # module dicts are read once per module, not once per entry
    assert src.count("= self._modules\n") == 1


def test_each_input_change_fails_and_is_named():
    m, _, x, entry, fn = _compiled()
    cases = {
        "dtype": (x.double(), ".dtype is"),
        "shape": (torch.randn(5, 8), ".shape =="),
        "stride": (torch.randn(8, 4).t(), ".stride() =="),
        "requires_grad": (x.clone().requires_grad_(), ".requires_grad is"),
        "device": (x.to("meta"), ".device =="),
        "type": (nn.Parameter(x.clone(), requires_grad=False), "type("),
    }
    if torch.backends.mkldnn.is_available():
        # type torch.Tensor, contiguous by is_contiguous(), strides (1, 0): stride guard fails
        cases["layout"] = (x.to_mkldnn(), ".stride() ==")
    for name, (v, frag) in cases.items():
        ok, fails = _check(entry, fn, m, [v])
        assert not ok, name
        assert fails and frag in fails[0], (name, fails)


def test_stride_change_same_shape_with_size_one_dims():
    m, _, x, entry, fn = _compiled()
    w = m.blk[0].weight
    old = w.data
    try:
        # (1, 6) weight with stride (1, 1) instead of (6, 1): contiguous, but a different stride
        w.data = torch.randn(6, 1).t()
        assert w.stride() != old.stride() and w.is_contiguous()
        ok, fails = _check(entry, fn, m, [x])
        assert not ok and ".stride() ==" in fails[0], fails
    finally:
        w.data = old
    assert _check(entry, fn, m, [x])[0]


def test_parameter_changes():
    m, _, x, entry, fn = _compiled()
    p = m.fc.weight
    edits = {
        "dtype": (lambda: nn.Parameter(p.detach().double()), ".dtype is"),
        "shape": (lambda: nn.Parameter(torch.randn(6, 9)), ".shape =="),
        "stride": (lambda: nn.Parameter(torch.randn(8, 6).t()), ".stride() =="),
        "requires_grad": (lambda: nn.Parameter(p.detach().clone(), requires_grad=False),
                          ".requires_grad is"),
        "device": (lambda: nn.Parameter(p.detach().to("meta")), ".device =="),
        "type": (lambda: p.detach().clone(), "type("),
    }
    for name, (make, frag) in edits.items():
        m.fc._parameters["weight"] = make()
        try:
            ok, fails = _check(entry, fn, m, [x])
            assert not ok, name
            assert frag in fails[0], (name, fails)
        finally:
            m.fc._parameters["weight"] = p
    # a swapped parameter of the same metadata passes (it is fetched on the next call)
    m.fc._parameters["weight"] = nn.Parameter(torch.randn(6, 8))
    assert _check(entry, fn, m, [x]) == (True, [])
    m.fc._parameters["weight"] = p
    # in-place metadata changes of the same object
    with torch.no_grad():
        p.requires_grad_(False)
        assert not _check(entry, fn, m, [x])[0]
        p.requires_grad_(True)
        assert _check(entry, fn, m, [x])[0]
    rm = m.bn._buffers["running_mean"]
    rm.resize_(7)
    assert not _check(entry, fn, m, [x])[0]
    rm.resize_(6)
    assert _check(entry, fn, m, [x])[0]


def test_hooks_and_module_swaps():
    m, _, x, entry, fn = _compiled()
    for mod in (m.blk[1], m.bn, m):
        h = mod.register_forward_hook(lambda *a: None)
        ok, fails = _check(entry, fn, m, [x])
        assert not ok and "_forward_hooks" in fails[0], fails
        h.remove()
        h = mod.register_forward_pre_hook(lambda *a: None)
        ok, fails = _check(entry, fn, m, [x])
        assert not ok and "_forward_pre_hooks" in fails[0], fails
        h.remove()
    assert _check(entry, fn, m, [x])[0]
    old = m.blk[1]
    m.blk._modules["1"] = nn.GELU()
    ok, fails = _check(entry, fn, m, [x])
    assert not ok and fails[0].startswith("type("), fails
    m.blk._modules["1"] = old
    m.bn.eps = 1e-3
    ok, fails = _check(entry, fn, m, [x])
    assert not ok and "eps" in fails[0], fails
    m.bn.eps = 1e-5
    assert _check(entry, fn, m, [x])[0]


def test_recompile_reason_names_condition(capsys):
    coil.reset()
    m = Net().eval()
    cm = coil.compile(m, backend="eager")
    x = torch.randn(4, 8)
    with coil.config.patch(verbose=True), torch.no_grad():
        cm(x)
        ref = m(x)
        torch.testing.assert_close(cm(x), ref)
        m.fc.weight.requires_grad_(False)
        torch.testing.assert_close(cm(x), m(x))
        m.fc.weight.requires_grad_(True)
        xt = x.t().contiguous().t()                          # (4, 8) with stride (1, 4)
        torch.testing.assert_close(cm(xt), m(xt))
    text = capsys.readouterr().out
    assert "recompiling" in text
    assert ".requires_grad is True" in text and "expected True, got False" in text
    assert ".stride() == (8, 1)" in text
