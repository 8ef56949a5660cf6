"""Corpus: plain user classes (attributes, methods, properties, class/static methods,
inheritance, super(), __call__), dataclasses, objects created inside and returned,
attribute writes on objects passed in (side effects).

PYTEST_DONT_REWRITE: the corpus programs must stay plain Python (no assertion rewriting).
"""
import dataclasses
from typing import Optional

import pytest
import torch

from corpus_harness import C, cases, randn


def x34():
    return (randn(3, 4),)


class Scaler:
    factor_default = 2.0

    def __init__(self, factor):
        self.factor = factor
        self.calls = 0

    def apply(self, x):
        self.calls += 1
        return x * self.factor

    @property
    def double(self):
        return self.factor * 2

    @staticmethod
    def shift(x):
        return x + 1

    @classmethod
    def default(cls):
        return cls(cls.factor_default)


class Base:
    def __init__(self, k):
        self.k = k

    def run(self, x):
        return x + self.k

    def describe(self):
        return "base"


class Child(Base):
    def __init__(self, k, m):
        super().__init__(k)
        self.m = m

    def run(self, x):
        return super().run(x) * self.m

    def describe(self):
        return "child<" + super().describe() + ">"


class CallableObj:
    def __init__(self, w):
        self.w = w

    def __call__(self, x):
        return x @ self.w


class WithSlots:
    __slots__ = ("a",)

    def __init__(self, a):
        self.a = a


@dataclasses.dataclass
class Cfg:
    scale: float
    bias: float = 0.5
    tags: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Frozen:
    n: int
    name: str = "f"


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    mask: Optional[torch.Tensor] = None


def obj_method_call(x, s):
    return s.apply(x) + s.apply(x * 2)


def obj_property_static_class(x, s):
    return x * s.double + Scaler.shift(x) + Scaler.default().factor + s.factor_default


def obj_created_inside(x):
    s = Scaler(3.0)
    y = s.apply(x)
    return y, s.calls, s.factor


def obj_returned(x):
    s = Scaler(x.shape[0])
    s.apply(x)
    return s


def obj_attribute_write(x, s):
    s.factor = s.factor + 1
    s.last = x.sum()
    s.new_attr = "set"
    return x * s.factor


def inheritance_super(x):
    c = Child(1.0, 3.0)
    return c.run(x), c.describe(), isinstance(c, Base), type(c).__name__


def inheritance_input(x, c):
    return c.run(x) + c.k


def callable_object(x, f):
    return f(x).relu()


def slots_object(x, o):
    o.a = o.a * 2
    return x * o.a


def class_attribute_read(x):
    return x * Scaler.factor_default + len(Child.__mro__)


def isinstance_user_classes(x, c):
    r = [isinstance(c, Base), isinstance(c, Child), isinstance(c, Scaler), issubclass(Child, Base), type(c) is Child]
    return x * sum(r), r


def getattr_on_object(x, s):
    name = "factor"
    return x * getattr(s, name) + getattr(s, "nope", 1.0), hasattr(s, "apply"), hasattr(s, "zzz")


def dataclass_input(x, cfg):
    return x * cfg.scale + cfg.bias, len(cfg.tags)


def dataclass_created_inside(x):
    cfg = Cfg(scale=2.0)
    cfg.tags.append("made")
    return x * cfg.scale + cfg.bias, cfg


def dataclass_mutation(x, cfg):
    cfg.scale = cfg.scale * 2
    cfg.tags.append(x.shape[0])
    return x + cfg.scale


def dataclass_frozen(x, f):
    g = Frozen(f.n + 1)
    return x * g.n, g, dataclasses.replace(f, name="g"), f == Frozen(f.n, f.name)


def dataclass_with_tensors(b):
    y = b.x * 2
    if b.mask is not None:
        y = y * b.mask
    return Batch(y, b.mask)


def dataclass_fields_asdict(x, cfg):
    names = [f.name for f in dataclasses.fields(cfg)]
    d = dataclasses.asdict(cfg)
    return x * d["scale"], names


def dataclass_returned_tensor_fields(x):
    return Batch(x.relu(), x > 0)


class Accumulator:
    def __init__(self):
        self.items = []
        self.total = None

    def add(self, t):
        self.items.append(t)
        self.total = t if self.total is None else self.total + t
        return self


