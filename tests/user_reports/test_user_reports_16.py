"""Minimal repros from the sixteenth round of user testing: small HuggingFace models from
random configs (inference, an AdamW training step, ``generate()`` with dynamic and static
KV caches), activation functions and their backward with special values in fp32, fp64
and bf16, ``no_grad``, ``inference_mode`` and ``autocast`` regions inside compiled
functions, Python-scalar promotion with int and bool tensors, in-place ops on views of
inputs, error messages for bad input, ``torch.compile(backend="coil")`` with
``dynamic=True``, and the compile log (``COIL_TRACE`` + ``coil report``); see
FINDINGS_16.md.

Each failure is the smallest program that showed a defect (``xfail(strict=True)`` with
the diagnosis, so it flips when fixed); the plain tests are compact versions of what was
verified to match eager. CPU only. Tests that use ``torch.compile`` call
``torch._dynamo.reset()`` afterwards.
"""
import copy
import glob
import json
import os
import random
import subprocess
import sys
import traceback
import warnings

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import coil
from coil.testing import CompileCounter

from report_helpers import arg_copies

transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("coil_reset")  # tests/user_reports/conftest.py


def _quiet_warnings():
    # pytest restores the warning filters after each test
    warnings.simplefilter("ignore")


# --------------------------------------------------------------------------------------
# tiny HuggingFace models from configs (random weights, no downloads)
# --------------------------------------------------------------------------------------

def _hf(name):
    T = transformers
    torch.manual_seed(0)
    ids = dict(vocab_size=101, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, **ids))
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
            intermediate_size=64, max_position_embeddings=64, **ids))
    if name == "bert":
        return T.BertForMaskedLM(T.BertConfig(
            num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
            max_position_embeddings=64, vocab_size=101, pad_token_id=0))
    if name == "t5":
        return T.T5ForConditionalGeneration(T.T5Config(
            num_layers=2, num_decoder_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64,
            vocab_size=101, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    raise ValueError(name)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "t5"])
def test_hf_inference_matches_eager(name):
    _quiet_warnings()
    m = _hf(name).eval()
    torch.manual_seed(1)
    ids = torch.randint(3, 101, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0                      # a padded row
    kw = dict(input_ids=ids, attention_mask=mask)
    if name == "t5":
        kw["decoder_input_ids"] = ids[:, :5]
    cm = coil.compile(m)
    with torch.no_grad():
        r, o = m(**kw).logits, cm(**kw).logits
    torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-5)
    assert o.stride() == r.stride()
    if name in ("gpt2", "llama", "bert"):
        with torch.no_grad():
            ex = coil.explain(m, **kw)
        assert ex.graph_count == 1 and ex.graph_break_count == 0, str(ex)[:300]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hf_training_steps_match_eager(name):
    """Two AdamW steps; dropout draws eager's masks with fallback_random. Gradients are
    compared relative to each parameter's largest grad (the attention key biases have a
    mathematically zero grad, so only noise there)."""
    _quiet_warnings()
    m = _hf(name).train()
    m2 = copy.deepcopy(m)
    cm = coil.compile(m2, options={"fallback_random": True})
    o1 = torch.optim.AdamW(m.parameters(), lr=1e-3)
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-3)
    for step in range(2):
        torch.manual_seed(10 + step)
        ids = torch.randint(3, 101, (2, 9))
        torch.manual_seed(step)
        r = m(input_ids=ids, labels=ids).loss
        r.backward()
        torch.manual_seed(step)
        o = cm(input_ids=ids, labels=ids).loss
        o.backward()
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-5)
        for (n, p), q in zip(m2.named_parameters(), m.parameters()):
            scale = q.grad.abs().max().clamp_min(1e-6)
            assert ((p.grad - q.grad).abs().max() / scale) < 1e-4, n
        o1.step(); o1.zero_grad()
        o2.step(); o2.zero_grad()


