"""A failed bounds check in a C++ kernel names the user's line (FINDINGS_16 defect 5).

Each Loops body records the ``stack_trace`` of the ATen node whose lowering made it
(``coil.ir.nodes``: ``Loops.origin``); the C++ kernel stores the origin of each check site
``#n`` and ``CppLauncher._fail`` appends ``-- from file:line in fn: source`` to the
IndexError. Nothing is added to a successful call."""
import inspect

import pytest
import torch
import torch.nn.functional as F

import coil
from coil.codegen.cpp.launch import CppLauncher
from coil.ir.nodes import describe_origin

HERE = __file__


@pytest.fixture(autouse=True)
def _reset():
    coil.reset()
    yield
    coil.reset()


def _compile(fn):
    return coil.compile(fn, options={"cpu_backend": "cpp"})


def _where(fn, text: str) -> str:
    src, first = inspect.getsourcelines(fn)
    k = next(k for k, line in enumerate(src) if text in line)
    return f"-- from {HERE}:{first + k} in {fn.__name__}: {src[k].strip()}"


def test_index_error_names_the_line_of_the_index():
    def pick(x, i):
        return x[i] * 2

    with pytest.raises(IndexError) as ei:
        _compile(pick)(torch.randn(5, 3), torch.tensor([1, 9]))
    msg = str(ei.value)
    assert msg.startswith("index 9 is out of bounds for dimension with size 5 (coil C++ kernel ")
    assert msg.endswith(_where(pick, "return x[i] * 2")), msg


def test_the_inlined_producer_is_named_not_the_kernel_output():
    def pick(x, i):
        y = x[i]
        return y * 2      # the kernel computes this buffer, with the gather inlined

    with pytest.raises(IndexError) as ei:
        _compile(pick)(torch.randn(5, 3), torch.tensor([1, 9]))
    assert str(ei.value).endswith(_where(pick, "y = x[i]")), str(ei.value)


def test_each_check_site_names_its_own_line():
    def two(a, b, i, j):
        u = a[i]
        v = b[j]
        return u + v

    a, b = torch.randn(5, 3), torch.randn(7, 3)
    f = _compile(two)
    with pytest.raises(IndexError) as ei:
        f(a, b, torch.tensor([1, 2]), torch.tensor([0, 7]))
    assert "size 7" in str(ei.value) and str(ei.value).endswith(_where(two, "v = b[j]")), str(ei.value)
    with pytest.raises(IndexError) as ei:
        f(a, b, torch.tensor([5, 2]), torch.tensor([0, 6]))
    assert "size 5" in str(ei.value) and str(ei.value).endswith(_where(two, "u = a[i]")), str(ei.value)
    torch.testing.assert_close(f(a, b, torch.tensor([4, 2]), torch.tensor([0, 6])),
                               a[[4, 2]] + b[[0, 6]])


@pytest.mark.parametrize("case", ["embedding", "gather", "scatter_add", "cross_entropy", "setitem"])
def test_indexing_ops_name_the_user_line(case):
    emb = torch.nn.Embedding(5, 4)

    def f(x, i):
        if case == "embedding":
            return emb(i).relu()
        if case == "gather":
            return torch.gather(x, 0, i.view(2, 1).expand(2, 3)).sum(0)
        if case == "scatter_add":
            return x.scatter_add(0, i.view(2, 1).expand(2, 3), torch.ones(2, 3)) + 1
        if case == "cross_entropy":
            return F.cross_entropy(x[:2], i)
        y = x.clone()
        y[i] = 1.0
        return y

    with torch.no_grad():
        with pytest.raises(IndexError) as ei:
            _compile(f)(torch.randn(5, 3), torch.tensor([1, 7]))
    line = {"embedding": "return emb(i).relu()", "gather": "return torch.gather(x, 0",
            "scatter_add": "return x.scatter_add(0", "cross_entropy": "return F.cross_entropy(x[:2], i)",
            "setitem": "y[i] = 1.0"}[case]
    assert f"{HERE}:" in str(ei.value) and f" in f: {line}" in str(ei.value), str(ei.value)
    assert str(ei.value).startswith("index 7 is out of bounds"), str(ei.value)


def test_describe_origin_formats():
    trace = ('  File "/m/model.py", line 7, in forward\n    h = self.emb(ids)\n'
             f'  File "{torch.__file__.rsplit("/", 1)[0]}/nn/functional.py", line 2500, in embedding\n'
             '    return torch.embedding(weight, input)\n')
    assert describe_origin(trace) == "/m/model.py:7 in forward: h = self.emb(ids)"  # torch's frame skipped
    assert describe_origin('File "/m/a.py", line 3, in g <- File "/m/b.py", line 9, in f') == "/m/a.py:3 in g"
    assert describe_origin(None) is None and describe_origin("no frame here") is None


def test_launcher_without_origins_keeps_the_plain_message():
    launcher = CppLauncher("", "k", 0, True, batch=True, check_origins=[None, "m.py:1 in f: y = x[i]"])
    from coil.codegen.cpp import launch
    with launch._pending_lock:
        launch._pending.remove(launcher)  # never built
    err = [1, 9, 5, 0]
    with pytest.raises(IndexError) as ei:
        launcher._fail(err)
    assert str(ei.value) == "index 9 is out of bounds for dimension with size 5 (coil C++ kernel k, check #0)"
    assert err == [0, 0, 0, 0]
    with pytest.raises(IndexError, match=r"check #1\) -- from m.py:1 in f: y = x\[i\]$"):
        launcher._fail([1, 9, 5, 1])
