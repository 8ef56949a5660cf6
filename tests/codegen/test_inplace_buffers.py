"""A kernel stores an output over an input buffer no later step reads (``config.inplace_buffers``,
``KernelPlan.inplace``): only when every load of the input is at the output's index, with one layout; the results
are bit for bit those of separate buffers, on both kernel backends."""
import pytest
import torch
import torch.nn.functional as F

import coil
from coil import trace

BACKENDS = ["cpp", "triton"]


def _wrappers(fn, args, backend, tmp_path, **opts):
    coil.reset()
    trace.set_dir(str(tmp_path))
    try:
        out = coil.compile(fn, options={"cpu_backend": backend, **opts})(*args)
    finally:
        trace.set_dir(None)
    from coil.trace.report import read_log
    log = read_log(str(tmp_path))
    return out, [a.get("text") for c in log.compiles for a in c.artifacts if a.get("name") == "wrapper"]


def extern_then_pointwise(x, w, b):
    return F.gelu(x @ w + b)                       # the mm's buffer is dead after the epilogue


def neighbour_read(x, w):
    y = x @ w
    return y * y.flip(-1)                           # y read at two indices: never over y


def transposed_store(x, w):
    y = x @ w
    return (y.t() * 2).contiguous()                 # another layout: never over y


def still_read_later(x, w):
    y = x @ w
    return torch.relu(y), y @ w                     # y read by a later step: never over y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,inplace", [(extern_then_pointwise, True), (neighbour_read, False),
                                        (transposed_store, False), (still_read_later, False)])
def test_inplace_only_where_safe(fn, inplace, backend, tmp_path, monkeypatch):
    if backend == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    args = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16))[:fn.__code__.co_argcount]
    got, wrappers = _wrappers(fn, args, backend, tmp_path)
    torch.testing.assert_close(got, fn(*args))
    assert any("# in place" in w for w in wrappers) == inplace, wrappers


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(16)
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)
        self.conv = torch.nn.Conv1d(16, 16, 3, padding=1)

    def forward(self, x):
        h = self.fc2(F.gelu(self.fc1(self.ln(x)))) + x
        h = torch.relu(self.conv(h.transpose(1, 2))).transpose(1, 2) + h
        return h.softmax(-1) * h.sigmoid()


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_step_is_bitwise_the_same_without_inplace(backend, monkeypatch):
    """Outputs and gradients of a training step with and without stores over dead buffers: identical bits."""
    if backend == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    results = []
    for inplace in (True, False):
        torch.manual_seed(0)
        m = Block()
        x = torch.randn(2, 5, 16, requires_grad=True)
        coil.reset()
        out = coil.compile(m, options={"cpu_backend": backend, "inplace_buffers": inplace})(x)
        out.pow(2).sum().backward()
        results.append([out.detach(), x.grad] + [p.grad for p in m.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b)
