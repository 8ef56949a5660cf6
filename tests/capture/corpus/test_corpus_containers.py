"""Corpus: tuples, lists, dicts, sets, namedtuples; building, indexing, slicing, mutation
(of locals and of inputs), comprehensions, unpacking, *args and **kwargs.

PYTEST_DONT_REWRITE: the corpus programs must stay plain Python (no assertion rewriting).
"""
import collections

import pytest
import torch

from corpus_harness import Args, C, cases, randn


def x34():
    return (randn(3, 4),)


def xs3():
    return ([randn(3, 4), randn(3, 4), randn(3, 4)],)


def tuple_build_index(x):
    t = (x, x * 2, 3)
    return t[0] + t[1] * t[2], t[1:], t[-1], t + (4,), t * 1, len(t)


def list_build_index(x):
    lst = [x, x + 1, x + 2]
    return lst[0] * lst[-1], lst[1:], lst[::2], lst[:0]


def list_mutation_local(x):
    lst = [x]
    lst.append(x * 2)
    lst.extend([x + 1, x - 1])
    lst.insert(0, x * 0.5)
    popped = lst.pop()
    lst[1] = lst[1] * 3
    del lst[0]
    lst.reverse()
    return lst, popped


def list_methods_python(x):
    lst = [3, 1, 2, 3]
    lst.sort()
    c = lst.count(3)
    i = lst.index(2)
    cp = lst.copy()
    cp.clear()
    return x * (c + i), lst, cp, lst + [9], [0] * 3


def list_input_mutation(x, out):
    out.append(x.sum())
    out.append(x.shape[0])
    out[0] = out[0] * 2 if isinstance(out[0], torch.Tensor) else out[0]
    return x + 1


def list_input_extend_pop(xs):
    last = xs.pop()
    xs.extend([last * 2, last * 3])
    xs[0] = xs[0] + 1
    return sum(xs)


def list_of_tensors_input(xs):
    return torch.stack(xs).sum(0), xs[1] * xs[2], len(xs)


def list_slicing_assign(x):
    lst = [1, 2, 3, 4, 5]
    lst[1:3] = [20, 30, 40]
    del lst[-1:]
    return x * sum(lst), lst


def dict_build_index(x):
    d = {"a": x, "b": x * 2, 3: 4.0}
    d["c"] = d["a"] + d["b"]
    return d["c"] * d[3], d, len(d), "a" in d, 7 in d


def dict_methods(x):
    d = dict(a=1, b=2)
    d.update({"c": 3}, d=4)
    d.setdefault("e", 5)
    p = d.pop("a")
    g = d.get("zz", 10) + d.get("b")
    ks, vs, its = list(d.keys()), list(d.values()), list(d.items())
    return x * (p + g), ks, vs, its, dict(d), d.copy()


def dict_iteration(x):
    d = {"w": 2.0, "b": 0.5}
    out = x
    for k, v in d.items():
        out = out * v if k == "w" else out + v
    for k in d:
        out = out + len(k)
    return out, [k for k in d.keys()]


def dict_input(x, d):
    return x * d["scale"] + d["shift"], sorted(d)


def dict_input_mutation(x, d):
    d["seen"] = x.shape[0]
    d["t"] = x * 2
    del d["scale"]
    return x.sum()


def dict_of_tensors_input(d):
    return {k: v * 2 for k, v in d.items()}, d["a"] @ d["b"].t()


def dict_comprehension(x):
    d = {i: x * i for i in range(3)}
    e = {f"k{i}": i ** 2 for i in range(4) if i % 2 == 0}
    return d[2] - d[1], e


def ordered_dict(x):
    od = collections.OrderedDict()
    od["z"] = x
    od["a"] = x + 1
    od.move_to_end("z")
    return list(od.keys()), od["a"] * od["z"]


def default_dict(x):
    dd = collections.defaultdict(list)
    dd["a"].append(1)
    dd["a"].append(2)
    dd["b"].append(3)
    return x * sum(dd["a"]) + len(dd["b"]), dict(dd)


def counter_usage(x):
    c = collections.Counter("abracadabra")
    return x * c["a"], c.most_common(1)


def set_ops(x):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    t = s | {10}
    u = s & {2, 3, 99}
    return x * len(t) + len(u) + (2 in s), sorted(s - {4}), frozenset([1, 2]) == frozenset([2, 1])


def set_iteration(x):
    total = 0
    for v in {5, 6, 7}:
        total += v
    return x * total


def list_comprehension(x):
    ys = [x * i for i in range(4)]
    zs = [y.sum() for y in ys if y is not ys[0]]
    return ys, torch.stack(zs), [[i * j for j in range(2)] for i in range(3)]


def generator_expression_consumed(x):
    return sum(x * i for i in range(3)), tuple(i * 2 for i in range(3)), list(v for v in (1, 2)), max(i for i in range(4))


def nested_containers(x):
    cfg = {"layers": [{"scale": 2.0}, {"scale": 3.0}], "pair": (x, [x * 2])}
    out = cfg["pair"][1][0]
    for layer in cfg["layers"]:
        out = out * layer["scale"]
    return out, cfg


def unpack_tuple_return(x):
    a, b = x.chunk(2, dim=1)
    (c, d), e = (a, b), a + b
    return c * d + e


def star_unpack_call(x):
    args = (x, 1)
    kwargs = {"alpha": 2.0}
    return torch.add(*args, **kwargs)


