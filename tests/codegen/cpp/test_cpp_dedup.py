"""Copies of one C++ kernel body (the same fused ops in every layer) compile once per
batch (coil/codegen/cpp/launch.py ``_flush``): the key leaves out the kernel's name,
comment lines and its parameters' buffer names (renamed by first use, the signature's
order); a 4-layer GPT-2 had 23 kernels and 11 bodies."""
import torch

from coil.codegen.cpp import launch
from coil.runtime import cpp_build

BODY = """// {note}
extern "C" int64_t {name}(const float* __restrict__ p_{a}, float* __restrict__ p_{b}, int64_t* coil_err) {{
  for (int64_t x0 = 0; x0 < 4; ++x0) {{
    p_{b}[x0] = p_{a}[x0] * {k};
  }}
  return 0;
}}"""


def test_copies_of_a_body_compile_once_and_each_runs(monkeypatch):
    built = []
    orig = cpp_build.build
    monkeypatch.setattr(cpp_build, "build", lambda src: (built.append(src), orig(src))[1])
    ls = [launch.CppLauncher(BODY.format(note=f"layer {i}", name=f"cpp_poi_{i}_buf{i}", a=f"buf{2 * i}",
                                         b=f"buf{2 * i + 1}", k=k), f"cpp_poi_{i}_buf{i}", 2, False,
                             batch=True)
          for i, k in enumerate(["2.0f", "2.0f", "3.0f"])]
    x = torch.arange(4.0)
    outs = [torch.empty(4) for _ in ls]
    for la, o in zip(ls, outs):
        la(x, o)
    assert [la.symbol for la in ls] == ["cpp_poi_0_buf0", "cpp_poi_0_buf0", "cpp_poi_2_buf2"]
    assert sum(src.count('extern "C"') for src in built) == 2
    for o, k in zip(outs, [2.0, 2.0, 3.0]):
        torch.testing.assert_close(o, x * k)


def test_same_name_different_bodies_from_two_graphs_keep_their_own_function():
    """Two graphs' kernels may share a name (``cpp_poi_0_buf0``) with other bodies: they
    build in separate sources, and each copy must load its own (a map of futures by name
    would hand one of them the other graph's function)."""
    ls = [launch.CppLauncher(BODY.format(note="", name="cpp_poi_0_buf0", a="buf0", b="buf1", k=k),
                             "cpp_poi_0_buf0", 2, False, batch=True) for k in ("2.0f", "5.0f")]
    x = torch.arange(4.0)
    for la, k in zip(ls, (2.0, 5.0)):
        o = torch.empty(4)
        la(x, o)
        torch.testing.assert_close(o, x * k)
