"""User-style probes of coil's CUDA graph trees (``coil.compile(..., mode="reduce-overhead")``).

Each case is a small program a user might write, run compiled with mode="reduce-overhead" on CUDA and
compared to eager on the same inputs (values, dtypes, shapes, gradients, mutated inputs, buffers).
One line per case, ``CASE <name>: PASS|FAIL|ERROR|SKIP <detail>``, then a summary. Never stops at the
first failure. Without CUDA it prints ``SKIP: no CUDA`` and exits 0.

    PYTHONPATH=. python benchmarks/ro_probe.py [case_name ...]
"""
import copy
import sys
import time
import traceback
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import coil

DEV = "cuda"
BUDGET_S = 170.0          # stop starting new cases after this many seconds (the whole run must stay < 4 min)
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


class CaseFail(Exception):
    pass


class CaseSkip(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise CaseFail(msg)


def close(got, ref, what, rtol=1e-3, atol=1e-3):
    """Shape, dtype and values of ``got`` against ``ref`` (raises CaseFail)."""
    check(isinstance(got, torch.Tensor), f"{what}: not a tensor ({type(got).__name__})")
    check(got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} vs eager {tuple(ref.shape)}")
    check(got.dtype == ref.dtype, f"{what}: dtype {got.dtype} vs eager {ref.dtype}")
    check(got.device == ref.device, f"{what}: device {got.device} vs eager {ref.device}")
    try:
        torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)
    except AssertionError as e:
        first = [ln for ln in str(e).splitlines() if ln.strip()][:4]
        raise CaseFail(f"{what}: values differ: {' / '.join(first)}")


def rel_err(a, b):
    a, b = a.detach().float(), b.detach().float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def is_stale_error(e):
    msg = str(e)
    return isinstance(e, RuntimeError) and ("cudagraph_mark_step_begin" in msg or "clone" in msg)


def probe_kept(t, ref, rtol=1e-3, atol=1e-3):
    """A tensor kept across later compiled calls: 'ok' (still right), 'raised' (clear stale error) or
    'WRONG: ...' (silently overwritten or another error)."""
    try:
        v = t.detach().clone()
    except Exception as e:  # noqa: BLE001
        if is_stale_error(e):
            return "raised"
        return f"WRONG: unexpected error reading a kept output: {type(e).__name__}: {str(e)[:150]}"
    if v.shape != ref.shape or not torch.allclose(v.float(), ref.float(), rtol=rtol, atol=atol):
        return f"WRONG: silently holds other values (rel err {rel_err(v, ref):.2e})"
    return "ok"


def tree_stats():
    """Recorded nodes / replays of coil's CUDA tree (internal; for the detail text only)."""
    try:
        from coil.runtime import cudagraph_trees as ct
        t = ct._TREES.get(0)
        return "no tree" if t is None else f"nodes={t.nodes} replays={t.replays}"
    except Exception:  # noqa: BLE001
        return "stats n/a"


def params_close(cm, em, p0, what, tol=2e-2):
    """Parameters of the compiled-trained model against the eager-trained one, relative to how far training
    moved them (AdamW normalises, so tiny gradient differences move single elements by ~lr)."""
    worst, worst_name = 0.0, ""
    for (n, pc), (_, pe), q in zip(cm.named_parameters(), em.named_parameters(), p0):
        check(pc.dtype == pe.dtype and pc.shape == pe.shape, f"{what}: {n} dtype/shape changed")
        check(torch.isfinite(pc).all().item(), f"{what}: {n} has non-finite values")
        moved = (pe.detach() - q).norm().item()
        diff = (pc.detach() - pe.detach()).norm().item()
        r = diff / max(moved, 1e-8)
        if moved < 1e-7:
            r = diff / max(pe.norm().item(), 1e-8) * 1e3
        if r > worst:
            worst, worst_name = r, n
    check(worst < tol, f"{what}: param {worst_name} differs from eager by {worst:.3e} of its update (tol {tol})")
    return worst


