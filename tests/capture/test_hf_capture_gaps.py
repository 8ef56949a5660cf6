"""Capture gaps found compiling transformers' Mamba and Jamba (slow path) and YOSO:

- ``ACT2FN["silu"]`` in the forward: ``ClassInstantier.__getitem__`` (an ``OrderedDict``
  subclass) calls ``super().__getitem__(key)`` (a graph break), then builds
  ``SiLUActivation()``, an ``nn.Module`` subclass with torch.nn's constructor (a graph
  break: only torch.nn's own classes were built in the frame);
- kernels' ``use_kernelized_func`` stores ``(obj, obj.forward.__func__)`` in a global
  before a graph break: the function has no source, so rebuilding the side effect failed
  and the whole frame ran eagerly (a capture fallback);
- YOSO's ``YosoCumulation.apply(..., self.config)`` (a custom autograd Function given a
  non-tensor object) is a graph break whose call the entry makes: ``Fn.apply`` could not
  be rebuilt there, and the whole frame ran eagerly."""
import collections

import torch

import coil
import coil.capture


class Instantier(collections.OrderedDict):
    def __getitem__(self, key):
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


class Doubling(dict):
    def __getitem__(self, key):
        return super().__getitem__(key) * 2

    def get(self, key, default=None):
        return super().get(key, default)


class SiLUActivation(torch.nn.Module):       # a user class with torch.nn's constructor
    def forward(self, x):
        return torch.nn.functional.silu(x)


class Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = []                         # a pure user constructor: built in the frame

    def forward(self, x):
        self.calls.append(1)
        return x * len(self.calls)


BUILT = [0]


class GELUActivation(torch.nn.Module):        # transformers' own __init__ (DeBERTa's ContextPooler)
    def __init__(self, use_gelu_python: bool = False):
        super().__init__()
        self.act = self._gelu_python if use_gelu_python else torch.nn.functional.gelu

    def _gelu_python(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / 1.4142135623730951))

    def forward(self, x):
        return self.act(x)


class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        BUILT[0] += 1                           # a side effect outside the object: a break

    def forward(self, x):
        return x * BUILT[0]


ACT = Instantier({"silu": SiLUActivation, "gelu": (torch.nn.GELU, {"approximate": "tanh"}),
                  "stateful": Stateful, "gelu_py": (GELUActivation, {"use_gelu_python": True}),
                  "counting": Counting})
TABLE = Doubling(a=3)


def _run(fn, *args):
    coil.reset()
    compiled = coil.compile(fn, backend="eager")
    torch.testing.assert_close(compiled(*args), fn(*args))
    return compiled, coil.capture.stats


def test_super_getitem_of_dict_subclass_and_user_module_in_frame():
    def f(x):
        return ACT["silu"](x) + ACT["gelu"](x) + TABLE["a"] + TABLE.get("b", 1)

    x = torch.randn(6)
    compiled, stats = _run(f, x)
    assert stats["graph_breaks"] == 0 and stats["graphs"] == 1
    # the dict is read through guards: a change recompiles, a removed key raises as in eager
    TABLE["a"] = 5
    ACT["silu"] = torch.nn.Tanh
    try:
        torch.testing.assert_close(compiled(x), f(x))
        del TABLE["a"]
        try:
            compiled(x)
            raise AssertionError("expected KeyError")
        except KeyError:
            pass
    finally:
        TABLE["a"] = 3
        ACT["silu"] = SiLUActivation


def test_pure_user_constructor_is_built_in_the_frame():
    """FINDINGS_50 #4: ``ACT2FN["gelu"]`` builds transformers' ``GELUActivation`` (its own ``__init__``) in
    DeBERTa's pooler; its ``__init__`` is traced, found pure, and the module built at trace time."""
    def f(x):
        return ACT["stateful"](x) + ACT["stateful"](x) + ACT["gelu_py"](x)

    compiled, stats = _run(f, torch.randn(3))
    assert stats["graph_breaks"] == 0 and stats["graphs"] == 1
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))


def test_user_constructor_with_side_effects_is_a_break():
    def f(x):
        return ACT["counting"](x) + 1

    BUILT[0] = 0
    coil.reset()
    compiled = coil.compile(f, backend="eager")
    x = torch.randn(3)
    got = [compiled(x) for _ in range(3)]
    assert BUILT[0] == 3 and coil.capture.stats["graph_breaks"] == 1
    BUILT[0] = 0
    for g in got:
        torch.testing.assert_close(g, f(x))


class Holder:
    value = None


HOLDER = Holder()


class Kernel(torch.nn.Module):
    def forward(self, x):
        return x * 2


KERNEL = Kernel()


def test_sourceless_function_in_a_side_effect_at_a_break():
    def f(x):
        HOLDER.value = {"k": (KERNEL, KERNEL.forward.__func__)}
        y = x + 1
        print("break")                            # a graph break after the store
        return HOLDER.value["k"][1](KERNEL, y)

    HOLDER.value = None
    _, stats = _run(f, torch.randn(4))
    assert stats["fallbacks"] == 0
    assert HOLDER.value["k"][1] is Kernel.forward


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg):
        ctx.s = cfg.scale
        return x * cfg.scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.s, None


