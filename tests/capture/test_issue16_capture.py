"""Issue 16: capture bugs and graph breaks where torch.compile captures.

Each test is the smallest input that showed the bug, compared with eager PyTorch."""
import pytest
import torch

import coil
from coil.testing import CompileCounter, assert_same_as_eager


def _eager_and_compiled(fn, *args, backend="eager"):
    """(eager result or exception repr, compiled result or exception repr)."""
    out = []
    for f in (fn, coil.compile(fn, backend=backend)):
        try:
            out.append(f(*[a.clone() for a in args]))
        except Exception as e:  # noqa: BLE001
            out.append(repr(e))
    return out


# --- 1. iterating a container that the loop body mutates --------------------------------

def test_for_loop_sees_items_appended_to_its_list():
    def f(x):
        xs = [x, x + 1]
        for t in xs:
            if len(xs) < 5:
                xs.append(t * 2)
        return sum(xs)

    assert_same_as_eager(f, (torch.randn(3),), backend="eager")


def test_genexpr_sees_items_appended_to_its_list():
    def f(x):
        xs = [x, x + 1]
        return list(xs.append(t * 2) or t for t in xs if len(xs) < 6)

    assert_same_as_eager(f, (torch.randn(3),), backend="eager")


def test_for_loop_over_list_shrunk_by_body():
    def f(x):
        xs = [x, x + 1, x + 2]
        out = []
        for t in xs:
            out.append(t)
            xs.pop()
        return out

    assert_same_as_eager(f, (torch.randn(3),), backend="eager")


def test_list_iterator_live_across_graph_break():
    def f(x):
        xs = [x, x + 1]
        it = iter(xs)
        a = next(it)
        print("", end="")       # graph break with the iterator live
        xs.append(x * 3)
        return [a] + list(it)

    e, c = _eager_and_compiled(f, torch.randn(3))
    assert len(c) == len(e) == 3
    for a, b in zip(e, c):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["dict", "set", "dict_after_break", "dict_items"])
def test_container_resized_during_iteration_raises(kind):
    def f_dict(x):
        d = {"a": x}
        for k in d:
            d["b"] = x
        return d

    def f_set(x):
        s = {1, 2}
        for k in s:
            s.add(k + 10)
        return x

    def f_dict_after_break(x):
        d = {"a": x}
        it = iter(d)
        next(it)
        print("", end="")
        d["b"] = x
        return list(it)

    def f_dict_items(x):
        d = {"a": x, "b": x + 1}
        for k, v in d.items():
            d.pop("b")
        return x

    fn = {"dict": f_dict, "set": f_set, "dict_after_break": f_dict_after_break,
          "dict_items": f_dict_items}[kind]
    e, c = _eager_and_compiled(fn, torch.randn(3))
    assert isinstance(e, str) and "changed size during iteration" in e
    assert c == e


def test_dict_iteration_without_resize_stays_one_graph():
    def f(x):
        d = {"a": x, "b": x + 1}
        for k in d:
            d[k] = d[k] * 2           # same size: allowed
        return d["a"] + d["b"]

    cnt = CompileCounter()
    assert_same_as_eager(f, (torch.randn(3),), backend=cnt)
    assert cnt.frame_count == 1


# --- 4. torch.compiler.nested_compile_region helpers (regions) ---------------------------

import dataclasses  # noqa: E402


@dataclasses.dataclass
class _Cfg:
    scale: float


_CFG = _Cfg(1.0)


@torch.compiler.nested_compile_region
def _region_helper(x):
    return x * _CFG.scale


def test_nested_compile_region_reads_global_rebound_in_loop():
    def f(x):
        global _CFG
        out = x
        for i in range(3):
            _CFG = _Cfg(float(i + 2))
            out = _region_helper(out)
        return out

    cnt = CompileCounter()
    assert_same_as_eager(f, (torch.randn(4),), backend=cnt)
    assert cnt.frame_count == 1
    assert _CFG.scale == 4.0
    assert_same_as_eager(f, (torch.randn(4, requires_grad=True),), check_grads=True)


