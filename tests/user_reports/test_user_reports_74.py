"""Repros from new-user trial 74 (FINDINGS_74.md): training loops, nn.Module patterns, dynamic shapes, torch.func,
higher-order ops and small transformers models, compared with eager.

Open findings are ``xfail(strict=True)``: the test flips to XPASS (and fails CI) once fixed, so remove the marker then.
"""

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil


def _grads(mod):
    return [p.grad for p in mod.parameters()]


# ---------------------------------------------------------------------------------------------------------------
# Finding 1 (open; SILENT WRONG GRADIENT): once a Python float read by the compiled code becomes a graph input (it
# changed between calls: automatic dynamic; or `dynamic=True`), AOT's `_tensorized_forward` (coil/aot/compile.py)
# re-traces the forward under `torch.no_grad()` and the joint graph differentiates that ATen graph. For
# `F.rrelu(training=True)` / `nn.RReLU` the forward holds `rrelu_with_noise_functional(x, empty)`, whose derivative
# reads the *input* noise buffer (`empty`, re-created in the backward), not the noise the forward wrote: every
# gradient through the activation is 0 from the second call on, with no error or warning. The first (static) call
# is right, and so is `dynamic=True` without a float.
# ---------------------------------------------------------------------------------------------------------------

class _RReLUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.act, self.l2 = nn.Linear(8, 16), nn.RReLU(), nn.Linear(16, 1)
        self.temperature = 1.0

    def forward(self, x):
        return self.l2(self.act(self.l1(x))) / self.temperature


def test_rrelu_gradient_with_a_temperature_schedule_matches_eager(coil_reset):
    torch.manual_seed(0)
    m = _RReLUNet()
    m2 = copy.deepcopy(m)
    cm = coil.compile(m2, options={"fallback_random": True})     # eager's random slopes, bit for bit
    for step in range(3):
        m.temperature = m2.temperature = 1.0 + 0.1 * step        # a schedule on a module attribute
        x = torch.randn(64, 8)
        torch.manual_seed(step)
        a = m(x)
        torch.manual_seed(step)
        b = cm(x)
        torch.testing.assert_close(b, a)
        a.pow(2).mean().backward()
        b.pow(2).mean().backward()
        torch.testing.assert_close(_grads(m2), _grads(m))
        m.zero_grad()
        m2.zero_grad()


def test_rrelu_gradient_equals_the_forward_slopes_with_a_float_argument(coil_reset):
    cf = coil.compile(lambda x, s: F.rrelu(x, training=True) * s)
    for s in (0.5, 0.7):
        x = torch.tensor([-2.0, -1.0, 1.0, 2.0], requires_grad=True)
        out = cf(x, s)
        g, = torch.autograd.grad(out.sum(), x)
        torch.testing.assert_close(g, (out / x).detach())    # d(out)/dx is the slope the forward used (times s)


def test_rrelu_gradient_without_a_float_input_is_right(coil_reset):
    for dyn in (None, True):
        cm = coil.compile(nn.RReLU(), dynamic=dyn)
        for k in range(3):
            x = (torch.tensor([-2.0, -1.0, 1.0, 2.0]) * (k + 1)).requires_grad_()
            out = cm(x)
            g, = torch.autograd.grad(out.sum(), x)
            torch.testing.assert_close(g, (out / x).detach())


# ---------------------------------------------------------------------------------------------------------------
# Finding 2 (open; compile error in training; same root cause as finding 1): attention with symbolic sizes in a
# graph that also reads a symbolic Python float. `_tensorized_forward` (coil/aot/compile.py) re-traces the forward
# under `torch.no_grad()`; there the `sdpa` substitute (coil/capture/substitutes.py) sees no grad and records the
# opaque, non-differentiable `coil::sdpa`, and the joint trace then fails: "Trying to backward through
# coil.sdpa.default but no autograd formula was registered". Reached by default automatic dynamic (a changing
# temperature / scale argument and a changing sequence length) and by `torch.compile(model, backend="coil",
# dynamic=True)` on transformers LLaMA / Qwen2 / Phi / Gemma / OPT in training (Dynamo makes the attention module's
# `scaling` / `attention_dropout` floats symbolic).
# ---------------------------------------------------------------------------------------------------------------

def _sdpa_with_temperature(q, k, v, t):
    return F.scaled_dot_product_attention(q / t, k, v, is_causal=True)


