"""Helpers shared by the runtime tests."""
import pytest


@pytest.fixture
def lockstep():
    """``run(pairs, make_opt, batches, loss)``: train each ``(callable, module)`` of
    ``pairs`` on the same batches, one optimizer (``make_opt(params)``) per module:
    zero_grad, ``loss(callable(x)).backward()``, step."""
    def run(pairs, make_opt, batches, loss):
        opts = [make_opt(module.parameters()) for _, module in pairs]
        for x in batches:
            for (model, _), opt in zip(pairs, opts):
                opt.zero_grad()
                loss(model(x)).backward()
                opt.step()
    return run
