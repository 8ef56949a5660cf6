"""``coil bench --mode reduce-overhead``: CUDA graphs, coil against torch.compile.

For each workload, in one process, three copies of one model with the same weights run
side by side: eager, ``torch.compile(mode="reduce-overhead")`` and
``coil.compile(mode="reduce-overhead")``. Per copy, the first call is timed (compile s),
then warmed up (at least 3 calls: a CUDA graph is recorded on the second call of a graph
and replayed from the third); the outputs of the first call and of the last warm-up call
(replayed) are both checked against eager's same calls; then a few steady-state steps
give the peak memory. Then all copies are timed in the same rounds, rotated by one each round
(``measure.time_interleaved``), and each gets ``speedup = median(eager) /
median(its own)``; the coil row also gets ``coil / torch.compile = median(torch) /
median(coil)`` (above 1: coil is faster).

Workloads (``full`` on CUDA, ``small`` on CPU and in tests):

- ``gpt2_b1``, ``gpt2_b8``: transformers GPT-2 124M, batch 1 / 8 x 64 tokens, bf16
  inference; ``llama_b1``, ``llama_b8``: an 8-layer LLaMA-style model (hidden 1024,
  GQA 16/8 heads), the same;
- ``gpt2_decode``: greedy decoding of 32 new tokens after a 64-token prompt with a
  static KV cache (:class:`CachedDecoder`, GPT-2 124M shapes, bf16): one prefill call
  and 31 one-token calls per step, each call's output token fed back as the next input,
  as torch.compile users write it (gpt-fast): each generated token starts a CUDA graph
  step (``torch.compiler.cudagraph_mark_step_begin()`` / ``coil.cudagraph_mark_step_begin()``,
  :data:`MARK_STEP`) and the token that persists is cloned out of the graph's memory,
  the same for every compiler; compiled with ``dynamic=False`` (two static graphs:
  prefill and decode);
- ``resnet50``, ``mobilenet``: timm ResNet-50 / MobileNetV3-Large (torchvision where
  timm is missing), random weights, batch 1, 224x224, bf16 inference;
- ``train_gpt``: coil's SmallGPT (6 layers, d=512), one training step: forward with
  the loss inside the compiled module under bf16 autocast, backward, AdamW (eager).

Peak memory (``peak_gb``, steady state), measured for each copy **alone, in its own
process** (:func:`isolated_peaks`, after all rows are timed; ``inproc_peak_gb`` in the
JSON is the same measure taken in the shared process, where what the other compilers
left in the caching allocator makes it depend on the order of the copies):
``torch.cuda.max_memory_reserved`` over
:data:`STEADY_STEPS` steps after the warm-up, minus ``torch.cuda.memory_reserved`` before
the copy was compiled (taken after ``torch.cuda.empty_cache()``): the device memory the
process holds for the copy, as a user sees it. Reserved memory counts the CUDA graph
pools of both compilers (their segments stay reserved while the graphs live, whether or
not the allocator counts their blocks as allocated: torch.compile hands its pool's
blocks back to the allocator after recording, coil keeps its outputs') and what the
default pool caches (each step's working set, and what compiling and warming up left
there); the copy's weights, and what earlier copies hold, are in the base.
``first_peak_gb`` (JSON only) is the same over the first call and the warm-up.

Correctness: floating outputs within ``rmse(compiled - eager) <= tol * rms(eager)``
(``tol`` 5e-2 for bf16, 1e-3 for fp32); generated tokens are not part of the verdict
(a near-tie in bf16 logits may pick another token and the sequences diverge after it):
the row notes how many of them equal eager's, and at the first token that differs,
eager's margin between its top two logits there and the largest difference of the
compiled logits from eager's there and before it (:func:`_token_diagnosis`: a near-tie
when the logits there are about as close to eager's as before it; wrong values otherwise).

Without CUDA the rows still run (tiny configs): neither compiler records CUDA graphs on
CPU (coil logs ``cudagraph_skip``), peak memory is not measured, and the result says so.
A workload whose package is missing (timm / torchvision on CPU) is ``skipped`` with the
reason; a compiler that raises gets an ``error`` row and the others are timed without it.
"""
from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import gc
import json
import math
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from coil.bench import measure
from coil.bench.models import _GPT2, _LLAMA, SmallGPT, _ids, _image, flatten_outputs
from coil.bench.output import Progress, fmt, machine_info, meta_markdown, render_markdown, render_table