def test_sdpa_training_with_a_changing_float_and_length_compiles(coil_reset):
    cf = coil.compile(_sdpa_with_temperature)
    for L, t in ((5, 1.0), (7, 0.5)):         # the second call: L and t both symbolic
        torch.manual_seed(L)
        q, k, v = (torch.randn(1, 2, L, 8) for _ in range(3))
        a = [x.clone().requires_grad_() for x in (q, k, v)]
        b = [x.clone().requires_grad_() for x in (q, k, v)]
        out_e = _sdpa_with_temperature(*a, t)
        out_c = cf(*b, t)
        torch.testing.assert_close(out_c, out_e)
        g_e = torch.autograd.grad(out_e.sum(), a)
        g_c = torch.autograd.grad(out_c.sum(), b)
        torch.testing.assert_close(g_c, g_e)


class _FloatAttrAttention(nn.Module):
    """transformers' sdpa attention in miniature: float attributes for the scale and the dropout probability."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.scaling = 8 ** -0.5
        self.attention_dropout = 0.0

    def forward(self, x):
        B, L, _ = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, 2, 8).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling,
                                           dropout_p=self.attention_dropout)
        return o.transpose(1, 2).reshape(B, L, 16) * self.scaling


def test_sdpa_training_under_a_scaled_forward_with_dynamic_true(coil_reset):
    torch.manual_seed(0)
    m = _FloatAttrAttention()
    m2 = copy.deepcopy(m)
    cf = coil.compile(lambda x, s: m2(x) * s, dynamic=True)
    x = torch.randn(2, 5, 16)
    out_e, out_c = m(x) * 0.5, cf(x, 0.5)
    torch.testing.assert_close(out_c, out_e)
    out_e.sum().backward()
    out_c.sum().backward()
    torch.testing.assert_close(_grads(m2), _grads(m))




def test_torch_compile_dynamic_llama_training_step(coil_reset, dynamo_reset):
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                        intermediate_size=64, vocab_size=50, max_position_embeddings=64)
    m = T.LlamaForCausalLM(cfg)
    m2 = copy.deepcopy(m)
    cm = torch.compile(m2, backend="coil", dynamic=True)
    ids = torch.randint(1, 50, (2, 6))
    a, b = m(input_ids=ids, labels=ids), cm(input_ids=ids, labels=ids)
    torch.testing.assert_close(b.loss, a.loss)
    a.loss.backward()
    b.loss.backward()
    torch.testing.assert_close(_grads(m2), _grads(m))

# ---------------------------------------------------------------------------------------------------------------
# Finding 3 (open; runtime error in backward): the same no_grad re-trace as finding 1 (`_tensorized_forward`)
# records `nn.LSTM` as `aten.mkldnn_rnn_layer(..., train=False)`, which returns an empty workspace; the joint graph's
# `mkldnn_rnn_layer_backward` then gets `None` for it: "Expected a proper Tensor but got None ... for argument #22
# 'workspace'" at `loss.backward()`. Static shapes suffice: an LSTM step whose compiled function takes a Python float
# that changes (a loss weight, a teacher-forcing ratio) crashes from the second value on. GRU, RNN, LSTM with
# `proj_size` and the cells are fine.
# ---------------------------------------------------------------------------------------------------------------

def test_lstm_training_with_a_changing_float_argument(coil_reset):
    torch.manual_seed(0)
    lstm = nn.LSTM(6, 5, batch_first=True)

    def f(x, s):
        return lstm(x)[0] * s
    cf = coil.compile(f)
    for s in (0.5, 0.7):          # the second value makes `s` a graph input (automatic dynamic)
        x = torch.randn(2, 5, 6)
        params = list(lstm.parameters())
        g_c = torch.autograd.grad(cf(x, s).sum(), params)
        g_e = torch.autograd.grad(f(x, s).sum(), params)
        torch.testing.assert_close(g_c, g_e)



def test_embedding_bag_of_a_computed_weight_with_a_changing_float_argument(coil_reset):
    w = torch.randn(10, 4, requires_grad=True)

    def f(i, s):
        return F.embedding_bag(i, w * 2, mode="mean") * s
    cf = coil.compile(f)
    for s in (0.5, 0.7):
        i = torch.randint(0, 10, (3, 2))
        torch.testing.assert_close(torch.autograd.grad(cf(i, s).sum(), w), torch.autograd.grad(f(i, s).sum(), w))

def test_gru_and_lstm_with_projections_train_with_a_changing_float_argument(coil_reset):
    torch.manual_seed(0)
    for rnn in (nn.GRU(6, 5, bidirectional=True), nn.LSTM(6, 5, proj_size=3)):
        def f(x, s):
            return rnn(x)[0] * s
        cf = coil.compile(f)
        for s in (0.5, 0.7):
            x = torch.randn(4, 3, 6)
            params = list(rnn.parameters())
            torch.testing.assert_close(torch.autograd.grad(cf(x, s).sum(), params),
                                       torch.autograd.grad(f(x, s).sum(), params))


# ---------------------------------------------------------------------------------------------------------------
# Finding 4 (open; compile error on the second call): a Python float that changes between calls (automatic dynamic
# makes it a SymFloat) and is read inside a `torch.cond` / `while_loop` / `scan` body is passed to the HOP as a
# SymFloat operand, which torch's HOP refuses in coil's AOT trace: "AssertionError: (...) can only be of (Tensor,
# int, SymInt) but got (..., SymFloat)". The first call (static) works; `torch.map` works. torch.compile's own
# capture raises an AssertionError for cond too (shared), but coil makes floats symbolic by default.
# ---------------------------------------------------------------------------------------------------------------

def _cond_with_float(x, s):
    return torch.cond(x.sum() > 0, lambda a: a * s, lambda a: a - s, (x,))


def _scan_with_float(x, s):
    from torch._higher_order_ops.scan import scan
    return scan(lambda c, y: (c + y * s, c.clone()), x[0], x)[0]


def test_cond_body_reading_a_changing_float(coil_reset):
    """The float is specialized in the body, guarded (each value recompiles; a compile error before)."""
    cf = coil.compile(_cond_with_float)
    for s in (0.5, 0.7, 0.9, 0.7):
        for sign in (1, -1):
            x = torch.rand(4, 3) * sign
            torch.testing.assert_close(cf(x, s), _cond_with_float(x, s))


def test_scan_body_reading_a_changing_float(coil_reset):
    cf = coil.compile(_scan_with_float)
    for s in (0.5, 0.7, 0.9, 0.5):
        x = torch.randn(4, 3)
        torch.testing.assert_close(cf(x, s), _scan_with_float(x, s))


def test_map_body_reading_a_changing_float(coil_reset):
    from torch._higher_order_ops.map import map as hmap

    def f(x, s):
        return hmap(lambda r: r * s, x)
    cf = coil.compile(f)
    for s in (0.5, 0.7, 0.9):
        x = torch.randn(4, 3)
        torch.testing.assert_close(cf(x, s), f(x, s))



# ---------------------------------------------------------------------------------------------------------------
# Finding 5 (open; missing error): the same tensorized re-trace (finding 1) differentiates the functionalized forward,
# which has no in-place ops left, so autograd's saved-tensor version check is gone: `(x * s).relu_().exp_()`, which
# eager (and coil's first, static call) refuses at backward ("one of the variables needed for gradient computation
# has been modified by an inplace operation"), returns a gradient from the second float on.
# ---------------------------------------------------------------------------------------------------------------

def test_backward_through_an_overwritten_saved_output_raises_with_a_changing_float(coil_reset):
    def f(x, s):
        return (x * s).relu_().exp_()
    cf = coil.compile(f)
    for s in (0.5, 0.7):
        x = torch.tensor([-1.0, 0.5, 2.0], requires_grad=True)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(f(x, s).sum(), x)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(cf(x, s).sum(), x)

# ---------------------------------------------------------------------------------------------------------------
# What worked (kept as regressions): training loops and nn.Module patterns from the trial.
# ---------------------------------------------------------------------------------------------------------------

def test_param_groups_scheduler_grad_accumulation_and_clipping(coil_reset):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))
    m2 = copy.deepcopy(m)
    cm = coil.compile(m2)

    def make(mod):
        opt = torch.optim.AdamW([{"params": mod[0].parameters(), "lr": 1e-2},
                                 {"params": list(mod[1].parameters()) + list(mod[3].parameters()), "lr": 1e-3,
                                  "weight_decay": 0.1}])
        return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[2e-2, 2e-3], total_steps=10)
    (o1, s1), (o2, s2) = make(m), make(m2)
    for _ in range(3):
        for _ in range(2):      # gradient accumulation
            x, y = torch.randn(5, 8), torch.randn(5, 4)
            (F.mse_loss(m(x), y) / 2).backward()
            (F.mse_loss(cm(x), y) / 2).backward()
        for mod, opt, sch in ((m, o1, s1), (m2, o2, s2)):
            torch.nn.utils.clip_grad_norm_(mod.parameters(), 0.5)
            opt.step()
            sch.step()
            opt.zero_grad()
    torch.testing.assert_close(list(m2.parameters()), list(m.parameters()))


def test_bf16_autocast_training_with_tied_weights_and_a_step_counter_buffer(coil_reset):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 32)
            self.l1 = nn.Linear(32, 32)
            self.head = nn.Linear(32, 50, bias=False)
            self.head.weight = self.emb.weight
            self.register_buffer("steps", torch.zeros((), dtype=torch.long))

        def forward(self, i, y):
            self.steps += 1
            h = self.emb(i)
            h = h + F.gelu(self.l1(h))
            return F.cross_entropy(self.head(h).flatten(0, 1).float(), y.flatten(), label_smoothing=0.1)
    torch.manual_seed(0)
    m = Net()
    m2 = copy.deepcopy(m)
    cm = coil.compile(m2)
    assert m2.head.weight is m2.emb.weight
    i, y = torch.randint(0, 50, (4, 7)), torch.randint(0, 50, (4, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = m(i, y), cm(i, y)
    torch.testing.assert_close(b, a, atol=1e-2, rtol=1e-2)
    a.backward()
    b.backward()
    torch.testing.assert_close(_grads(m2), _grads(m), atol=2e-2, rtol=2e-2)
    assert m2.steps.item() == m.steps.item() == 1
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm", "orthogonal"])
def test_parametrized_linear_trains_like_eager(coil_reset, kind):
    from torch.nn.utils import parametrizations as P
    torch.manual_seed(0)
    m = nn.Sequential(getattr(P, kind)(nn.Linear(6, 6)), nn.Tanh(), nn.Linear(6, 3))
    m2 = copy.deepcopy(m)
    cm = coil.compile(m2)
    o1, o2 = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(m2.parameters(), lr=0.1)
    x = torch.randn(5, 6)
    for _ in range(3):
        a, b = m(x), cm(x)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
        a.square().mean().backward()
        b.square().mean().backward()
        torch.testing.assert_close(_grads(m2), _grads(m), atol=1e-5, rtol=1e-4)
        o1.step(); o2.step(); o1.zero_grad(); o2.zero_grad()
    # spectral_norm's power-iteration vectors are buffers updated in place in training
    torch.testing.assert_close(dict(m2.named_buffers()), dict(m.named_buffers()), atol=1e-5, rtol=1e-4)
    m.eval(); cm.eval()
    torch.testing.assert_close(cm(x), m(x), atol=1e-5, rtol=1e-4)


def test_qat_fake_quant_observers_update_like_eager(coil_reset):
    import torch.ao.quantization as Q

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.dq = Q.QuantStub(), Q.DeQuantStub()
            self.l1, self.l2 = nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x):
            return self.dq(self.l2(torch.relu(self.l1(self.q(x)))))
    torch.manual_seed(0)
    m = M()
    m.qconfig = Q.get_default_qat_qconfig("x86")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Q.prepare_qat(m, inplace=True)
    m2 = copy.deepcopy(m)
    cm = coil.compile(m2)
    for i in range(3):
        x = torch.randn(5, 8) * (i + 1)
        a, b = m(x), cm(x)
        torch.testing.assert_close(b, a)
        torch.testing.assert_close(dict(m2.named_buffers()), dict(m.named_buffers()))
        a.pow(2).mean().backward()
        b.pow(2).mean().backward()
        torch.testing.assert_close(_grads(m2), _grads(m))


def test_forward_hooks_added_and_removed_between_calls(coil_reset):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3))
    cm = coil.compile(m)
    x = torch.randn(2, 4)
    h1 = m[0].register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    m[2].register_forward_hook(lambda mod, args, out: out + 1)
    torch.testing.assert_close(cm(x), m(x))
    h1.remove()
    torch.testing.assert_close(cm(x), m(x))
    m[1].register_forward_hook(lambda mod, args, out: out * 0.5, prepend=True)
    torch.testing.assert_close(cm(x), m(x))
    m[2] = nn.Linear(4, 5)          # a module swapped between calls
    torch.testing.assert_close(cm(x), m(x))


def test_per_sample_gradients_with_vmap_grad_functional_call(coil_reset):
    from torch.func import functional_call, grad, vmap
    torch.manual_seed(0)
    m = nn.Linear(5, 3)
    params = dict(m.named_parameters())

    def per_sample(params, x):
        return vmap(grad(lambda p, xi: functional_call(m, p, (xi,)).pow(2).sum()), in_dims=(None, 0))(params, x)
    x = torch.randn(4, 5)
    torch.testing.assert_close(coil.compile(per_sample)(params, x), per_sample(params, x))


def test_gradient_layout_follows_non_contiguous_parameters(coil_reset):
    for make in (lambda: torch.randn(4, 3).t(), lambda: torch.randn(2, 3, 4, 5).permute(0, 2, 3, 1)):
        p1 = nn.Parameter(make())
        p2 = nn.Parameter(torch.empty_strided(p1.shape, p1.stride()))
        with torch.no_grad():
            p2.copy_(p1)
        x = torch.randn(p1.shape)

        def f(p, x):
            return (p * x).sin().sum()
        f(p1, x).backward()
        coil.compile(f)(p2, x).backward()
        assert p2.grad.stride() == p1.grad.stride()
        torch.testing.assert_close(p2.grad, p1.grad)


def test_ema_teacher_updated_under_no_grad_inside_forward(coil_reset):
    class EMA(nn.Module):
        def __init__(self):
            super().__init__()
            self.student, self.teacher = nn.Linear(4, 4), nn.Linear(4, 4)
            self.teacher.requires_grad_(False)

        def forward(self, x):
            with torch.no_grad():
                for pt, ps in zip(self.teacher.parameters(), self.student.parameters()):
                    pt.mul_(0.9).add_(ps, alpha=0.1)
            return (self.student(x) - self.teacher(x)).pow(2).mean()
    torch.manual_seed(0)
    m = EMA()
    m2 = copy.deepcopy(m)
    cm = coil.compile(m2)
    for _ in range(3):
        x = torch.randn(3, 4)
        a, b = m(x), cm(x)
        torch.testing.assert_close(b, a)
        a.backward()
        b.backward()
        torch.testing.assert_close(list(m2.teacher.parameters()), list(m.teacher.parameters()))
        torch.testing.assert_close(_grads(m2.student), _grads(m.student))


# ---------------------------------------------------------------------------------------------------------------
# Found by a sweep of every OpInfo op with autograd (first two float32 samples) as op(x) * s, s changing between calls:
# the tensorized forward was traced with every decomposition, so the joint differentiated decompositions instead of
# the ops' own formulas.
# ---------------------------------------------------------------------------------------------------------------

def test_log_ndtr_gradient_of_very_negative_inputs_with_a_changing_float(coil_reset):
    """``special.log_ndtr``'s decomposition differentiated gave NaN gradients at x = -9 (eager's formula is finite)."""
    def f(x, s):
        return (torch.special.log_ndtr(x) * s).sum()
    cf = coil.compile(f)
    for s in (0.5, 0.7):
        x = torch.tensor([-9.0, -3.0, 0.0, 2.0], requires_grad=True)
        g_c, = torch.autograd.grad(cf(x, s), x)
        g_e, = torch.autograd.grad(f(x, s), x)
        torch.testing.assert_close(g_c, g_e)


def test_fill_of_an_input_with_a_changing_float_compiles(coil_reset):
    """``torch.fill(x, True) * s`` (OpInfo's sample): the decomposed forward lost fill's (zero) gradient edge, and the
    joint trace raised "element 0 of tensors does not require grad" on the second float."""
    def f(x, s):
        return (torch.fill(x, True) * s).sum()
    cf = coil.compile(f)
    for s in (0.5, 0.7):
        x = torch.randn(5, requires_grad=True)
        torch.testing.assert_close(torch.autograd.grad(cf(x, s), x), torch.autograd.grad(f(x, s), x))


def test_native_layer_norm_and_safe_softmax_gradients_with_a_changing_float(coil_reset):
    """Silent wrong values before the fix (OpInfo's samples): from the second ``s`` on, the joint differentiated
    coil's decomposition of ``native_layer_norm``, so gradients flowed through its ``mean`` / ``rstd`` outputs, which
    eager's formula does not differentiate (the input's gradient off by 0.13); ``_safe_softmax`` of a row of -inf gave
    NaN gradients where eager's are 0."""
    torch.manual_seed(0)

    def f(x, w, b, y, s):
        out, mean, rstd = torch.native_layer_norm(x, (1, 2, 3), w, b, 0.5)
        return (out * s).sum() + (mean * s).sum() + (rstd * s).sum() + (torch.ops.aten._safe_softmax(y, 1) * s).sum()
    cf = coil.compile(f)
    for s in (0.5, 0.7, 0.9):
        x, w, b = (torch.randn(1, 2, 3, requires_grad=True) for _ in range(3))
        y = torch.randn(2, 3, 4).index_fill(1, torch.tensor([0, 1, 2]), float("-inf"))
        y[1] = torch.randn(3, 4)
        y.requires_grad_(True)
        torch.testing.assert_close(torch.autograd.grad(cf(x, w, b, y, s), (x, w, b, y)),
                                   torch.autograd.grad(f(x, w, b, y, s), (x, w, b, y)))