def test_nested_compile_region_method_and_rebinding():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        @torch.compiler.nested_compile_region
        def block(self, x):
            return torch.relu(self.lin(x))

        def forward(self, x):
            return self.block(self.block(x))

    assert_same_as_eager(M(), (torch.randn(2, 4),), check_grads=True)

    global _region_helper
    saved = _region_helper

    def g(x):
        return _region_helper(x)

    try:
        cg = coil.compile(g, backend="eager")
        x = torch.randn(3)
        _CFG.scale = 3.0
        torch.testing.assert_close(cg(x), x * 3.0)
        _region_helper = torch.compiler.nested_compile_region(lambda x: x + 1)
        torch.testing.assert_close(cg(x), x + 1)      # a different region: recompiled
    finally:
        _region_helper = saved


# --- 3. closures share their cells with the code after a graph break ---------------------

@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_closure_reads_variable_bound_after_data_dependent_branch(sign):
    def f(x):
        def g(y):
            return y.mul_(w)
        if x.sum() > 0:
            x = x + 1
        w = x * 2
        return g(x.clone())

    assert_same_as_eager(f, (torch.rand(4) * sign,), backend="eager")


def test_closure_writes_nonlocal_across_break_and_in_try():
    def f(x):
        n = 0

        def bump(t):
            nonlocal n
            n += 1
            return t + n
        x = bump(x)
        print("", end="")          # a graph break (call)
        x = bump(x)
        try:
            print("", end="")      # a graph break inside a try block (trampoline)
            x = bump(x)
        finally:
            x = x * n
        return x, n

    assert_same_as_eager(f, (torch.randn(3),), backend="eager")


def test_parameter_cell_rebound_after_break():
    def f(x, k):
        def g():
            return x * k
        if x.sum() > 0:
            k = k + 1
        x = x - 1
        return g()

    for s in (1.0, -1.0):
        assert_same_as_eager(f, (torch.rand(3) * s, 2), backend="eager")


# --- 2. hooks registered after the first compiled call ----------------------------------

def _hook_run(kind, compiled, where):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    f = coil.compile(m, backend="eager") if compiled else m
    x = torch.randn(4, 3, requires_grad=True)
    f(x).sum().backward()                      # first call: compiled without hooks
    target = m if where == "top" else m[0]
    mm = torch.nn.modules.module
    handles = []
    if kind == "backward_pre":
        handles.append(target.register_full_backward_pre_hook(lambda mod, go: (go[0] * 10,)))
    elif kind == "backward":
        handles.append(target.register_full_backward_hook(lambda mod, gi, go: (gi[0] * 3,)))
    elif kind == "forward_pre":
        handles.append(target.register_forward_pre_hook(lambda mod, a: (a[0] * 2,)))
    elif kind == "forward":
        handles.append(target.register_forward_hook(lambda mod, a, o: o + 1))
    elif kind == "global_forward":
        handles.append(mm.register_module_forward_hook(
            lambda mod, a, o: o * 2 if isinstance(mod, torch.nn.ReLU) else None))
    elif kind == "global_backward":
        handles.append(mm.register_module_full_backward_hook(
            lambda mod, gi, go: (gi[0] * 5,) if isinstance(mod, torch.nn.ReLU) else None))
    elif kind == "param_tensor":
        handles.append(m[0].weight.register_hook(lambda g: g * 7))
    try:
        x.grad = None
        m.zero_grad()
        out = f(x)
        out.sum().backward()
        return out.detach(), x.grad.clone(), m[0].weight.grad.clone()
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("where", ["inner", "top"])
@pytest.mark.parametrize("kind", ["backward_pre", "backward", "forward_pre", "forward",
                                  "global_forward", "global_backward", "param_tensor"])
def test_hook_registered_after_first_compiled_call_is_honoured(kind, where):
    e, c = _hook_run(kind, False, where), _hook_run(kind, True, where)
    for a, b in zip(e, c):
        torch.testing.assert_close(b, a)


def test_replaced_forward_hook_recompiles():
    m = torch.nn.Linear(3, 3)
    f = coil.compile(m, backend="eager")
    x = torch.randn(2, 3)
    h = m.register_forward_hook(lambda mod, a, o: o + 1)
    torch.testing.assert_close(f(x), m(x))
    h.remove()
    m.register_forward_hook(lambda mod, a, o: o * 3)   # as many hooks, another one
    torch.testing.assert_close(f(x), m(x))