MODE = "reduce-overhead"
NO_CUDA_NOTE = ("no CUDA device: CUDA graphs are not recorded (coil and torch.compile run "
                "their compiled code without them; coil logs cudagraph_skip) and peak "
                "memory is not measured; the timings are of compiled code only")


class Unavailable(Exception):
    """A workload cannot be built here (a package is missing); the row is skipped."""


# ---------------------------------------------------------------- workloads

@dataclasses.dataclass
class Built:
    """A workload ready to run: ``step_for(fn, module, mark_step)`` makes a zero-argument
    step for the callable ``fn`` (the module itself or a compiled one) that returns a
    list of tensors (compared with eager's); ``mark_step()`` starts a CUDA graph step of
    ``fn``'s compiler (:data:`MARK_STEP`) where a loop over calls needs one."""

    module: nn.Module
    step_for: Callable[[Callable, nn.Module], Callable[[], list]]
    config: str
    dtype: torch.dtype
    dynamic: Optional[bool] = None


@dataclasses.dataclass
class Workload:
    name: str
    description: str
    build: Callable[[torch.device, str], Built]


def _inference(module: nn.Module, args: tuple, config: str) -> Built:
    def step_for(fn, _module, _mark):
        def step():
            with torch.no_grad():
                return flatten_outputs(fn(*args))
        return step
    return Built(module.eval(), step_for, config, torch.bfloat16)


def _hf_lm(cls_name: str, config_cls: str, cfg: dict, batch: int):
    def build(device, size):
        import transformers

        conf = getattr(transformers, config_cls)(**cfg[size])
        torch.manual_seed(0)
        m = getattr(transformers, cls_name)(conf).to(device, torch.bfloat16)
        seq = 64 if size == "full" else 16
        return _inference(m, (_ids(batch, seq, conf.vocab_size, device),),
                          f"{conf.num_hidden_layers} layers, d={conf.hidden_size}, {batch}x{seq}, bf16")
    return build


def _vision(timm_arch: str, tv_name: str):
    def build(device, size):
        try:
            import timm

            torch.manual_seed(0)
            m, src = timm.create_model(timm_arch, pretrained=False), f"timm {timm_arch}"
        except ImportError:
            try:
                import torchvision
            except ImportError:
                raise Unavailable("needs timm or torchvision (neither is installed)") from None
            torch.manual_seed(0)
            m, src = getattr(torchvision.models, tv_name)(weights=None), f"torchvision {tv_name}"
        res = 224 if size == "full" else 64
        m = m.to(device, torch.bfloat16)
        return _inference(m, (_image(1, res, device).to(torch.bfloat16),), f"{src}, 1x3x{res}x{res}, bf16")
    return build


