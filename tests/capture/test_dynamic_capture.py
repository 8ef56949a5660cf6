"""Dynamic shapes in coil's capture (docs/dynamic_shapes.md): symbolic input sizes
(``dynamic=True``, automatic dynamic, ``coil.mark_dynamic``), sizes used as Python ints,
0/1 specialization, shape guards, marks and their errors. Every result is compared with
eager; compiles are counted at the backend (``eager`` and ``aot_eager``)."""
import json
import os

import pytest
import torch

import coil
from coil import trace
from coil.backends import lookup_backend
from coil.capture.frame import _caches
from coil.exc import UserError

BACKENDS = ["eager", "aot_eager"]


class Counting:
    """A registered backend that counts the graphs it compiles."""

    def __init__(self, name):
        self.inner = lookup_backend(name)
        self.graphs = []
        self.__name__ = f"counting_{name}"

    def __call__(self, gm, example_inputs):
        self.graphs.append((gm, list(example_inputs)))
        return self.inner(gm, example_inputs)

    @property
    def n(self):
        return len(self.graphs)


def _entries(fn):
    return sum(len(c.entries) for c in _caches.values())


def _records(log_dir) -> list:
    out = []
    for name in os.listdir(log_dir):
        with open(os.path.join(log_dir, name)) as fh:
            out += [json.loads(line) for line in fh]
    return out


@pytest.fixture(autouse=True)
def _fresh():
    coil.reset()
    yield
    coil.reset()