def method_chaining_with_side_effects(x, acc):
    acc.add(x).add(x * 2).add(x.sum(0, keepdim=True))
    return acc.total


class Vec:
    def __init__(self, t):
        self.t = t

    def __add__(self, other):
        return Vec(self.t + other.t)

    def __mul__(self, k):
        return Vec(self.t * k)

    def __len__(self):
        return self.t.shape[0]

    def __getitem__(self, i):
        return self.t[i]

    def __eq__(self, other):
        return self is other


def dunder_methods(x):
    v = Vec(x) + Vec(x * 2) * 3
    return v.t, len(v), v[0]


class Registry:
    table = {}

    @classmethod
    def register(cls, name, value):
        cls.table[name] = value
        return value


def class_level_dict_mutation(x):
    Registry.register("k", 3)
    return x * Registry.table["k"]


def _reset_registry():
    Registry.table.clear()


class Lazy:
    def __init__(self):
        self._cache = None

    @property
    def value(self):
        if self._cache is None:
            self._cache = 10
        return self._cache


def property_with_side_effect(x, o):
    return x * o.value + o.value


class Settable:
    def __init__(self):
        self._v = 1.0

    @property
    def v(self):
        return self._v

    @v.setter
    def v(self, new):
        self._v = new * 2


def property_setter(x, o):
    o.v = 3.0
    return x * o.v


class Shape2:
    def __init__(self, t):
        self.rows, self.cols = t.shape


def object_from_tensor_shape(x):
    s = Shape2(x)
    return x.reshape(s.cols, s.rows), vars(s)


def object_identity(x, s):
    t = s
    return x * (t is s), s is not None


def type_call_builtin_ctor(x):
    kind = list
    return x * len(kind((1, 2, 3))), dict(a=1), tuple.__name__


CASES = cases(
    C(obj_method_call, lambda: (randn(3, 4), Scaler(1.5))),
    C(obj_property_static_class, lambda: (randn(3, 4), Scaler(0.5))),
    C(obj_created_inside, x34),
    C(obj_returned, x34),
    C(obj_attribute_write, lambda: (randn(3, 4), Scaler(2.0))),
    C(inheritance_super, x34),
    C(inheritance_input, lambda: (randn(3, 4), Child(2.0, 0.5))),
    C(callable_object, lambda: (randn(3, 4), CallableObj(randn(4, 2)))),
    C(slots_object, lambda: (randn(3, 4), WithSlots(1.5))),
    C(class_attribute_read, x34),
    C(isinstance_user_classes, lambda: (randn(3, 4), Child(1.0, 2.0))),
    C(getattr_on_object, lambda: (randn(3, 4), Scaler(1.25))),
    C(dataclass_input, lambda: (randn(3, 4), Cfg(1.5, 0.25, ["a"]))),
    C(dataclass_created_inside, x34),
    C(dataclass_mutation, lambda: (randn(3, 4), Cfg(0.75))),
    C(dataclass_frozen, lambda: (randn(3, 4), Frozen(3))),
    C(dataclass_with_tensors, lambda: (Batch(randn(3, 4), (randn(3, 4) > 0).float()),)),
    C(dataclass_with_tensors, lambda: (Batch(randn(3, 4)),), name="dataclass_with_tensors_none"),
    C(dataclass_fields_asdict, lambda: (randn(3, 4), Cfg(2.0, 1.0, [1]))),
    C(dataclass_returned_tensor_fields, x34),
    C(method_chaining_with_side_effects, lambda: (randn(3, 4), Accumulator())),
    C(dunder_methods, x34),
    C(class_level_dict_mutation, x34, setup=_reset_registry, observe=lambda: dict(Registry.table)),
    C(property_with_side_effect, lambda: (randn(3, 4), Lazy())),
    C(property_setter, lambda: (randn(3, 4), Settable())),
    C(object_from_tensor_shape, x34, breaks=(0, 1), torch_wrong="vars() of an object built in the frame returns {} (torch 2.13)",
      note="vars() may be a graph break"),
    C(object_identity, lambda: (randn(3, 4), Scaler(1.0))),
    C(type_call_builtin_ctor, x34),
)


@pytest.mark.parametrize("case", CASES)
def test_classes_dataclasses(case, check):
    check(case)