class CachedDecoder(nn.Module):
    """A GPT-2-shaped decoder with a static KV cache (gpt-fast style).

    ``forward(ids (B, T) int64, pos (T,) int64) -> (next_ids (B, 1), last_logits (B, vocab))``:
    writes the keys and values of positions ``pos`` into the cache buffers (``index_copy_``),
    attends over the whole cache with the mask ``key position <= query position``, and
    picks the greedy next token. Shapes do not depend on how much of the cache is used."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, max_len: int, batch: int):
        super().__init__()
        self.heads, self.max_len = heads, max_len
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.fc = nn.ModuleList(nn.Linear(d, 4 * d) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(4 * d, d) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        for i in range(layers):
            self.register_buffer(f"k{i}", torch.zeros(batch, heads, max_len, d // heads))
            self.register_buffer(f"v{i}", torch.zeros(batch, heads, max_len, d // heads))

    def forward(self, ids: torch.Tensor, pos: torch.Tensor):
        b, t = ids.shape
        x = self.tok(ids) + self.pos(pos)
        mask = torch.arange(self.max_len, device=ids.device)[None, :] <= pos[:, None]
        for i in range(len(self.qkv)):
            q, k, v = self.qkv[i](self.ln1[i](x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            kc, vc = getattr(self, f"k{i}"), getattr(self, f"v{i}")
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            y = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
            x = x + self.proj[i](y.transpose(1, 2).reshape(b, t, -1))
            x = x + self.out[i](F.gelu(self.fc[i](self.ln2[i](x)), approximate="tanh"))
        logits = self.head(self.ln_f(x[:, -1]))
        return logits.argmax(-1, keepdim=True), logits


def _build_decode(device, size):
    vocab, d, heads, layers, prompt, new = ((50257, 768, 12, 12, 64, 32) if size == "full"
                                            else (512, 64, 4, 2, 8, 4))
    torch.manual_seed(0)
    m = CachedDecoder(vocab, d, heads, layers, prompt + new, 1).to(device, torch.bfloat16).eval()
    prompt_ids = _ids(1, prompt, vocab, device)
    prefill_pos = torch.arange(prompt, device=device)

    def step_for(fn, _module, mark):
        toks = torch.empty(1, new, dtype=torch.long, device=device)
        positions = [torch.tensor([prompt + i], device=device) for i in range(new)]

        def step():
            # the first call keeps every token's logits (fp32) for _token_diagnosis
            keep = [] if step.token_logits is None else None
            with torch.no_grad():
                mark()
                nxt, logits = fn(prompt_ids, prefill_pos)
                first = logits.float()          # a copy: the next call overwrites logits
                for i in range(new):
                    if i:
                        mark()                  # each token is a step (gpt-fast)
                        nxt, logits = fn(nxt, positions[i - 1])
                        if keep is not None:
                            keep.append(logits.float())
                    nxt = nxt.clone()           # fed back and kept past the next call
                    toks[:, i] = nxt[:, 0]
            if keep is not None:
                step.token_logits = torch.cat([first] + keep)
            return [first, toks.clone()]
        step.token_logits = None
        return step
    return Built(m, step_for, f"{layers} layers, d={d}, prompt {prompt} + {new} new tokens, "
                 "static KV cache, bf16", torch.bfloat16, dynamic=False)


class _WithLoss(nn.Module):
    """``forward(ids) -> next-token cross-entropy of ``model``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(ids[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())


def _build_train(device, size):
    vocab, d, heads, layers, batch, seq = ((8192, 512, 8, 6, 8, 128) if size == "full"
                                           else (256, 32, 2, 1, 2, 16))
    torch.manual_seed(0)
    m = _WithLoss(SmallGPT(vocab, d, heads, layers, seq)).to(device)
    ids = _ids(batch, seq + 1, vocab, device)
    amp = device.type == "cuda"

    def step_for(fn, module, _mark):
        opt = torch.optim.AdamW(module.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                loss = fn(ids)
            loss.backward()
            opt.step()
            return [loss.detach().clone()]
        return step
    return Built(m.train(), step_for, f"SmallGPT {layers} layers, d={d}, {batch}x{seq}, "
                 f"forward+backward+AdamW{', bf16 autocast' if amp else ''}",
                 torch.bfloat16 if amp else torch.float32)


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("gpt2_b1", "GPT-2 124M, batch 1", _hf_lm("GPT2LMHeadModel", "GPT2Config", _GPT2, 1)),
    Workload("gpt2_b8", "GPT-2 124M, batch 8", _hf_lm("GPT2LMHeadModel", "GPT2Config", _GPT2, 8)),
    Workload("llama_b1", "LLaMA-style 8 layers, batch 1",
             _hf_lm("LlamaForCausalLM", "LlamaConfig", _LLAMA, 1)),
    Workload("llama_b8", "LLaMA-style 8 layers, batch 8",
             _hf_lm("LlamaForCausalLM", "LlamaConfig", _LLAMA, 8)),
    Workload("gpt2_decode", "greedy decoding with a static KV cache", _build_decode),
    Workload("resnet50", "ResNet-50, batch 1", _vision("resnet50", "resnet50")),
    Workload("mobilenet", "MobileNetV3-Large, batch 1",
             _vision("mobilenetv3_large_100", "mobilenet_v3_large")),
    Workload("train_gpt", "small GPT training step", _build_train),
]}


