"""``id()`` of guarded objects and a compile-aware context variable (the pattern of the
``kernels`` package's ``use_kernelized_func``, which transformers 5 puts on LLaMA layers)."""
import contextvars

import torch

import coil


def scale(x):
    return x * 2


def shift(x):
    return x + 1


FN = scale


def id_lookup(x):
    table = {id(scale): 10, id(shift): 20}
    return x + table[id(FN)], id(FN)


def test_id_of_a_guarded_global_is_a_constant_and_guarded():
    x = torch.ones(2)
    cf = coil.compile(id_lookup, fullgraph=True)
    out, i = cf(x)
    torch.testing.assert_close(out, x + 10)
    assert i == id(scale)
    global FN
    FN = shift
    try:
        out, i = cf(x)          # the identity guard fails: recompiled, not the stale id
        torch.testing.assert_close(out, x + 20)
        assert i == id(shift)
    finally:
        FN = scale


class Box:
    pass


def id_of_new_object(x):
    return x + 1, id(Box()) > 0, id(x) > 0, id(KERNEL.forward) > 0   # (a fresh bound method)


def test_id_of_tensors_and_new_objects_still_breaks():
    e = coil.explain(id_of_new_object, torch.ones(2))
    assert e.graph_break_count >= 1 and "id()" in e.break_reasons[0]["reason"]
    out = coil.compile(id_of_new_object)(torch.ones(2))
    assert out[1:] == (True, True, True)


class CompileAwareVar:
    """A ContextVar that switches to a plain attribute under compilation (as ``kernels``)."""

    def __init__(self, name):
        self.context_var = contextvars.ContextVar(name, default=None)
        self.global_var = None
        self.uses_global_var = False

    def get(self):
        if self.uses_global_var or torch.compiler.is_compiling():
            return self.global_var
        return self.context_var.get()

    def set(self, value):
        if self.uses_global_var or torch.compiler.is_compiling():
            previous = self.global_var
            self.global_var, self.uses_global_var = value, True
            return previous
        return self.context_var.set(value)

    def reset(self, token):
        if self.uses_global_var:
            self.global_var, self.uses_global_var = token, token is not None
        else:
            self.context_var.reset(token)


ACTIVE = CompileAwareVar("active")


class Kernel(torch.nn.Module):
    def forward(self, x):
        active = ACTIVE.get()
        if active is not None and (factor := active.get(id(self))) is not None:
            return x * factor
        return x - 1


KERNEL = Kernel()


class Layer(torch.nn.Module):
    def __init__(self, factor, balanced=True):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.factor, self.balanced = factor, balanced

    def forward(self, x):
        active = dict(ACTIVE.get() or {})
        active[id(KERNEL)] = self.factor
        token = ACTIVE.set(active)
        if not self.balanced:
            return KERNEL(self.lin(x))
        try:
            return KERNEL(self.lin(x))
        finally:
            ACTIVE.reset(token)


def test_kernelized_forward_pattern_is_one_graph_and_leaves_the_var_as_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(Layer(3.0), Layer(5.0))
    x = torch.randn(2, 3)
    with torch.no_grad():
        ref = model(x)
        assert (ACTIVE.global_var, ACTIVE.uses_global_var) == (None, False)
        cf = coil.compile(model, fullgraph=True)
        torch.testing.assert_close(cf(x), ref)
        torch.testing.assert_close(cf(x), ref)
    assert (ACTIVE.global_var, ACTIVE.uses_global_var) == (None, False)


def test_unbalanced_set_is_replayed_after_the_compiled_call():
    layer = Layer(7.0, balanced=False)
    x = torch.randn(2, 3)
    try:
        with torch.no_grad():
            out = coil.compile(layer, fullgraph=True)(x)
            torch.testing.assert_close(out, layer.lin(x) * 7.0)
        assert ACTIVE.uses_global_var is True and ACTIVE.global_var == {id(KERNEL): 7.0}
    finally:
        ACTIVE.global_var, ACTIVE.uses_global_var = None, False
