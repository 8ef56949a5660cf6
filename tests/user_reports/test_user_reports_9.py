"""Minimal repros from the ninth round of user testing: training loops (optimizer steps,
autocast, gradient accumulation, train/eval switches, checkpointing, hooks, graph breaks);
see FINDINGS_9.md.

Each failure is the smallest program that showed a defect (``xfail(strict=True)`` with the
diagnosis, so it flips when fixed); the plain tests are compact versions of training
patterns verified to match eager. CPU only, both kernel backends ("cpp" and "triton"
through its interpreter).
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp

import coil

BACKENDS = ["cpp", "triton"]


def _compiled(fn, backend, **opts):
    coil.reset()
    return coil.compile(fn, options={"cpu_backend": backend, **opts})


def _train_both(make_model, make_batch, step, backend, steps=3, opt=None):
    """Trains ``make_model()`` eagerly and a deep copy compiled (fallback_random, so
    dropout draws eager's numbers) for ``steps`` steps of ``step(model, batch, optimizer)``
    with identical seeds; compares the losses, then parameters, grads and buffers."""
    opt = opt or (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    torch.manual_seed(0)
    m1 = make_model()
    m2 = copy.deepcopy(m1)
    cm = _compiled(m2, backend, fallback_random=True)
    o1, o2 = opt(m1.parameters()), opt(m2.parameters())
    for s in range(steps):
        torch.manual_seed(100 + s)
        batch = make_batch()
        losses = []
        for m, o in ((m1, o1), (cm, o2)):
            torch.manual_seed(1000 + s)
            o.zero_grad()
            losses.append(step(m, batch, o).detach())
        torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-4,
                                   msg=lambda msg: f"loss of step {s}: {msg}")
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
        torch.testing.assert_close(p2, p1, atol=1e-5, rtol=1e-4, msg=lambda msg: f"{n}: {msg}")
        assert (p1.grad is None) == (p2.grad is None), n
        if p1.grad is not None:
            torch.testing.assert_close(p2.grad, p1.grad, atol=1e-5, rtol=1e-4,
                                       msg=lambda msg: f"{n}.grad: {msg}")
    for (n, b1), b2 in zip(m1.named_buffers(), m2.buffers()):
        torch.testing.assert_close(b2, b1, atol=1e-5, rtol=1e-4, msg=lambda msg: f"{n}: {msg}")


def _plain_step(m, batch, o):
    x, y = batch
    loss = F.cross_entropy(m(x), y)
    loss.backward()
    o.step()
    return loss


def _mlp():
    return nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.Linear(32, 32), nn.LayerNorm(32),
                         nn.Tanh(), nn.Linear(32, 5))


def _batch():
    return torch.randn(8, 10), torch.randint(0, 5, (8,))


# -- verified to work (compact versions of what was tried; FINDINGS_9.md lists more) ------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_mlp_and_convnet_optimizer_steps(backend, opt):
    o = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
         "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2)}[opt]
    _train_both(_mlp, _batch, _plain_step, backend, opt=o)
    # no conv bias before BatchNorm: its true gradient is 0, and AdamW turns the rounding
    # noise there into full-size steps in eager and coil alike
    conv = lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                 nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, stride=2),
                                 nn.Dropout(0.2), nn.Flatten(), nn.Linear(8, 4))
    _train_both(conv, lambda: (torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))),
                _plain_step, backend, opt=o)


@pytest.mark.parametrize("backend", BACKENDS)
def test_accumulation_retain_graph_two_losses_clip_and_input_grads(backend):
    def step(m, batch, o):
        x, y = batch
        total = 0
        for i in range(2):  # two micro-batches
            loss = F.cross_entropy(m(x[4 * i:4 * i + 4]), y[4 * i:4 * i + 4]) / 2
            loss.backward()
            total = total + loss.detach()
        out = m(x)  # one output in two losses, backward twice through a retained graph
        l2 = F.cross_entropy(out, y) + out.pow(2).mean()
        l2.backward(retain_graph=True)
        l2.backward()
        xi = x.clone().requires_grad_()
        F.mse_loss(m(xi), torch.zeros(8, 5)).backward(create_graph=False)
        n = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        o.step()
        return total + l2.detach() + n + xi.grad.abs().sum()
    _train_both(_mlp, _batch, step, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_eval_no_grad_switches_and_frozen_params(backend):
    calls = [0]

    def make():
        return nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(inplace=True),
                             nn.Dropout(0.3), nn.Linear(16, 16), nn.Linear(16, 5))

    def step(m, batch, o):
        k = calls[0] // 2
        calls[0] += 1
        inner = getattr(m, "_orig_mod", m)
        inner[0].weight.requires_grad_(k != 1)  # frozen for one step only
        inner[4].requires_grad_(k < 2)  # frozen from step 2 on
        m.train()
        loss = _plain_step(m, batch, o)
        m.eval()
        with torch.no_grad():
            ev = m(batch[0]).sum()
        m.train()
        return loss + ev
    _train_both(make, _batch, step, backend)


class _Fancy(nn.Module):
    """Checkpoint with dropout, a custom autograd.Function, a forward hook, a tensor hook,
    a parameter used twice, tied weights and graph breaks (print, .item(), data-dependent
    branch) in one forward."""

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x * w.sigmoid()

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            s = w.sigmoid()
            return g * s * 2, (g * x * s * (1 - s)).sum(0)

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 16)
        self.a = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.3), nn.GELU())
        self.w = nn.Parameter(torch.randn(16))
        self.b = nn.Linear(16, 16)
        self.head = nn.Linear(16, 20, bias=False)
        self.head.weight = self.emb.weight
        self.a[2].register_forward_hook(lambda mod, i, o: o * 2)

    def forward(self, ids):
        h = cp.checkpoint(self.a, self.emb(ids), use_reentrant=False)
        h = self.Scale.apply(h, self.w)
        h.register_hook(lambda g: g * 3)
        print(end="")
        if h.sum().item() > 0:
            h = self.b(torch.tanh(self.b(h)))
        else:
            h = self.b(h).relu()
        return self.head(h)


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_custom_function_hooks_tied_weights_graph_breaks(backend):
    def step(m, batch, o):
        ids, y = batch
        loss = F.cross_entropy(m(ids).flatten(0, 1), y.flatten())
        loss.backward()
        o.step()
        return loss
    _train_both(_Fancy, lambda: (torch.randint(0, 20, (4, 6)), torch.randint(0, 20, (4, 6))),
                step, backend)


def test_gpt2_autocast_bf16_grad_checkpointing_train_eval():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32)

    def make():
        m = transformers.GPT2LMHeadModel(cfg)
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return m

    def step(m, batch, o):
        ids = batch[0]
        labels = ids.clone()
        labels[:, :3] = -100
        loss = m(input_ids=ids, labels=labels).loss
        loss.backward()
        o.step()
        m.eval()
        with torch.no_grad():
            ev = m(input_ids=ids).logits.mean()
        m.train()
        return loss + ev
    _train_both(make, lambda: (torch.randint(0, 100, (2, 16)),), step, "cpp")
    # bf16 autocast: compare with a bf16-sized tolerance
    torch.manual_seed(0)
    m1 = transformers.GPT2LMHeadModel(cfg)
    m2 = copy.deepcopy(m1)
    cm = _compiled(m2, "cpp", fallback_random=True)
    ids = torch.randint(0, 100, (2, 16))
    for m in (m1, cm):
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            m(input_ids=ids, labels=ids).loss.backward()
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, atol=2e-2, rtol=2e-2, msg=lambda s: f"{n}: {s}")


# -- defects ----------------------------------------------------------------------------

# 1. fixed: guards checked only whether autocast is *enabled*, not its dtype; a graph
# compiled under bf16 autocast was reused under fp16 and returned bfloat16. The capture now
# guards torch.get_autocast_dtype(dev) while autocast is on (coil/capture/output.py).
@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_dtype_change_recompiles(backend):
    f = lambda x, w: x @ w
    cf = _compiled(f, backend)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cf(x, w).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.float16):
        ref, out = f(x, w), cf(x, w)
    assert out.dtype == ref.dtype == torch.float16, out.dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cf(x, w).dtype == torch.bfloat16  # the first graph is still found


# 2. fixed: with fallback_random (documented: random ops equal eager bit for bit given the
# same seed), dropout of a non-contiguous tensor drew a different mask from eager's. Eager's
# CPU dropout fills empty_like(x) (x's strides) with bernoulli_, so draws follow x's memory
# order; functionalization turns that into bernoulli.p(empty_permuted(...)), and ATen's
# functional bernoulli allocates contiguous, so draws followed the logical order (the
# empty_permuted buffer itself already had eager's strides). The extern now runs
# empty_like(x).bernoulli_(p) (ir/graph.py _BernoulliInLayout), as Inductor does. Seen with
# nn.TransformerEncoderLayer(batch_first=True) in training (its attention output is
# transposed): losses differed from eager from step 1 with fallback_random=True.
@pytest.mark.parametrize("backend", BACKENDS)
def test_fallback_random_dropout_of_transposed_tensor(backend):
    """Fixed (session 5, ir/graph.py ``_BernoulliInLayout``): bernoulli draws in its input's memory order."""
    f = lambda x: F.dropout(x.transpose(0, 1), 0.5)
    x = torch.randn(6, 4, 16)
    cf = _compiled(f, backend, fallback_random=True)
    torch.manual_seed(0)
    ref = f(x)
    torch.manual_seed(0)
    torch.testing.assert_close(cf(x), ref)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["permuted_4d", "channels_last"])
def test_fallback_random_dropout_follows_memory_order(backend, layout):
    if layout == "channels_last":
        x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
        f = lambda x: F.dropout(x, 0.3) * 2
    else:
        x = torch.randn(2, 3, 4, 5)
        f = lambda x: F.dropout(x.permute(0, 3, 1, 2), 0.3) + 1
    cf = _compiled(f, backend, fallback_random=True)
    torch.manual_seed(0)
    ref = f(x)
    torch.manual_seed(0)
    torch.testing.assert_close(cf(x), ref)
