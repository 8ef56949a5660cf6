"""Dynamic shapes through AOT, the IR, the scheduler, both CPU code generators and the
wrapper (issue 17, docs/dynamic_shapes.md): ``torch.compile(fn, backend="coil",
dynamic=True)`` hands coil graphs with symbolic sizes; coil compiles each graph ONCE
(kernels take sizes as arguments, the wrapper binds them per call) and every size
gives eager's values, strides and gradients."""
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import coil.codegen
from coil import config as coil_config

BACKENDS = ["cpp", "triton"]


class Compiles:
    """Counts ``compile_aten_graph`` calls and the kernels they generate."""

    def __init__(self, monkeypatch):
        self.graphs = []
        orig = coil.codegen.compile_aten_graph

        def spy(gm, example_inputs, device):
            out = orig(gm, example_inputs, device)
            self.graphs.append(out)
            return out
        monkeypatch.setattr(coil.codegen, "compile_aten_graph", spy)

    @property
    def sources(self):
        return [k.source for g in self.graphs if hasattr(g, "kernels") for k in g.kernels]


def _check(fn, make_args, sizes, backend, monkeypatch, grad=False, graphs=1, atol=1e-5):
    """Run ``fn`` compiled with dynamic shapes on ``make_args(n)`` for every ``n``:
    same values (and strides, and gradients with ``grad``) as eager, ``graphs``
    compiled graphs in all, none of them the FX-interpreter fallback."""
    torch._dynamo.reset()
    c = Compiles(monkeypatch)
    f = torch.compile(fn, backend="coil", dynamic=True)
    with coil_config.patch(cpu_backend=backend):
        for n in sizes:
            args = make_args(n)
            for a in args:
                if isinstance(a, torch.Tensor):
                    a.grad = None
            ref_args = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
                        else a for a in args]
            got, exp = f(*args), fn(*ref_args)
            got_t = got if isinstance(got, tuple) else (got,)
            exp_t = exp if isinstance(exp, tuple) else (exp,)
            for g, e in zip(got_t, exp_t):
                torch.testing.assert_close(g, e, atol=atol, rtol=1e-4)
                assert g.shape == e.shape
                assert all(st == se or sz == 1 for st, se, sz in zip(g.stride(), e.stride(), e.shape)), \
                    (g.stride(), e.stride())
            if grad:
                sum(g.float().sum() for g in got_t).backward()
                sum(e.float().sum() for e in exp_t).backward()
                for a, r in zip(args, ref_args):
                    if isinstance(a, torch.Tensor) and a.requires_grad:
                        torch.testing.assert_close(a.grad, r.grad, atol=atol, rtol=1e-4)
    assert all(isinstance(g, coil.codegen.CompiledGraph) for g in c.graphs), c.graphs
    assert len(c.graphs) == graphs, [g.source for g in c.graphs]
    return c


@pytest.mark.parametrize("backend", BACKENDS)
def test_pointwise_broadcast_one_compile(backend, monkeypatch):
    # broadcasting against a size-1 dim and a row vector; 5 batch sizes, one graph
    c = _check(lambda x, y, z: torch.sigmoid(x * 2 + y) - z, lambda n: (torch.randn(n, 7), torch.randn(1, 7),
               torch.randn(n, 1)), [3, 5, 8, 17, 30], backend, monkeypatch)
    src = "\n".join(g.source for g in c.graphs)
    assert "s" in src and "empty_strided((" in src


@pytest.mark.parametrize("backend", BACKENDS)
def test_reductions_over_dynamic_dims(backend, monkeypatch):
    # looped (dynamic row length) and over the outer dim, sum/amax/mean/argmax
    fn = lambda x: (x.sum(1), x.amax(-1), x.mean(0), x.argmax(1))
    _check(fn, lambda n: (torch.randn(n, n + 9),), [3, 6, 40], backend, monkeypatch)