# --- 5b. functools.lru_cache functions ----------------------------------------------------

import functools  # noqa: E402

_LRU_CALLS = []
_LRU_FLAG = {"on": True}


@functools.lru_cache
def _lru_flag(name):
    _LRU_CALLS.append(name)          # eager runs the body once per key
    return _LRU_FLAG["on"] and name == "yes"


def test_lru_cache_function_with_constant_args_one_graph():
    def f(x):
        if _lru_flag("yes"):
            x = x + 1
        if _lru_flag("no"):
            x = x * 100
        return x * 2

    _lru_flag.cache_clear()
    _LRU_CALLS.clear()
    cnt = CompileCounter()
    cf = coil.compile(f, backend=cnt)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(cf(x), (x + 1) * 2)
    assert cnt.frame_count == 1
    assert _LRU_CALLS == ["yes", "no"]          # the body ran once per key, as in eager
    _LRU_FLAG["on"] = False
    try:
        _lru_flag.cache_clear()                 # a new cached result: recompiled
        torch.testing.assert_close(cf(x), x * 2)
        assert cnt.frame_count == 2
    finally:
        _LRU_FLAG["on"] = True
        _lru_flag.cache_clear()


@functools.lru_cache
def _lru_tensor(n):
    return torch.ones(n)


def test_lru_cache_returning_tensor_stays_correct():
    def f(x):
        return x + _lru_tensor(3)

    _lru_tensor.cache_clear()
    assert_same_as_eager(f, (torch.randn(3),), backend="eager")


# --- 5c. dict lookups keyed by types; object.__getattribute__ past a custom one ----------

_BY_TYPE = {list: "list", tuple: "tuple"}


def test_dict_get_with_type_keys_is_traced_and_guarded():
    def f(x, kind):
        v = _BY_TYPE.get(kind)
        if v == "list":
            return x + 1
        if list in _BY_TYPE and _BY_TYPE[tuple] == "tuple":
            return x - 1
        return x

    cnt = CompileCounter()
    cf = coil.compile(f, backend=cnt)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x, list), x + 1)
    assert cnt.frame_count == 1
    torch.testing.assert_close(cf(x, tuple), x - 1)
    _BY_TYPE[list] = "changed"
    try:
        torch.testing.assert_close(cf(x, list), x - 1)       # guard on the found value
    finally:
        _BY_TYPE[list] = "list"


class _Shadowing:
    attribute_map = {"a": "b"}

    def __init__(self):
        self.b = 2.0

    def __getattribute__(self, key):
        d = super().__getattribute__("__dict__")
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        if d.get("missing") is not None:
            raise AssertionError
        return super().__getattribute__(key)


def test_object_getattribute_through_super():
    obj = _Shadowing()

    def f(x):
        return x * obj.a + obj.b

    cnt = CompileCounter()
    assert_same_as_eager(f, (torch.randn(3),), backend=cnt)
    assert cnt.frame_count == 1


# --- 5b/5c on transformers models ---------------------------------------------------------

def _hf_check(model, args, kwargs):
    """Compiled (backend 'eager') gives eager's loss/output and gradients; one graph."""
    import copy

    ref = copy.deepcopy(model)
    cnt = CompileCounter()
    outs = []
    for m, fn in ((ref, ref), (model, coil.compile(model, backend=cnt))):
        torch.manual_seed(0)
        out = fn(*args, **kwargs)
        val = out.loss if getattr(out, "loss", None) is not None else out.last_hidden_state
        val.sum().backward()
        outs.append((val.detach(), [p.grad for p in m.parameters()], m.config.problem_type
                     if hasattr(m.config, "problem_type") else None))
    (ve, ge, pe), (vc, gc, pc) = outs
    torch.testing.assert_close(vc, ve)
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b)
    assert pc == pe
    return cnt


@pytest.mark.parametrize("arch", ["vit", "convnext"])
def test_hf_image_classification_with_labels_one_graph(arch):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if arch == "vit":
        cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=37, image_size=16, patch_size=8,
                                     num_labels=3)
        model = transformers.ViTForImageClassification(cfg)
    else:
        cfg = transformers.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                                          image_size=16, num_labels=3)
        model = transformers.ConvNextForImageClassification(cfg)
    model.train()
    px, labels = torch.randn(2, 3, 16, 16), torch.tensor([0, 2])
    cnt = _hf_check(model, (px,), {"labels": labels})
    assert cnt.frame_count == 1