def _mlp(x, w):
    h = (x @ w).relu()
    return h.view(x.shape[0], h.shape[1] // 2, -1).sum(1) * x.size(0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_sizes_2_to_9_one_dynamic_compile(backend):
    cnt = Counting(backend)
    f = coil.compile(_mlp, backend=cnt, dynamic=True)
    w = torch.randn(8, 6)
    for b in range(2, 10):
        x = torch.randn(b, 8)
        torch.testing.assert_close(f(x, w), _mlp(x, w))
    assert cnt.n == 1
    ph = [n for n in cnt.graphs[0][0].graph.nodes if n.op == "placeholder"]
    vals = [n.meta["example_value"] for n in ph]
    # placeholders are FakeTensors with SymInt sizes, SymInt placeholders for sizes used as ints
    assert any(isinstance(v, torch.SymInt) for v in vals)
    assert any(isinstance(v, torch.Tensor) and isinstance(v.shape[0], torch.SymInt) for v in vals)
    ex = cnt.graphs[0][1]
    assert all(type(e) in (int, torch.Tensor) for e in ex)


@pytest.mark.parametrize("backend", BACKENDS)
def test_automatic_dynamic_recompiles_once(backend, tmp_path):
    cnt = Counting(backend)
    f = coil.compile(_mlp, backend=cnt)
    w = torch.randn(8, 6)
    trace.set_dir(str(tmp_path))
    try:
        for b in range(2, 10):
            x = torch.randn(b, 8)
            torch.testing.assert_close(f(x, w), _mlp(x, w))
    finally:
        trace.set_dir(None)
    assert cnt.n == 2                      # static first, then one dynamic graph
    recs = _records(tmp_path)
    dyn = [r for r in recs if r.get("event") == "dynamic_dim"]
    assert dyn and all(r["reason"] == "automatic" for r in dyn)
    assert {(r["source"], r["dim"]) for r in dyn} == {("x", 0)}
    guards = [r for r in recs if r.get("name") == "guards"]
    assert any("x.size()[0]" in r["text"] or "___z" in r["text"] for r in guards)


def test_dynamic_false_recompiles_each_size():
    cnt = Counting("eager")
    f = coil.compile(lambda x: x * 2, backend=cnt, dynamic=False)
    for b in range(2, 5):
        f(torch.randn(b))
    assert cnt.n == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_last_partial_batch(backend):
    cnt = Counting(backend)
    lin = torch.nn.Linear(5, 3)
    f = coil.compile(lambda x: torch.log_softmax(lin(x), -1).mean(0), backend=cnt)
    data = torch.randn(29, 5)
    for i in range(0, 29, 8):
        x = data[i:i + 8]
        torch.testing.assert_close(f(x), torch.log_softmax(lin(x), -1).mean(0))
    assert cnt.n == 2                      # 8 (static), 5 (dynamic)
    f(data[:3])
    assert cnt.n == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_sizes_0_and_1_are_their_own_entries(backend):
    cnt = Counting(backend)
    f = coil.compile(lambda x: (x + 1).sum(0), backend=cnt, dynamic=True)
    for n in (4, 7, 1, 0, 1, 0, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(f(x), (x + 1).sum(0))
    assert cnt.n == 3                      # n >= 2, n == 1, n == 0


def test_size_one_broadcasting_stays_static():
    """A size-1 dim broadcasts; a symbolic one (>= 2) would not: 1 is its own entry."""
    cnt = Counting("eager")
    f = coil.compile(lambda x, y: x + y, backend=cnt, dynamic=True)
    y = torch.randn(5, 3)
    for n in (5, 1):
        x = torch.randn(n, 3)
        torch.testing.assert_close(f(x, y), x + y)
    assert cnt.n == 2


def test_alternating_sizes_at_most_two_entries():
    cnt = Counting("eager")
    f = coil.compile(lambda x: x.cumsum(0), backend=cnt)
    for n in (4, 6, 4, 6, 4, 11, 4, 6):
        x = torch.randn(n)
        torch.testing.assert_close(f(x), x.cumsum(0))
    assert cnt.n == 2
    assert _entries(f) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_shape_arithmetic_in_views(backend):
    def fn(x):
        b, t, c = x.shape
        h = x.view(b, t, 2, c // 2).transpose(1, 2)
        return h.reshape(b * 2, t, -1).mean(1) + x.size(1) * 4 + len(x)

    cnt = Counting(backend)
    f = coil.compile(fn, backend=cnt, dynamic=True)
    for shape in ((2, 3, 4), (3, 5, 8), (4, 7, 6)):
        x = torch.randn(shape)
        torch.testing.assert_close(f(x), fn(x))
    assert cnt.n == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_reductions_over_dynamic_dims(backend):
    def fn(x):
        return x.sum(0), x.mean(1), x.softmax(-1), x.amax((0, 1)), x.var(0)

    cnt = Counting(backend)
    f = coil.compile(fn, backend=cnt, dynamic=True)
    for shape in ((2, 3), (5, 9), (7, 4)):
        x = torch.randn(shape)
        for a, b in zip(f(x), fn(x)):
            torch.testing.assert_close(a, b)
    assert cnt.n == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_slices_of_a_larger_tensor(backend):
    emb = torch.nn.Embedding(50, 4)

    def fn(ids):
        return emb(ids).sum(1)

    cnt = Counting(backend)
    f = coil.compile(fn, backend=cnt)
    ids = torch.randint(0, 50, (3, 16))
    for L in range(3, 12):
        x = ids[:, :L]
        torch.testing.assert_close(f(x), fn(x))
    assert cnt.n == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_with_dynamic_sizes(backend):
    w = torch.randn(6, 4, requires_grad=True)

    def fn(x):
        return ((x @ w).tanh() * x.shape[0]).sum()

    cnt = Counting(backend)
    f = coil.compile(fn, backend=cnt, dynamic=True)
    for n in (3, 5, 8):
        x = torch.randn(n, 6, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        w.grad = None
        f(x).backward()
        gw = w.grad.clone()
        w.grad = None
        fn(x2).backward()
        torch.testing.assert_close(x.grad, x2.grad)
        torch.testing.assert_close(gw, w.grad)
    assert cnt.n == 1


def test_python_control_flow_on_a_size_guards():
    def fn(x):
        if x.shape[0] > 4:
            return x * 2
        return x - 1

    cnt = Counting("eager")
    f = coil.compile(fn, backend=cnt, dynamic=True)
    for n in (5, 6, 9, 3, 2, 4):
        x = torch.randn(n)
        torch.testing.assert_close(f(x), fn(x))
    assert cnt.n == 2                      # one graph for > 4, one for <= 4


def test_range_over_a_size_specializes_with_the_user_line(tmp_path):
    def fn(x):
        out = x[0]
        for i in range(x.size(0)):
            out = out + x[i]
        return out

    cnt = Counting("eager")
    f = coil.compile(fn, backend=cnt, dynamic=True)
    trace.set_dir(str(tmp_path))
    try:
        for n in (3, 3, 4):
            x = torch.randn(n, 2)
            torch.testing.assert_close(f(x), fn(x))
    finally:
        trace.set_dir(None)
    assert cnt.n == 2
    spec = [r for r in _records(tmp_path) if r.get("event") == "specialization"]
    assert spec and __file__ in spec[0]["user_line"]


def test_mark_dynamic_compiles_symbolic_from_the_first_call(tmp_path):
    cnt = Counting("eager")
    f = coil.compile(lambda x: x.sum(1), backend=cnt)
    trace.set_dir(str(tmp_path))
    try:
        for n in (3, 5, 7):
            x = torch.randn(4, n)
            coil.mark_dynamic(x, 1)
            torch.testing.assert_close(f(x), x.sum(1))
    finally:
        trace.set_dir(None)
    assert cnt.n == 1
    dyn = [r for r in _records(tmp_path) if r.get("event") == "dynamic_dim"]
    assert [(r["dim"], r["reason"]) for r in dyn] == [(1, "marked")]


def test_mark_static_under_dynamic_true():
    cnt = Counting("eager")
    f = coil.compile(lambda x: x.sum(1), backend=cnt, dynamic=True)
    for n in (3, 5):
        x = torch.randn(n, 4)
        coil.mark_static(x, 0)
        torch.testing.assert_close(f(x), x.sum(1))
    assert cnt.n == 2


def test_mark_dynamic_range_error_names_dim():
    f = coil.compile(lambda x: x * 2, backend="eager")
    x = torch.randn(3, 100)
    coil.mark_dynamic(x, 1, min=2, max=64)
    with pytest.raises(UserError, match=r"dim 1 of x.*\[2, 64\]"):
        f(x)


def test_marked_dim_forced_constant_raises_with_user_line():
    def fn(x):
        return x + torch.ones(8)          # forces x.shape[0] == 8

    f = coil.compile(fn, backend="eager")
    x = torch.randn(8)
    coil.mark_dynamic(x, 0)
    with pytest.raises(UserError) as e:
        f(x)
    msg = str(e.value)
    assert "dim 0 of x" in msg and "constant 8" in msg and __file__ in msg


def test_recompile_on_violated_shape_guard_names_it():
    cnt = Counting("eager")

    def fn(x, y):
        return x + y

    f = coil.compile(fn, backend=cnt, dynamic=True)
    f(torch.randn(3), torch.randn(3))
    f(torch.randn(5), torch.randn(5))
    assert cnt.n == 1
    e = next(iter(_caches.values())).entries[0]
    assert "___z" in e.guard_src
    fails = e.guards.failures(e.argnames, (torch.randn(4), torch.randn(5), fn))
    assert fails and "size()" in fails[0]["text"]
    x, y = torch.randn(4, 1), torch.randn(5)          # broadcasting is another entry
    torch.testing.assert_close(f(x, y), x + y)


# ------------------------------------------------------------------ symbolic scalars


@pytest.mark.parametrize("backend", BACKENDS)
def test_changing_float_and_int_arguments_are_graph_inputs(backend):
    def fn(x, temperature, n):
        return (x / temperature).softmax(-1) * n + temperature * 2

    cnt = Counting(backend)
    f = coil.compile(fn, backend=cnt)
    x = torch.randn(3, 5)
    for t, n in [(0.5, 3), (0.7, 4), (1.5, 5), (2.25, 7), (0.1, 9), (0.5, 2)]:
        torch.testing.assert_close(f(x, t, n), fn(x, t, n))
    assert cnt.n == 2                      # constants first, then inputs
    gm = cnt.graphs[-1][0]
    assert any(n.op == "call_method" and n.target == "item" for n in gm.graph.nodes)


def test_dynamic_true_float_argument_compiles_once():
    cnt = Counting("aot_eager")
    f = coil.compile(lambda x, lr: x - lr * x.sin(), backend=cnt, dynamic=True)
    x = torch.randn(4)
    for lr in (0.1, 0.01, 0.3):
        torch.testing.assert_close(f(x, lr), x - lr * x.sin())
    assert cnt.n == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_item_result_passed_to_the_resume_function(backend):
    def fn(x):
        s = x.sum().item()                 # graph break; s is an argument of the resume
        return x * s + 1

    cnt = Counting(backend)
    f = coil.compile(fn, backend=cnt)
    for _ in range(6):
        x = torch.randn(4)
        torch.testing.assert_close(f(x), fn(x))
    assert cnt.n <= 3                      # the first graph, the resume static then symbolic


def test_random_random_value_does_not_recompile():
    import random

    def fn(x):
        p = random.random()
        return x * p

    cnt = Counting("eager")
    f = coil.compile(fn, backend=cnt)
    random.seed(0)
    outs = [f(torch.ones(2)) for _ in range(6)]
    random.seed(0)
    refs = [fn(torch.ones(2)) for _ in range(6)]
    for a, b in zip(outs, refs):
        torch.testing.assert_close(a, b)
    assert cnt.n <= 2


# ------------------------------------------------------------------ guard function


def _dyn_entry():
    def fn(x, y, w):
        return (x @ w + y).relu()

    f = coil.compile(fn, backend="eager", dynamic=True)
    f(torch.randn(8, 16), torch.randn(8, 32), torch.randn(16, 32))
    return fn, next(iter(_caches.values())).entries[0]


def test_dynamic_guard_reads_each_shape_once():
    """The per-call cost: one ``x.shape`` per dynamic tensor, no stride relation for a
    contiguous input (its ``is_contiguous()`` check implies them)."""
    _, e = _dyn_entry()
    src = e.guard_src
    assert src.count("x.shape") == 1 and ".stride()" not in src and ".size()" not in src
    assert "(2 <= ___z" in src


@pytest.mark.parametrize("args", [
    lambda: (torch.randn(5, 16), torch.randn(5, 32), torch.randn(16, 32)),      # passes
    lambda: (torch.randn(1, 16), torch.randn(1, 32), torch.randn(16, 32)),      # 0/1
    lambda: (torch.randn(5, 16), torch.randn(4, 32), torch.randn(16, 32)),      # relation
    lambda: (torch.randn(5, 16, 1), torch.randn(5, 32), torch.randn(16, 32)),   # rank
    lambda: (torch.randn(16, 5).t(), torch.randn(5, 32), torch.randn(16, 32)),  # strides
    lambda: (torch.randn(5, 16), torch.randn(5, 32), torch.randn(12, 32)),      # matmul
])
@pytest.mark.parametrize("warm", [False, True])
def test_dynamic_guard_function_agrees_with_guard_list(args, warm):
    """Also after the shape memo holds passing calls of (5, 16) and (4, 16) inputs: a
    transposed (5, 16) input or a broken relation must still fail."""
    fn, e = _dyn_entry()
    if warm:
        for n in (5, 4):
            assert e.guard(torch.randn(n, 16), torch.randn(n, 32), torch.randn(16, 32), fn)
    bound = args() + (fn,)
    for _ in range(2):  # the second call may be a memo hit
        try:
            ok = bool(e.guard(*bound))
        except Exception:  # noqa: BLE001 - a raising guard is a miss
            ok = False
        fails = e.guards.failures(e.argnames, bound)
        assert ok == (not fails), (ok, fails)


def test_shape_memo_stops_keeping_sizes_that_keep_changing():
    fn, e = _dyn_entry()
    assert "___memo.last.check(x, y, w)" in e.guard_src
    for n in range(2, 40):
        assert e.guard(torch.randn(n, 16), torch.randn(n, 32), torch.randn(16, 32), fn)
    memo = e.guards.ns["___memo"]
    assert memo.kept == [] and not e.guard(torch.randn(7, 16), torch.randn(6, 32), torch.randn(16, 32), fn)
    assert e.guard(torch.randn(7, 16), torch.randn(7, 32), torch.randn(16, 32), fn)


# ------------------------------------------------------------------ the whole pipeline


class _Block(torch.nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.h) ** 0.5)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


def _transformer():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(100, 32), _Block(), _Block(),
                               torch.nn.LayerNorm(32), torch.nn.Linear(32, 100)).eval()


def _run_lengths(cpu_backend, lengths, mark):
    from coil import exc

    m = _transformer()
    cnt = Counting("coil")
    cm = coil.compile(m, backend=cnt, options={"cpu_backend": cpu_backend})
    before = sum(exc.fallback_counts.values())
    with torch.no_grad():
        for T in lengths:
            ids = torch.randint(0, 100, (2, T))
            if mark:
                coil.mark_dynamic(ids, 1)
            torch.testing.assert_close(cm(ids), m(ids), atol=1e-4, rtol=1e-4)
    assert sum(exc.fallback_counts.values()) == before        # generated kernels ran
    return cnt.n


@pytest.mark.parametrize("mark", [True, False])
def test_transformer_lengths_cpp(mark):
    n = _run_lengths("cpp", (7, 33, 128, 500), mark)
    assert n == (1 if mark else 2)        # marked: one dynamic graph; else static 7 + one


def test_transformer_lengths_triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _run_lengths("triton", (7, 33, 61), True) == 1


@pytest.mark.slow
def test_transformer_lengths_triton_long(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _run_lengths("triton", (7, 33, 128, 500), True) == 1


# ------------------------------------------------------------------ sizes as Python numbers

import math  # noqa: E402

import torch.nn.functional as F  # noqa: E402

SIZE_PROGRAMS = {
    "math_prod": lambda x: x.view(x.shape[0], math.prod(x.shape[1:])),
    "int_of_division": lambda x: x[: int(x.shape[0] / 2)],
    "new_zeros": lambda x: x.new_zeros(x.size(0), 4) + x.sum(),
    "factory": lambda x: torch.zeros(x.shape[0], 3) + x[:, :1],
    "arange": lambda x: torch.arange(x.size(1)) * x,
    "reshape_last": lambda x: x.reshape(-1, x.shape[-1]),
    "expand": lambda x: x[None].expand(x.size(0), -1, -1),
    "slice_half": lambda x: x[:, : x.size(1) // 2],
    "split": lambda x: torch.split(x, x.size(1) // 2, dim=1)[0],
    "size_returned": lambda x: (x * 2, x.shape[0] * 2, x.shape),
    "tuple_list": lambda x: x.view(*tuple(x.shape)) + len(list(x.shape)),
    "max_of_sizes": lambda x: x[: max(x.size(0) - 1, 2)],
    "numel": lambda x: x.sum() / x.numel(),
    "float_power": lambda x: x * (x.shape[1] ** -0.5),
    "math_sqrt": lambda x: x / math.sqrt(x.size(-1)),
    "negative_index": lambda x: x.view(x.shape[-2] * x.shape[-1]),
    "pad_to_multiple": lambda x: F.pad(x, (0, 8 - x.shape[1] % 8)),
    "full": lambda x: torch.full((x.shape[0],), x.shape[1]) + x.sum(1),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SIZE_PROGRAMS))
def test_sizes_in_python_stay_symbolic(name, backend):
    fn = SIZE_PROGRAMS[name]
    cnt = Counting(backend)
    f = coil.compile(fn, backend=cnt, dynamic=True)
    for shape in ((4, 4), (5, 8), (7, 16)):    # (x.size(0) // 2 >= 2: no 0/1 case)
        x = torch.randn(shape)
        got, want = f(x), fn(x)
        if isinstance(got, tuple):
            assert got[1:] == want[1:] and type(got[2]) is torch.Size
            got, want = got[0], want[0]
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
    assert cnt.n == 1


# ------------------------------------------------------------------ unbacked sizes

UNBACKED_OPTS = {"capture_scalar_outputs": True, "capture_dynamic_output_shape_ops": True}

UNBACKED_PROGRAMS = {
    "nonzero": lambda x: x.nonzero() * 2,
    "masked_select": lambda x: torch.masked_select(x, x > 0).sum() + x.masked_select(x > 0.5).numel(),
    "bool_mask_index": lambda x: x[x > 0] + 1,
    "item_in_arithmetic": lambda x: x * x.sum().item(),
    "check_is_size": lambda x: (lambda n: (torch._check_is_size(n), torch.ones(n))[1])(
        x.argmax().item()),
    "unique": lambda x: torch.unique(x.round()),
}


@pytest.mark.parametrize("name", sorted(UNBACKED_PROGRAMS))
def test_unbacked_sizes_are_one_graph(name):
    from coil.capture.frame import break_log

    fn = UNBACKED_PROGRAMS[name]
    cnt = Counting("eager")
    f = coil.compile(fn, backend=cnt, options=UNBACKED_OPTS)
    for n in (5, 9, 4):
        x = torch.randn(n)
        torch.testing.assert_close(f(x), fn(x))
    assert not break_log and cnt.n <= 2


def test_unbacked_off_by_default_is_a_break():
    from coil.capture.frame import break_log

    f = coil.compile(UNBACKED_PROGRAMS["nonzero"], backend="eager")
    x = torch.randn(6)
    torch.testing.assert_close(f(x), x.nonzero() * 2)
    assert break_log and "nonzero" in break_log[0]["reason"]


def test_branch_on_unbacked_value_breaks_with_hint():
    from coil.capture.frame import break_log

    def fn(x):
        return x * 2 if x.sum().item() > 0 else x

    f = coil.compile(fn, backend="eager", options=UNBACKED_OPTS)
    for _ in range(3):
        x = torch.randn(5)
        torch.testing.assert_close(f(x), fn(x))
    assert break_log and "torch._check" in break_log[0]["reason"] + str(break_log[0])


def test_mark_unbacked_shares_sizes_0_and_1():
    cnt = Counting("eager")
    f = coil.compile(lambda x: (x * 2).sum(0), backend=cnt)
    for n in (5, 0, 1, 7):
        x = torch.randn(n, 3)
        coil.mark_unbacked(x, 0)
        torch.testing.assert_close(f(x), (x * 2).sum(0))
    assert cnt.n == 1


def test_unbacked_nonzero_through_aot():
    f = coil.compile(UNBACKED_PROGRAMS["nonzero"], backend="aot_eager", options=UNBACKED_OPTS)
    x = torch.randn(6)
    torch.testing.assert_close(f(x), x.nonzero() * 2)


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
@pytest.mark.parametrize("name", sorted(UNBACKED_PROGRAMS))
def test_unbacked_sizes_through_aot(name, backend):
    """AOT traces on the capture's fakes and ShapeEnv (nonzero, .item(), unique: unbacked
    symbols); the capture's own fake runs leave no pending unbacked symbols behind."""
    from coil.capture.frame import break_log

    from coil import exc

    fn = UNBACKED_PROGRAMS[name]
    cnt = Counting(backend)
    f = coil.compile(fn, backend=cnt, options=UNBACKED_OPTS)
    before = sum(exc.fallback_counts.values())
    for x in (torch.randn(5), torch.randn(9), torch.randn(4), -torch.ones(3), torch.ones(1)):
        torch.testing.assert_close(f(x), fn(x))
    assert not break_log and cnt.n <= 3
    if backend == "coil":
        # generated code ran: the wrapper binds the unbacked sizes from the extern outputs
        # (u1 = buf2.size(0)) and from .item() (u2 = buf1); unique's output layout is
        # compared without a guard on its unbacked size
        assert sum(exc.fallback_counts.values()) == before


#: programs whose torch._check / torch._check_is_size on a data-dependent value must hold
#: at run time: (program, an input that satisfies it, one that does not)
CHECKED_PROGRAMS = {
    "item_check": (lambda x: x * (lambda n: (torch._check(n < 10), n)[1])(x.sum().item()),
                   torch.tensor([1, 2]), torch.tensor([10, 20])),
    "item_size_check": (lambda x: (lambda n: (torch._check_is_size(n), torch._check(n <= 6),
                                              torch.ones(n) * 2)[2])(x.max().item()),
                        torch.tensor([1, 5]), torch.tensor([1, 9])),
    "nonzero_check": (lambda x: (lambda k: (torch._check(k.shape[0] <= 3), k * 2)[1])(x.nonzero()),
                      torch.tensor([0, 1, 1, 0, 0]), torch.tensor([1, 1, 1, 1, 0])),
}


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
@pytest.mark.parametrize("name", sorted(CHECKED_PROGRAMS))
def test_checks_on_data_dependent_values_hold_at_run_time(name, backend):
    """Tracing keeps a torch._check on an unbacked symbol only as a ShapeEnv fact; AOT
    adds it back as aten._assert_scalar (coil: a wrapper line ``extern(u2 <= 9, msg)``).
    The compiled program returned values where eager raised."""
    from coil import exc

    fn, good, bad = CHECKED_PROGRAMS[name]
    f = coil.compile(fn, backend=backend, options=UNBACKED_OPTS, dynamic=True)
    before = sum(exc.fallback_counts.values())
    torch.testing.assert_close(f(good), fn(good))
    with pytest.raises(RuntimeError):
        fn(bad)
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        f(bad)
    assert sum(exc.fallback_counts.values()) == before


@pytest.mark.parametrize("backend", ["aot_eager", "coil"])
def test_mark_unbacked_through_aot(backend):
    """With ``coil``, generated kernels run: an unbacked symbol (``u0``, not positive) is
    a kernel size argument bound by the wrapper (it was left out of the C++ signature)."""
    from coil import exc

    cnt = Counting(backend)
    f = coil.compile(lambda x: (x * 2).sum(0), backend=cnt)
    before = sum(exc.fallback_counts.values())
    for n in (5, 0, 1, 7):
        x = torch.randn(n, 3)
        coil.mark_unbacked(x, 0)
        torch.testing.assert_close(f(x), (x * 2).sum(0))
    assert cnt.n == 1
    assert sum(exc.fallback_counts.values()) == before


# ------------------------------------------------------------------ decoding


@pytest.mark.parametrize("backend", ["eager", "coil"])
def test_gpt2_generate_compiles_at_most_three_graphs(backend):
    """transformers' generate() with the default dynamic KV cache: prefill, the first
    decode step (static), then one automatic-dynamic decode graph for every later token;
    eager's tokens."""
    transformers = pytest.importorskip("transformers")
    from coil import exc

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=200,
                                  n_positions=128, bos_token_id=0, eos_token_id=0)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(1, 200, (1, 5))
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=None)
    ref = m.generate(ids, **kw)
    cnt = Counting(backend)
    m.forward = coil.compile(m.forward, backend=cnt)
    before = sum(exc.fallback_counts.values())
    out = m.generate(ids, **kw)
    assert torch.equal(out, ref)
    assert cnt.n <= 3
    assert sum(exc.fallback_counts.values()) == before


NUMBER_ARG_PROGRAMS = {
    "sum_dim": (lambda x, d: x.sum(d), [0, 1, 0, 1]),
    "reshape": (lambda x, n: x.reshape(-1, n), [2, 4, 8, 2]),
    "narrow": (lambda x, n: x.narrow(1, 0, n), [2, 3, 5, 4]),
    "leaky_relu_slope": (lambda x, p: F.leaky_relu(x, p), [0.1, 0.2, 0.3]),
    "pow": (lambda x, p: x ** p, [2.0, 3.0, 0.5]),
    "list_index": (lambda x, i: [x, x * 2, x * 3][i], [0, 1, 2, 1]),
    "range_loop": (lambda x, n: sum(x * i for i in range(n)), [2, 3, 4]),
    "topk": (lambda x, k: x.topk(k, dim=1).values, [2, 3, 4]),
    "add_alpha": (lambda x, a: torch.add(x, x, alpha=a), [0.5, 1.5, 2.5]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(NUMBER_ARG_PROGRAMS))
def test_number_arguments_under_automatic_dynamic(name, backend):
    """A changing int/float argument becomes a graph input after it changed; uses that
    need its value (a dim, a list index, a loop count) specialize it, correctly."""
    fn, values = NUMBER_ARG_PROGRAMS[name]
    cnt = Counting(backend)
    f = coil.compile(fn, backend=cnt)
    x = torch.randn(4, 8)
    for v in values:
        torch.testing.assert_close(f(x, v), fn(x, v), equal_nan=True)
    assert cnt.n <= len(values)


def test_marked_dim_specialized_by_python_names_the_line():
    def fn(x):
        out = x[0]
        for i in range(x.size(0)):         # needs a concrete trip count
            out = out + x[i]
        return out

    f = coil.compile(fn, backend="eager")
    x = torch.randn(3, 2)
    coil.mark_dynamic(x, 0)
    with pytest.raises(UserError) as e:
        f(x)
    msg = str(e.value)
    assert "dim 0 of x" in msg and "constant 3" in msg and __file__ in msg
    assert "what to do" in msg


def test_shape_memo_covers_a_module_called_with_args():
    """A module's tensors are ``args[0]``: the memo applies to them too, and a
    transposed input of memoized sizes still fails the guard."""
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    f = coil.compile(m, backend="eager", dynamic=True)
    f(torch.randn(4, 8))
    (e,) = next(iter(_caches.values())).entries
    assert "___memo.last.check(args[0])" in e.guard_src
    guard, seen = e.guard, []
    e.guard = lambda *a: seen.append(a) or guard(*a)
    f(torch.randn(4, 8))
    self_, _, kwargs, fn = seen[0]
    assert guard(self_, (torch.randn(8, 8),), kwargs, fn)
    assert guard(self_, (torch.randn(8, 8),), kwargs, fn)  # a memo hit
    assert not guard(self_, (torch.randn(8, 8).t(),), kwargs, fn)
    e.guard = guard
    for n in (8, 5, 8):
        x = torch.randn(n, 8)
        torch.testing.assert_close(f(x), m(x))
        torch.testing.assert_close(f(x.t().contiguous().t()), m(x.t().contiguous().t()))


@pytest.mark.parametrize("fn", [
    lambda x, a: torch.tensor(a) + x,
    lambda x, a: x * 2 if math.isinf(a) else x * 3,
    lambda x, a: x * 2 if a == float("inf") else x * 3,
])
def test_an_infinite_float_argument_is_a_constant_not_a_symbol(fn):
    """A changing float argument becomes a symbol; one that is inf was one too, baked
    into its graph as a constant under a guard of `not isnan` only, so every later finite
    value returned inf; a symbol's entry also took inf (sympy drops `a != inf`). inf
    stays a guarded constant now, and a symbolic float's entry requires it finite."""
    coil.reset()
    f, x = coil.compile(fn), torch.ones(2)
    for a in (0.5, 2.5, math.inf, 4.0, -math.inf, 3.0, math.inf):
        torch.testing.assert_close(f(x, a), fn(x, a))


def test_torch_tensor_of_a_changing_int_is_one_graph_and_keeps_64_bits():
    """``torch.tensor(n)`` of a symbolic int traced into a constant: one graph per value,
    and above 2**31 only the low 32 bits (2**40 + 1 gave 1). It is ``full((), n)`` now,
    and a list holding symbolic ints (``torch.tensor([n, 1])``) a stack of those."""
    def fn(x, n):
        return (torch.tensor(n) + x, torch.tensor(n * 0.5) * x, torch.tensor([n, 1]) + x,
                torch.tensor([[n, 1.5], (2, n)]), torch.tensor((n,), dtype=torch.float64))

    coil.reset()
    f, x = coil.compile(fn), torch.zeros(2, dtype=torch.int64)
    for n in (5, 7, 2 ** 40 + 1, 9, 11):
        for out, ref in zip(f(x, n), fn(x, n)):
            assert out.dtype == ref.dtype and torch.equal(out, ref), (n, out, ref)
    assert len(next(iter(_caches.values())).entries) <= 2


def test_dynamic_from_options_and_config():
    """``options={"dynamic": True}`` and ``coil.config.dynamic`` (``COIL_DYNAMIC=1``) were
    accepted and ignored: three sizes made two graphs (automatic dynamic), not one."""
    from coil.testing import CompileCounter

    for opts, patch in (({"dynamic": True}, {}), ({}, {"dynamic": True})):
        coil.reset()
        cnt = CompileCounter()
        with coil.config.patch(**patch):
            f = coil.compile(lambda x: x + 1, backend=cnt, options=opts)
            for n in (3, 5, 7):
                torch.testing.assert_close(f(torch.ones(n)), torch.ones(n) + 1)
        assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_backward_of_a_nonzero_sized_output(backend):
    """``x[nonzero(mask)] @ w.t()`` with backward: the tangent's size is a fresh unbacked symbol
    that the backward wrapper read (a view of the tangent) before the extern binding it ran
    (UnboundLocalError u1; fresh-user trial). It is bound from the tangent itself."""
    w = torch.randn(4, 4, requires_grad=True)

    def f(x):
        sel = (x[:, 0] > 0).nonzero().squeeze(-1)
        return x[sel] @ w.t()

    x = torch.randn(6, 4)
    x[1, 0], x[4, 0] = 1.0, 1.0
    grads = []
    for fn in (f, coil.compile(f, options={"capture_dynamic_output_shape_ops": True, "cpu_backend": backend})):
        xx = x.clone().requires_grad_(True)
        w.grad = None
        out = fn(xx)
        (out * torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
        grads.append((out.detach(), xx.grad, w.grad))
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dynamic", [None, True])
def test_max_of_a_symbolic_int_in_a_triton_kernel(dynamic):
    """``max(k, 3) * x`` with k symbolic: the Triton kernel printed Max as Python's ``max``, which in
    the interpreter returned the int 3 for k = 2 (AttributeError: 'int' object has no attribute
    'to'; fresh-user trial). Min/Max print as tl.minimum/tl.maximum."""
    def f(x, k):
        return max(k, 3) * x + min(k, 1)

    cf = coil.compile(f, options={"cpu_backend": "triton"}, dynamic=dynamic)
    x = torch.randn(3)
    for k in (5, 6, 2, 0):
        torch.testing.assert_close(cf(x, k), f(x, k))


def _neg_index_cases():
    def add_at(y, k):
        y[-k].add_(1)
        return y
    return {"x[-k]": lambda x, k: x[-k] * 1, "x[..., -k]": lambda x, k: x[..., -k] * 1,
            "x[k - 3]": lambda x, k: x[k - 3] * 1, "x[-k, k]": lambda x, k: x[-k, k] * 1,
            "y[-k].add_": add_at}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("case", list(_neg_index_cases()))
def test_select_at_a_negative_symbolic_index(backend, case):
    """``x[-k] * 1`` with k symbolic (automatic dynamic): the select was read at ``-k`` unwrapped,
    outside the tensor (garbage values; fresh-user trial). A symbolic index's sign and range are
    guards; k of the other sign recompiles, k out of range raises IndexError as eager."""
    f = _neg_index_cases()[case]
    cf = coil.compile(f, options={"cpu_backend": backend})
    for k in (1, 2, 3, -1, 0, 5):
        x, y = torch.arange(12.).view(3, 4), torch.arange(12.).view(3, 4)
        try:
            want = f(y, k)
        except IndexError:
            with pytest.raises(IndexError):
                cf(x, k)
            continue
        torch.testing.assert_close(cf(x, k), want)
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_var_with_correction_at_least_a_symbolic_count(backend):
    """``var(x, 0, correction=3)`` of 2 rows with the row count symbolic divided by n - 3 = -1
    (-0.5, eager inf; fresh-user trial): the divisor is max(n - c, 0) for a symbolic n too."""
    f = lambda x: (torch.var(x, 0, correction=3), x.std(0, correction=2))  # noqa: E731
    cf = coil.compile(f, options={"cpu_backend": backend})
    for n in (5, 6, 2, 3, 4, 1):
        x = torch.arange(float(n))[:, None] * torch.tensor([1.0, -2.0])
        for a, b in zip(cf(x), f(x)):
            torch.testing.assert_close(a, b, equal_nan=True)


def test_tensor_of_an_unbacked_float_keeps_float_dtype():
    """``torch.tensor(x.sum().item())`` with capture_scalar_outputs: the item has no hint and the
    dtype was inferred from the int 1 (int64: 3.75 became 3; fresh-user trial)."""
    f = lambda x: torch.tensor(x.sum().item()) * 2  # noqa: E731
    x = torch.tensor([1.5, 2.25])
    out = coil.compile(f, options={"capture_scalar_outputs": True})(x)
    assert out.dtype == f(x).dtype
    torch.testing.assert_close(out, f(x))


@pytest.mark.parametrize("cond", ["nonzero_size", "item"])
def test_branch_on_a_data_dependent_value_breaks_and_keeps_both_graphs(cond):
    """``if rows.numel() == 0`` (``nonzero``) or ``if x.sum().item() > 0`` with capture_scalar_outputs: the
    condition's symbol has no input source, and rebuilding it at the graph break raised, so the whole frame
    ran eagerly (stats ``fallbacks``). The value now leaves the graph as a 0-d tensor the entry reads."""
    from coil.capture.frame import reset_stats, stats

    def f(x):
        y = x * 2
        if cond == "item":
            if y.sum().item() > 0:
                return y + 1
            return y - 1
        rows = (y > 0).nonzero().squeeze(-1)
        n = rows.numel()
        if n == 0:
            return y, n
        return y.index_select(0, rows) + 1, n

    coil.reset()
    reset_stats()
    cf = coil.compile(f, backend="aot_eager", options=UNBACKED_OPTS)
    for x in (torch.tensor([1.0, -2.0, 3.0]), torch.tensor([-1.0, -2.0, -3.0])):
        out, ref = cf(x), f(x)
        torch.testing.assert_close(out, ref)
    assert stats["fallbacks"] == 0 and stats["graphs"] >= 2