def test_hf_generate_with_static_and_dynamic_cache():
    """Greedy ``generate()`` through a compiled forward: the static cache compiles twice
    (prefill, decode); the dynamic cache at most 3 times (prefill, first decode step, one
    automatic-dynamic decode graph: docs/dynamic_shapes.md), never reaching the recompile
    limit, with the same tokens."""
    _quiet_warnings()
    m = _hf("llama").eval()
    torch.manual_seed(2)
    ids = torch.randint(3, 101, (2, 5))
    gen = dict(max_new_tokens=10, do_sample=False)
    with torch.no_grad():
        ref_static = m.generate(ids, cache_implementation="static", **gen)
        ref_dyn = m.generate(ids, **gen)
    cnt = CompileCounter()
    m.forward = coil.compile(m.forward, backend=cnt)
    try:
        with torch.no_grad():
            out = m.generate(ids, cache_implementation="static", **gen)
        assert torch.equal(out, ref_static)
        assert cnt.frame_count == 2
    finally:
        del m.forward
    coil.reset()
    m.forward = coil.compile(m.forward, options={"recompile_limit": 3})
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with torch.no_grad():
                out = m.generate(ids, **gen)
        assert torch.equal(out, ref_dyn)
        assert not any("recompile limit" in str(x.message) for x in w)
        from coil.capture import stats
        assert stats["graphs"] <= 3, stats
    finally:
        del m.forward


def test_kv_cache_buffers_index_copy_decode_loop():
    """A hand-written decode step writing a preallocated KV cache (module buffers) with
    ``index_copy_`` at a tensor position: one compile, cache and outputs as eager, fp32
    and bf16."""
    B, H, D, T = 2, 2, 8, 12

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(H * D, 3 * H * D)
            self.o = nn.Linear(H * D, H * D)
            self.register_buffer("k", torch.zeros(B, H, T, D))
            self.register_buffer("v", torch.zeros(B, H, T, D))

        def forward(self, x, pos):
            q, k, v = self.qkv(x).view(B, 1, 3, H, D).unbind(2)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            self.k.index_copy_(2, pos, k)
            self.v.index_copy_(2, pos, v)
            mask = (torch.arange(T) <= pos)[None, None, None, :]
            y = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask)
            return self.o(y.transpose(1, 2).reshape(B, 1, H * D))

    for dt in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        m = Attn().to(dt).eval()
        m2 = copy.deepcopy(m)
        cnt = CompileCounter()
        cm = coil.compile(m2)
        counted = coil.compile(copy.deepcopy(m), backend=cnt)
        with torch.no_grad():
            for t in range(T):
                x = torch.randn(B, 1, H * D).to(dt)
                pos = torch.tensor([t])
                torch.testing.assert_close(cm(x, pos), m(x, pos))
                counted(x, pos)
        torch.testing.assert_close(m2.k, m.k)
        torch.testing.assert_close(m2.v, m.v)
        assert cnt.frame_count == 1
        coil.reset()


# --------------------------------------------------------------------------------------
# activations and their backward, special values
# --------------------------------------------------------------------------------------

_ACTS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "mish": F.mish,
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x, beta=2.0, threshold=5.0),
    "elu": F.elu,
    "selu": F.selu,
    "celu": lambda x: F.celu(x, alpha=1.3),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "relu6": F.relu6,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "logsigmoid": F.logsigmoid,
    "softsign": F.softsign,
    "hardtanh": F.hardtanh,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}


def _act_input(dtype, n=64):
    torch.manual_seed(0)
    x = torch.randn(n, dtype=torch.float64) * 5
    x[:16] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, 1e30, -1e30, 88.0,
                           -88.0, -100.0, 100.0, 20.0, -20.0, 3.0, -3.0, 6.0, -6.0])
    return x.to(dtype)


