"""Shared helpers for tests/aot: compare a compiled module with eager, values and grads."""
import copy

import torch

from coil.aot.backend import aot_eager


def compile_aot(fn, **kw):
    """torch.compile with coil's aot_eager backend (torch's capture), static shapes."""
    import torch._dynamo  # tests may use torch's capture

    torch._dynamo.reset()
    return torch.compile(fn, backend=aot_eager, dynamic=False, **kw)


def first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "keys"):
        return next(v for v in out.values() if isinstance(v, torch.Tensor))
    return next(v for v in out if isinstance(v, torch.Tensor))


def check_module(model, *inputs, loss_fn=None, rtol=1e-4, atol=1e-5, steps=1):
    """Train-step ``model`` eagerly and compiled (aot_eager) from the same weights;
    assert equal outputs and equal parameter gradients."""
    ref = model
    test = copy.deepcopy(model)
    compiled = compile_aot(test)
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
    return compiled
