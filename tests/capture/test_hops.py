"""Higher-order operators (torch.cond, checkpoint) through capture, AOT and kernels,
compared with eager: values and gradients (docs/hops.md)."""
import pytest
import torch

import coil
from coil.exc import UserError
from coil.testing import CompileCounter, assert_same_as_eager

BACKENDS = ["aot_eager", "coil"]


def t_fn(x, w):
    return torch.sin(x) * w


def f_fn(x, w):
    return torch.cos(x) + w


def module_level(x, w):
    return torch.cond(x.sum() > 0, t_fn, f_fn, (x, w)) * 2


def nested_closures(x, w):
    y = x * 3

    def tb(a):
        return torch.tanh(a @ w) + y

    def fb(a):
        return a - y.sum()

    return torch.cond(x.mean() > 0, tb, fb, (x,))


def _signs(shape=(4, 8)):
    base = torch.rand(*shape) + 0.1
    return [base, -base]


def _one_graph(fn, *args):
    """Capture ``fn`` with a counting backend: one graph, no break."""
    cnt = CompileCounter()
    coil.compile(fn, backend=cnt, fullgraph=True)(*args)
    assert cnt.frame_count == 1
    return cnt.graphs[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_module_level_functions(backend):
    w = torch.randn(4, 8)
    for x in _signs():
        assert_same_as_eager(module_level, (x, w), backend=backend, check_grads=True)
    gm = _one_graph(module_level, _signs()[0], w)
    conds = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]
    assert len(conds) == 1
    assert isinstance(getattr(gm, conds[0].args[1].target), torch.fx.GraphModule)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_nested_functions_closing_over_tensors(backend):
    w = torch.randn(8, 8)
    for x in _signs():
        assert_same_as_eager(nested_closures, (x, w), backend=backend, check_grads=True)
    gm = _one_graph(nested_closures, _signs()[0], w)
    sub = [m for name, m in gm.named_children() if name.startswith("cond_true")][0]
    names = [n.name for n in sub.graph.nodes if n.op == "placeholder"]
    # the operand first, then the lifted closed-over tensors (w, y)
    assert len(names) == 3 and names[1].startswith("lifted_") and names[2].startswith("lifted_")


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        out = torch.cond(x.sum() > 0, lambda v: self.a(v).relu(), lambda v: self.b(v) * 2, (x,))
        return out + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_closing_over_module_parameters(backend):
    m = Gate()
    for x in _signs():
        assert_same_as_eager(m, (x,), backend=backend, check_grads=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_python_predicate_is_resolved_and_guarded(backend):
    def fn(x, flag: bool):
        return torch.cond(flag, lambda v: v.sin(), lambda v: v.cos(), (x,))

    x = torch.randn(5)
    for flag in (True, False):
        assert_same_as_eager(fn, (x, flag), backend=backend, check_grads=True)
    gm = _one_graph(fn, x, True)
    assert not any(n.target is torch.ops.higher_order.cond for n in gm.graph.nodes)
    cnt = CompileCounter()
    c = coil.compile(fn, backend=cnt)
    assert torch.allclose(c(x, True), x.sin()) and torch.allclose(c(x, False), x.cos())
    assert cnt.frame_count == 2  # the predicate is guarded: a recompile, not a stale branch


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_multiple_outputs_and_nested_cond(backend):
    def fn(x):
        def inner_t(v):
            return torch.cond(v.max() > 0.5, lambda u: u * 2, lambda u: u - 1, (v,))

        def t(v):
            return inner_t(v), v.sum(0)

        def f(v):
            return v.exp(), v.mean(0)

        a, b = torch.cond(x.sum() > 0, t, f, (x,))
        return a * 3, b

    for x in _signs((3, 4)):
        assert_same_as_eager(fn, (x,), backend=backend, check_grads=True)
    big = torch.rand(3, 4) * 0.1 + 0.01   # inner predicate false
    assert_same_as_eager(fn, (big,), backend=backend, check_grads=True)


def test_cond_in_no_grad_and_int_outputs():
    def fn(x):
        return torch.cond(x[0] > 0, lambda v: (v * 2).long(), lambda v: v.long() - 1, (x,))

    for x in _signs((6,)):
        with torch.no_grad():
            assert_same_as_eager(fn, (x * 10,), backend="coil")


def test_cond_branches_with_different_shapes_raise_naming_both():
    def fn(x):
        return torch.cond(x.sum() > 0, lambda v: v.sum(0), lambda v: v * 2, (x,))

    with pytest.raises(UserError) as e:
        coil.compile(fn, backend="eager")(torch.randn(3, 4))
    msg = str(e.value)
    assert "true_fn" in msg and "false_fn" in msg and "(4,)" in msg and "(3, 4)" in msg
    assert "test_hops.py" in msg


def test_cond_branches_with_different_dtypes_raise():
    def fn(x):
        return torch.cond(x.sum() > 0, lambda v: v.double(), lambda v: v * 2, (x,))

    with pytest.raises(UserError, match="float64"):
        coil.compile(fn, backend="eager")(torch.randn(3))


def test_cond_mutating_a_closed_over_tensor_raises():
    buf = torch.zeros(3)

    def fn(x):
        def t(v):
            buf.add_(1)
            return v + 1
        return torch.cond(x.sum() > 0, t, lambda v: v - 1, (x,))

    with pytest.raises(UserError, match="in place") as e:
        coil.compile(fn, backend="eager")(torch.randn(3))
    assert "buf.add_(1)" in str(e.value)
    assert torch.equal(buf, torch.zeros(3))


@pytest.mark.parametrize("pred", [lambda x: x > 0, lambda x: (x.sum() > 0).float(), lambda x: "yes"])
def test_cond_bad_predicate_raises(pred):
    def fn(x):
        return torch.cond(pred(x), lambda v: v + 1, lambda v: v - 1, (x,))

    with pytest.raises(UserError, match="pred"):
        coil.compile(fn, backend="eager")(torch.randn(3))


def test_cond_side_effect_is_a_logged_break_naming_the_op():
    from coil.capture import frame

    seen = []

    def fn(x):
        def t(v):
            seen.append(1)
            return v + 1
        return torch.cond(x.sum() > 0, t, lambda v: v - 1, (x,))

    frame.break_log.clear()
    with pytest.raises(Exception, match="side effect"):
        # the break runs torch.cond eagerly, which refuses the side effect itself
        coil.compile(fn, backend="eager")(torch.ones(3))
    reasons = [b["reason"] for b in frame.break_log]
    assert any("torch.cond true_fn" in r and "mutation" in r for r in reasons), reasons
    assert "test_hops.py" in "".join(frame.break_log[-1]["user_stack"])
    with pytest.raises(UserError, match="torch.cond true_fn"):
        # fullgraph: the break is an error naming the op and the user's line
        coil.compile(fn, backend="eager", fullgraph=True)(torch.ones(3))


# ------------------------------------------------------------------ checkpoint

class Block(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, 4, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class Stack(torch.nn.Module):
    def __init__(self, n=3, checkpointed=False):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(n))
        self.checkpointed = checkpointed

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.checkpointed else b(x)
        return x


def _activation_bytes(tmp_path, model, x, backend):
    """Bytes the partitioner saves for backward that are not graph inputs (parameters,
    the input itself), read from the compile log's ``aot_partition`` event."""
    import json

    from coil import trace

    coil.reset()
    trace.set_dir(str(tmp_path))
    try:
        out = coil.compile(model, backend=backend)(x)
        out.sum().backward()
    finally:
        trace.set_dir(None)
    events = [json.loads(line) for f in tmp_path.iterdir() for line in f.open()]
    parts = [e for e in events if e.get("event") == "aot_partition"]
    assert len(parts) == 1
    assert not [e for e in events if e.get("event") in ("graph_break", "capture_fallback")]
    return sum(s["bytes"] for s in parts[0]["saved"] if "aliases_input" not in s)


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpointed_blocks_match_eager_and_save_a_third(backend, tmp_path):
    torch.manual_seed(0)
    plain = Stack()
    ck = Stack(checkpointed=True)
    ck.load_state_dict(plain.state_dict())
    x = torch.randn(2, 16, 32)
    assert_same_as_eager(ck, (x,), backend=backend, check_grads=True, atol=1e-4, rtol=1e-4)
    full = _activation_bytes(tmp_path / "plain", plain, x.clone().requires_grad_(), backend)
    kept = _activation_bytes(tmp_path / "ck", ck, x.clone().requires_grad_(), backend)
    assert 0 < kept <= full / 3, (kept, full)


def test_checkpoint_with_kwargs_and_closure():
    from torch.utils.checkpoint import checkpoint

    w = torch.randn(6, 6, requires_grad=True)

    def body(a, scale=1.0):
        return torch.tanh(a @ w) * scale

    def fn(x):
        return checkpoint(body, x, use_reentrant=False, scale=2.0).sum(0)

    assert_same_as_eager(fn, (torch.randn(4, 6),), backend="coil", check_grads=True)
    _one_graph(fn, torch.randn(4, 6))


def test_cond_branches_compile_to_their_own_kernels(tmp_path):
    """backend="coil": each branch is compiled apart (forward and backward conds) and the
    wrapper picks one per call (ir/hops.py); no branch falls back to the FX interpreter."""
    import json

    from coil import config, trace

    w = torch.randn(4, 8)
    trace.set_dir(str(tmp_path))
    try:
        with config.patch(strict_codegen=True):
            for x in _signs():
                assert_same_as_eager(module_level, (x, w), backend="coil", check_grads=True)
    finally:
        trace.set_dir(None)
    events = [json.loads(line) for f in tmp_path.iterdir() for line in f.open()]
    lowered = [e for e in events if e.get("event") == "hop_lowered"]
    assert len(lowered) >= 2 and all(e["compiled"] == [True, True] for e in lowered)
    assert not [e for e in events if e.get("event") in ("hop_branch_fallback", "codegen_fallback")]
    wrappers = [e["text"] for e in events if e.get("name") == "wrapper"]
    assert any("run_cond" in t for t in wrappers)


# ------------------------------------------------------------------ while_loop

def _loop(x, n, w):
    from torch._higher_order_ops import while_loop

    def c(i, v):
        return i < n

    def body(i, v):
        # a cond nested in the loop body, closing over w
        v = torch.cond(v.sum() > 0, lambda u: torch.tanh(u @ w), lambda u: u * 0.5 + 0.1, (v,))
        return i + 1, v

    i, v = while_loop(c, body, (torch.zeros((), dtype=torch.int64), x))
    return v * 2, i


@pytest.mark.parametrize("backend", BACKENDS)
def test_while_loop_with_nested_cond(backend):
    w = torch.randn(4, 4) * 0.5
    x = torch.randn(3, 4)
    for n in (0, 1, 4):
        assert_same_as_eager(_loop, (x, torch.tensor(n), w), backend=backend)
    gm = _one_graph(_loop, x, torch.tensor(2), w)
    body = [m for name, m in gm.named_children() if name.startswith("while_body")][0]
    assert any(n.target is torch.ops.higher_order.cond for n in body.graph.nodes)
    assert any(name.startswith("cond_true") for name, _ in body.named_children())


def test_while_loop_body_changing_the_carried_shape_raises():
    from torch._higher_order_ops import while_loop

    def fn(x):
        return while_loop(lambda v: v.sum() < 10, lambda v: torch.cat([v, v]), (x,))

    with pytest.raises(UserError, match="carried input 0"):
        coil.compile(fn, backend="eager")(torch.ones(2))


def test_while_loop_requiring_grad_is_a_logged_break():
    from torch._higher_order_ops import while_loop

    def fn(x):
        return while_loop(lambda v: v.sum() < 10, lambda v: v * 2, (x,))[0]

    x = torch.ones(3, requires_grad=True)
    with pytest.raises(UserError, match="while_loop with inputs that require grad"):
        coil.compile(fn, backend="eager", fullgraph=True)(x)


def test_uncaptured_higher_order_op_is_a_logged_break():
    from torch._higher_order_ops import foreach_map

    from coil.capture import frame

    def fn(x):
        return foreach_map(torch.exp, [x.sin()])[0].cos()

    frame.break_log.clear()
    assert_same_as_eager(fn, (torch.randn(4, 3),), backend="aot_eager")
    assert any("higher-order operator foreach_map is not captured" in b["reason"]
               for b in frame.break_log)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_with_dynamic_shapes_compiles_once(backend):
    c = coil.compile(nested_closures, backend=backend, dynamic=True)
    w = torch.randn(8, 8)
    coil.capture.reset_stats()
    for n in (3, 5, 7):
        for x in _signs((n, 8)):
            x.requires_grad_()
            out, ref = c(x, w), nested_closures(x, w)
            torch.testing.assert_close(out, ref)
            torch.testing.assert_close(torch.autograd.grad(out.sum(), x),
                                       torch.autograd.grad(ref.sum(), x))
    assert coil.capture.stats["graphs"] == 1 and coil.capture.stats["graph_breaks"] == 0


def test_cond_triton_cpu_backend(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    w = torch.randn(4, 8)
    fn = coil.compile(module_level, backend="coil", options={"cpu_backend": "triton"})
    for x in _signs():
        torch.testing.assert_close(fn(x, w), module_level(x, w))


def test_cond_integer_outputs_with_grad_is_a_logged_break():
    from coil.capture import frame

    def fn(x):
        a, b = torch.cond(x.sum() > 0, lambda v: (v * 2, v.long()),
                          lambda v: (v.exp(), (v + 1).long()), (x,))
        return a.sum() + b.sum()

    frame.break_log.clear()
    x = torch.randn(5, requires_grad=True)
    out = coil.compile(fn, backend="aot_eager")(x)
    torch.testing.assert_close(out, fn(x))
    assert any("integer or bool tensors" in b["reason"] for b in frame.break_log)


class ModuleBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU())

    def forward(self, x):
        return torch.cond(x.mean() > 0, self.a, self.b, (x,))


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_with_modules_as_branches(backend):
    m = ModuleBranches()
    for x in _signs((3, 6)):
        assert_same_as_eager(m, (x,), backend=backend, check_grads=True)


def test_compile_log_shows_the_subgraph_tree(tmp_path):
    """The captured graph's artifact prints each subgraph under its parent: the cond
    inside the while_loop body, with lifted inputs named."""
    import json

    from coil import trace

    trace.set_dir(str(tmp_path))
    try:
        coil.compile(_loop, backend="eager")(torch.randn(3, 4), torch.tensor(2),
                                             torch.randn(4, 4))
    finally:
        trace.set_dir(None)
    events = [json.loads(line) for f in tmp_path.iterdir() for line in f.open()]
    text = [e["text"] for e in events if e.get("name") == "captured_graph"][0]
    body = text[text.index("class while_body_"):]
    assert "class cond_true_" in body and "class cond_false_" in body
    assert "lifted_" in body[body.index("class cond_true_"):]
    hops = [e for e in events if e.get("event") == "hop"]
    assert {e["op"] for e in hops} == {"cond", "while_loop"}


# ------------------------------------------------------------------ map

def _mapped(xs, b, w):
    from torch._higher_order_ops import map as tmap

    def f(x, bb):
        return torch.tanh(x @ w) + bb, x.sum(-1)

    y, s = tmap(f, xs, b)
    return y * 2, s


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_body_compiled_once(backend):
    w, b = torch.randn(4, 4), torch.randn(4)
    for n in (1, 5):
        with torch.no_grad():
            assert_same_as_eager(_mapped, (torch.randn(n, 3, 4), b, w), backend=backend)
    with torch.no_grad():
        gm = _one_graph(_mapped, torch.randn(5, 3, 4), b, w)
    assert any(n.target is torch.ops.higher_order.map_impl for n in gm.graph.nodes)


def test_map_requiring_grad_is_a_logged_break():
    from coil.capture import frame

    frame.break_log.clear()
    w, b = torch.randn(4, 4), torch.randn(4, requires_grad=True)
    assert_same_as_eager(_mapped, (torch.randn(3, 3, 4), b, w), backend="aot_eager",
                         check_grads=True)
    assert any("map with inputs that require grad" in r["reason"] for r in frame.break_log)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_operand_passed_twice_and_no_operands(backend):
    w = torch.randn(4)

    def twice(x):
        return torch.cond(x.sum() > 0, lambda a, b: a * b, lambda a, b: a + b, (x, x))

    def closure_only(x):
        y = x * 2
        return torch.cond(x.sum() > 0, lambda: y.sin() + w, lambda: y.cos() - w, ())

    for x in _signs((4,)):
        assert_same_as_eager(twice, (x,), backend=backend, check_grads=True)
        assert_same_as_eager(closure_only, (x,), backend=backend, check_grads=True)


@pytest.mark.parametrize("branch", [lambda v: v, lambda v: v.t()])
def test_cond_branch_returning_its_input_raises(branch):
    def fn(x):
        return torch.cond(x.sum() > 0, branch, lambda v: v * 2, (x,))

    with pytest.raises(UserError, match="aliasing inputs"):
        coil.compile(fn, backend="eager")(torch.ones(2, 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_checkpoint_with_tuple_output(backend):
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(6, 6)

    def inner(a):
        return torch.relu(lin(a)), a.exp()

    def outer(a):
        h, e = checkpoint(inner, a, use_reentrant=False)
        return (h * e).tanh()

    def fn(x):
        return checkpoint(outer, x, use_reentrant=True).sum(-1)

    assert_same_as_eager(fn, (torch.randn(3, 6),), backend=backend, check_grads=True)


def test_nested_compile_region_is_one_subgraph_called_twice():
    from coil.aot.regions import region_calls
    from coil.capture import frame

    @torch.compiler.nested_compile_region
    def blk(x):
        return x.sin() * 2

    def fn(x):
        return blk(blk(x))

    frame.break_log.clear()
    gm = _one_graph(fn, torch.randn(3))
    assert not frame.break_log
    assert [n.args[1] for n in region_calls(gm)] == ["region_0", "region_0"]
    assert_same_as_eager(fn, (torch.randn(3),), backend="coil")


def _scan_step(c, x):
    n = torch.tanh(c * 0.5 + x)
    return n, (n * 2, n.sum(-1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim,reverse", [(0, False), (1, True), (-2, False)])
def test_scan_values(backend, dim, reverse):
    from torch._higher_order_ops import scan

    w = torch.randn(4)

    def fn(init, xs):
        def step(c, x):   # closes over w: a lifted input
            n, (y, s) = _scan_step(c, x + w)
            return n, (y, s)
        return scan(step, init, xs, dim=dim, reverse=reverse)

    xs = torch.randn(5, 3, 4) if dim == 0 else torch.randn(3, 5, 4)
    gm = _one_graph(fn, torch.randn(3, 4), xs)
    assert any(n.target is torch.ops.higher_order.scan for n in gm.graph.nodes)
    assert_same_as_eager(fn, (torch.randn(3, 4), xs), backend=backend)


def test_scan_carry_tuple_and_triton_cpu_backend(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    from torch._higher_order_ops import scan

    def fn(a, b, xs):
        def step(c, x):
            s, m = c
            return (s + x, torch.maximum(m, x)), s * x
        (s, m), ys = scan(step, (a, b), xs)
        return s, m, ys

    args = (torch.zeros(4), torch.full((4,), -1e9), torch.randn(6, 4))
    out = coil.compile(fn, backend="coil", options={"cpu_backend": "triton"})(*args)
    for o, r in zip(out, fn(*args)):
        torch.testing.assert_close(o, r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_grads(backend):
    """torch's scan autograd (a backward scan) through coil, the body reading a lifted
    weight; the backward scan's first carry is the expanded gradient of a sum."""
    from torch._higher_order_ops import scan
    from coil.capture import frame

    def fn(init, xs, w):
        def step(c, x):
            n = torch.tanh(c @ w + x)
            return n, n * 2
        c, ys = scan(step, init, xs)
        return c.sum() + ys.sum()

    frame.break_log.clear()
    args = (torch.randn(2, 4, requires_grad=True), torch.randn(5, 2, 4, requires_grad=True),
            torch.randn(4, 4, requires_grad=True))
    assert_same_as_eager(fn, args, backend=backend, check_grads=True)
    assert not frame.break_log


def test_scan_carry_changing_dtype_raises():
    from torch._higher_order_ops import scan

    def fn(init, xs):
        return scan(lambda c, x: (c.double() + x, x), init, xs)

    with pytest.raises(UserError, match="changes carry 0"):
        coil.compile(fn, backend="eager")(torch.zeros(3), torch.randn(2, 3))


def test_scan_carry_changing_strides_raises():
    """An expanded init whose carry comes back dense: eager's scan refuses it too."""
    from torch._higher_order_ops import scan

    def fn(xs):
        return scan(lambda c, x: (c * x + 1, c.sum()), torch.ones(1).expand(4), xs)

    with pytest.raises(UserError, match="changes carry 0"):
        coil.compile(fn, backend="eager")(torch.randn(3, 4))


def _method_body(x):
    y = (x * 2).sin() * x
    return torch.cos(y).exp().relu() + y.tanh()


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_body_with_tensor_methods_saves_only_its_input(backend, tmp_path):
    """A checkpoint body calling tensor methods (``x.sin()``, ``z.relu()``): capture tagged only its ``call_function``
    nodes for recomputation, so each method call was outside the region, the values feeding it were region outputs
    kept for the backward, and the body saved three activations where eager's checkpoint saves only its input."""
    from torch.utils.checkpoint import checkpoint

    def fn(x):
        return checkpoint(_method_body, x, use_reentrant=False)

    assert_same_as_eager(fn, (torch.randn(8),), backend=backend, check_grads=True)
    assert _activation_bytes(tmp_path, fn, torch.randn(8, requires_grad=True), backend) == 0


def _random_bodies():
    return {"rand_like": lambda x: x * torch.rand_like(x),
            "dropout": lambda x: torch.nn.functional.dropout(x.sin(), 0.5, training=True) * x}


@pytest.mark.parametrize("body", ["rand_like", "dropout"])
@pytest.mark.parametrize("fallback_random", [True, False])
def test_checkpoint_over_torch_random_ops_matches_eager(body, fallback_random):
    """Non-reentrant checkpoint over ``torch.rand_like`` / dropout: eager recomputes the body in the backward with the
    torch RNG state restored (same numbers); coil never recomputes a random op (the partitioner saves it). With
    ``fallback_random`` (eager's kernels) values, gradients and the RNG state afterwards are eager's bit for bit;
    without, coil's in-kernel stream differs from eager's, but the gradient uses the forward's numbers."""
    from torch.utils.checkpoint import checkpoint

    f = _random_bodies()[body]

    def fn(x):
        return checkpoint(f, x, use_reentrant=False)

    x0 = torch.randn(16) + 3   # (no zeros: out / x below)
    res = []
    for g in (fn, coil.compile(fn, options={"fallback_random": fallback_random})):
        torch.manual_seed(0)
        x = x0.clone().requires_grad_()
        out = g(x)
        out.backward(torch.ones_like(out))
        res.append((out.detach(), x.grad, torch.rand(3)))
    if fallback_random:
        torch.testing.assert_close(res[1], res[0], rtol=0, atol=0)
    out, grad, _ = res[1]
    if body == "rand_like":    # d(x * r)/dx = r = out / x
        torch.testing.assert_close(grad, out / x0)
    else:                      # the dropout mask of the forward, in the sin's derivative
        torch.testing.assert_close(grad, torch.where(out != 0, 2 * (x0.sin() + x0 * x0.cos()), 0.0))


def test_checkpoint_over_python_random_draws_once():
    """Sharp edge: ``random.random()`` in a checkpoint body is drawn once, in the forward (the entry calls it and
    passes the number to the graph), and the gradient uses that number. Eager's checkpoint restores the torch RNG
    state, not Python's: its backward re-runs the body and draws a second number, which the recomputed tensors (the
    ``sin``'s input) take while ``mul``'s Scalar stays the first, and leaves Python's RNG one draw further. Values are
    eager's; eager's gradient (of two draws) and the Python RNG state afterwards are not."""
    import math
    import random

    from torch.utils.checkpoint import checkpoint

    def body(x):
        return (x * random.random()).sin()

    def fn(x):
        return checkpoint(body, x, use_reentrant=False)

    res = []
    for g in (fn, coil.compile(fn)):
        random.seed(0)
        x = torch.ones(4, requires_grad=True)
        out = g(x)
        out.sum().backward()
        res.append((out.detach(), x.grad, random.random()))
    random.seed(0)
    first, second, third = random.random(), random.random(), random.random()
    torch.testing.assert_close(res[1][0], res[0][0])                  # forward: the first draw, both
    torch.testing.assert_close(res[0][1], torch.full((4,), math.cos(second) * first))   # eager: two draws
    torch.testing.assert_close(res[1][1], torch.full((4,), math.cos(first) * first))    # coil: the forward's
    assert (res[0][2], res[1][2]) == (third, second)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_checkpoint_saves_only_the_outer_input(backend, tmp_path):
    """A checkpoint inside a checkpoint's body: capture gave the inner body's nodes their own region, so the inner
    checkpoint's input and output were outputs of the inner region read by the outer one, kept for the backward.
    Eager's outer checkpoint recomputes them like every other value of its body: one region, only ``x`` saved."""
    from torch.utils.checkpoint import checkpoint

    def outer(z):
        return checkpoint(lambda a: a.sin().exp(), z.cos(), use_reentrant=False).tanh() + 1

    def fn(x):
        return checkpoint(outer, x, use_reentrant=False)

    assert_same_as_eager(fn, (torch.randn(8),), backend=backend, check_grads=True)
    assert _activation_bytes(tmp_path, fn, torch.randn(8, requires_grad=True), backend) == 0


def test_checkpoint_with_early_stop_off_runs_eagerly():
    """``set_checkpoint_early_stop(False)``: eager's recomputation runs the whole body, so ``z.tanh().add_(1)``
    differentiates tanh at the written value (``1 - (tanh + 1) ** 2``); the compiled graph reads saved values as of
    the region's last save (early stop). Capture guards the flag and breaks at the checkpoint when it is off."""
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    def fn(x):
        return checkpoint(lambda z: z.tanh().add_(1.0), x, use_reentrant=False).sum()

    cf = coil.compile(fn)
    x0 = torch.randn(5)
    for early_stop in (True, False, True):
        with set_checkpoint_early_stop(early_stop):
            grads = []
            for f in (fn, cf):
                x = x0.clone().requires_grad_()
                f(x).backward()
                grads.append(x.grad)
        torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_of_a_0d_output_with_grads_under_dynamic_shapes(backend):
    """torch's scan autograd saves the sizes its backward reads (``sum``'s, to expand the gradient of a 0-d output)
    as per-step outputs it stacks, unless they are inputs of the body: capture lifts the symbols of the body's input
    sizes as torch's does ("'SymInt' object has no attribute 'unsqueeze'": FINDINGS_73 8)."""
    from torch._higher_order_ops import scan

    def f(xs, init):
        def comb(c, x):
            n = c + x
            return n, n.sum()
        return scan(comb, init, xs)

    compiled = coil.compile(f, backend=backend, dynamic=True)
    for n, m in ((6, 3), (4, 5), (7, 2)):
        xs, init = torch.randn(n, m, requires_grad=True), torch.randn(m, requires_grad=True)
        xs2, init2 = xs.detach().clone().requires_grad_(), init.detach().clone().requires_grad_()
        got, want = compiled(xs, init), f(xs2, init2)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        sum(t.sum() for t in got).backward()
        sum(t.sum() for t in want).backward()
        torch.testing.assert_close(xs.grad, xs2.grad)
        torch.testing.assert_close(init.grad, init2.grad)