_ACT_TOL = {torch.float32: (1e-5, 1.3e-6), torch.float64: (1e-7, 1e-7),
            torch.bfloat16: (1e-2, 1.6e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32", "f64", "bf16"])
def test_activation_values_and_grads_with_special_values(dtype):
    """Values (NaN, ±inf, ±1e30 included) and grads. Grads are compared where the input
    is not NaN: eager's own grad at a NaN input depends on the tensor length (elu,
    hardswish, relu6 and hardtanh take a vectorized path from 16 or 64 elements that gives
    NaN or 0, the scalar path gives the incoming grad), so there is no eager value to
    match there."""
    atol, rtol = _ACT_TOL[dtype]
    x = _act_input(dtype)
    finite = ~x.isnan()
    for name, f in _ACTS.items():
        coil.reset()
        xr = x.clone().requires_grad_()
        xc = x.clone().requires_grad_()
        r = f(xr)
        o = coil.compile(f)(xc)
        torch.testing.assert_close(o, r, atol=atol, rtol=rtol, equal_nan=True,
                                   msg=lambda m: f"{name}: {m}")
        g = torch.randn(r.shape, dtype=torch.float64).to(dtype)
        r.backward(g)
        o.backward(g)
        torch.testing.assert_close(xc.grad[finite], xr.grad[finite], atol=atol, rtol=rtol,
                                   equal_nan=True, msg=lambda m: f"grad of {name}: {m}")


def test_activations_triton_interpreter_tiny():
    x = _act_input(torch.float32, n=32)
    finite = ~x.isnan()
    for name in ("gelu", "gelu_tanh", "silu", "mish", "softplus", "elu", "hardswish", "logsigmoid"):
        f = _ACTS[name]
        coil.reset()
        xr = x.clone().requires_grad_()
        xc = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # NumPy overflow warnings of the interpreter
            r = f(xr)
            o = coil.compile(f, options={"cpu_backend": "triton"})(xc)
            torch.testing.assert_close(o, r, equal_nan=True, msg=lambda m: f"{name}: {m}")
            g = torch.randn(r.shape)
            r.backward(g)
            o.backward(g)
        torch.testing.assert_close(xc.grad[finite], xr.grad[finite], equal_nan=True,
                                   msg=lambda m: f"grad of {name}: {m}")


def test_relu_keeps_negative_zero_cpp():
    """Was defect 10 of FINDINGS_16 (relu(-0.0) gave +0.0 on the C++ backend: coil_max(x, 0));
    fixed in the same session (c64ce97: relu is a select, max/min keep the first operand
    on ties)."""
    x = torch.tensor([-0.0, 0.0, -1.0, 2.0, float("nan")] * 8)
    zero = x == 0
    # (not torch.maximum: eager's own sign of a -0.0/0.0 tie differs between its
    # vectorized body and its scalar tail)
    for f in (F.relu, F.relu6, lambda t: t.clamp_min(0)):
        coil.reset()
        out, ref = coil.compile(f)(x), f(x)
        torch.testing.assert_close(out, ref, equal_nan=True)
        assert torch.equal(out[zero].signbit(), ref[zero].signbit())


# --------------------------------------------------------------------------------------
# grad-mode and autocast regions, promotion, in-place ops on views
# --------------------------------------------------------------------------------------

def _both(f, *args):
    a_ref, a_out = arg_copies(args), arg_copies(args)
    r = f(*a_ref)
    o = coil.compile(f)(*a_out)
    as_t = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,)  # noqa: E731
    return as_t(o), as_t(r), a_out, a_ref


def test_grad_mode_and_autocast_regions_inside_compiled_functions():
    torch.manual_seed(0)
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(6, 5, requires_grad=True)

    def no_grad_scale(x, w):
        with torch.no_grad():
            s = x.abs().amax()
        return (x / s) @ w, s

    def inference_inside(x, w):
        with torch.inference_mode():
            y = x @ w
        return y

    def autocast_inside(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
            z = F.softmax(y, -1)
            with torch.autocast("cpu", enabled=False):
                u = y.float() @ w.t()
        return y, z, u, y.float() + 1

    for f in (no_grad_scale, inference_inside, autocast_inside):
        coil.reset()
        outs, refs, a_out, a_ref = _both(f, x, w)
        for o, r in zip(outs, refs):
            assert o.dtype == r.dtype and o.requires_grad == r.requires_grad, f.__name__
            assert o.is_inference() == r.is_inference(), f.__name__
            tol = 2e-2 if r.dtype == torch.bfloat16 or f is autocast_inside else 1e-5
            torch.testing.assert_close(o.float(), r.float(), atol=tol, rtol=tol)
        if f is no_grad_scale:
            outs[0].sum().backward()
            refs[0].sum().backward()
            torch.testing.assert_close(a_out[0].grad, a_ref[0].grad)
            torch.testing.assert_close(a_out[1].grad, a_ref[1].grad)

    @coil.compile
    @torch.no_grad()
    def decorated(x, w):
        return (x @ w).softmax(-1)
    out = decorated(x, w)
    assert not out.requires_grad
    torch.testing.assert_close(out, (x @ w).softmax(-1).detach())


def test_python_scalar_promotion_int_and_bool_tensors():
    torch.manual_seed(0)
    f32 = torch.randn(3, 5) * 4
    i32 = torch.randint(-1000, 1000, (3, 5), dtype=torch.int32)
    i8 = torch.randint(-128, 127, (3, 5), dtype=torch.int8)
    u8 = torch.randint(0, 255, (3, 5), dtype=torch.uint8)
    b = torch.rand(3, 5) > 0.5

    def f(f32, i32, i8, u8, b):
        return (i32 * 2.5, i32 / 3, i32 // -7, i32 % -7, i32 + 2 ** 40, u8 + 256, u8 - 3,
                -u8, i8 * 100, b + b, b * 1.5, b + True, (f32 > 0) + 1, ~b, b.sum(),
                torch.where(b, i32, 2.5), i32 ** 2.0, i8 << 2, u8 >> 1, f32.int() + 0.5,
                torch.tensor(2.5) * i32, f32.half() * torch.tensor(3), f32.bfloat16() + 1e-3)

    outs, refs, _, _ = _both(f, f32, i32, i8, u8, b)
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert o.dtype == r.dtype, (i, o.dtype, r.dtype)
        torch.testing.assert_close(o, r, msg=lambda m: f"output {i}: {m}")


def test_inplace_ops_on_views_of_inputs():
    torch.manual_seed(0)

    def views(x):
        x[:, 1:3].mul_(2).add_(1)
        x.t()[0].zero_()
        x.view(-1)[::5] = 7
        return x.sum()

    def int_views(i):
        i[1:] *= 2
        i.t()[0] -= 3
        return i.sum()

    def into_buffer(x, y):
        y[0] += x.sum(0)
        y.diagonal().copy_(x[0])
        return (y * x).sum()

    for f, args in ((views, (torch.randn(4, 5),)),
                    (int_views, (torch.randint(-9, 9, (3, 4)),)),
                    (into_buffer, (torch.randn(5, 5, requires_grad=True), torch.randn(5, 5)))):
        coil.reset()
        outs, refs, a_out, a_ref = _both(f, *args)
        torch.testing.assert_close(outs[0], refs[0])
        for y, z in zip(a_out, a_ref):
            torch.testing.assert_close(y.detach(), z.detach())
        if f is into_buffer:
            outs[0].backward()
            refs[0].backward()
            torch.testing.assert_close(a_out[0].grad, a_ref[0].grad)


def test_whole_train_step_compiled():
    """forward + backward + clip_grad_norm_ + AdamW step in one compiled function (the
    backward and the optimizer are graph breaks): losses and parameters as eager."""
    def mk():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))

    def step(m, opt, x, y):
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    m1, m2 = mk(), mk()
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2)
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    cstep = coil.compile(step)
    torch.manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(5, 8), torch.randint(0, 3, (5,))
        torch.testing.assert_close(cstep(m2, o2, x, y), step(m1, o1, x, y))
    for p, q in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(q, p)