# ---------------------------------------------------------------- compilers

def _torch_compile(module, dynamic):
    return torch.compile(module, mode=MODE, dynamic=dynamic)


def _coil_compile(module, dynamic):
    import coil

    return coil.compile(module, mode=MODE, dynamic=dynamic)


def _coil_mark_step() -> None:
    import coil

    coil.cudagraph_mark_step_begin()


#: ``name -> compile(module, dynamic)``; "eager" is always timed (the baseline)
COMPILERS: dict[str, Callable] = {"inductor": _torch_compile, "coil": _coil_compile}
#: ``name -> start a CUDA graph step`` (a no-op for the others)
MARK_STEP: dict[str, Callable[[], None]] = {
    "inductor": lambda: torch.compiler.cudagraph_mark_step_begin(), "coil": _coil_mark_step}
#: steps timed for the steady-state peak memory, after the warm-up
STEADY_STEPS = 3
LABELS = {"eager": "eager", "inductor": "torch.compile", "coil": "coil"}


def _reset_compilers() -> None:
    import coil
    import torch._dynamo  # bench may import dynamo (to compare)

    coil.reset()
    torch._dynamo.reset()


# ---------------------------------------------------------------- one workload

@dataclasses.dataclass
class Run:
    """One compiler's copy of a workload while it is measured."""

    compiler: str
    row: dict
    step: Optional[Callable[[], list]] = None
    #: the outputs of its first call and of its last warm-up call
    outputs: Optional[list] = None


def _check(eager: list, got: list, dtype: torch.dtype) -> tuple[bool, str]:
    """(pass, note): floating outputs close to eager's, tokens counted (module docstring)."""
    tol = 5e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-3
    notes = []
    for i, (e, g) in enumerate(zip(eager, got)):
        if tuple(e.shape) != tuple(g.shape):
            return False, f"output {i}: shape {tuple(g.shape)} != {tuple(e.shape)}"
        if not e.is_floating_point():
            notes.append(f"{int((e == g).sum())}/{e.numel()} tokens equal to eager's")
            continue
        e64, g64 = e.detach().double(), g.detach().double()
        if not bool(torch.isfinite(g64).all()):
            return False, f"output {i}: non-finite values"
        err, scale = measure.rmse(e64, g64), math.sqrt(float((e64 * e64).mean())) if e.numel() else 0.0
        if err > tol * scale + 1e-6:
            return False, f"output {i}: rmse {err:.3g} vs eager's rms {scale:.3g} (allowed {tol:g}x)"
    return True, "; ".join(notes)


def _token_diagnosis(eager: torch.Tensor, got: torch.Tensor) -> str:
    """Where greedy tokens first differ: ``eager`` and ``got`` are the fp32 logits of
    each generated token (new x vocab) of eager and of a compiled copy; the tokens are
    their argmax. Returns "" when all tokens agree, else the first differing token,
    eager's margin between its top two logits there and the largest ``|got - eager|``
    there and before it, and a verdict: a near-tie when the difference there is at most
    4x the one before (where both decoded the same prefix), else values differ."""
    pick_e, pick_g = eager.argmax(-1), got.argmax(-1)
    diff = (pick_e != pick_g).nonzero()
    if diff.numel() == 0:
        return ""
    j = int(diff[0, 0])
    top2 = eager[j].topk(2).values
    margin = float(top2[0] - top2[1])
    lost = float(eager[j, pick_e[j]] - eager[j, pick_g[j]])  # eager's preference for its token
    err = (got[: j + 1] - eager[: j + 1]).abs().amax(-1)
    at, before = float(err[j]), float(err[:j].max()) if j else 0.0
    # a flip needs 2 * at >= lost; a near-tie is one where the logits there are as close
    # to eager's as on the tokens before (rounding), not further off
    verdict = ("undecided (no token before it)" if not j else
               "a near-tie" if at <= 4 * before else "not a tie: values differ")
    return (f"token {j} differs: eager's top-2 margin {margin:.3g} (over ours {lost:.3g}), "
            f"max |logit - eager's| {at:.3g} there, {before:.3g} before: {verdict}")