def snapshot(m):
    return [p.detach().clone() for p in m.parameters()]


# --------------------------------------------------------------------------------------------- cases


@case
def stale_outputs_inference_loop():
    """Keep every output of an inference loop without cloning: each kept output must either still be right
    or raise a clear error naming clone / coil.cudagraph_mark_step_begin; never silently hold new values."""
    torch.manual_seed(0)
    w = torch.randn(32, 32, device=DEV)

    def f(x, w):
        return torch.tanh(x @ w) * 2 + 1

    cf = coil.compile(f, mode="reduce-overhead")
    xs = [torch.randn(8, 32, device=DEV) for _ in range(6)]
    kept = []
    for x in xs:
        y = cf(x, w)
        close(y, f(x, w), "fresh output")
        kept.append(y)
    states = [probe_kept(y, f(x, w)) for y, x in zip(kept, xs)]
    bad = [s for s in states if s.startswith("WRONG")]
    check(not bad, f"kept outputs: {states}")
    check(states[-1] == "ok", f"last output unreadable: {states[-1]}")
    check("raised" in states, f"no kept output raised (states {states}); graphs replayed? {tree_stats()}")
    # the error's text
    msg = ""
    for y in kept:
        try:
            y.sum().item()
        except RuntimeError as e:
            msg = str(e)
            break
    check("cudagraph_mark_step_begin" in msg and "clone" in msg, f"stale message unclear: {msg[:200]!r}")
    # stale output used as an input of the next call: must raise, not compute with garbage
    stale = kept[states.index("raised")]
    try:
        out = cf(stale, w)
        torch.cuda.synchronize()
        return f"FEEDING a stale output back did not raise (got tensor {tuple(out.shape)}); states={states}"
    except RuntimeError as e:
        check(is_stale_error(e), f"feeding stale output raised an unclear error: {str(e)[:200]}")
    return f"states={states} {tree_stats()}"


@case
def clone_and_mark_step_keep_outputs():
    """Cloned outputs stay right; mark_step_begin + clone; and one input tensor the user refills in place."""
    torch.manual_seed(1)
    lin = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)).to(DEV).eval()
    cm = coil.compile(lin, mode="reduce-overhead")
    xs = [torch.randn(4, 16, device=DEV) for _ in range(5)]
    with torch.no_grad():
        kept = [cm(x).clone() for x in xs]
        for i, (k, x) in enumerate(zip(kept, xs)):
            close(k, lin(x), f"cloned output {i}")
        kept2 = []
        for x in xs:
            coil.cudagraph_mark_step_begin()
            kept2.append(cm(x).clone())
        for i, (k, x) in enumerate(zip(kept2, xs)):
            close(k, lin(x), f"mark_step+clone output {i}")
        # a static input buffer refilled by the user (common CUDA-graph habit): replays must see new values
        buf = torch.empty(4, 16, device=DEV)
        for i, x in enumerate(xs):
            buf.copy_(x)
            close(cm(buf).clone(), lin(x), f"refilled input buffer call {i}")
    return tree_stats()


@case
def train_adamw_no_dropout():
    """5 AdamW steps of an MLP with LayerNorm, loss outside the compiled module; params and losses vs eager."""
    torch.manual_seed(2)
    em = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 8)).to(DEV)
    cmod = copy.deepcopy(em)
    p0 = snapshot(em)
    cm = coil.compile(cmod, mode="reduce-overhead")
    eo = torch.optim.AdamW(em.parameters(), lr=1e-2)
    co = torch.optim.AdamW(cmod.parameters(), lr=1e-2)
    data = [(torch.randn(16, 32, device=DEV), torch.randn(16, 8, device=DEV)) for _ in range(5)]
    losses = []
    for i, (x, y) in enumerate(data):
        le = F.mse_loss(em(x), y)
        le.backward()
        eo.step()
        eo.zero_grad()
        lc = F.mse_loss(cm(x), y)
        lc.backward()
        co.step()
        co.zero_grad()
        losses.append((lc.item(), le.item()))
        check(abs(lc.item() - le.item()) < 1e-3 * max(1.0, abs(le.item())), f"step {i} loss {lc.item()} vs {le.item()}")
    worst = params_close(cmod, em, p0, "after 5 AdamW steps")
    return f"worst param diff/update {worst:.1e}; {tree_stats()}"