# --------------------------------------------------------------------------------------
# tensors made to require grad inside the compiled function
# --------------------------------------------------------------------------------------

def test_requires_grad_on_intermediate_gets_grad():
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)

    def saliency(img):
        x = img.clone().requires_grad_()
        return x, lin(x).max()

    img = torch.randn(2, 4)
    x_ref, s_ref = saliency(img)
    s_ref.backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # ".grad of a non-leaf" UserWarning
        x_out, s_out = coil.compile(saliency)(img)
        s_out.backward()
        assert x_out.is_leaf == x_ref.is_leaf
        assert x_out.grad is not None
    torch.testing.assert_close(x_out.grad, x_ref.grad)


def test_leaf_created_inside_compiled_function_is_differentiable():
    def f(a):
        x = torch.zeros(3, requires_grad=True)
        return x, (x * a).sum()

    a = torch.randn(3)
    x_ref, l_ref = f(a)
    x_out, l_out = coil.compile(f)(a)
    assert l_out.requires_grad == l_ref.requires_grad
    l_out.backward()
    torch.testing.assert_close(x_out.grad, a)


def test_autograd_grad_wrt_tensor_made_to_require_grad_inside():
    def forces(a):
        x = a.detach().requires_grad_()
        energy = (x.sin() * 3).sum()
        return -torch.autograd.grad(energy, x)[0]

    a = torch.randn(5)
    torch.testing.assert_close(coil.compile(forces)(a), forces(a))