def test_hf_wav2vec2_one_graph():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=37, conv_dim=(8, 8), conv_stride=(5, 2),
                                      conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                      num_conv_pos_embedding_groups=2)
    model = transformers.Wav2Vec2Model(cfg).eval()
    cnt = _hf_check(model, (torch.randn(1, 400),), {})
    assert cnt.frame_count == 1


# --- 5a. custom torch.autograd.Function: traced, with the user's backward ----------------

class _TanhGelu(torch.autograd.Function):
    """BLOOM-style GeLU whose backward is deliberately *not* the derivative of forward
    (scaled by 3), so a compiled gradient from autograd's derivative would be caught."""

    @staticmethod
    def forward(ctx, x, bias, scale):
        ctx.save_for_backward(x, bias)
        ctx.scale = scale
        y = x + bias
        return y * 0.5 * (1.0 + torch.tanh(0.79788456 * y * (1 + 0.044715 * y * y)))

    @staticmethod
    def backward(ctx, g):
        x, bias = ctx.saved_tensors
        y = x + bias
        t = torch.tanh(0.79788456 * y * (1 + 0.044715 * y * y))
        d = 0.5 * y * ((1 - t * t) * (0.79788456 + 0.1070322243 * y * y)) + 0.5 * (1 + t)
        return d * g * ctx.scale, d * g, None


class _SplitFn(torch.autograd.Function):
    """Two outputs, one non-differentiable; setup_context style."""

    @staticmethod
    def forward(x):
        return x * 2, (x > 0).to(x.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, g, g_mask):
        return g * 5


class _ItemInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * float(x.sum().item() > 0)      # not traceable: stays a graph break


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "coil"])
def test_autograd_function_traced_with_user_backward(backend):
    def f(x, b):
        return _TanhGelu.apply(x * 2, b, 3.0).sum()

    cnt = CompileCounter()
    coil.compile(f, backend=cnt)(torch.randn(4), torch.randn(4))
    assert cnt.frame_count == 1
    x, b = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    assert_same_as_eager(f, (x, b), backend=backend, check_grads=True)
    # the gradient is the user's (3x the true derivative), not autograd's of forward
    x.grad = None
    coil.compile(f, backend=backend)(x, b).backward()
    y = (x * 2 + b).detach().requires_grad_()
    torch.nn.functional.gelu(y, approximate="tanh").sum().backward()
    torch.testing.assert_close(x.grad, y.grad * 2 * 3, atol=1e-5, rtol=1e-4)


def test_autograd_function_setup_context_two_outputs():
    def f(x):
        a, mask = _SplitFn.apply(x)
        return (a * mask).sum() + a.sum()

    cnt = CompileCounter()
    coil.compile(f, backend=cnt)(torch.randn(5))
    assert cnt.frame_count == 1
    assert_same_as_eager(f, (torch.randn(5, requires_grad=True),), backend="aot_eager",
                         check_grads=True)


def test_autograd_function_untraceable_backward_stays_a_break():
    def f(x):
        return _ItemInBackward.apply(x * 2).sum()

    ex = coil.explain(f, torch.randn(3, requires_grad=True))
    assert ex.graph_break_count == 1 and "cannot be traced" in ex.break_reasons[0]["reason"]
    assert_same_as_eager(f, (torch.randn(3, requires_grad=True),), backend="aot_eager",
                         check_grads=True)


def test_autograd_function_redefined_backward_recompiles():
    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def f(x):
        return Fn.apply(x).sum()

    cf = coil.compile(f, backend="aot_eager")
    x = torch.randn(3, requires_grad=True)
    cf(x).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    Fn.backward = staticmethod(lambda ctx, g: g * 7)
    x.grad = None
    cf(x).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 7.0))


def test_hf_bloom_gelu_training_one_graph():
    transformers = pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import BloomGelu

    m = BloomGelu().train()
    cnt = CompileCounter()
    coil.compile(m, backend=cnt)(torch.randn(2, 8))
    assert cnt.frame_count == 1
    assert_same_as_eager(m, (torch.randn(2, 8, requires_grad=True),), backend="aot_eager",
                         check_grads=True)