@case
def dropout_p0_matches_and_p05_masks_vary():
    """Dropout(p=0) training equals eager; Dropout(p=0.5): masks differ per call, keep ~half, scale by 2, loss
    finite and decreasing; and manual_seed gives the same numbers with and without CUDA graphs (doc claim)."""
    torch.manual_seed(3)

    def make(p):
        return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Dropout(p), nn.Linear(128, 4))

    em = make(0.0).to(DEV)
    cmod = copy.deepcopy(em)
    p0 = snapshot(em)
    cm = coil.compile(cmod, mode="reduce-overhead")
    eo, co = torch.optim.SGD(em.parameters(), lr=0.1), torch.optim.SGD(cmod.parameters(), lr=0.1)
    x, y = torch.randn(64, 32, device=DEV), torch.randint(0, 4, (64,), device=DEV)
    for _ in range(5):
        for m, o in ((em, eo), (cm, co)):
            F.cross_entropy(m(x), y).backward()
            o.step()
            o.zero_grad()
    params_close(cmod, em, p0, "p=0 dropout, 5 SGD steps")
    coil.reset()

    # p=0.5: a dropout-only function, so masks are visible
    def drop(x):
        return F.dropout(x, p=0.5, training=True)

    cd = coil.compile(drop, mode="reduce-overhead")
    ones = torch.ones(256, 256, device=DEV)
    outs = [cd(ones).clone() for _ in range(5)]
    for i, o in enumerate(outs):
        vals = set(torch.unique(o).tolist())
        check(vals <= {0.0, 2.0}, f"dropout call {i}: values {sorted(vals)[:5]} not in {{0, 2}}")
        frac = (o == 0).float().mean().item()
        check(0.45 < frac < 0.55, f"dropout call {i}: dropped fraction {frac:.3f}")
    for i in range(1, 5):
        check(not torch.equal(outs[i], outs[i - 1]), f"dropout mask of call {i} equals call {i - 1} (replay reused RNG)")
    # same seed -> same numbers with and without CUDA graphs (docs/cudagraphs.md, RNG)
    coil.reset()
    plain = coil.compile(drop)
    torch.manual_seed(123)
    a = [plain(ones).clone() for _ in range(4)]
    coil.reset()
    graphed = coil.compile(drop, mode="reduce-overhead")
    torch.manual_seed(123)
    b = [graphed(ones).clone() for _ in range(4)]
    same = [torch.equal(u, v) for u, v in zip(a, b)]
    check(all(same), f"after manual_seed, graphed dropout differs from un-graphed coil per call: {same}")
    coil.reset()

    # a dropout training loop: finite, decreasing loss
    torch.manual_seed(4)
    mod = make(0.3).to(DEV)
    cm2 = coil.compile(mod, mode="reduce-overhead")
    opt = torch.optim.AdamW(mod.parameters(), lr=1e-2)
    ls = []
    for _ in range(12):
        loss = F.cross_entropy(cm2(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ls.append(loss.item())
    check(all(map(lambda v: v == v and abs(v) < 1e6, ls)), f"non-finite losses {ls}")
    check(sum(ls[-3:]) < sum(ls[:3]), f"loss did not decrease: {[round(v, 3) for v in ls]}")
    return f"loss {ls[0]:.3f}->{ls[-1]:.3f}; {tree_stats()}"


@case
def grad_accumulation_two_microbatches():
    """Two forward/backward per SGD-momentum step (grads accumulate in .grad), 3 steps; params vs eager."""
    torch.manual_seed(5)
    em = nn.Sequential(nn.Linear(24, 48), nn.Tanh(), nn.Linear(48, 24), nn.Tanh(), nn.Linear(24, 1)).to(DEV)
    cmod = copy.deepcopy(em)
    p0 = snapshot(em)
    cm = coil.compile(cmod, mode="reduce-overhead")
    eo = torch.optim.SGD(em.parameters(), lr=0.05, momentum=0.9)
    co = torch.optim.SGD(cmod.parameters(), lr=0.05, momentum=0.9)
    for step in range(3):
        mbs = [(torch.randn(8, 24, device=DEV), torch.randn(8, 1, device=DEV)) for _ in range(2)]
        for x, y in mbs:
            (F.mse_loss(em(x), y) / 2).backward()
        for x, y in mbs:
            (F.mse_loss(cm(x), y) / 2).backward()
        for (n, pc), pe in zip(cmod.named_parameters(), em.parameters()):
            close(pc.grad, pe.grad, f"step {step} accumulated grad {n}", rtol=1e-3, atol=1e-5)
        eo.step()
        co.step()
        eo.zero_grad()
        co.zero_grad(set_to_none=False)   # zero in place: .grad tensors survive across steps
    worst = params_close(cmod, em, p0, "after 3 accumulated steps")
    return f"worst {worst:.1e}; {tree_stats()}"


def _batch_sizes(dynamic):
    torch.manual_seed(6)
    m = nn.Sequential(nn.Linear(20, 40), nn.SiLU(), nn.Linear(40, 10), nn.LogSoftmax(-1)).to(DEV).eval()
    cm = coil.compile(m, mode="reduce-overhead", dynamic=dynamic)
    kept = []
    with torch.no_grad():
        for b in (1, 2, 4, 2, 1, 4, 3):
            x = torch.randn(b, 20, device=DEV)
            out = cm(x)
            close(out, m(x), f"batch {b}")
            kept.append((out, m(x)))
    states = [probe_kept(o, r) for o, r in kept]
    check(not any(s.startswith("WRONG") for s in states), f"kept outputs across sizes: {states}")
    return f"kept states={states}; {tree_stats()}"


@case
def changing_batch_size_default():
    """Batch sizes 1,2,4,2,1,4,3 with default dynamic (static then automatic dynamic)."""
    return _batch_sizes(None)


@case
def changing_batch_size_dynamic_true():
    """Batch sizes 1,2,4,2,1,4,3 with dynamic=True."""
    return _batch_sizes(True)


@case
def noncontiguous_and_expanded_inputs():
    """Same compiled fn fed contiguous, transposed, sliced (storage offset) and expanded (stride 0) inputs."""
    torch.manual_seed(7)

    def f(a, b):
        return (a * b.sum(0)).softmax(-1) + a.mean(1, keepdim=True)

    cf = coil.compile(f, mode="reduce-overhead")
    base = torch.randn(32, 32, device=DEV)
    b = torch.randn(8, 32, device=DEV)
    variants = [("contig", base[:16].clone()), ("contig2", base[16:].clone()), ("transposed", base.t()[:16]),
                ("offset-slice", base[3:19]), ("strided", base[::2]), ("expanded", base[0:1].expand(16, 32)),
                ("contig-again", base[:16].contiguous())]
    for name, a in variants * 2:
        out = cf(a, b)
        close(out, f(a, b), f"{name}")
    return tree_stats()


@case
def graph_break_item_control_flow():
    """.item() in Python control flow plus print() (graph breaks) in the middle of a function, both branches."""
    torch.manual_seed(8)
    w1, w2 = torch.randn(16, 16, device=DEV), torch.randn(16, 16, device=DEV)

    def f(x):
        h = torch.relu(x @ w1)
        s = h.sum().item()
        if s > 10.0:
            h = h * 0.5
        else:
            h = h + 1
        print(f"ro_probe: graph break print, s={s:.3f}", file=sys.stderr)
        return torch.sigmoid(h @ w2), s

    cf = coil.compile(f, mode="reduce-overhead")
    kept = []
    for i in range(6):
        x = torch.randn(4, 16, device=DEV) * (1.0 if i % 2 == 0 else 0.01)
        out, s = cf(x)
        ref, rs = f(x)
        check(abs(s - rs) <= 1e-3 * max(1.0, abs(rs)), f"call {i}: item {s} vs {rs}")
        close(out, ref, f"call {i}")
        kept.append((out, ref))
    states = [probe_kept(o, r) for o, r in kept]
    check(not any(s.startswith("WRONG") for s in states), f"kept: {states}")
    return f"states={states}; {tree_stats()}"


class BreakMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)
        self.calls = 0

    def forward(self, x):
        h = F.gelu(self.a(x))
        self.calls += 1
        if h.mean().item() > -100:   # graph break in the middle of a training forward
            h = h * 1.5
        return self.b(h)


@case
def graph_break_training():
    """A training forward with a .item() break (two graphs, two backwards), 4 AdamW steps vs eager."""
    torch.manual_seed(9)
    em = BreakMLP().to(DEV)
    cmod = copy.deepcopy(em)
    p0 = snapshot(em)
    cm = coil.compile(cmod, mode="reduce-overhead")
    eo, co = torch.optim.AdamW(em.parameters(), lr=1e-2), torch.optim.AdamW(cmod.parameters(), lr=1e-2)
    for i in range(4):
        x, y = torch.randn(8, 16, device=DEV), torch.randn(8, 16, device=DEV)
        F.mse_loss(em(x), y).backward()
        F.mse_loss(cm(x), y).backward()
        for (n, pc), pe in zip(cmod.named_parameters(), em.parameters()):
            close(pc.grad, pe.grad, f"step {i} grad {n}", rtol=1e-3, atol=1e-5)
        eo.step()
        co.step()
        eo.zero_grad()
        co.zero_grad()
    worst = params_close(cmod, em, p0, "after 4 steps with a graph break")
    return f"worst {worst:.1e}; {tree_stats()}"


@case
def batchnorm_train_buffers():
    """Conv+BatchNorm in train mode (forward mutates running stats), 3 SGD steps; buffers, params, then eval."""
    torch.manual_seed(10)
    em = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                       nn.Conv2d(8, 8, 3, stride=2), nn.BatchNorm2d(8),
                       nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)).to(DEV)
    cmod = copy.deepcopy(em)
    p0 = snapshot(em)
    cm = coil.compile(cmod, mode="reduce-overhead")
    eo, co = torch.optim.SGD(em.parameters(), lr=0.1), torch.optim.SGD(cmod.parameters(), lr=0.1)
    for i in range(3):
        x, y = torch.randn(4, 3, 12, 12, device=DEV), torch.randint(0, 5, (4,), device=DEV)
        F.cross_entropy(em(x), y).backward()
        F.cross_entropy(cm(x), y).backward()
        eo.step()
        co.step()
        eo.zero_grad()
        co.zero_grad()
        for (n, bc), (_, be) in zip(cmod.named_buffers(), em.named_buffers()):
            close(bc, be, f"step {i} buffer {n}", rtol=1e-4, atol=1e-5)
    params_close(cmod, em, p0, "BN model after 3 steps")
    em.eval()
    cm.eval()
    with torch.no_grad():
        x = torch.randn(2, 3, 12, 12, device=DEV)
        close(cm(x), em(x), "eval output after training", rtol=1e-3, atol=1e-4)
        close(cm(x * 2), em(x * 2), "eval output 2")
    return tree_stats()