def test_requires_grad_inside_works_through_torch_compile(dynamo_reset):
    lin = nn.Linear(4, 3)

    def saliency(img):
        x = img.clone().requires_grad_()
        return x, lin(x).max()

    img = torch.randn(2, 4)
    x_ref, s_ref = saliency(img)
    s_ref.backward()
    x_out, s_out = torch.compile(saliency, backend="coil")(img)
    s_out.backward()
    torch.testing.assert_close(x_out.grad, x_ref.grad)


def test_double_backward_through_compiled_graph_is_a_clear_error():
    D = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def penalty(x):
        g, = torch.autograd.grad(D(x).sum(), x, create_graph=True)
        return (g ** 2).sum()

    x = torch.randn(3, 4, requires_grad=True)
    out = coil.compile(penalty)(x)
    with pytest.raises(RuntimeError, match="double backward through a compiled graph"):
        out.backward()


# --------------------------------------------------------------------------------------
# invalid input that eager rejects
# --------------------------------------------------------------------------------------

# fixed: coil/capture/substitutes.py (one_hot through a bounds-checked index_select)
def test_one_hot_out_of_range_raises():
    f = coil.compile(lambda i: F.one_hot(i, 4).float() * 2)
    with pytest.raises((RuntimeError, IndexError)):
        f(torch.tensor([1, 5, 2]))


# fixed: coil/capture/meta_checks.py (eager's dtype checks, at capture)
def test_index_add_dtype_mismatch_raises():
    t = torch.randn(4, 8)
    h = torch.randn(4, 8).bfloat16()
    i = torch.tensor([0, 1, 0, 2])
    with pytest.raises(RuntimeError):
        t.index_add(0, i, h)
    with pytest.raises(RuntimeError):
        coil.compile(lambda t, h: t.index_add(0, i, h))(t, h)


def test_capture_time_errors_name_the_user_line():
    def mm_bad(x, w):
        h = x.relu()
        y = h @ w   # bad shapes
        return y

    with pytest.raises(RuntimeError, match="cannot be multiplied") as ei:
        coil.compile(mm_bad)(torch.randn(3, 4), torch.randn(5, 2))
    lines = [fr.line for fr in traceback.extract_tb(ei.value.__traceback__)]
    assert "y = h @ w   # bad shapes" in lines

    def checked(x):
        assert x.shape[0] == 4, "batch must be 4"
        return x * 2
    with pytest.raises(AssertionError, match="batch must be 4"):
        coil.compile(checked)(torch.randn(3, 2))

    def brk(x):
        print("", end="")
        return x
    with pytest.raises(Exception, match=r"test_user_reports_16.py:\d+"):
        coil.compile(brk, fullgraph=True)(torch.randn(2))


def test_kernel_index_error_names_the_user_line():
    def pick(x, i):
        return x[i] * 2     # the user's line

    with pytest.raises(IndexError) as ei:
        coil.compile(pick)(torch.randn(5, 3), torch.tensor([1, 9]))
    tb = traceback.extract_tb(ei.value.__traceback__)
    named = [fr for fr in tb if fr.line and "return x[i] * 2" in fr.line]
    assert named or "return x[i] * 2" in str(ei.value) or "pick" in str(ei.value)


# --------------------------------------------------------------------------------------
# torch.compile(backend="coil") with dynamic=True: symbolic floats
# --------------------------------------------------------------------------------------

def _counting_coil_backend(errors: list):
    from torch._dynamo.backends.registry import lookup_backend

    def be(gm, example_inputs):
        try:
            return lookup_backend("coil")(gm, example_inputs)
        except Exception as e:  # Dynamo turns it into a graph break and runs eagerly
            errors.append(f"{type(e).__name__}: {e}")
            raise
    return be


