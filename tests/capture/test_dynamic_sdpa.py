"""Attention in graphs with symbolic sizes: ``F.scaled_dot_product_attention`` is recorded
as the opaque op ``coil::sdpa`` (coil/capture/substitutes.py), which chooses its kernel
when it runs. Traced, the kernel choice and the chosen kernel's mask padding (CUDA C++
checks of the sizes and of the mask's strides) added guards on the sequence length: on
the H200, GPT-2 recompiled for lengths whose residue mod 8 changed. Static graphs, graphs
that differentiate through attention and dropout keep ATen's ops."""
import json
import warnings

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import coil
import coil.codegen as cg
from coil import trace


@pytest.fixture
def graphs(tmp_path, monkeypatch):
    """The ATen graphs the run compiles (their text), and a count of backend compiles."""
    trace.set_dir(str(tmp_path))
    count = []
    orig = cg.compile_aten_graph

    def counting(*args):
        count.append(1)
        return orig(*args)
    monkeypatch.setattr(cg, "compile_aten_graph", counting)

    def read():
        out = []
        for p in tmp_path.glob("*.jsonl"):
            for line in p.read_text().splitlines():
                e = json.loads(line)
                if e["event"] == "artifact" and e["name"].startswith("aot_") and \
                        e["name"].endswith("graph"):
                    out.append(e["text"])
        return out, len(count)
    yield read
    trace.set_dir(None)


def attend(q, k, v, m):
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    return o.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1) * 2


def _qkvm(L, dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(2, 4, L, 16, generator=g, dtype=dtype).requires_grad_(grad)
               for _ in range(3))
    return q, k, v, torch.ones(L, L, dtype=torch.bool).tril()


def test_symbolic_attention_is_one_opaque_op_for_every_length(graphs):
    c = coil.compile(attend)
    with torch.no_grad():
        for L in (8, 16, 13, 24, 21):
            args = _qkvm(L)
            out, ref = c(*args), attend(*args)
            torch.testing.assert_close(out, ref)
            assert out.stride() == ref.stride()
    texts, n = graphs()
    assert n == 2                     # static 8, then one symbolic graph for the rest
    assert "coil.sdpa" not in texts[0] and "scaled_dot_product" in texts[0]
    assert "torch.ops.coil.sdpa.default" in texts[1]
    with pytest.raises(RuntimeError):  # eager's own size check, at run time
        with torch.no_grad():
            q, k, v, _ = _qkvm(12)
            c(q, k, v, torch.ones(5, 5, dtype=torch.bool))


def test_attention_with_gradients_keeps_atens_ops(graphs):
    c = coil.compile(attend, dynamic=True)
    for L in (8, 13):
        a_ref, a_out = _qkvm(L, grad=True), _qkvm(L, grad=True)
        ref, out = attend(*a_ref), c(*a_out)
        torch.testing.assert_close(out, ref)
        ref.sum().backward()
        out.sum().backward()
        for x, y in zip(a_ref[:3], a_out[:3]):
            torch.testing.assert_close(y.grad, x.grad)
    texts, _ = graphs()
    assert texts and not any("coil.sdpa" in t for t in texts)


def test_torch_compile_graphs_get_the_opaque_op(graphs):
    warnings.simplefilter("ignore")
    torch._dynamo.reset()
    try:
        c = torch.compile(attend, backend="coil", dynamic=True)
        with torch.no_grad():
            for L in (8, 13):
                args = _qkvm(L, dtype=torch.bfloat16)
                torch.testing.assert_close(c(*args), attend(*args))
    finally:
        torch._dynamo.reset()
    texts, n = graphs()
    assert n == 1 and "torch.ops.coil.sdpa.default" in texts[0]


def test_boolean_mask_made_additive_once_and_called_without_dispatch(graphs, monkeypatch):
    # eager's sdpa turns a boolean mask into 0 / -inf in every call (two ATen kernels per
    # layer on the GPU), and the custom op's Python dispatch cost ~40 us per call: the
    # conversion is one graph node for all layers sharing the mask, and the wrapper
    # calls the op's implementation itself. A row with every key masked gives eager's 0s
    from coil.capture.substitutes import run_sdpa
    calls = []
    monkeypatch.setattr(cg, "compile_aten_graph",
                        lambda *a, orig=cg.compile_aten_graph: calls.append(orig(*a)) or calls[-1])

    def two_layers(q, k, v, m):
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        return F.scaled_dot_product_attention(h * 2, k, v, attn_mask=m) + h

    c = coil.compile(two_layers, dynamic=True)
    with torch.no_grad():
        for L in (8, 13, 24):
            q, k, v, m = _qkvm(L)
            m[3] = False
            torch.testing.assert_close(c(q, k, v, m), two_layers(q, k, v, m))
    (text,), _ = graphs()
    assert text.count("torch.ops.coil.sdpa.default(") == 2 and text.count("aten.where") == 1, text
    assert len(calls) == 1 and run_sdpa in calls[0].call.__globals__.values()