@case
def returns_input_view_and_mutates_input():
    """fn returning an input, a view of an input, a transposed input and new math; and an in-place cache update."""
    torch.manual_seed(11)

    def f(x, y):
        return x, x[1:], y.t(), x * 2 + y.sum()

    cf = coil.compile(f, mode="reduce-overhead")
    for i in range(4):
        x, y = torch.randn(5, 6, device=DEV), torch.randn(6, 3, device=DEV)
        o = cf(x, y)
        r = f(x, y)
        check(len(o) == 4, f"returned {len(o)} values")
        check(o[0] is x or (o[0].data_ptr() == x.data_ptr()), f"call {i}: returned input is not the input's memory")
        check(o[1].data_ptr() == x[1:].data_ptr(), f"call {i}: x[1:] is not a view of x")
        check(o[2].data_ptr() == y.data_ptr() and o[2].stride() == y.t().stride(), f"call {i}: y.t() not a view of y")
        for j in range(4):
            close(o[j], r[j], f"call {i} out {j}")
        x.add_(1)   # views must see it
        close(o[1], x[1:], f"call {i}: view after mutating x")
    # in-place mutation of an input (a KV-cache-like buffer), same cache object every call
    def upd(cache, pos, v):
        cache.index_copy_(1, pos, v)
        return cache.sum(1)

    cu = coil.compile(upd, mode="reduce-overhead")
    cache_c = torch.zeros(2, 8, 4, device=DEV)
    cache_e = cache_c.clone()
    for t in range(8):
        pos = torch.tensor([t], device=DEV)
        v = torch.randn(2, 1, 4, device=DEV)
        oc = cu(cache_c, pos, v).clone()
        oe = upd(cache_e, pos, v)
        close(oc, oe, f"cache step {t} output")
        close(cache_c, cache_e, f"cache step {t} mutated input")
    return tree_stats()