def _reserved_gb(device: torch.device, fn: Callable[[], Any], base: Optional[int]) -> tuple[Any, Optional[float]]:
    """``(fn(), GiB reserved at the peak of fn beyond base)`` (module docstring)."""
    if device.type != "cuda":
        return fn(), None
    measure.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    measure.synchronize(device)
    return out, (torch.cuda.max_memory_reserved(device) - base) / 2**30


def _prepare(run: Run, built: Built, device: torch.device, warmup: int,
             eager: Optional[Run]) -> list:
    """Compile ``run``'s copy, time and check its first call and its last warm-up call,
    measure its steady-state memory; fills its row. Returns both calls' outputs."""
    module = copy.deepcopy(built.module)
    base = None
    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_reserved(device)
    fn = module if run.compiler == "eager" else COMPILERS[run.compiler](module, built.dynamic)
    run.step = built.step_for(fn, module, MARK_STEP.get(run.compiler, lambda: None))

    def first_and_warm():
        measure.synchronize(device)
        t0 = time.perf_counter()
        out = [t.detach().clone() for t in run.step()]
        measure.synchronize(device)
        secs = time.perf_counter() - t0
        for _ in range(warmup - 1):
            run.step()
        return out, [t.detach().clone() for t in run.step()], secs

    (first, last, secs), run.row["first_peak_gb"] = _reserved_gb(device, first_and_warm, base)
    _, run.row["peak_gb"] = _reserved_gb(device, lambda: [run.step() for _ in range(STEADY_STEPS)], base)
    if run.compiler != "eager":
        run.row["compile_s"] = secs
    notes, ok = [], True
    if eager is not None:
        (ok1, n1), (ok2, n2) = (_check(eager.outputs[k], out, built.dtype)
                                for k, out in enumerate((first, last)))
        ok = ok1 and ok2
        notes = [n1] if n1 == n2 else [f"first call: {n1}", f"after warm-up: {n2}"]
        mine, theirs = getattr(run.step, "token_logits", None), getattr(eager.step, "token_logits", None)
        if mine is not None and theirs is not None:
            notes.append(_token_diagnosis(theirs, mine))
    run.row["status"] = "pass" if ok else "mismatch"
    run.row["note"] = "; ".join(n for n in notes if n) or None
    return [first, last]


