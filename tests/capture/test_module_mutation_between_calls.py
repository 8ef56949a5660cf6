"""A module changed between calls of its compiled form (an entry replaced, a parameter
reassigned) gives eager's value: capture re-reads what the frame reads through its
sources, or a guard recompiles. Never a value computed from the old module."""
import torch
import torch.nn as nn

import coil


class _Sliced(nn.Module):
    """Entries reached through a slice of a ModuleList / Sequential / ParameterList."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])
        self.seq = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3))
        self.pl = nn.ParameterList([nn.Parameter(torch.randn(3)) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers[::-1]:
            x = layer(x)
        x = self.seq[1:](x)
        for p in self.pl[::2]:
            x = x * p
        return x


def test_sliced_container_entries_replaced_after_first_call():
    # layers[::-1] built a new ModuleList at compile time whose parameters were held as
    # constants of the graph: after `m.layers[0] = nn.Linear(3, 3)` the compiled module
    # kept computing with the old layer (max abs difference ~0.9, silent).
    m = _Sliced()
    fast = coil.compile(m)
    x = torch.randn(2, 3)
    torch.testing.assert_close(fast(x), m(x))
    m.layers[0] = nn.Linear(3, 3)
    m.seq[2] = nn.Linear(3, 3)
    m.pl[2] = nn.Parameter(torch.randn(3))
    torch.testing.assert_close(fast(x), m(x))
    m.layers[2].weight = nn.Parameter(torch.zeros(3, 3))
    torch.testing.assert_close(fast(x), m(x))


def test_sliced_container_gradients_reach_the_parameters():
    m = _Sliced()
    x = torch.randn(2, 3)
    m(x).sum().backward()
    eager = [p.grad for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    coil.compile(m)(x).sum().backward()
    for p, g in zip(m.parameters(), eager):
        if g is None:               # seq[0], pl[1]: not used
            assert p.grad is None
        else:
            torch.testing.assert_close(p.grad, g)


def test_method_shadowed_on_the_instance_after_first_call():
    # `m.act = f` (an instance attribute over the class's method) was not guarded: the
    # compiled module kept calling the class's act (relu) instead of f.
    class M(nn.Module):
        def act(self, x):
            return x.relu()

        def forward(self, x):
            return self.act(x)

    class Plain:
        def act(self, x):
            return x.relu()

    m, obj = M(), Plain()
    fast = coil.compile(m)
    fast_fn = coil.compile(lambda x: obj.act(x) + 1)
    x = torch.randn(5)
    torch.testing.assert_close(fast(x), m(x))
    torch.testing.assert_close(fast_fn(x), obj.act(x) + 1)
    m.act = lambda x: x * 100
    obj.act = lambda x: x * 100
    torch.testing.assert_close(fast(x), x * 100)
    torch.testing.assert_close(fast_fn(x), x * 100 + 1)
    del m.act
    torch.testing.assert_close(fast(x), x.relu())


def test_defaults_of_the_compiled_function_reassigned_or_edited():
    # the argument binder held the defaults of the first call: after
    # `f.__defaults__ = (7.0,)` the compiled f still multiplied by 1.0
    def f(x, s=1.0, *, t=1.0):
        return x * s + t

    fast = coil.compile(f)
    x = torch.randn(4)
    torch.testing.assert_close(fast(x), f(x))
    f.__defaults__ = (7.0,)
    torch.testing.assert_close(fast(x), x * 7.0 + 1.0)
    f.__kwdefaults__["t"] = 3.0
    torch.testing.assert_close(fast(x), x * 7.0 + 3.0)
    f.__kwdefaults__ = {"t": -2.0}
    torch.testing.assert_close(fast(x), x * 7.0 - 2.0)
    torch.testing.assert_close(fast(x, 2.0, t=0.5), x * 2.0 + 0.5)


def test_defaults_of_an_inlined_function_reassigned():
    # literal defaults of a function called inside the frame are guarded by one identity check of the tuple
    def helper(x, s=2.0, b=None, mode="mul"):
        y = x * s if mode == "mul" else x + s
        return y if b is None else y + b

    fast = coil.compile(lambda x: helper(x))
    x = torch.randn(4)
    torch.testing.assert_close(fast(x), x * 2.0)
    helper.__defaults__ = (3.0, None, "add")
    torch.testing.assert_close(fast(x), x + 3.0)
    helper.__defaults__ = (3.0, 1.0, "mul")
    torch.testing.assert_close(fast(x), x * 3.0 + 1.0)


def test_property_replaced_on_the_class_after_first_call():
    # methods replaced on the class recompiled, properties did not: the compiled
    # function kept the old getter's value
    class A:
        @property
        def scale(self):
            return 2.0

    a = A()
    fast = coil.compile(lambda x: x * a.scale)
    x = torch.randn(4)
    torch.testing.assert_close(fast(x), x * 2.0)
    A.scale = property(lambda self: 10.0)
    torch.testing.assert_close(fast(x), x * 10.0)


def test_attribute_missing_at_compile_time_set_later():
    # hasattr(o, "flag") / getattr(m, "cache", None) found nothing and guarded nothing:
    # an attribute (or buffer) set after the first call was never seen
    class O:
        pass

    class M(nn.Module):
        def forward(self, x):
            c = getattr(self, "cache", None)
            return x if c is None else x + c

    o, m = O(), M()
    fast_fn = coil.compile(lambda x: x * 2 if hasattr(o, "flag") else x)
    fast_m = coil.compile(m)
    x = torch.randn(3)
    torch.testing.assert_close(fast_fn(x), x)
    torch.testing.assert_close(fast_m(x), x)
    o.flag = True
    m.cache = torch.ones(3)
    torch.testing.assert_close(fast_fn(x), x * 2)
    torch.testing.assert_close(fast_m(x), x + 1)
    del m.cache
    m.register_buffer("cache", torch.full((3,), 2.0))
    torch.testing.assert_close(fast_m(x), x + 2)


def test_method_reached_through_super_replaced_after_first_call():
    # super().act(x) resolved Base.act at compile time without a guard: after
    # Base.act was replaced, the compiled Child kept calling the old one
    class Base(nn.Module):
        def act(self, x):
            return x + 1

    class Child(Base):
        def act(self, x):
            return super().act(x) * 2

        def forward(self, x):
            return self.act(x)

    m = Child()
    fast = coil.compile(m)
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), (x + 1) * 2)
    Base.act = lambda self, x: x - 5
    torch.testing.assert_close(fast(x), (x - 5) * 2)


def test_class_attribute_read_through_type_of_self():
    # type(self) / self.__class__ was wrapped without a source, so type(self).X and
    # self.__class__.table["a"] became constants: changing them on the class was not seen
    class C:
        X = 2.0
        table = {"a": 1.0}

        def m(self, x):
            return x * type(self).X * self.__class__.table["a"]

    c = C()
    fast = coil.compile(lambda x: c.m(x))
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), x * 2.0)
    C.X = 5.0
    torch.testing.assert_close(fast(x), x * 5.0)
    C.table["a"] = 7.0
    torch.testing.assert_close(fast(x), x * 35.0)


def test_module_imported_inside_the_function_is_read_per_call(monkeypatch):
    # `import mod` / `from mod import cfg` inside the compiled function wrapped the module
    # without a source: mod.K and cfg["s"] became constants of the graph
    import sys
    import types

    mod = types.ModuleType("_coil_test_local_import")
    mod.K, mod.cfg, mod.W = 2.0, {"s": 1.0}, torch.ones(3)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)

    def f(x):
        import _coil_test_local_import as m
        from _coil_test_local_import import cfg
        return x * m.K * cfg["s"] * m.W

    fast = coil.compile(f)
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), f(x))
    mod.K = 3.0
    torch.testing.assert_close(fast(x), f(x))
    mod.cfg["s"] = 5.0
    torch.testing.assert_close(fast(x), f(x))
    mod.W = torch.full((3,), 4.0)
    torch.testing.assert_close(fast(x), f(x))


def test_hook_objects_state_is_read_per_call():
    # a hook that is a callable object, a bound method or a functools.partial was wrapped
    # without a source: the state it reads (self.scale, a dict in the partial) was a
    # constant, so changing it between calls was not seen
    import functools

    class Scaler:
        def __init__(self):
            self.scale = 2.0

        def __call__(self, mod, inp, out):
            return out * self.scale

        def meth(self, mod, inp, out):
            return out + self.scale

    m = nn.Linear(3, 3)
    fast = coil.compile(m)
    x = torch.randn(2, 3)
    sc, state = Scaler(), {"k": 1.0}
    for hook in (sc, sc.meth, functools.partial(lambda st, mod, i, o: o * st["k"], state)):
        handle = m.register_forward_hook(hook)
        torch.testing.assert_close(fast(x), m(x))
        sc.scale += 3.0
        state["k"] += 2.0
        torch.testing.assert_close(fast(x), m(x))
        handle.remove()


def test_forward_hook_added_while_a_pre_hook_exists():
    # with a pre-hook registered, only the non-empty hook dicts were guarded: a forward
    # hook added after that compile was never called
    m = nn.Linear(3, 3)
    fast = coil.compile(m)
    x = torch.randn(2, 3)
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    torch.testing.assert_close(fast(x), m(x))
    m.register_forward_hook(lambda mod, args, out: out + 1)
    torch.testing.assert_close(fast(x), m(x))


def test_dict_subclass_with_its_own_getitem_changed_between_calls():
    # its items were guarded and, once a changed float became a graph input, fetched
    # through source d['a'], which runs the subclass's __getitem__: the override applied
    # twice (eager 20.0, coil 200.0)
    class Scaled(dict):
        def __getitem__(self, k):
            return super().__getitem__(k) * 10

    d = Scaled(a=1.0)
    fast = coil.compile(lambda x: x * d["a"])
    x = torch.ones(3)
    for v in (1.0, 2.0, 3.0):
        d["a"] = v
        torch.testing.assert_close(fast(x), x * v * 10)


def test_functions_read_through_a_class_replaced_after_first_call():
    # C.helper(x), C.sh(x) (staticmethod), C.ch(x) / c.ch(x) (classmethod) were resolved at
    # compile time with no guard on the class: replacing them was not seen
    class C:
        def helper(x):
            return x + 1

        @staticmethod
        def sh(x):
            return x + 2

        @classmethod
        def ch(cls, x):
            return x + 3

    c = C()

    def f(x):
        return C.helper(x) * C.sh(x) * C.ch(x) * c.ch(x)

    fast = coil.compile(f)
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), f(x))
    C.helper = lambda x: x - 10
    torch.testing.assert_close(fast(x), f(x))
    C.sh = staticmethod(lambda x: x - 20)
    torch.testing.assert_close(fast(x), f(x))
    C.ch = classmethod(lambda cls, x: x - 30)
    torch.testing.assert_close(fast(x), f(x))