# --- 1 (continued). zip / enumerate / map / filter are lazy, as in CPython --------------

def test_enumerate_and_zip_see_items_appended_to_their_list():
    def f(x):
        xs, ys = [x, x + 1], [1, 2, 3, 4]
        out = []
        for i, t in enumerate(xs):
            if i < 3:
                xs.append(t * 2)
            out.append(t * i)
        for t, k in zip(xs, ys):
            out.append(t * k)
        return out

    assert_same_as_eager(f, (torch.randn(3),), backend="eager")


_MAP_CALLS = []


def _counted(t):
    _MAP_CALLS.append(1)
    return t * len(_MAP_CALLS)


def test_map_calls_its_function_lazily():
    def f(x):
        m = map(_counted, [x, x + 1, x + 2])
        first = next(m)
        _MAP_CALLS.append(10)             # eager: between the first and second call
        return [first] + list(m) + [x * len(_MAP_CALLS)]

    outs = []
    for fn in (f, coil.compile(f, backend="eager")):
        _MAP_CALLS.clear()
        outs.append(fn(torch.ones(2)))
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a)


def test_enumerate_live_across_graph_break():
    def f(x):
        xs = [x, x + 1, x + 2]
        e = enumerate(xs)
        a = next(e)
        print("", end="")
        xs.append(x * 5)
        return [a[1] * a[0]] + [t * i for i, t in e]

    assert_same_as_eager(f, (torch.randn(3),), backend="eager")


def test_comprehension_closures_then_break():
    def f(x):
        fs = [lambda: x * i for i in range(3)]
        print("", end="")          # a graph break with the closures live
        return [g() for g in fs]

    assert_same_as_eager(f, (torch.randn(3),), backend="eager")


def test_dict_views_are_live_and_exhausted_iterators_stay_exhausted():
    def f(x):
        d = {"a": x}
        ks, vs, its = d.keys(), d.values(), d.items()
        d["b"] = x + 1
        out = [list(ks), [v * 2 for v in vs], len(its), "b" in ks]
        it = iter(d)
        list(it)
        d["c"] = x                       # after exhaustion: no error, as in CPython
        return out, next(it, None), d

    assert_same_as_eager(f, (torch.randn(3),), backend="eager")


def test_truth_value_of_a_submodule_is_captured_and_guarded():
    """MobileViT's ``if self.downsampling_layer:`` (a module, or None) was a graph break
    ("not a compile-time constant"): bool() of a module follows Python's rule (True
    unless its class defines ``__len__``: an empty Sequential is falsy)."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.down = torch.nn.Linear(4, 4)
            self.seq = torch.nn.Sequential()

        def forward(self, x):
            if self.down:
                x = self.down(x)
            if self.seq:
                x = x * 100
            return x + 1

    m, x = Block(), torch.randn(2, 4)
    cnt = CompileCounter()
    cm = coil.compile(m, backend=cnt, fullgraph=True)
    torch.testing.assert_close(cm(x), m(x))
    m.seq.append(torch.nn.Identity())              # now truthy: the guard sees it
    torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 2


@pytest.mark.parametrize("method_load", [True, False])
def test_rest_of_frame_is_captured_after_a_break_in_a_property_getter(method_load):
    """GPT-2's training call: transformers' ``loss_function`` property logs a warning (a
    break in the getter, at the caller's LOAD_METHOD). The frame resumed at that load
    uncaptured, so the cross-entropy after it ran outside any graph; now the getter is
    called from the entry and the frame resumes captured after the load."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 5)

        @property
        def lossf(self):
            print("", end="")                      # a graph break in the getter
            return torch.nn.functional.cross_entropy

        def forward(self, x, y):
            if method_load:
                return self.lossf(self.lin(x), y) * 2
            f = self.lossf                         # LOAD_ATTR, not LOAD_METHOD
            return f(self.lin(x), y) * 2

    m, x, y = M(), torch.randn(3, 4), torch.tensor([0, 1, 4])
    cnt = CompileCounter()
    torch.testing.assert_close(coil.compile(m, backend=cnt)(x, y), m(x, y))
    ops = [n.target for g in cnt.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert torch.nn.functional.cross_entropy in ops