def _takes_star(*args, **kwargs):
    total = args[0]
    for a in args[1:]:
        total = total + a
    for k, v in kwargs.items():
        total = total * v
    return total, len(args), sorted(kwargs)


def varargs_kwargs(x):
    return _takes_star(x, x * 2, 3, scale=0.5, other=2)


def star_args_input(*xs):
    return sum(xs), len(xs)


def kwargs_input(x, **opts):
    return x * opts["scale"] + opts.get("bias", 0.0), sorted(opts)


def star_build(x):
    a = [1, 2]
    b = (*a, 3, *range(2))
    d = {**{"p": 1}, "q": 2, **{"r": 3}}
    return x * sum(b) + sum(d.values()), b, d, [*a, *a]


def zip_dict_build(x):
    names = ["a", "b", "c"]
    vals = [x, x * 2, x * 3]
    d = dict(zip(names, vals))
    return d["b"] + d["c"], list(zip(*[(1, 2), (3, 4)]))


Point = collections.namedtuple("Point", ["x", "y"])


def namedtuple_build(x):
    p = Point(x, x * 2)
    q = p._replace(y=p.y + 1)
    return q, p.x + q.y, p[0] * p[1], q._asdict()["y"], Point._fields


def namedtuple_input(p):
    a, b = p
    return Point(b, a), p.x - p.y


def namedtuple_return_from_torch(x):
    r = torch.max(x, dim=1)
    s = x.sort(dim=0)
    return r.values + r.indices, s.values, r[1], type(r).__name__


def tuple_compare_in(x):
    t = (1, 2, 3)
    return x * ((1, 2) < (1, 3)) + (2 in t) + t.index(3) + t.count(1) + (t == (1, 2, 3))


def list_of_lists_index(x):
    grid = [[x, x + 1], [x + 2, x + 3]]
    return grid[1][0] - grid[0][1], [row[0] for row in grid]


def list_sort_key(x):
    items = [("b", 2), ("a", 3), ("c", 1)]
    items.sort(key=lambda kv: kv[1])
    return x * items[0][1], items, sorted(items, key=lambda kv: kv[0], reverse=True)


def container_return_structure(x):
    return {"out": [x, (x * 2, {"deep": x + 1})], "n": 3}


def list_identity_alias(x):
    a = [x]
    b = a
    b.append(x * 2)
    return a, a is b, len(a)


def list_mult_and_in(x, xs):
    return x * len(xs * 2), xs[0] in xs


def enumerate_list_tensors(xs):
    out = []
    for i, t in enumerate(xs):
        out.append(t * i)
    return out


def zip_tensors(xs):
    ws = [0.5, 1.5, 2.5]
    return sum(t * w for t, w in zip(xs, ws))


def reversed_list_tensors(xs):
    return [t + i for i, t in enumerate(reversed(xs))]


def tensor_shape_tuple_ops(x):
    s = x.shape
    t = tuple(s) + (1,)
    return x.reshape(*t), list(s), s[::-1], torch.Size([2, 6]) == x.reshape(2, 6).shape, s.numel()


def dict_keys_views(x):
    d = {"a": 1, "b": 2}
    return x * len(d.keys() & {"a"}), list(d.items())[0], 2 in d.values()


CASES = cases(
    C(tuple_build_index, x34),
    C(list_build_index, x34),
    C(list_mutation_local, x34),
    C(list_methods_python, x34),
    C(list_input_mutation, lambda: (randn(3, 4), [randn(2), "tag"])),
    C(list_input_extend_pop, xs3),
    C(list_of_tensors_input, xs3),
    C(list_slicing_assign, x34),
    C(dict_build_index, x34),
    C(dict_methods, x34),
    C(dict_iteration, x34),
    C(dict_input, lambda: (randn(3, 4), {"scale": 2.0, "shift": randn(4)})),
    C(dict_input_mutation, lambda: (randn(3, 4), {"scale": 2.0})),
    C(dict_of_tensors_input, lambda: ({"a": randn(3, 4), "b": randn(2, 4)},)),
    C(dict_comprehension, x34),
    C(ordered_dict, x34),
    C(default_dict, x34),
    C(set_ops, x34),
    C(set_iteration, x34),
    C(list_comprehension, x34),
    C(generator_expression_consumed, x34),
    C(nested_containers, x34),
    C(unpack_tuple_return, x34),
    C(star_unpack_call, x34),
    C(varargs_kwargs, x34),
    C(star_args_input, lambda: (randn(3), randn(3), randn(3))),
    C(kwargs_input, lambda: Args(randn(3, 4), scale=1.5, bias=randn(4))),
    C(star_build, x34),
    C(zip_dict_build, x34),
    C(namedtuple_build, x34),
    C(namedtuple_input, lambda: (Point(randn(3), randn(3)),)),
    C(namedtuple_return_from_torch, x34),
    C(tuple_compare_in, x34),
    C(list_of_lists_index, x34),
    C(list_sort_key, x34),
    C(container_return_structure, x34),
    C(list_identity_alias, x34),
    C(list_mult_and_in, lambda: (randn(3, 4), [1, 2])),
    C(enumerate_list_tensors, xs3),
    C(zip_tensors, xs3),
    C(reversed_list_tensors, xs3),
    C(tensor_shape_tuple_ops, x34),
    C(dict_keys_views, x34),
)


@pytest.mark.parametrize("case", CASES)
def test_containers(case, check):
    check(case)