def run_workload(w: Workload, device: torch.device, size: str, compilers: Sequence[str],
                 warmup: int, repeat: int, max_timing_s: Optional[float],
                 row_timeout: Optional[float]) -> list[dict]:
    """The rows (eager first, then each compiler) of one workload (module docstring)."""
    rows = [{"workload": w.name, "compiler": c, "status": "error", "config": None, "ms": None,
             "speedup": None, "vs_torch": None, "compile_s": None, "peak_gb": None,
             "first_peak_gb": None,
             "note": None, "error": None} for c in ["eager", *compilers]]
    try:
        built = w.build(device, size)
    except Unavailable as e:
        for r in rows:
            r["status"], r["note"] = "skipped", str(e)
        return rows
    except Exception as e:  # noqa: BLE001 - the row says what failed
        for r in rows:
            r["error"] = measure.short_error(e)
        return rows
    for r in rows:
        r["config"] = built.config
    runs = [Run(r["compiler"], r) for r in rows]
    warmup = max(warmup, 3)
    for run in runs:
        try:
            with measure.time_limit(row_timeout):
                run.outputs = _prepare(run, built, device, warmup, runs[0] if run is not runs[0] else None)
        except Exception as e:  # noqa: BLE001 - confined to this compiler's row
            run.row["status"] = "timeout" if measure.is_timeout(e) else "error"
            run.row["error"] = measure.short_error(e)
            run.row["traceback"] = traceback.format_exc()[-4000:]
            run.step = None
            if run.compiler == "eager":
                return rows
    timed = [r for r in runs if r.step is not None]
    try:
        with measure.time_limit(row_timeout and row_timeout * len(timed)):
            times = measure.time_interleaved(
                [r.step for r in timed], repeat, lambda fn: measure.time_once(fn, device),
                max_seconds=max_timing_s and max_timing_s * len(timed), rotate=True)
    except Exception as e:  # noqa: BLE001 - a step that raises in the rounds
        for r in timed[1:]:
            r.row["error"] = r.row["error"] or f"timing: {measure.short_error(e)}"
        return rows
    for r, ts in zip(timed, times):
        speed = measure.summarize(times[0], ts)
        r.row["ms"], r.row["speedup"] = speed.compiled_s * 1e3, speed.speedup
    by = {r.compiler: r.row for r in timed}
    if "coil" in by and "inductor" in by:
        by["coil"]["vs_torch"] = by["inductor"]["ms"] / by["coil"]["ms"]
    return rows


def _peak_child(name: str, compiler: str, size: str, warmup: int) -> dict:
    """In a fresh process: build, compile and warm up one copy of workload ``name`` and
    measure its memory as :func:`_prepare` does; ``{"peak_gb", "first_peak_gb"}``."""
    dev = torch.device("cuda")
    built = WORKLOADS[name].build(dev, size)
    run = Run(compiler, {})
    _prepare(run, built, dev, warmup, None)
    return {k: run.row[k] for k in ("peak_gb", "first_peak_gb")}


def isolated_peaks(rows: list[dict], size: str, warmup: int, jobs: int = 4,
                   timeout_s: float = 300.0) -> None:
    """Re-measure ``peak_gb`` / ``first_peak_gb`` (GiB) of every row that ran, each copy
    alone in a child process (``python -m coil.bench.reduce_overhead --peak ...``), at
    most ``jobs`` at a time (each process's caching allocator is its own, so children
    running side by side do not change each other's numbers). The shared-process values
    move to ``inproc_peak_gb`` / ``inproc_first_peak_gb``. A child that fails leaves
    ``peak_gb`` None and says why in ``peak_error``."""
    todo = [r for r in rows if r.get("peak_gb") is not None]

    def one(r: dict) -> None:
        cmd = [sys.executable, "-m", "coil.bench.reduce_overhead", "--peak", r["workload"],
               r["compiler"], size, str(warmup)]
        r["inproc_peak_gb"], r["inproc_first_peak_gb"] = r["peak_gb"], r.get("first_peak_gb")
        r["peak_gb"] = r["first_peak_gb"] = None
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if p.returncode or not line:
                r["peak_error"] = f"exit {p.returncode}: {p.stderr[-300:]}"
                return
            r.update(json.loads(line[-1]))
        except subprocess.TimeoutExpired:
            r["peak_error"] = f"timed out after {timeout_s:.0f} s"

    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, todo))


# ---------------------------------------------------------------- the run

def resolve(names: Optional[Sequence[str]], table: dict, kind: str, compilers: Sequence[str],
            compiler_table: dict, device: str, size: Optional[str]) -> tuple:
    """``(names, device, size)`` of a run: every name of ``table`` by default, ``auto``
    device (CUDA where there is one), ``full`` size on CUDA, else ``small``.

    Raises ValueError naming unknown names and compilers and the known ones."""
    names = list(names or table)
    bad = [n for n in names if n not in table] + [c for c in compilers if c not in compiler_table]
    if bad:
        raise ValueError(f"unknown {', '.join(bad)}; {kind}: {', '.join(table)}; "
                         f"compilers: {', '.join(compiler_table)}")
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       "cpu" if device == "auto" else device)
    return names, dev, size or ("full" if dev.type == "cuda" else "small")


