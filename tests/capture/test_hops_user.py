"""Higher-order operators used the way a torch.compile user writes them, compiled with
the C++ kernels and with Triton kernels (interpreter), compared with eager: values and,
where torch defines autograd, gradients (docs/hops.md)."""
import copy

import pytest
import torch
from torch._higher_order_ops import map as tmap
from torch._higher_order_ops import scan, while_loop
from torch.utils.checkpoint import checkpoint

import coil
from coil.exc import UserError

KERNELS = ["cpp", "triton"]


def _compile(fn, kernels, monkeypatch):
    if kernels == "triton":
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        return coil.compile(fn, options={"cpu_backend": "triton"})
    return coil.compile(fn)


def _leaves(x):
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _same(fn, args, kernels, monkeypatch, grad=False):
    """Run ``fn`` eagerly and compiled on copies of ``args``; compare outputs (values,
    dtypes, shapes, strides) and, with ``grad``, the gradients of the float args that
    require grad (cotangent: ones)."""
    ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    got_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    ref, got = fn(*ref_args), _compile(fn, kernels, monkeypatch)(*got_args)
    assert len(_leaves(ref)) == len(_leaves(got))
    for r, g in zip(_leaves(ref), _leaves(got)):
        torch.testing.assert_close(g, r)
        assert r.numel() <= 1 or g.stride() == r.stride()
    if grad:
        for out, ins in ((ref, ref_args), (got, got_args)):
            sum(t.sum() for t in _leaves(out) if t.requires_grad).backward()
        for r, g in zip(ref_args, got_args):
            if r.requires_grad:
                torch.testing.assert_close(g.grad, r.grad)


# ------------------------------------------------------------------ cond in a module

class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)

    def forward(self, x):
        return torch.cond(x.norm() > 3.0, lambda z: self.a(z).relu(),
                          lambda z: self.b(z) * 0.5, (x,))


@pytest.mark.parametrize("kernels", KERNELS)
def test_cond_tensor_predicate_in_module_forward(kernels, monkeypatch):
    torch.manual_seed(0)
    m = Gate()
    ref_m = copy.deepcopy(m)
    cm = _compile(m, kernels, monkeypatch)
    for scale in (0.1, 5.0):   # one call per branch
        x = torch.randn(2, 6) * scale
        outs = cm(x), ref_m(x)
        torch.testing.assert_close(*outs)
        torch.autograd.backward([o.sum() for o in outs])
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


# ------------------------------------------------------------------ while_loop, map

def _count_and_branch(n, x):
    def c(i, y):
        return i < n

    def b(i, y):
        return i + 1, torch.cond(i % 2 == 0, lambda t: t * 2, lambda t: t - 1, (y,))

    i, y = while_loop(c, b, (torch.tensor(0), x))
    return y + i, i


@pytest.mark.parametrize("kernels", KERNELS)
def test_while_loop_tensor_counter_with_cond(kernels, monkeypatch):
    for n in (0, 3, 4):
        _same(_count_and_branch, [torch.tensor(n), torch.randn(3)], kernels, monkeypatch)


def _newton_sqrt(a):
    def c(x, it):   # a data-dependent trip count
        return ((x * x - a).abs().max() > 1e-5) & (it < 50)

    def b(x, it):
        return (x + a / x) / 2, it + 1

    return while_loop(c, b, (a.clone(), torch.tensor(0)))


@pytest.mark.parametrize("kernels", KERNELS)
def test_while_loop_value_dependent_trip_count(kernels, monkeypatch):
    with torch.no_grad():
        _same(_newton_sqrt, [torch.rand(5) + 1], kernels, monkeypatch)


def _map_batch(xs, w):
    return tmap(lambda x, ww: ((x @ ww).sin() + x.sum(), x.max()), xs, w)


@pytest.mark.parametrize("kernels", KERNELS)
def test_map_over_a_batch(kernels, monkeypatch):
    with torch.no_grad():
        _same(_map_batch, [torch.randn(5, 2, 4), torch.randn(4, 3)], kernels, monkeypatch)
        _same(_map_batch, [torch.randn(4, 5, 2).permute(1, 2, 0), torch.randn(4, 3)],
              kernels, monkeypatch)   # xs not contiguous


# ------------------------------------------------------------------ scan

def _scan_carry_read_twice(x, w):
    def comb(c, xi):
        c2 = c * w + xi
        return c2, c2.sin()   # the new carry also feeds a y: torch saves it for backward

    return scan(comb, torch.zeros(3), x)


