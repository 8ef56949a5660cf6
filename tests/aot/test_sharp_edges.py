"""Documented sharp edges of coil.aot (STYLE.md §7): each asserts today's behaviour,
so a change to one is visible. docs/aot.md lists them."""
import pytest
import torch

from coil.aot import aot_compile
from coil.aot.backend import run_graph


def test_mutating_one_of_two_aliased_inputs_of_two_dtypes_runs_eagerly():
    # inputs sharing memory with a mutated one are traced through one synthetic base
    # (coil/aot/aliasing.py), which needs one dtype: with views of another dtype the graph
    # runs eagerly, warned (it was refused with a CoilError; a graph break makes such inputs)
    def f(a, b):
        a.add_(1)
        return b * 2

    base = torch.randn(4)
    with pytest.warns(UserWarning, match="share memory"):
        c = aot_compile(f, [base, base.view(torch.int32)[:2]], run_graph)
    ref = base.clone()
    torch.testing.assert_close(c(base, base.view(torch.int32)[:2]), f(ref, ref.view(torch.int32)[:2]))
    torch.testing.assert_close(base, ref)


def test_aliased_inputs_without_mutation_are_fine():
    def f(a, b):
        return a.sum() + b.sum()

    base = torch.randn(4)
    c = aot_compile(f, [base, base[:2]], run_graph)
    torch.testing.assert_close(c(base, base[:2]), f(base, base[:2]))


def test_path_is_fixed_at_compile_time():
    # compiled under no_grad -> inference graph; called with grad on, the result
    # does not require grad (capture's guards on grad mode make this a recompile).
    def f(x, w):
        return (x * w).sum()

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    with torch.no_grad():
        c = aot_compile(f, [x, w], lambda gm, ex: gm.forward)
    out = c(x, w)
    # aot_eager runs ATen ops eagerly, so autograd still records them here; a
    # generated-kernel compiler would return a tensor without grad_fn
    assert c._coil_aot_path == "inference"
    torch.testing.assert_close(out, f(x, w))


def test_backward_for_missing_tangents_is_labelled_backward():
    """The backward compiled for calls whose tangents are partly None (an output the loss does not use) is a new graph
    module; it lacked ``meta["coil_aot_graph"] = "backward"``, so code generation took it for an inference graph
    (channels-last choice for training graphs, the CUDA-graph kind of its pieces, backward-only rewrites)."""
    kinds = []

    def bw(gm, ex):
        kinds.append(gm.meta.get("coil_aot_graph"))
        return gm.forward

    def f(x, w):
        return x @ w, (w * 2).sum()

    x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    c = aot_compile(f, [x, w], lambda gm, ex: gm.forward, bw)
    out, _ = c(x, w)
    out.sum().backward()    # the second output (it requires grad) gets none: its tangent is None
    torch.testing.assert_close(w.grad, x.t() @ torch.ones(4, 5))
    assert kinds and all(k == "backward" for k in kinds), kinds


def test_an_output_other_outputs_were_computed_from_is_not_on_their_backward_path():
    # one compiled graph is one autograd node (FINDINGS_77 #1, as torch.compile's AOTAutograd): eager's hook on s
    # sees c's gradient and zeroes a.grad; the compiled s's hook is called with None, and a.grad is cos(s) * -sin(s)
    import coil

    def f(a):
        s = a.sin()
        return s, s.cos()

    seen = []
    a = torch.ones(3, requires_grad=True)
    s, c = coil.compile(f, backend="aot_eager")(a)
    s.register_hook(lambda g: seen.append(g))
    c.sum().backward()
    assert seen == [None] and torch.allclose(a.grad, -s.detach().sin() * a.detach().cos())