@pytest.mark.parametrize("backend", BACKENDS)
def test_persistent_reduction_dynamic_rows(backend, monkeypatch):
    # static row length (persistent on Triton), dynamic number of rows
    x_static = {}

    def make(n):
        return (torch.randn(n, 64),)
    fn = lambda x: torch.softmax(x * 3, -1) + x.sum(-1, keepdim=True)
    torch._dynamo.reset()
    c = Compiles(monkeypatch)
    f = torch.compile(fn, backend="coil")
    with coil_config.patch(cpu_backend=backend):
        for n in (3, 9, 21):
            x = make(n)[0]
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(f(x), fn(x), atol=1e-5, rtol=1e-4)
    assert len(c.graphs) == 1 and isinstance(c.graphs[0], coil.codegen.CompiledGraph)
    if backend == "triton":
        assert any("triton_per" in k.name for k in c.graphs[0].kernels), c.sources


def test_symbolic_row_length_runs_a_persistent_twin_for_short_rows(monkeypatch):
    """A reduction over a symbolic row length is one kernel with a looped body and a persistent
    twin under the constexpr ``PERSISTENT``, which size buckets of rows up to
    ``triton_persistent_rnumel`` run (both give eager's values); rows address by ``rnumel``,
    which Triton specializes on divisibility by 16 (a bare stride symbol is not: unvectorized
    loads, 1.22x the static softmax on an H200)."""
    fn = lambda x, y: (torch.softmax(x, -1) + y, F.layer_norm(x, (x.shape[-1],)) * y, x.sum(-1))  # noqa: E731
    with coil_config.patch(triton_persistent_rnumel=64):
        c = _check(fn, lambda n: (torch.randn(9, n), torch.randn(n)), [5, 17, 64, 65, 300], "triton",
                   monkeypatch, atol=1e-4)
    (k,) = [k for k in c.graphs[0].kernels if "PERSISTENT" in k.source]
    assert "if PERSISTENT:" in k.source and "rnumel * xindex" in k.source, k.source
    chosen = [cfg["PERSISTENT"] for _, cfg in k.launcher._tuned]
    assert True in chosen and False in chosen, k.launcher._tuned


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_layer_norm(backend, monkeypatch):
    fn = lambda x, w, b: F.layer_norm(torch.softmax(x, -1), (x.shape[-1],), w, b)
    _check(fn, lambda n: (torch.randn(4, n), torch.randn(n), torch.randn(n)), [5, 12, 33], backend,
           monkeypatch, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_views_and_reshapes(backend, monkeypatch):
    def fn(x):
        b = x.shape[0]
        h = x.shape[1] // 2
        y = x.view(b, -1) * 2
        z = x[:, :h] + x[:, h:]
        return y.reshape(-1, 2).sum(-1), z.transpose(0, 1).contiguous(), (x.permute(1, 0, 2) + 1)
    _check(fn, lambda n: (torch.randn(n, 2 * n, 3),), [2, 3, 7], backend, monkeypatch)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slices_of_larger_tensor_as_inputs(backend, monkeypatch):
    # ids[:, :L] style inputs: the stride is the big tensor's row, not L
    big = torch.randn(6, 64)
    fn = lambda x, w: (x * w).cumsum(-1)[:, -1] + (x + 1).sum(-1)
    _check(fn, lambda n: (big[:, :n], torch.randn(n)), [5, 9, 40], backend, monkeypatch)


@pytest.mark.parametrize("backend", BACKENDS)
def test_matmul_extern_symbolic(backend, monkeypatch):
    fn = lambda x, w, b: F.gelu(x @ w + b).t()
    _check(fn, lambda n: (torch.randn(n, 16), torch.randn(16, 8), torch.randn(8)), [3, 10, 31], backend,
           monkeypatch, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_step_dynamic_batch(backend, monkeypatch):
    w = torch.randn(12, 5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)

    def fn(x, w, b):
        return torch.log_softmax(torch.tanh(x @ w + b), -1).mean(0)
    _check(fn, lambda n: (torch.randn(n, 12, requires_grad=True), w, b), [4, 7, 19], backend, monkeypatch,
           grad=True, graphs=2, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_kernel_compile_per_size(backend, monkeypatch):
    # the same kernel sources serve every size: nothing is generated after the first call
    c = _check(lambda x: (x.exp() * x.sum(-1, keepdim=True)).relu(), lambda n: (torch.randn(n, n),),
               [3], backend, monkeypatch)
    first = list(c.sources)
    f = torch.compile(lambda x: x, backend="coil", dynamic=True)  # noqa: F841 (no recompiles below)
    torch._dynamo.reset()
    c2 = Compiles(monkeypatch)
    g = torch.compile(lambda x: (x.exp() * x.sum(-1, keepdim=True)).relu(), backend="coil", dynamic=True)
    with coil_config.patch(cpu_backend=backend):
        for n in (3, 5, 11, 64, 100):
            x = torch.randn(n, n)
            torch.testing.assert_close(g(x), (x.exp() * x.sum(-1, keepdim=True)).relu(), rtol=1e-4, atol=1e-4)
    assert c2.sources == first


class _Block(torch.nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5
        mask = torch.ones(s, s, dtype=torch.bool).tril()
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), -1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


@pytest.mark.parametrize("backend", BACKENDS)
def test_transformer_forward_sequence_lengths(backend, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Block(), _Block()).eval()
    with torch.no_grad():
        c = _check(model, lambda s: (torch.randn(2, s, 32),), [7, 33, 128, 500] if backend == "cpp"
                   else [7, 33, 128], backend, monkeypatch, atol=1e-4)
    assert len(c.graphs) == 1


def test_size_expression_printers_parenthesize_divisors():
    # x // s**2 printed as "x / s * s" (C++) divided by s and multiplied back: the
    # transformer's attention kernels read out of bounds (a segfault) before the fix
    import sympy
    from coil.codegen.cpp.indexing import cexpr
    from coil.ir.symbols import XINDEX, FloorDiv, Mod, pyexpr
    s = sympy.Symbol("s5", integer=True, positive=True)
    for e in (FloorDiv(XINDEX, s ** 2), Mod(XINDEX, 2 * s), FloorDiv(XINDEX, 3 * s) * s):
        for x in (0, 7, 40, 123):
            for sv in (2, 3, 5):
                want = int(e.subs({XINDEX: x, s: sv}).replace(
                    lambda t: isinstance(t, FloorDiv), lambda t: t.args[0] // t.args[1]).replace(
                    lambda t: isinstance(t, Mod), lambda t: t.args[0] % t.args[1]))
                assert eval(pyexpr(e), {"xindex": x, "s5": sv}) == want, pyexpr(e)
                assert eval(cexpr(e).replace("/", "//"), {"xindex": x, "s5": sv}) == want, cexpr(e)


def test_size_expression_printers_print_bitwise_ops_of_negative_ints():
    # n & 3, n | 1, n ^ 5 of a symbolic int (torch's BitwiseFn) were "cannot print index expression"
    import sympy
    from torch.utils._sympy import functions as tf
    from coil.codegen.cpp.indexing import cexpr
    from coil.ir.symbols import pyexpr
    s = sympy.Symbol("s5", integer=True)
    for e in (2 * tf.BitwiseFn_bitwise_and(s - 7, 3), tf.BitwiseFn_bitwise_or(-s, 1) + 1,
              tf.BitwiseFn_bitwise_xor(3 * s, -5)):
        for sv in (-6, -1, 0, 2, 5, 7):
            want = int(e.subs({s: sv}))
            assert eval(pyexpr(e), {"s5": sv}) == want and eval(cexpr(e), {"s5": sv}) == want, (pyexpr(e), sv)


def test_symbolic_index_simplification_folds_relinearized_dims():
    # s1*(x // s1) + x % s1 -> x, with size symbols and their powers as coefficients
    import sympy
    from coil.ir.symbols import XINDEX, FloorDiv, Mod, simplify_index
    s0, s1 = (sympy.Symbol(n, integer=True, positive=True) for n in ("s0", "s1"))
    assert simplify_index(s1 * FloorDiv(XINDEX, s1) + Mod(XINDEX, s1), {XINDEX: s0 * s1}) == XINDEX
    assert simplify_index(s1 ** 2 * FloorDiv(XINDEX, s1 ** 2) + Mod(XINDEX, s1 ** 2), {XINDEX: s0 * s1 ** 2}) == XINDEX
    assert simplify_index(FloorDiv(XINDEX, s1), {XINDEX: s1}) == 0
    assert simplify_index(Mod(XINDEX, s1), {XINDEX: s1}) == XINDEX


def test_static_graphs_keep_int_plans():
    # without symbolic inputs nothing changes: plans hold ints, kernels take no sizes
    import sys
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from codegen_helpers import compile_fn
    c = compile_fn(lambda x: torch.softmax(x, -1), torch.randn(8, 100))
    assert c.kernels and all(not k.size_args for k in c.kernels)
    assert all("xnumel = " in k.source and "int64_t s" not in k.source for k in c.kernels)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cat_slice_select_pad_symbolic(backend, monkeypatch):
    def fn(x, y):
        n = x.shape[1]
        a = torch.cat([x[:, 1:-1], y, x[:, :n // 2]], 1)
        return a * x[:, -1:], F.pad(x, (1, 2)) + 1, x[:, -1]
    c = _check(fn, lambda n: (torch.randn(3, n), torch.randn(3, n + 1)), [4, 9, 30], backend, monkeypatch)
    assert not c.graphs[0].fallbacks, c.graphs[0].fallbacks  # cat/slice/pad lowered, no ATen


@pytest.mark.parametrize("backend", BACKENDS)
def test_advanced_indexing_symbolic(backend, monkeypatch):
    # aten.index.Tensor with symbolic sizes (it ran as ATen: the broadcast shape of the
    # indices took int() of each size): GPT-2's mask[:, :, idx] (adjacent indexed dims
    # stay in place), x[idx, :, jdx] (not adjacent: the broadcast dims go first), a 2-D
    # index; negative indices wrap
    def fn(mask, x, idx, jdx, ij):
        return mask[:, :, idx] * 2, x[idx, :, jdx] + 1, x[ij] - 1

    def make(n):
        g = torch.Generator().manual_seed(n)
        return (torch.randn(2, 3, n, n, generator=g), torch.randn(n, 4, n, generator=g),
                torch.randint(-n, n, (n,), generator=g), torch.randint(-n, n, (n,), generator=g),
                torch.randint(-n, n, (n, 3), generator=g))
    c = _check(fn, make, [5, 9, 30], backend, monkeypatch)  # 3, 4: duck-sized with dims
    assert not c.graphs[0].fallbacks, c.graphs[0].fallbacks


@pytest.mark.parametrize("backend", BACKENDS)
def test_codegen_adds_no_size_guards(backend, monkeypatch):
    # a specialization inside coil (int() of a SymInt: _dense_strides_like did it for a
    # training graph's extern inputs) would guard on the size and recompile per size
    w = torch.randn(12, 5, requires_grad=True)
    fn = lambda x, w: torch.log_softmax(x @ w, -1).sum(0)
    c = _check(fn, lambda n: (torch.randn(n, 12, requires_grad=True), w), [4, 7], backend, monkeypatch,
               grad=True, graphs=2, atol=1e-4)
    assert all(not any("Eq(" in g for g in cg.guards) for cg in c.graphs), [cg.guards for cg in c.graphs]


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_loops_with_product_divisors(backend, monkeypatch):
    # the C++ loop split of a symbolic extent divides by products of sizes
    # (x3 = xo / (4 * s)); printed without parentheses it read far out of bounds
    fn = lambda x: x.view(x.shape[0], x.shape[1], 4, 8).transpose(1, 2).contiguous() * 2
    _check(fn, lambda n: (torch.randn(3, n, 32),), [5, 11, 30], backend, monkeypatch)


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_matmul_symbolic_rows(backend, monkeypatch):
    # GPT-2's LM head under dynamic shapes: M = batch * length is symbolic, N = 1027 is
    # static; the output was not padded (cuBLAS align1 kernels on the H200, 7x slower).
    # N is padded to a row stride of 1032 whatever M is, through one compile (outputs with eager's strides:
    # _check compares them; keeping the padding is test_padded_matmul_user_outputs_keep_padding)
    import coil.ir.graph as G
    from coil import trace
    monkeypatch.setattr(G, "_PAD_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(coil_config, "keep_padded_matmul_outputs", False)
    events, real_log = [], trace.log
    monkeypatch.setattr(trace, "log", lambda ev, **kw: (events.append((ev, kw)), real_log(ev, **kw)))
    head = torch.nn.Linear(64, 1027).bfloat16().requires_grad_(False)  # parameters: static
    fn = lambda x: (head(x), F.linear(torch.relu(x), head.weight) * 2)
    c = _check(fn, lambda n: (torch.randn(n * 512, 64, dtype=torch.bfloat16),), [3, 5, 8], backend,
               monkeypatch, atol=0.1)
    pads = [kw for ev, kw in events if ev == "pad_matmul"]
    assert len(pads) == 2 and all(kw["row_stride"] == 1032 and "s" in kw["m"] for kw in pads), pads
    assert c.graphs[0].source.count("matmul_padded(") == 2, c.graphs[0].source


def test_view_strides_symbolic():
    # q of GPT-2's QKV projection: a (B, L, 48) slice with strides (144 L, 144, 1) viewed
    # as (B, L, 12, 4) is a strided view under symbolic sizes too (was a copy kernel)
    import sympy
    from coil.ir.lowering_views import view_strides
    b, n = sympy.symbols("s0 s1", integer=True, positive=True)
    assert view_strides([b, n, 48], [144 * n, 144, 1], [b, n, 12, 4]) == [144 * n, 144, 4, 1]
    assert view_strides([b, n, 48], [48 * n, 48, 1], [b * n, 48]) == [48, 1]
    assert view_strides([b, n, 48], [144 * n, 144, 1], [b * n, 48]) == [144, 1]
    assert view_strides([b, n, 48], [144 * n, 144, 1], [b, 48 * n]) is None


def test_floor_div_by_symbolic_multiple_of_a_small_term():
    # (r + 48 x) // (48 s) -> x // s for r < 48: a layer norm's epilogue reads its row
    # statistics at that index; unsimplified, it did not fuse with the reduction
    import sympy
    from coil.ir.symbols import FloorDiv, Mod, simplify_index
    r, x = sympy.symbols("rindex xindex", integer=True, nonnegative=True)
    s = sympy.Symbol("s14", integer=True, positive=True)
    flat = r + 48 * x
    assert simplify_index(s * FloorDiv(flat, 48 * s) + Mod(FloorDiv(flat, 48), s), {r: 48}) == x
    assert simplify_index(Mod(flat, 48 * s), {r: 48}) == 48 * Mod(x, s) + r


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_gpt2_as_few_kernels_as_static(backend, monkeypatch):
    # transformers GPT-2 compiled dynamic made 106 kernels where the static graph made
    # 45 (12 layers): q/k/v copied before attention, layer norms in two kernels
    transformers = pytest.importorskip("transformers")
    import coil
    torch.manual_seed(0)
    conf = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=128, n_positions=64,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    m = transformers.GPT2LMHeadModel(conf).eval()
    c = Compiles(monkeypatch)
    with torch.no_grad(), coil_config.patch(cpu_backend=backend):
        for dynamic, lengths in ((False, [9]), (True, [9, 16, 13])):
            f = coil.compile(m, dynamic=dynamic)
            for n in lengths:
                ids = torch.randint(0, 128, (2, n), generator=torch.Generator().manual_seed(n))
                torch.testing.assert_close(f(input_ids=ids).logits, m(input_ids=ids).logits,
                                           atol=1e-4, rtol=1e-4)
    static, dyn = c.graphs
    # (+ one per layer: the dynamic graph's coil::sdpa returns eager's contiguous layout on
    # the CPU, so the heads' transpose is a kernel, where ensure_layout copied it before)
    assert len(dyn.kernels) <= len(static.kernels) + conf.n_layer, (static.source, dyn.source)


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrapper_computes_each_size_product_once_per_call(backend, monkeypatch):
    # the flat numel s0 * s1 is passed to several kernels and allocations: it is one
    # local bound after the symbols, not a product per use
    c = _check(lambda x: (x.reshape(-1) * 2, x.t().contiguous() + 1, x.exp().sum(1)),
               lambda n: (torch.randn(n, n + 3),), [4, 9, 16], backend, monkeypatch)
    call = c.graphs[0].source.split("def call_boxed")[0]
    products = [l.strip() for l in call.splitlines() if " * " in l]
    assert products and all(l.startswith("_sz") for l in products), call
    assert len({l.split(" = ")[1] for l in products}) == len(products), call