@case
def cpu_tensors_passed():
    """All-CPU inputs under reduce-overhead (must run, warn, be right); CUDA math with a 0-dim CPU tensor."""
    torch.manual_seed(12)

    def f(x, w):
        return torch.relu(x @ w).sum(-1)

    cf = coil.compile(f, mode="reduce-overhead")
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        for i in range(3):
            x, w = torch.randn(4, 8), torch.randn(8, 8)
            close(cf(x, w), f(x, w), f"cpu call {i}", rtol=1e-4, atol=1e-4)
    warned = any("coil" in str(w.message) or "CPU" in str(w.message) for w in ws)
    coil.reset()

    def g(x, s):
        return x * s + s.exp()

    cg = coil.compile(g, mode="reduce-overhead")
    for i in range(4):
        x, s = torch.randn(16, device=DEV), torch.tensor(0.5 + i)
        close(cg(x, s), g(x, s), f"cuda x * cpu 0-dim scalar, call {i}")
    return f"warned={warned}; {tree_stats()}"


@case
def grad_and_no_grad_interleaved():
    """One compiled module called under no_grad and with grad (then backward) alternately; outputs and grads."""
    torch.manual_seed(13)
    em = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 6)).to(DEV)
    cmod = copy.deepcopy(em)
    cm = coil.compile(cmod, mode="reduce-overhead")
    for i in range(6):
        x = torch.randn(5, 12, device=DEV)
        if i % 2 == 0:
            with torch.no_grad():
                oc = cm(x)
                check(not oc.requires_grad, f"call {i}: no_grad output requires grad")
                close(oc, em(x), f"no_grad call {i}")
                kept = oc
        else:
            oc = cm(x)
            oe = em(x)
            check(oc.requires_grad, f"call {i}: grad-mode output does not require grad")
            close(oc, oe, f"grad call {i}")
            oc.pow(2).sum().backward()
            oe.pow(2).sum().backward()
            for (n, pc), pe in zip(cmod.named_parameters(), em.parameters()):
                close(pc.grad, pe.grad, f"call {i} grad {n}", rtol=1e-3, atol=1e-5)
            # the no_grad output kept from the previous call: right or a clear error
            st = probe_kept(kept, em(xprev).detach())
            check(not st.startswith("WRONG"), f"call {i}: no_grad output kept across a grad call: {st}")
        xprev = x
    return tree_stats()


