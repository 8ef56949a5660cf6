"""Shared helpers for tests/aot: compare a compiled module with eager, values and grads."""
import copy

import torch

from coil.aot.backend import aot_eager


class CountingAotEager:
    """aot_eager that counts the graphs it compiled and which path each took."""

    def __init__(self):
        self.paths = []

    def __call__(self, gm, example_inputs):
        compiled = aot_eager(gm, example_inputs)
        self.paths.append(compiled._coil_aot_path)
        return compiled


def compile_aot(fn, capture="torch"):
    """Compile ``fn`` with coil's aot_eager backend through torch's capture
    (torch.compile, static shapes) or coil's (coil.compile). Returns
    (compiled, counter)."""
    counter = CountingAotEager()
    if capture == "torch":
        import torch._dynamo  # tests may use torch's capture

        torch._dynamo.reset()
        return torch.compile(fn, backend=counter, dynamic=False), counter
    import coil

    coil.reset()
    return coil.compile(fn, backend=counter), counter


def first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "keys"):
        return next(v for v in out.values() if isinstance(v, torch.Tensor))
    return next(v for v in out if isinstance(v, torch.Tensor))


def check_module(model, *inputs, loss_fn=None, rtol=1e-4, atol=1e-5, steps=1, capture="torch"):
    """Train-step ``model`` eagerly and compiled (aot_eager) from the same weights;
    assert equal outputs and equal parameter gradients, and that at least one graph
    went through the training path."""
    ref = model
    test = copy.deepcopy(model)
    compiled, counter = compile_aot(test, capture)
    loss_fn = loss_fn or (lambda out: first_tensor(out).float().pow(2).mean())
    for _ in range(steps):
        out_ref = ref(*inputs)
        out_test = compiled(*inputs)
        torch.testing.assert_close(first_tensor(out_test), first_tensor(out_ref), rtol=rtol, atol=atol)
        loss_fn(out_ref).backward()
        loss_fn(out_test).backward()
        for (name, p), q in zip(ref.named_parameters(), test.parameters()):
            if p.grad is None:
                # known difference (docs/aot.md): parameters reached only through an
                # output the loss does not use get zero gradients instead of None
                assert q.grad is None or not q.grad.any(), name
                continue
            torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
        for (name, b), c in zip(ref.named_buffers(), test.buffers()):
            torch.testing.assert_close(c, b, rtol=rtol, atol=atol, msg=lambda m: f"buffer {name}: {m}")
    assert "training" in counter.paths, counter.paths
    return compiled