class Cfg:
    scale = 3.0


def test_autograd_function_with_an_object_argument_breaks_without_fallback():
    def f(x, cfg):
        return Scale.apply(x.sin(), cfg).cos()

    coil.reset()
    x = torch.randn(5, requires_grad=True)
    out = coil.compile(f)(x, Cfg())
    out.sum().backward()
    grad, x.grad = x.grad, None
    ref = f(x, Cfg())
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(grad, x.grad)
    assert coil.capture.stats["fallbacks"] == 0 and coil.capture.stats["graph_breaks"] == 1


@torch.jit.script
def _scripted_expand(pos: torch.Tensor, q: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
    return pos.expand([q.size(0), q.size(1), q.size(2), rel.size(-1)])


@torch.jit.script
def _scripted_scale(q: torch.Tensor, factor: int) -> torch.Tensor:
    return torch.sqrt(torch.tensor(q.size(-1), dtype=torch.float) * factor)


@torch.jit.script
def _scripted_one(q: torch.Tensor, factor: int) -> torch.Tensor:
    return torch.ones(())


def _traced_double(x):
    return x * 2 + 1


_TRACED = torch.jit.trace(_traced_double, torch.randn(3))


def test_scripted_and_traced_functions_are_inlined():
    """DeBERTa-v2 (transformers 5.17) calls ``@torch.jit.script`` helpers in every attention layer: each call was a
    graph break. Their Python functions are traced instead; replacing the global recompiles."""
    global _scripted_scale

    def f(x, pos, rel):
        y = x / _scripted_scale(x, 2) + _scripted_expand(pos, x, rel)
        return _TRACED(y) * _scripted_scale(y, 3)     # the same scripted function read twice

    x, pos, rel = torch.randn(2, 3, 4, 5), torch.randn(1, 1, 4, 5), torch.randn(1, 4, 5)
    compiled, stats = _run(f, x, pos, rel)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, pos, rel), f(x, pos, rel))
    # (a guard comparing the scripted function with its Python function recompiled every call)
    assert stats["graph_breaks"] == 0 and stats["graphs"] == 1 and stats["recompiles"] == 0
    saved = _scripted_scale
    _scripted_scale = _scripted_one
    try:
        torch.testing.assert_close(compiled(x, pos, rel), f(x, pos, rel))
    finally:
        _scripted_scale = saved


def test_jit_annotate_is_its_value():
    """``torch.jit.annotate(torch.Tensor, v)`` (TorchScript-ready model code) was recorded as a graph call whose class
    argument made the graph's code a SyntaxError: the whole frame ran eagerly; ``list[torch.Tensor]`` looked up
    ``list.__getitem__`` instead of ``__class_getitem__`` (a TypeError eager never raises, and a graph break)."""
    def f(x):
        y: torch.Tensor = torch.jit.annotate(torch.Tensor, x * 2)
        out = torch.jit.annotate(list[torch.Tensor], [])
        out.append(y + 1)
        return out[0]

    _, stats = _run(f, torch.randn(3))
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0 and stats["fallbacks"] == 0


def test_typing_subscripts_are_compile_time_constants():
    """``typing.List[torch.Tensor]`` is evaluated at trace time (a subscript of a typing form by classes, typing forms,
    constants and tuples or lists of them); before, typing's ``lru_cache`` (3.11) or its ``_caches`` dict (3.12)
    made each subscript a graph break."""
    import typing

    def f(x):
        out = torch.jit.annotate(typing.List[torch.Tensor], [])
        named = torch.jit.annotate(typing.Dict[str, torch.Tensor], {})
        none = torch.jit.annotate(typing.Optional[torch.Tensor], None)
        torch.jit.annotate(typing.Callable[[int], str], None)
        torch.jit.annotate(typing.Tuple[int, ...], (1,))
        out.append(x * 2)
        named["a"] = x
        return out[0] + named["a"] if none is None else x

    _, stats = _run(f, torch.randn(3))
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0 and stats["fallbacks"] == 0


def test_scripted_function_is_inlined_when_its_call_is_patched(monkeypatch):
    """torch.testing._internal patches ``ScriptFunction.__call__`` with a Python profiling wrapper on import: the
    scripted function's Python original was then not found (4 graph breaks, tests passing or failing by order)."""
    original_call = torch.jit.ScriptFunction.__call__

    def prof_func_call(self, *args, **kwargs):
        return original_call(self, *args, **kwargs)

    monkeypatch.setattr(torch.jit.ScriptFunction, "__call__", prof_func_call)

    def f(x, pos, rel):
        return x / _scripted_scale(x, 2) + _scripted_expand(pos, x, rel)

    x, pos, rel = torch.randn(2, 3, 4, 5), torch.randn(1, 1, 4, 5), torch.randn(1, 4, 5)
    compiled, stats = _run(f, x, pos, rel)
    torch.testing.assert_close(compiled(x, pos, rel), f(x, pos, rel))
    assert stats["graph_breaks"] == 0 and stats["graphs"] == 1