@case
def two_compiled_functions_alternating():
    """Two compiled functions called alternately, each keeping its output; g's replay must not clobber f's."""
    torch.manual_seed(14)
    w = torch.randn(32, 32, device=DEV)

    def f(x):
        return torch.sin(x @ w)

    def g(x):
        return torch.cos(x) @ w.t() + 1

    cf, cg = coil.compile(f, mode="reduce-overhead"), coil.compile(g, mode="reduce-overhead")
    kept = []
    for i in range(6):
        x = torch.randn(8, 32, device=DEV)
        a = cf(x)
        b = cg(x)
        c = cg(a)         # g fed f's output
        close(a, f(x), f"iter {i}: f's output after g ran twice")
        close(b, g(x), f"iter {i}: g(x) after g(a) ran")
        close(c, g(f(x)), f"iter {i}: g(f(x))")
        kept.append((a, f(x)))
        kept.append((b, g(x)))
    states = [probe_kept(o, r) for o, r in kept]
    check(not any(s.startswith("WRONG") for s in states), f"kept: {states}")
    return f"states={states}; {tree_stats()}"


@case
def loop_with_uncompiled_ops_and_feedback():
    """x = compiled(x) fed back, with uncompiled CUDA ops (matmul, in-place add, indexing) on its outputs."""
    torch.manual_seed(15)
    cell = nn.GRUCell(16, 16).to(DEV).eval()
    proj = torch.randn(16, 16, device=DEV) * 0.3

    def step(x, h):
        return cell(x, h)

    cs = coil.compile(step, mode="reduce-overhead")
    x0, h0 = torch.randn(3, 16, device=DEV), torch.zeros(3, 16, device=DEV)
    with torch.no_grad():
        xe, he = x0.clone(), h0.clone()
        xc, hc = x0.clone(), h0.clone()
        for t in range(8):
            he = step(xe, he)
            xe = torch.tanh(he @ proj)
            xe[:, 0] += 1.0
            hc = cs(xc, hc)         # output fed back as the next call's input
            xc = torch.tanh(hc @ proj)
            xc[:, 0] += 1.0
            close(hc, he, f"step {t} hidden", rtol=1e-3, atol=1e-4)
            if t % 2 == 1:          # the user edits the returned state in place before feeding it back
                he[:, :2] *= 0.5
                hc[:, :2] *= 0.5
        close(xc, xe, "final x", rtol=1e-3, atol=1e-4)
    return tree_stats()