def run(workloads: Optional[Sequence[str]] = None, device: str = "auto", size: Optional[str] = None,
        compilers: Sequence[str] = ("inductor", "coil"), warmup: int = 3, repeat: int = 20,
        max_timing_s: Optional[float] = 30.0, row_timeout: Optional[float] = 300.0,
        budget_s: Optional[float] = None, progress: bool = True,
        on_workload: Optional[Callable[[dict], None]] = None, memory_jobs: int = 4) -> dict:
    """Run the workloads (default: all of :data:`WORKLOADS`); returns ``{"meta", "rows"}``
    (also handed to ``on_workload`` after each workload, so that a run killed from
    outside keeps what finished). On CUDA, peak memory is then measured per copy in its
    own process (:func:`isolated_peaks`, ``memory_jobs`` at a time; 0: keep the
    shared-process values).

    Raises ValueError for an unknown workload or compiler name."""
    names, dev, size = resolve(workloads, WORKLOADS, "workloads", compilers, COMPILERS,
                               device, size)
    meta = machine_info()
    meta.update(mode=MODE, device=str(dev), size=size, compilers=["eager", *compilers],
                note=None if dev.type == "cuda" else NO_CUDA_NOTE)
    rows: list = []
    start = time.perf_counter()
    bar = Progress(len(names), enabled=progress)
    for name in names:
        if budget_s is not None and time.perf_counter() - start > budget_s:
            rows += [{"workload": name, "compiler": c, "status": "skipped",
                      "note": "budget exhausted"} for c in ["eager", *compilers]]
            continue
        bar.show(name)
        _reset_compilers()
        rows += run_workload(WORKLOADS[name], dev, size, compilers, warmup, repeat,
                             max_timing_s, row_timeout)
        bar.advance(name)
        if on_workload is not None:
            on_workload({"meta": meta, "rows": rows})
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    bar.close()
    if dev.type == "cuda" and memory_jobs > 0:
        isolated_peaks(rows, size, max(warmup, 3), memory_jobs)
        meta["peak_memory"] = "each copy alone in its own process"
        if on_workload is not None:
            on_workload({"meta": meta, "rows": rows})
    return {"meta": meta, "rows": rows}


HEADERS = ["workload", "compiler", "status", "ms", "speedup", "coil/torch", "compile s",
           "peak GB", "note"]


def _cells(r: dict) -> list[str]:
    return [r["workload"], LABELS.get(r["compiler"], r["compiler"]), r["status"],
            fmt(r.get("ms"), ".3f"), fmt(r.get("speedup"), ".2f"), fmt(r.get("vs_torch"), ".2f"),
            fmt(r.get("compile_s"), ".1f"), fmt(r.get("peak_gb"), ".3f"),
            (r.get("error") or r.get("note") or "")[:240]]


def _configs(result: dict) -> list[str]:
    seen = {}
    for r in result["rows"]:
        if r.get("config"):
            seen.setdefault(r["workload"], r["config"])
    return [f"{w}: {c}" for w, c in seen.items()]


def format_text(result: dict) -> str:
    """The rows as a text table, the configs and the CPU note below it."""
    lines = [render_table(HEADERS, [_cells(r) for r in result["rows"]]), ""] + _configs(result)
    if result["meta"].get("note"):
        lines += ["", "note: " + result["meta"]["note"]]
    return "\n".join(lines)


def format_markdown(result: dict) -> str:
    """A markdown block: how it was made, the table, the configs."""
    parts = [meta_markdown(result["meta"]), "", render_markdown(HEADERS, [_cells(r) for r in result["rows"]]),
             ""] + ["- " + c for c in _configs(result)]
    if result["meta"].get("note"):
        parts += ["", "Note: " + result["meta"]["note"]]
    return "\n".join(parts) + "\n"


if __name__ == "__main__" and sys.argv[1:2] == ["--peak"]:
    _name, _compiler, _size, _warmup = sys.argv[2:6]
    print(json.dumps(_peak_child(_name, _compiler, _size, int(_warmup))), flush=True)
