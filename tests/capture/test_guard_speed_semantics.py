"""The generated guard function (tensors checked in C++ batches, or one Python ``if``
per tensor where ``TensorGuards`` is missing; hoisted source prefixes; module attributes
read through ``__dict__``) decides exactly what the guard list decides: it fails on
every single change the list checks (dtype, device, shape, stride, requires_grad, a hook
on a submodule, a swapped parameter of other metadata, eps, train/eval), passes on a
swapped parameter of the same metadata, and recompile reasons still name the failing
condition (``GuardSet.failures`` evaluates the individual guards). Every test runs with
the batched C++ check and with the Python one (``batched`` fixture)."""
import re

import pytest
import torch
import torch.nn as nn

import coil
from coil.capture import guards as guards_mod
from coil.capture.frame import _caches


@pytest.fixture(autouse=True, params=["batched", "python"])
def batched(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(guards_mod, "_TensorGuards", None)
    elif guards_mod._TensorGuards is None:
        pytest.skip("torch._C._dynamo.guards.TensorGuards is not available")
    return request.param == "batched"


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


def test_baseline_passes_and_source_is_combined(batched):
    m, _, x, entry, fn = _compiled()
    assert _check(entry, fn, m, [x]) == (True, [])
    src = entry.guard_src
    lines = src.splitlines()
    # module dicts are read once per module, not once per entry, from its __dict__
    d = re.search(r"(___v\d+) = self\.__dict__\n", src).group(1)
    assert src.count(f"= {d}['_modules']\n") == 1 and "self._modules" not in src
    assert not re.search(r"___v\d+\.(_modules|_parameters|_buffers)", src)
    # the guard list still holds the stride check itself (recompile reasons name it)
    assert any(g.code.endswith(".stride() == (8, 1)") for g in entry.guards.guards)
    if batched:
        # no tensor is checked in Python: the input in one C++ call, before any module
        # state is read; the 9 parameters and buffers in another, once all are fetched
        assert ".shape ==" not in src and ".dtype is" not in src
        first_in = src.index("___tensors_args.check(___v0)")
        assert first_in < src.index("_forward_hooks")
        check = src[src.index("___tensors_attrs.check("):]
        assert check[:check.index("return False")].count("___v") == 8
        assert "# ___v0: ___tensors_args[0], Tensor torch.float32 cpu (4, 8) stride (8, 1) " \
            "requires_grad=False" in src
        # module constants and hook dicts are read from the instance __dict__, once a module
        bn = [ln for ln in lines if "= ___v4.__dict__" in ln]
        assert len(bn) == 1 and f"{bn[0].split()[0]}['eps']" in src
        assert "['_forward_hooks']" in src and not re.search(r"(___v\d+|self)\._forward_hooks", src)
        return
    # one if per tensor; contiguous strides of sizes >= 2 are read as is_contiguous()
    fc_w = [ln for ln in lines if ".shape == (6, 8)" in ln]
    assert len(fc_w) == 1
    assert all(k in fc_w[0] for k in ("type(", ".dtype is", ".device ==", ".shape ==",
                                      ".is_contiguous()", ".requires_grad is True"))
    assert ".stride() == (8, 1)" not in src
    # Linear(6, 1).weight is (1, 6): a size-1 dim, so its stride is compared as a tuple
    blk_w = [ln for ln in lines if ".shape == (1, 6)" in ln]
    assert len(blk_w) == 1 and ".stride() == (6, 1)" in blk_w[0]


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
    if torch.cuda.is_available():       # the GPU machine (torch 2.11): another device type
        cases["cuda"] = (x.cuda(), ".device ==")
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


def test_module_state_changes_fail_and_are_named():
    """train()/eval(), a forward in the instance __dict__, a parameter set to None, an
    attribute moved out of the instance __dict__: each fails the guard, named."""
    m, _, x, entry, fn = _compiled()
    edits = {
        "bn.train()": (lambda: m.bn.train(), lambda: m.bn.eval(), "['training']"),
        "train()": (lambda: m.train(), lambda: m.eval(), "['training']"),
        "forward in __dict__": (lambda: setattr(m, "forward", lambda x: x),
                                lambda: m.__dict__.pop("forward"), "'forward' not in"),
        "bias None": (lambda: setattr(m.fc, "bias", None),
                      lambda: setattr(m.fc, "bias", bias), "type("),
        "momentum not in __dict__": (lambda: m.bn.__dict__.pop("momentum"),
                                     lambda: setattr(m.bn, "momentum", 0.1), "['momentum']"),
    }
    bias = m.fc.bias
    for name, (do, undo, frag) in edits.items():
        do()
        try:
            ok, fails = _check(entry, fn, m, [x])
            assert not ok, name
            assert frag in fails[0], (name, fails)
        finally:
            undo()
        assert _check(entry, fn, m, [x]) == (True, []), name


def test_dispatch_key_change_fails_only_batched(batched):
    """An inference tensor has other dispatch keys than the tensor the graph was captured
    with: the C++ check rejects it and the reason names the keys guard; the Python check
    has no such guard and accepts it."""
    m, _, x, entry, fn = _compiled()
    with torch.inference_mode():
        xi = x.clone()
    ok, fails = _check(entry, fn, m, [xi])
    if batched:
        assert not ok and fails[0].startswith("___keys(args[0]) =="), fails
    else:
        assert ok


def test_batch_that_cannot_be_built_is_checked_in_python(monkeypatch, tmp_path, batched):
    """A TensorGuards that cannot be built (or rejects its examples) leaves the batch's
    tensors to the Python ``if``s, logged as a ``guard_batch`` decision."""
    if not batched:
        pytest.skip("the batched path only")
    import json

    from coil import trace

    class Refuses:
        def __init__(self, *ts, **kw):
            pass

        def check(self, *ts):
            return False

    monkeypatch.setattr(guards_mod, "_TensorGuards", Refuses)
    trace.set_dir(str(tmp_path))
    try:
        m, cm, x, entry, fn = _compiled()
        with torch.no_grad():
            torch.testing.assert_close(cm(x), m(x))
    finally:
        trace.set_dir(None)
    assert "___tensors" not in entry.guard_src and ".shape == (6, 8)" in entry.guard_src
    assert not any(g.batch for g in entry.guards.guards)
    assert _check(entry, fn, m, [x]) == (True, [])
    assert not _check(entry, fn, m, [x.double()])[0]
    recs = [json.loads(ln) for p in tmp_path.glob("*.jsonl") for ln in p.read_text().splitlines()]
    used = {(r["batch"], r["used"], r["reason"]) for r in recs if r.get("event") == "guard_batch"}
    assert used == {("___tensors_args", False, "rejects its example tensors"),
                    ("___tensors_attrs", False, "rejects its example tensors")}, used


def test_dynamic_input_batched_with_its_symbolic_dims_unchecked(batched):
    """An input with symbolic sizes is batched too, its symbolic sizes and strides left
    to the shape guards and ``is_contiguous()`` after the C++ check (a dynamic guard of
    three inputs cost 2.8x a static one's with Python checks); the module's parameters
    are batched as before."""
    coil.reset()
    m = Net().eval()
    cm = coil.compile(m, backend="eager", dynamic=True)
    with torch.no_grad():
        for n in (4, 6):
            x = torch.randn(n, 8)
            torch.testing.assert_close(cm(x), m(x))
    entry = _caches[cm._compiled_call._coil_code].entries[0]
    src = entry.guard_src
    assert ("___v0.dim() == 2" in src) != batched and ("___tensors_args" in src) == batched
    assert ("___tensors_attrs.check(" in src) == batched
    if batched:  # after the C++ check passed
        assert src.index("args[0].is_contiguous()") > src.index("___tensors_args.check(")
    fn = cm._compiled_call._coil_fn
    assert _check(entry, fn, m, [torch.randn(9, 8)])[0]
    assert not _check(entry, fn, m, [torch.randn(9, 7)])[0]
    assert not _check(entry, fn, m, [torch.randn(8, 9).t()])[0]   # not contiguous
    assert not _check(entry, fn, m, [torch.randn(9, 8, dtype=torch.float64)])[0]
    assert not _check(entry, fn, m, [torch.randn(9, 8, 1)])[0]
    assert not _check(entry, fn, m, [torch.randn(9, 8).requires_grad_()])[0]
    with torch.no_grad():
        m.fc._parameters["weight"] = nn.Parameter(torch.randn(6, 8).double())
    assert not _check(entry, fn, m, [torch.randn(9, 8)])[0]


def test_entry_hoists_every_prefix_of_a_module_tree_once():
    """The entry reads a nested module's parameters through one local per tree node (a
    MobileNet's 267 inputs were each a walk from the root: 45-107 µs per call)."""
    from coil.capture.guards import Hoister

    h, lines = Hoister("___i"), []
    a = h.hoist("self._modules['b']._modules['0']._parameters['weight']", lines, indent="")
    b = h.hoist("self._modules['b']._modules['0']._parameters['bias']", lines, indent="")
    c = h.hoist("self._modules['b']._modules['1.x']._buffers['m[0]']", lines, indent="")
    assert len(lines) == len(set(lines)) == 10, lines   # one line per tree node
    ns = {"self": torch.nn.Sequential()}
    ns["self"].add_module("b", torch.nn.ModuleDict({"0": torch.nn.Linear(2, 2)}))
    ns["self"].b._modules["1.x"] = torch.nn.Module()   # keys with '.' and '[' in them
    ns["self"].b._modules["1.x"].register_buffer("m[0]", torch.ones(1))
    exec("\n".join(lines), ns)
    assert ns[a] is ns["self"].b["0"].weight and ns[b] is ns["self"].b["0"].bias
    assert ns[c] is ns["self"].b._modules["1.x"]._buffers["m[0]"]


def test_default_dtype_is_guarded():
    """``torch.ones(2) + x.sum()`` takes the default dtype: after ``set_default_dtype(float64)`` the
    compiled function returned float32 (fresh-user trial). The default dtype is a guard."""
    def f(x):
        return torch.ones(2) + x.sum()

    x = torch.randn(3)
    cf = coil.compile(f)
    assert cf(x).dtype == torch.float32
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        out = cf(x)
        assert out.dtype == f(x).dtype == torch.float64
        torch.testing.assert_close(out, f(x))
    finally:
        torch.set_default_dtype(old)
    assert cf(x).dtype == torch.float32
