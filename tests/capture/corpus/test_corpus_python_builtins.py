"""Corpus: Python constants, operators, builtins, math/operator modules, enums, globals,
try/except/finally and assert around traceable code.

PYTEST_DONT_REWRITE: the corpus programs must stay plain Python (no assertion rewriting).
"""
import enum
import math
import operator

import pytest
import torch

from corpus_harness import C, cases, randn


def x34():
    return (randn(3, 4),)


def constants(x):
    a, b, c = 3, 2.5, True
    return x * a + b - c, None, "tag", (1, 2.0), -7


def int_arith(x):
    a = 17
    return x * (a // 5) + (a % 5) - (a ** 2) / 100 + divmod(a, 4)[1] + abs(-3) + (a << 2) - (a >> 1) + (a & 6) + (a | 1) + (a ^ 3)


def float_arith(x):
    f = 1.75
    return x * round(f * 3.3, 2) + float(3) + int(f) + math.floor(f) + math.ceil(f) + f // 0.5 + f % 0.4 + pow(f, 2)


def comparisons_py(x):
    a, b = 3, 4.0
    r = [a < b, a <= 3, a == 3, a != b, b > a, b >= 4, 1 < a < 5, a is not None, None is None, a in (1, 3)]
    return x * sum(r), r


def bool_ops(x):
    a, b = 0, 5
    c = a or b
    d = a and b
    e = not a
    return x * c + d + e, (b and "yes") or "no"


def ternary(x):
    n = x.shape[0]
    y = x * 2 if n > 2 else x * 3
    return y + (1 if x.dtype == torch.float32 else 2)


def walrus(x):
    if (n := x.shape[1]) > 2:
        return x * n
    return x


def fstrings(x):
    n = x.shape[0]
    s = f"n={n} d={x.dim()} {x.dtype} {3.14159:.2f} {n!r:>4}"
    return x + len(s), s


def str_methods(x):
    s = "Hello, World"
    parts = s.lower().split(", ")
    t = "-".join(p.upper() for p in parts).replace("O", "0")
    return x * len(t), t, s.startswith("He"), s.endswith("x"), s.strip("Hd"), s.find("W"), "%d-%s" % (3, "a"), "{}+{}".format(1, 2)


def str_concat_index(x):
    s = "abc" + "def"
    return x * s.index("d"), s[1:4], s * 2, s[::-1], "c" in s, str(3) + str(x.shape[0]), repr("q")


def builtins_range_enumerate(x):
    acc = x
    for i in range(3):
        acc = acc + i
    for i, v in enumerate([2.0, 3.0], start=1):
        acc = acc * v + i
    return acc, list(range(1, 10, 3)), len(range(5)), range(4)[2]


def builtins_zip_reversed_sorted(x):
    out = []
    for a, b in zip([1, 2, 3], [4.0, 5.0, 6.0]):
        out.append(x * a + b)
    s = sorted([3, 1, 2], reverse=True)
    r = list(reversed([1, 2, 3]))
    return out, s, r, sorted({"b": 1, "a": 2}), sorted([(2, "b"), (1, "a")], key=lambda p: p[0])


def builtins_min_max_sum(x):
    vals = [3, 1, 4, 1, 5]
    return x * max(vals) - min(vals) + sum(vals) + max(2, 7) + min(0.5, 3) + sum([1, 2], 10), max(vals, key=lambda v: -v)


def builtins_any_all(x):
    flags = [True, False, True]
    return x * int(any(flags)) + int(all(flags)), any(v > 2 for v in [1, 3]), all([])


def builtins_len(x):
    return x * len([1, 2, 3]) + len((1,)) + len({"a": 1}) + len("four") + len(x) + len(x.shape)


def builtins_isinstance(x):
    r = [isinstance(x, torch.Tensor), isinstance(3, int), isinstance(3.0, (int, float)), isinstance("s", str),
         isinstance([1], list), issubclass(bool, int), isinstance(x, (list, tuple)), issubclass(torch.nn.Linear, torch.nn.Module)]
    return x + sum(r), r


def builtins_type(x):
    t = type(3)
    return x * (t is int) + (type(x) is torch.Tensor) + (type(2.0) == float), type(x).__name__


def builtins_getattr(x):
    s = getattr(x, "shape")
    f = getattr(torch, "relu")
    return f(x) * s[0] + getattr(x, "missing", 2), hasattr(x, "dtype"), hasattr(x, "nope"), callable(f)


class Holder:
    def __init__(self):
        self.a = 1


def builtins_setattr(x, h):
    setattr(h, "a", 5)
    setattr(h, "b", x.shape[0])
    return x * getattr(h, "a") + h.b


def builtins_conversions(x):
    return x * int("3") + float("1.5") + int(2.7) + bool(3) + int(True), str(7), list((1, 2)), tuple([3, 4]), dict([(1, 2)]), set([1, 1, 2])


def builtins_abs_round_divmod(x):
    return x * abs(-2.5) + round(2.567, 1) + divmod(17, 5)[0] + pow(2, 5, 7), round(3.5), divmod(7.5, 2)


def builtins_id_hash(x):
    a = (1, 2)
    return x + (hash(a) == hash((1, 2))) + (id(a) == id(a))


def builtins_chr_ord(x):
    return x * ord("a") / 100, chr(66), bin(5), hex(255), "%.3f" % 1.23456


def builtins_iter_next(x):
    it = iter([1, 2, 3])
    a = next(it)
    b = next(it)
    return x * (a + b) + next(it, 0) + next(it, 10)


def builtins_map_filter(x):
    doubled = list(map(lambda v: v * 2, [1, 2, 3]))
    odd = list(filter(lambda v: v % 2, range(7)))
    return x * sum(doubled) + len(odd), doubled, odd


def math_module(x):
    return (x * math.sqrt(2.0) + math.log(3.0) - math.exp(0.5) + math.sin(1.0) + math.pi + math.tau / 10 + (math.inf > 1),
            math.isclose(1.0, 1.0), math.gcd(12, 18), math.prod([2, 3]), math.isfinite(1.0), math.log2(8), math.hypot(3, 4))


def math_on_shapes(x):
    n = x.numel()
    return x.view(-1) * math.sqrt(n) / math.log(n), math.ceil(n / 5), math.floor(math.log2(n))


def operator_module(x):
    return (operator.add(x, 1), operator.mul(x, 2), operator.neg(x), operator.getitem(x, 0), operator.truediv(x, 4),
            operator.itemgetter(1)([5, 6, 7]), operator.attrgetter("shape")(x), operator.sub(5, 3), operator.matmul(x, x.t()))


def operator_inplace(x):
    y = x.clone()
    y = operator.iadd(y, 1)
    y = operator.imul(y, 2)
    return y, operator.not_(False), operator.contains([1, 2], 2), operator.index(3)


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Mode(enum.IntEnum):
    FAST = 3
    SLOW = 4


def enums_read(x):
    c = Color.GREEN
    return x * c.value + Mode.FAST, c.name, Color.RED == c, Color(1) is Color.RED


def enum_arg(x, c):
    if c is Color.RED:
        return x + 1
    return x - 1


def enum_in_dict(x):
    table = {Color.RED: 2.0, Color.GREEN: 3.0}
    return x * table[Color.GREEN], [m.value for m in Mode]


SCALE = 2.5
OFFSETS = [1.0, 2.0]
CONFIG = {"gain": 3.0, "bias": 0.5}


def global_reads(x):
    return x * SCALE + OFFSETS[1] + CONFIG["gain"] * CONFIG.get("bias", 0)


COUNTER = 0


def _reset_counter():
    global COUNTER, LOG
    COUNTER = 0
    LOG = []


def _observe_counter():
    return COUNTER, list(LOG)


LOG = []


def global_writes(x):
    global COUNTER
    COUNTER += 1
    COUNTER = COUNTER * 10
    return x + COUNTER


def global_mutation(x):
    LOG.append(x.shape[0])
    LOG.append("seen")
    return x * len(LOG)


def global_tensor_write(x):
    global GT
    GT = x * 2
    return GT + 1


GT = None


def global_tensor_read(x):
    return x + GTENSOR


GTENSOR = torch.arange(4.0)


def global_module_attr(x):
    return torch.nn.functional.relu(x) * math.pi + torch.float32.itemsize


def try_except_traceable(x):
    try:
        y = x * 2
    except ValueError:
        y = x
    return y + 1


def try_except_caught(x):
    try:
        raise ValueError("handled")
    except ValueError as e:
        msg = str(e)
    return x * len(msg), msg


def try_finally(x):
    out = []
    try:
        y = x.sin()
    finally:
        out.append(1)
    return y, out


def try_except_else_finally(x):
    trail = []
    try:
        y = x + 1
    except KeyError:
        trail.append("except")
    else:
        trail.append("else")
        y = y * 2
    finally:
        trail.append("finally")
    return y, trail


def try_except_keyerror(x):
    d = {"a": 1}
    try:
        v = d["b"]
    except KeyError:
        v = 7
    return x * v


def try_nested(x):
    try:
        try:
            raise IndexError("inner")
        except IndexError:
            raise KeyError("outer")
    except KeyError as e:
        tag = e.args[0]
    return x + len(tag), tag


def assert_constant(x):
    assert x.dim() == 2, "need 2-d"
    assert isinstance(x, torch.Tensor)
    assert x.shape[1] == 4
    return x * 2


def del_locals(x):
    y = x + 1
    z = y * 2
    del y
    return z


def unpacking_star(x):
    a, *rest = [1, 2, 3, 4]
    *init, last = (5, 6, 7)
    (p, q), r = (1, 2), 3
    return x * a + sum(rest) + last + sum(init) + p + q + r


def while_loop(x):
    i, y = 0, x
    while i < 4:
        y = y * 0.5 + i
        i += 1
        if i == 3:
            break
    return y, i


def for_else_continue(x):
    total = x
    for i in range(5):
        if i % 2:
            continue
        total = total + i
    else:
        total = total * 2
    return total


def nested_loops(x):
    acc = x
    for i in range(2):
        for j in range(3):
            acc = acc + i * j
    return acc


def loop_over_tensor_dim(x):
    acc = torch.zeros(4)
    for row in x:
        acc = acc + row
    return acc


def loop_over_shape(x):
    acc = 0
    for s in x.shape:
        acc += s
    return x * acc


def none_checks(x, y=None):
    if y is None:
        y = x * 3
    return x + y


def int_float_bool_args(x, n, f, b):
    return x * n + f if b else x - n


def string_arg(x, mode):
    if mode == "double":
        return x * 2
    return x


def slice_builtin(x):
    s = slice(0, 2)
    lst = [1, 2, 3, 4]
    return x[s] * lst[s][1], s.start, lst[slice(1, None, 2)]


def bytes_and_complex(x):
    b = b"ab"
    c = complex(1, 2)
    return x * len(b) + c.real + c.imag, b + b"c"


def print_free_format(x):
    s = "%s:%d" % ("n", x.shape[0])
    return x + len(s), s


def chained_comparison_tensor_shape(x):
    return x * (1 <= x.shape[0] <= 5) + (x.shape == (3, 4)) + (x.shape[0] == 3 == x.size(0))


def locals_shadowing(x):
    len = 3  # noqa: A001  (shadows a builtin on purpose)
    return x * len


def global_function_call(x):
    return _helper_global(x) * 2


def _helper_global(x):
    return x.cos() + SCALE


CASES = cases(
    C(constants, x34),
    C(int_arith, x34),
    C(float_arith, x34),
    C(comparisons_py, x34),
    C(bool_ops, x34),
    C(ternary, x34),
    C(walrus, x34),
    C(fstrings, x34),
    C(str_methods, x34),
    C(str_concat_index, x34),
    C(builtins_range_enumerate, x34),
    C(builtins_zip_reversed_sorted, x34),
    C(builtins_min_max_sum, x34),
    C(builtins_any_all, x34),
    C(builtins_len, x34),
    C(builtins_isinstance, x34),
    C(builtins_type, x34),
    C(builtins_getattr, x34),
    C(builtins_setattr, lambda: (randn(3, 4), Holder())),
    C(builtins_conversions, x34),
    C(builtins_abs_round_divmod, x34),
    C(builtins_id_hash, x34),
    C(builtins_chr_ord, x34),
    C(builtins_iter_next, x34),
    C(builtins_map_filter, x34),
    C(math_module, x34),
    C(math_on_shapes, x34),
    C(operator_module, x34),
    C(operator_inplace, x34),
    C(enums_read, x34),
    C(enum_arg, lambda: (randn(3, 4), Color.RED)),
    C(enum_in_dict, x34),
    C(global_reads, x34),
    C(global_writes, x34, setup=_reset_counter, observe=_observe_counter),
    C(global_mutation, x34, setup=_reset_counter, observe=_observe_counter),
    C(global_tensor_write, x34, observe=lambda: GT),
    C(global_tensor_read, x34),
    C(global_module_attr, x34),
    C(try_except_traceable, x34),
    C(try_except_caught, x34),
    C(try_finally, x34),
    C(try_except_else_finally, x34),
    C(try_except_keyerror, x34),
    C(try_nested, x34),
    C(assert_constant, x34),
    C(del_locals, x34),
    C(unpacking_star, x34),
    C(while_loop, x34),
    C(for_else_continue, x34),
    C(nested_loops, x34),
    C(loop_over_tensor_dim, x34),
    C(loop_over_shape, x34),
    C(none_checks, x34),
    C(int_float_bool_args, lambda: (randn(3, 4), 3, 0.25, True)),
    C(string_arg, lambda: (randn(3, 4), "double")),
    C(slice_builtin, x34),
    C(bytes_and_complex, x34),
    C(print_free_format, x34),
    C(chained_comparison_tensor_shape, x34),
    C(locals_shadowing, x34),
    C(global_function_call, x34),
)


@pytest.mark.parametrize("case", CASES)
def test_python_builtins(case, check):
    check(case)