@case
def timm_resnet18_bf16_autocast():
    """timm resnet18 (random init) eval under bf16 autocast, batch 2 of 64x64, 4 calls with new images."""
    try:
        import timm
    except ImportError:
        raise CaseSkip("timm not installed")
    torch.manual_seed(16)
    m = timm.create_model("resnet18", pretrained=False, num_classes=10).to(DEV).eval()
    cm = coil.compile(m, mode="reduce-overhead")
    errs = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for i in range(4):
            x = torch.randn(2, 3, 64, 64, device=DEV)
            oc = cm(x).clone()
            oe = m(x)
            check(oc.dtype == oe.dtype and oc.shape == oe.shape, f"call {i}: {oc.dtype}{tuple(oc.shape)} vs "
                                                                 f"{oe.dtype}{tuple(oe.shape)}")
            e = rel_err(oc, oe)
            errs.append(e)
            check(e < 3e-2, f"call {i}: rel err {e:.3e} (bf16)")
            check(oc.argmax(-1).eq(oe.argmax(-1)).all().item() or e < 1e-2, f"call {i}: argmax differs")
    return f"rel errs {[f'{e:.1e}' for e in errs]}; {tree_stats()}"


def _hf_generate(kind):
    try:
        import transformers
    except ImportError:
        raise CaseSkip("transformers not installed")
    torch.manual_seed(17)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                       max_position_embeddings=128)
        model = transformers.LlamaForCausalLM(cfg)
    model = model.to(DEV).eval()
    model.generation_config.pad_token_id = model.generation_config.eos_token_id or 0
    ids = torch.randint(0, 1000, (2, 10), device=DEV)
    mask = torch.ones_like(ids)
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, use_cache=True)
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        eager_forward = model.forward
        model.forward = coil.compile(model.forward, mode="reduce-overhead")
        try:
            outs = [model.generate(ids, **kw) for _ in range(3)]   # warm-up, record, replay
            ids2 = torch.randint(0, 1000, (2, 10), device=DEV)
            out2 = model.generate(ids2, **kw)
        finally:
            model.forward = eager_forward
        ref2 = model.generate(ids2, **kw)
    res, ties = [], 0
    total = ref.numel()
    for i, o in enumerate(outs + [out2]):
        r, prompt = (ref, ids) if i < 3 else (ref2, ids2)
        check(o.shape == r.shape, f"run {i}: tokens shape {tuple(o.shape)} vs {tuple(r.shape)}")
        check(torch.equal(o[:, :10], prompt), f"run {i}: prompt tokens changed")
        res.append(int(o.eq(r).sum().item()))
        for row in range(o.shape[0]):
            diff = (o[row] != r[row]).nonzero()
            if diff.numel() == 0:
                continue
            j = int(diff[0, 0])
            with torch.no_grad():   # eager logits at the first divergence: a near-tie is acceptable
                lg = model(o[row:row + 1, :j]).logits[0, -1].float()
            gap = (lg[r[row, j]] - lg[o[row, j]]).abs().item()
            check(gap < 1e-3 * max(1.0, lg.abs().max().item()),
                  f"run {i} row {row}: token {j} is {int(o[row, j])}, eager {int(r[row, j])}, eager logit gap {gap:.2e}"
                  f" (not a near-tie); equal tokens per run so far {res} of {total}")
            ties += 1
    return f"tokens equal per run {res} of {total}, near-ties {ties}; {tree_stats()}"