@pytest.mark.parametrize("kernels", KERNELS)
def test_scan_carry_also_read_by_the_body_grads(kernels, monkeypatch):
    """Regression: with grad, torch's scan autograd refused this body ("scan might be
    aliasing the input or the output!"), as torch.compile does; capture now clones a
    carry output the body also reads."""
    args = [torch.randn(5, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    _same(_scan_carry_read_twice, args, kernels, monkeypatch, grad=True)


# ------------------------------------------------------------------ checkpoint

class CkptMLP(torch.nn.Module):
    def __init__(self, d=16, n=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(),
                                torch.nn.Linear(2 * d, d)) for _ in range(n))
        self.out = torch.nn.Linear(d, 1)

    def forward(self, x):
        for b in self.blocks:
            x = x + checkpoint(b, x, use_reentrant=False)
        return self.out(x)


@pytest.mark.parametrize("kernels", KERNELS)
def test_checkpointed_mlp_three_sgd_steps(kernels, monkeypatch):
    torch.manual_seed(0)
    m = CkptMLP()
    ref_m = copy.deepcopy(m)
    xs, ys = [torch.randn(8, 16) for _ in range(3)], [torch.randn(8, 1) for _ in range(3)]
    for model, step in ((ref_m, ref_m), (m, _compile(m, kernels, monkeypatch))):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in zip(xs, ys):
            opt.zero_grad()
            torch.nn.functional.mse_loss(step(x), y).backward()
            opt.step()
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p, q)


# ------------------------------------------------------------------ regional compilation

class RegionBlock(torch.nn.Module):
    def __init__(self, d=12):
        super().__init__()
        self.norm, self.attn, self.ff = torch.nn.RMSNorm(d), torch.nn.Linear(d, d), \
            torch.nn.Linear(d, d)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        h = self.norm(x)
        x = x + torch.softmax(h @ h.transpose(-1, -2) / 3.0, -1) @ self.attn(h)
        return x + torch.nn.functional.silu(self.ff(x))


class SixLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Linear(5, 12)
        self.layers = torch.nn.ModuleList(RegionBlock() for _ in range(6))
        self.head = torch.nn.Linear(12, 2)

    def forward(self, x):
        x = self.emb(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_six_layer_region_compiles_once_and_matches_eager(tmp_path):
    import json

    from coil import trace

    torch.manual_seed(0)
    m = SixLayers()
    ref_m = copy.deepcopy(m)
    x = torch.randn(2, 7, 5)
    trace.set_dir(str(tmp_path))
    coil.reset()
    try:
        out = coil.compile(m)(x)
    finally:
        trace.set_dir(None)
    ref = ref_m(x)
    torch.testing.assert_close(out, ref)
    out.square().sum().backward()
    ref.square().sum().backward()
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
    events = [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.open()]
    compiled = [e for e in events if e["event"] == "region_compiled"]
    assert [(e["region"], e["calls"]) for e in compiled] == [("region_0", 6)]
    assert not [e for e in events if e["event"] in ("region_inlined", "graph_break")]


# ------------------------------------------------------------------ bad input

def _different_dtypes(x):
    return torch.cond(x.sum() > 0, lambda t: t.int(), lambda t: t + 1, (x,))


def _writes_closed_over(x):
    buf = torch.zeros(3, 3)

    def tb(t):
        buf.add_(1)
        return t + buf

    return torch.cond(x.sum() > 0, tb, lambda t: t * 1.0, (x,))


def _float_predicate(x):
    return torch.cond(x.sum(), lambda t: t + 1, lambda t: t - 1, (x,))


def _body_grows_carry(x):
    return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, torch.cat([y, y])),
                      (torch.tensor(0), x))


@pytest.mark.parametrize("fn, words", [
    (_different_dtypes, "dtype torch.int32"),
    (_writes_closed_over, "writes in place (add_)"),
    (_float_predicate, "got a torch.float32 tensor"),
    (_body_grows_carry, "leaves with shape (6, 3)"),
])
def test_bad_input_raises_at_the_user_line(fn, words):
    coil.reset()
    with pytest.raises(UserError) as info:
        coil.compile(fn)(torch.randn(3, 3))
    line = fn.__code__.co_firstlineno
    assert words in str(info.value)
    assert any(f"test_hops_user.py:{k}" in str(info.value) for k in range(line, line + 6))
