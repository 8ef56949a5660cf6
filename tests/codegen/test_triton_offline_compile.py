"""Generated Triton kernels compile for a real GPU target (sm_90), checked offline
without a GPU (tests/codegen/triton_offline.py). Triton's CPU interpreter runs what the
GPU compiler rejects: timm Swin-T's shifted-window kernels called ``libdevice.fmod`` on
int64 indices (torch.roll's wrap-around), which the interpreter ran and the H200's
compiler refused (``CompilationError``), so the graph fell back to ATen ops. The class:
float-only libdevice functions reached with integer or bool operands."""
import importlib.util
import os

import pytest
import torch

from codegen_helpers import compile_fn
from triton_offline import compile_offline, kernel_job


def _offline_available() -> bool:
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return False
    return os.path.exists(os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin",
                                       "ptxas"))


pytestmark = pytest.mark.skipif(not _offline_available(),
                                reason="Triton's CUDA back end (ptxas) is not installed")

WS, NH = 7, 2


def _window_partition(x):
    B, H, W, C = x.shape
    x = x.view(B, H // WS, WS, W // WS, WS, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, WS, WS, C)


def _window_reverse(w, H, W):
    x = w.view(-1, H // WS, W // WS, WS, WS, w.shape[-1])
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, H, W, w.shape[-1])


def _relative_position_index():
    coords = torch.stack(torch.meshgrid(torch.arange(WS), torch.arange(WS), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += WS - 1
    rel[:, :, 1] += WS - 1
    rel[:, :, 0] *= 2 * WS - 1
    return rel.sum(-1)


def _mask_from_regions(img):
    """timm Swin's attention mask from an image of region ids (as a graph)."""
    mw = _window_partition(img).view(-1, WS * WS)
    m = mw.unsqueeze(1) - mw.unsqueeze(2)
    return m.masked_fill(m != 0, -100.0).masked_fill(m == 0, 0.0)


def _regions(H, W, shift):
    img = torch.zeros((1, H, W, 1))
    cnt = 0
    for h in (slice(0, -WS), slice(-WS, -shift), slice(-shift, None)):
        for w in (slice(0, -WS), slice(-WS, -shift), slice(-shift, None)):
            img[:, h, w, :] = cnt
            cnt += 1
    return img


def _swin_block(x, table, idx, mask, qkv_w):
    """A shifted-window attention block as timm's Swin computes it."""
    B, H, W, C = x.shape
    shifted = torch.roll(x, shifts=(-3, -3), dims=(1, 2))
    win = _window_partition(shifted).view(-1, WS * WS, C)
    qkv = (win @ qkv_w).reshape(win.shape[0], WS * WS, 3, NH, C // NH).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    attn = q @ k.transpose(-2, -1)
    bias = table[idx.view(-1)].view(WS * WS, WS * WS, -1).permute(2, 0, 1).contiguous()
    attn = (attn + bias.unsqueeze(0)).view(-1, mask.shape[0], NH, WS * WS, WS * WS)
    attn = (attn + mask.unsqueeze(1).unsqueeze(0)).view(-1, NH, WS * WS, WS * WS).softmax(-1)
    o = (attn @ v).transpose(1, 2).reshape(-1, WS, WS, C)
    return torch.roll(_window_reverse(o, H, W), shifts=(3, 3), dims=(1, 2)) + x


def _assert_compile(kernels):
    assert kernels
    errors = compile_offline([kernel_job(k) for k in kernels])
    bad = [f"{k.name}: {e[-800:]}" for k, e in zip(kernels, errors) if e]
    assert not bad, "\n".join(bad)


def test_swin_window_kernels_compile_for_sm90():
    torch.manual_seed(0)
    B, H, W, C = 2, 14, 14, 8
    x = torch.randn(B, H, W, C)
    table = torch.randn((2 * WS - 1) ** 2, NH)
    idx = _relative_position_index()
    img = _regions(H, W, 3)
    mask = _mask_from_regions(img)
    w = torch.randn(C, 3 * C)
    c = compile_fn(_swin_block, x, table, idx, mask, w)
    torch.testing.assert_close(c(x, table, idx, mask, w)[0], _swin_block(x, table, idx, mask, w),
                               atol=1e-4, rtol=1e-4)
    cm = compile_fn(_mask_from_regions, img)
    torch.testing.assert_close(cm(img)[0], mask)
    # the smallest failing input: torch.roll's index wrap on int64 (libdevice.fmod)
    r = torch.randn(3, 14)
    croll = compile_fn(lambda t: torch.roll(t, -3, 1), r)
    torch.testing.assert_close(croll(r)[0], torch.roll(r, -3, 1))
    _assert_compile(list(c.kernels) + list(cm.kernels) + list(croll.kernels))


def _int_ops(a, b):
    bz = torch.where(b == 0, torch.ones_like(b), b)
    return [a + b, a * b, a // bz, a % bz, torch.fmod(a, bz), torch.fmod(a, -3),
            torch.div(a, bz, rounding_mode="trunc"), a.abs(), a & b, ~a, torch.maximum(a, b),
            a.clamp(-3, 5), a.sign(), a.floor(), a.round(), a.isnan(), a.isinf(), a.isfinite(),
            a.signbit(), a.pow(3), torch.roll(a, 3, 0), a.to(torch.bfloat16), a.sum(-1),
            a.amax(-1), a.argmax(-1)]


def _float_ops(x, y):
    return [torch.fmod(x, y), torch.remainder(x, y), torch.atan2(x, y), x.pow(y.abs()),
            torch.copysign(x, y), x.round(), x.frac(), x.sign(), x.signbit(), x.isinf(),
            x.to(torch.int32), x.to(torch.bool), x // y, x.sum(-1), x.softmax(-1)]


def test_integer_and_low_precision_ops_compile_for_sm90():
    """Every dtype the printer may hand libdevice: integer and bool operands (fmod,
    isinf, signbit were float-only libdevice calls), fp16/bf16/fp64; values checked
    against eager under the interpreter, then the kernels compiled for sm_90."""
    torch.manual_seed(0)
    kernels = []
    for dt in (torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool):
        lo = 0 if dt in (torch.uint8, torch.bool) else -5
        a, b = (torch.randint(lo, 9, (4, 64)).to(dt) for _ in range(2))
        fn = _int_ops if dt != torch.bool else (lambda a, b: [a & b, a ^ b, ~a, a.isinf(),
                                                             a.signbit(), a.sum(-1), a.any(-1)])
        c = compile_fn(fn, a, b)
        for got, ref in zip(c(a, b), fn(a, b)):
            torch.testing.assert_close(got, ref, equal_nan=True)
        kernels += c.kernels
    for dt in (torch.bfloat16, torch.float16, torch.float64):
        x, y = torch.randn(4, 64).to(dt), torch.randn(4, 64).to(dt)
        c = compile_fn(_float_ops, x, y)
        for got, ref in zip(c(x, y), _float_ops(x, y)):
            torch.testing.assert_close(got, ref, equal_nan=True, atol=1e-2, rtol=1e-2)
        kernels += c.kernels
    _assert_compile(kernels)


def _record_kernels(monkeypatch, gpu_variants=False) -> list:
    """A list that fills with every kernel the Triton backend generates; with
    ``gpu_variants``, also each kernel as it is generated for a GPU launch (the masks
    the GPU's launch configs let it drop: a CPU run generates for the interpreter's)."""
    import dataclasses

    from coil.codegen.triton.backend import TritonBackend, kernel_source

    made = []
    generate = TritonBackend.generate

    def recording(self, plan, kernel_name):
        k = generate(self, plan, kernel_name)
        made.append(k)
        if gpu_variants:
            made.append(dataclasses.replace(k, source=kernel_source(plan, kernel_name, gpu=True)[0]))
        return k

    monkeypatch.setattr(TritonBackend, "generate", recording)
    return made


@pytest.mark.slow
def test_fuzz_program_kernels_compile_for_sm90(monkeypatch):
    """Every distinct kernel of the fuzzer's programs 0..59 of seed 31 (docs/fuzzing.md)
    that match eager, as generated for the interpreter and for a GPU launch, compiles
    for sm_90: the interpreter ran kernels the GPU compiler rejects (a negative literal
    beside a uint8 tensor)."""
    from coil.bench.fuzz import check_program, generate

    made = _record_kernels(monkeypatch, gpu_variants=True)
    kept = []
    for i in range(60):
        del made[:]
        if check_program(generate(31, i), "triton").outcome == "ok":
            kept += made  # (a program eager rejects, e.g. bool ^ 0.25, may compile to anything)
    _assert_compile(list({k.source: k for k in kept}.values()))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["b_gpt_neox", "b_hf_swin", "b_mixtral_moe", "b_bloom_alibi",
                                  "b_deberta_v2", "b_whisper"])
def test_broad_suite_model_kernels_compile_for_sm90(name, monkeypatch):
    """Every Triton kernel of a broad-suite model's forward and backward (small config,
    run under the interpreter, no fallback allowed) compiles for sm_90."""
    pytest.importorskip("transformers")
    import coil
    from coil.bench.broad import BROAD_MODELS
    from coil.bench.models import reduce_to_scalar_loss

    made = _record_kernels(monkeypatch)
    built = BROAD_MODELS[name].build(torch.device("cpu"), "small")
    coil.reset()
    f = coil.compile(built.module, options={"cpu_backend": "triton", "strict_codegen": True})
    reduce_to_scalar_loss(f(*built.args, **built.kwargs)).backward()
    _assert_compile(list({k.source: k for k in made}.values()))


def test_constant_operands_and_unsigned_pow_compile_for_sm90():
    """Ops whose operands are all constants run on ``[1]`` tensors (``tl.full``), and the
    integer power of unsigned bases compares ``a + 1 == 0``: Triton's front end rejected
    ``a == -1`` for uint8 ``a`` and ``tl.full`` of a block (fuzz findings s21 #271,
    s22 #1298, #2216); a libdevice call with a ``[1, 1]`` first argument (s21 #378). The
    kernels compile for sm_90 as well as run."""
    u = torch.tensor([0, 1, 9, 200, 255], dtype=torch.uint8)
    i = torch.tensor(2, dtype=torch.int32)
    cases = [(lambda a: [a ** a, torch.sub(a, 2, alpha=-3)], u),
             (lambda a: [torch.argmin(a) ** torch.argmin(a),
                         torch.nn.functional.gelu(torch.zeros_like(a, dtype=torch.float64))], i),
             (lambda x: [torch.sum((-3.0) ** x, dim=1)], torch.tensor([[1.0, 2.0, -0.5], [0.0, 3.0, 2.5]])),
             (lambda b: [torch.cat([torch.full_like(b, 1e-40), b], 1)], torch.ones(4, 1, dtype=torch.bfloat16))]
    kernels = []
    for fn, a in cases:
        c = compile_fn(fn, a)
        for got, ref in zip(c(a), fn(a)):
            torch.testing.assert_close(got, ref, equal_nan=True)
        kernels += c.kernels
    _assert_compile(kernels)