@case
def hf_gpt2_greedy_generate():
    """transformers GPT-2 (2 layers, random weights) greedy generate, 8 new tokens, 3 runs + new prompt."""
    return _hf_generate("gpt2")


@case
def hf_llama_greedy_generate():
    """transformers LLaMA (2 layers, GQA, random weights) greedy generate, 8 new tokens, 3 runs + new prompt."""
    return _hf_generate("llama")


# --------------------------------------------------------------------------------------------- driver


def tail(exc_text, n=6):
    lines = [ln.rstrip() for ln in exc_text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def main(argv):
    if not torch.cuda.is_available():
        print("SKIP: no CUDA")
        return 0
    wanted = set(argv)
    cases = [c for c in CASES if not wanted or c.__name__ in wanted]
    print(f"ro_probe: torch {torch.__version__}, {torch.cuda.get_device_name()}, {len(cases)} cases", flush=True)
    t0 = time.time()
    results = {}
    for fn in cases:
        name = fn.__name__
        if time.time() - t0 > BUDGET_S:
            results[name] = "SKIP"
            print(f"CASE {name}: SKIP time budget ({BUDGET_S:.0f} s) used up", flush=True)
            continue
        coil.reset()
        torch.cuda.synchronize()
        c0 = time.time()
        try:
            detail = fn()
            status = "PASS"
            if isinstance(detail, str) and detail.startswith("FEEDING"):
                status = "FAIL"
        except CaseFail as e:
            status, detail = "FAIL", str(e)
        except CaseSkip as e:
            status, detail = "SKIP", str(e)
        except Exception:  # noqa: BLE001
            status, detail = "ERROR", tail(traceback.format_exc())
        finally:
            try:
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                detail = f"{detail} [synchronize after case raised: {str(e)[:120]}]"
                status = "ERROR" if status == "PASS" else status
            coil.reset()
        results[name] = status
        print(f"CASE {name}: {status} ({time.time() - c0:.1f}s) {detail or ''}", flush=True)
    counts = {s: sum(1 for v in results.values() if v == s) for s in ("PASS", "FAIL", "ERROR", "SKIP")}
    print(f"SUMMARY: {len(results)} cases, " + ", ".join(f"{k} {v}" for k, v in counts.items())
          + f" in {time.time() - t0:.0f}s")
    bad = [n for n, s in results.items() if s in ("FAIL", "ERROR")]
    if bad:
        print("NOT PASSING: " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