def test_torch_compile_dynamic_symbolic_float(dynamo_reset):
    errors = []
    be = _counting_coil_backend(errors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = torch.randn(3, 4)
        cf = torch.compile(lambda x, t: (x / t).softmax(-1), backend=be)
        for t in (0.7, 1.3):                       # a sampling temperature
            torch.testing.assert_close(cf(x, t), (x / t).softmax(-1))
        torch._dynamo.reset()
        ln = nn.LayerNorm(4)
        torch.testing.assert_close(torch.compile(ln, backend=be, dynamic=True)(x), ln(x))
    assert errors == []


def test_torch_compile_dynamic_true_without_floats(dynamo_reset):
    errors = []
    be = _counting_coil_backend(errors)
    lin = nn.Linear(4, 4)
    cf = torch.compile(lambda x: lin(x).relu().sum(-1), backend=be, dynamic=True)
    for n in (2, 3, 5):
        x = torch.randn(n, 4)
        torch.testing.assert_close(cf(x), lin(x).relu().sum(-1))
    assert errors == []


# --------------------------------------------------------------------------------------
# graph breaks that real models hit
# --------------------------------------------------------------------------------------

def test_module_constructed_inside_forward_is_captured():
    def f(logits, y):
        return nn.CrossEntropyLoss()(logits, y) + nn.ReLU()(logits).mean()

    args = (torch.randn(4, 5), torch.tensor([0, 3, 1, 4]))
    torch.testing.assert_close(coil.compile(f)(*args), f(*args))
    ex = coil.explain(f, *args)
    assert ex.graph_break_count == 0, str(ex)[:300]


def test_python_random_value_does_not_recompile_every_call():
    """Fixed: the float passed to the resume frame becomes a graph input after it changed
    (automatic dynamic, docs/dynamic_shapes.md)."""
    def scale(x):
        return x * random.uniform(0.5, 1.5)

    cnt = CompileCounter()
    cf = coil.compile(scale, backend=cnt)
    state = random.getstate()
    try:
        random.seed(0)
        ref = [scale(torch.ones(2)) for _ in range(6)]
        random.seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = [cf(torch.ones(2)) for _ in range(6)]
    finally:
        random.setstate(state)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r)
    assert cnt.frame_count <= 2, cnt.frame_count


def test_activation_checkpoint_is_captured():
    # captured as a tagged region (docs/hops.md); was a graph break per block
    from torch.utils.checkpoint import checkpoint
    lin = nn.Linear(4, 4)

    def f(x):
        return checkpoint(lambda t: torch.tanh(lin(t)).sin(), x, use_reentrant=False).sum()

    x = torch.randn(3, 4, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    f(x).backward()
    coil.compile(f)(x2).backward()
    torch.testing.assert_close(x2.grad, x.grad)
    ex = coil.explain(f, x)
    assert ex.graph_break_count == 0, str(ex)[:300]


# --------------------------------------------------------------------------------------
# the compile log
# --------------------------------------------------------------------------------------

_LOG_SCRIPT = r"""
import torch, coil, torch.nn.functional as F
torch.manual_seed(0)
def f(x, w):
    y = F.gelu(x @ w)
    print("", end="")
    return y.softmax(-1)
cf = coil.compile(f)
w = torch.randn(8, 8, requires_grad=True)
cf(torch.randn(4, 8), w).sum().backward()
cf(torch.randn(5, 8), w).sum().backward()
"""


def _traced_run(tmp_path):
    log = tmp_path / "log"
    env = dict(os.environ, COIL_TRACE=str(log))
    subprocess.run([sys.executable, "-c", _LOG_SCRIPT], env=env, check=True,
                   capture_output=True, timeout=120)
    recs = [json.loads(line) for p in glob.glob(str(log / "*.jsonl")) for line in open(p)]
    return log, recs


def test_compile_log_and_report(tmp_path):
    log, recs = _traced_run(tmp_path)
    events = {r.get("event") for r in recs}
    assert {"graph_break", "recompile", "artifact"} <= events
    out = tmp_path / "report"
    res = subprocess.run([sys.executable, "-m", "coil.cli", "report", str(log), "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0 and "No module named" in res.stderr:
        res = subprocess.run(["coil", "report", str(log), "-o", str(out)],
                             capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-500:]
    index = (out / "index.html").read_text()
    assert "0/1" in index and "__resume_at" in index


def test_captured_graph_nodes_carry_stack_trace():
    cnt = CompileCounter()

    def f(x, w):
        y = F.gelu(x @ w)
        return y.softmax(-1)
    coil.compile(f, backend=cnt)(torch.randn(4, 8), torch.randn(8, 8))
    calls = [n for n in cnt.graphs[0].graph.nodes if n.op in ("call_function", "call_method")]
    assert calls and all("y = F.gelu(x @ w)" in (n.meta.get("stack_trace") or "")
                         or "return y.softmax(-1)" in (n.meta.get("stack_trace") or "")
                         for n in calls)
