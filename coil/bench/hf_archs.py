"""transformers architectures vs eager and vs torch.compile's graph count (``python -m
coil.bench.hf_archs``).

For each architecture (a small random-weight model built from a config; nothing is
downloaded) :func:`check_arch` runs, on CPU in float32:

1. inference: ``model.eval()`` under ``no_grad``, eager and ``coil.compile(model)`` (the
   default backend, C++ kernels); every output tensor is compared;
2. a training step: ``model.train()``, the model's own loss where it takes ``labels``
   (causal/masked LM, seq2seq, CTC, image classification), else the sum of the means of
   its float outputs (:func:`coil.bench.models.reduce_to_scalar_loss`); ``backward()``;
   the loss and every parameter gradient are compared;
3. the graphs each compiler makes for the same two calls: coil's capture with coil's
   backend, and ``torch.compile`` with a counting backend that runs the graph as captured.

Models that take token ids and an ``attention_mask`` get one that pads the end of the
first sequence in both calls (the masked-attention paths).

Comparisons use the bench's rule (:func:`coil.bench.measure.compare`): against a float64
eager run of the same weights and inputs, coil's error may be at most twice eager's float32
error plus 1e-5; eager's error per output is the larger of its runs with the default
threads and with one (its sums split by thread: wav2vec2's bias gradients are 2.5x closer
to float64 with two threads than with one, and coil's equal the one-thread error). An architecture passes when inference and training match and coil makes
no more graphs than torch.compile in either call (one graph wherever torch.compile makes
one). Codegen fallbacks (graphs that ran without coil's kernels) are counted and shown.

The architectures reuse the broad suite's builders (:mod:`coil.bench.broad`, its
``small`` configs: 2 layers, width 128) and add a few families it does not have
(Pegasus, GPT-Neo, Phi-3, Qwen3, transformers' ConvNeXt, ResNet, MobileViT), built
the same way. ``tests/models/test_hf_archs.py`` runs them all under ``-m slow`` and a few
tiny ones in CI.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import json
import sys
import time
import warnings
from typing import Any, Callable, Optional

import torch

from coil.bench import measure
from coil.bench.broad import BROAD_MODELS, _dec, _hf, _lm, _pixels, _seq2seq
from coil.bench.compilers import COMPILERS
from coil.bench.models import BuiltModel, flatten_outputs, reduce_to_scalar_loss
from coil.bench.suite import _cast_inputs

_CPU = torch.device("cpu")


def _extra(name: str, model_cls: str, config_cls: str, cfg: dict, inputs) -> tuple:
    return name, _hf(model_cls, config_cls, cfg, cfg, inputs)


#: architectures the broad suite does not build, as ``name -> build(device, size)``
_EXTRA: dict[str, Callable] = dict([
    _extra("pegasus", "PegasusForConditionalGeneration", "PegasusConfig",
           dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                vocab_size=256, max_position_embeddings=64), _seq2seq((2, 16, 8))),
    _extra("gpt_neo", "GPTNeoForCausalLM", "GPTNeoConfig",
           dict(num_layers=2, hidden_size=64, num_heads=4, vocab_size=256, window_size=8,
                attention_types=[[["global", "local"], 1]], max_position_embeddings=64,
                bos_token_id=0, eos_token_id=0),
           _lm((2, 16))),
    _extra("phi3", "Phi3ForCausalLM", "Phi3Config",
           _dec(2, 64, 4, 256, 128, num_key_value_heads=2, pad_token_id=0), _lm((2, 16))),
    _extra("qwen3", "Qwen3ForCausalLM", "Qwen3Config",
           _dec(2, 64, 4, 256, 128, num_key_value_heads=2, head_dim=16), _lm((2, 16))),
    _extra("hf_convnext", "ConvNextForImageClassification", "ConvNextConfig",
           dict(num_channels=3, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                num_labels=10), _pixels((2, 32))),
    _extra("hf_resnet", "ResNetForImageClassification", "ResNetConfig",
           dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                num_labels=10), _pixels((2, 32))),
    _extra("hf_mobilevit", "MobileViTForImageClassification", "MobileViTConfig",
           dict(image_size=32, patch_size=2, hidden_sizes=[32, 32, 32],
                neck_hidden_sizes=[8, 8, 16, 16, 16, 32, 64], num_attention_heads=2,
                num_labels=10), _pixels((2, 32))),
])


def _builders() -> dict[str, Callable]:
    found = {spec.name[2:]: spec.build for spec in BROAD_MODELS.values()
             if spec.source == "transformers"}
    found.update(_EXTRA)
    return found


#: architecture name -> ``build(device, size)`` returning a BuiltModel, in table order
ARCHS: dict[str, Callable] = _builders()
#: a few tiny architectures cheap enough for CI (tests/models/test_hf_archs.py)
FAST = ("gpt_neo", "hf_resnet")


@dataclasses.dataclass
class ArchResult:
    """One architecture's row. ``infer`` / ``train``: "pass", "mismatch: ...", or
    "error: ..."; graph counts are None where that compile did not run."""

    arch: str
    config: str = ""
    infer: str = "-"
    train: str = "-"
    coil_graphs: tuple = (None, None)    # (inference call, training call)
    torch_graphs: tuple = (None, None)
    coil_breaks: tuple = (None, None)
    fallbacks: int = 0
    seconds: float = 0.0

    @property
    def extra_graphs(self) -> bool:
        """True when coil made more graphs than torch.compile in either call."""
        return any(c is not None and t is not None and c > t
                   for c, t in zip(self.coil_graphs, self.torch_graphs))

    @property
    def ok(self) -> bool:
        return self.infer == "pass" and self.train == "pass" and not self.extra_graphs


# ---------------------------------------------------------------- inputs and steps

def _with_padding(module: torch.nn.Module, args: tuple, kwargs: dict) -> dict:
    """``kwargs`` plus an ``attention_mask`` that pads the last quarter of the first
    sequence, for models that take token ids and a mask (the masked-attention paths)."""
    first = args[0] if args else None
    takes = inspect.signature(module.forward).parameters
    if first is None or first.is_floating_point() or "attention_mask" not in takes:
        return dict(kwargs)
    mask = torch.ones_like(first)
    mask[0, first.shape[1] - first.shape[1] // 4:] = 0
    return {**kwargs, "attention_mask": mask}


def _with_labels(module: torch.nn.Module, args: tuple, kwargs: dict) -> dict:
    """Keyword inputs for the training call: ``labels`` when the model takes them."""
    params = inspect.signature(module.forward).parameters
    kw = dict(kwargs)
    if "labels" not in params:
        return kw
    first = args[0] if args else None
    if "decoder_input_ids" in kw:
        kw["labels"] = kw["decoder_input_ids"]
    elif first is not None and not first.is_floating_point():
        kw["labels"] = first
    elif first is not None and first.dim() == 4 and hasattr(module.config, "num_labels"):
        g = torch.Generator().manual_seed(2)
        kw["labels"] = torch.randint(0, module.config.num_labels, (first.shape[0],), generator=g)
    elif first is not None and first.dim() == 2:  # CTC: short targets, no blank (id 0)
        g = torch.Generator().manual_seed(2)
        kw["labels"] = torch.randint(1, module.config.vocab_size, (first.shape[0], 4),
                                     generator=g)
    return kw


def _infer(fn: Callable, args: tuple, kwargs: dict) -> list:
    with torch.no_grad():
        return [t.detach().clone() for t in flatten_outputs(fn(*args, **kwargs))]


def _train(fn: Callable, module: torch.nn.Module, args: tuple, kwargs: dict) -> list:
    for p in module.parameters():
        p.grad = None
    out = fn(*args, **kwargs)
    loss = out["loss"] if "labels" in kwargs else reduce_to_scalar_loss(out)
    loss.backward()
    return [loss.detach()] + [torch.zeros_like(p) if p.grad is None else p.grad.clone()
                              for p in module.parameters() if p.requires_grad]


def _larger_error(ref: list, a: list, b: list) -> list:
    """Per output, whichever of eager runs ``a`` and ``b`` is further from ``ref`` (wav2vec2's
    bias gradients: 3.0e-4 from float64 with 2 threads, 7.6e-4 with one; coil's 7.5e-4)."""
    def err(x, r):
        return (x.double() - r.double()).pow(2).mean().item() if x.is_floating_point() else 0.0
    return [x if err(x, r) >= err(y, r) else y for r, x, y in zip(ref, a, b)]


def _verdict(ref: list, eager: list, got: list) -> str:
    v = measure.compare(ref, eager, got)
    return "pass" if v.ok else f"mismatch: {v.reason}"


def _copy(module: torch.nn.Module, train: bool, dtype=torch.float32) -> torch.nn.Module:
    return copy.deepcopy(module).to(dtype).train(train)


def _compiled_run(compiler: str, module, train: bool, args, kwargs) -> tuple[list, Any]:
    """(results, Counts) of one call of ``module`` compiled by the bench compiler
    ``compiler`` (the compiler's in-memory caches are reset first)."""
    c = COMPILERS[compiler]
    c.reset()
    compiled, probe = c.compile(module)
    got = (_train(compiled, module, args, kwargs) if train
           else _infer(compiled, args, kwargs))
    return got, probe.read()


# ---------------------------------------------------------------- one architecture

def check_arch(name: str, size: str = "small", torch_counts: bool = True) -> ArchResult:
    """Build architecture ``name`` (a key of :data:`ARCHS`) and check it (module
    docstring). Errors are recorded in the row, not raised. ``torch_counts=False`` skips
    the torch.compile runs (their graph counts stay None)."""
    from coil.exc import fallback_counts

    row = ArchResult(name)
    t0 = time.perf_counter()
    warnings.simplefilter("ignore")
    built: BuiltModel = ARCHS[name](_CPU, size)
    row.config = built.config
    args, infer_kw = built.args, _with_padding(built.module, built.args, built.kwargs)
    train_kw = _with_labels(built.module, args, infer_kw)
    before = sum(fallback_counts.values())
    for train, kw in ((False, infer_kw), (True, train_kw)):
        i = int(train)

        def run(fn, m, dtype=torch.float32):
            a, k = _cast_inputs(args, dtype), _cast_inputs(kw, dtype)
            return _train(fn, m, a, k) if train else _infer(fn, a, k)

        try:
            m64 = _copy(built.module, train, torch.float64)
            ref = run(m64, m64, torch.float64)
            m32 = _copy(built.module, train)
            eager = run(m32, m32)
            threads = torch.get_num_threads()
            try:  # eager's error depends on its threads' split of each sum: the larger one
                torch.set_num_threads(1)
                m1 = _copy(built.module, train)
                eager = _larger_error(ref, eager, run(m1, m1))
            finally:
                torch.set_num_threads(threads)
            m = _copy(built.module, train)
            got, counts = _compiled_run("coil", m, train, args, kw)
            verdict = _verdict(ref, eager, got)
            row.coil_graphs = _set(row.coil_graphs, i, counts.graphs)
            row.coil_breaks = _set(row.coil_breaks, i, counts.graph_breaks)
        except Exception as e:  # noqa: BLE001 - the row records what failed
            verdict = "error: " + measure.short_error(e)
        if train:
            row.train = verdict
        else:
            row.infer = verdict
        if torch_counts:
            try:
                m = _copy(built.module, train)
                _, counts = _compiled_run("torch+eager", m, train, args, kw)
                row.torch_graphs = _set(row.torch_graphs, i, counts.graphs)
            except Exception:  # noqa: BLE001 - a torch.compile failure leaves None
                pass
    COMPILERS["coil"].reset()
    row.fallbacks = sum(fallback_counts.values()) - before
    row.seconds = time.perf_counter() - t0
    return row


def _set(pair: tuple, i: int, value) -> tuple:
    out = list(pair)
    out[i] = value
    return tuple(out)


# ---------------------------------------------------------------- the table

def _pair(p: tuple) -> str:
    return "/".join("-" if v is None else str(v) for v in p)


def _short(verdict: str) -> str:
    return verdict.split(":", 1)[0]


def markdown(rows: list[ArchResult]) -> str:
    """The results as a markdown table (graphs and coil's graph breaks as
    ``inference/training``), followed by the notes of rows that did not pass."""
    lines = ["| architecture | inference | training | coil graphs | torch.compile graphs "
             "| coil breaks | fallbacks | s | config |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.arch} | {_short(r.infer)} | {_short(r.train)} | "
                     f"{_pair(r.coil_graphs)} | {_pair(r.torch_graphs)} | {_pair(r.coil_breaks)} | "
                     f"{r.fallbacks} | "
                     f"{r.seconds:.0f} | {r.config} |")
    ok = sum(r.ok for r in rows)
    lines.append(f"\n{ok}/{len(rows)} architectures match eager in inference and training "
                 "with no more graphs than torch.compile.")
    for r in rows:
        for what, v in (("inference", r.infer), ("training", r.train)):
            if v != "pass":
                lines.append(f"- {r.arch} {what}: {v}")
        if r.extra_graphs:
            lines.append(f"- {r.arch}: coil graphs {_pair(r.coil_graphs)} > torch.compile's "
                         f"{_pair(r.torch_graphs)}")
        elif r.coil_graphs != r.torch_graphs and None not in r.torch_graphs:
            lines.append(f"- {r.arch}: coil graphs {_pair(r.coil_graphs)} < torch.compile's "
                         f"{_pair(r.torch_graphs)} (look for code left to run eagerly)")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m coil.bench.hf_archs [--arch NAME ...] [--json FILE] [--no-torch]``:
    prints one line per architecture as it finishes, then the markdown table. Exit status
    1 when any architecture does not pass."""
    p = argparse.ArgumentParser(prog="python -m coil.bench.hf_archs", description=__doc__)
    p.add_argument("--arch", action="append", choices=list(ARCHS),
                   help="architecture to check (repeatable; default: all)")
    p.add_argument("--json", help="also write the rows as JSON to this file")
    p.add_argument("--no-torch", action="store_true",
                   help="skip torch.compile's graph counts")
    ns = p.parse_args(argv)
    rows = []
    for name in ns.arch or list(ARCHS):
        r = check_arch(name, torch_counts=not ns.no_torch)
        rows.append(r)
        print(f"{name}: infer={r.infer} train={r.train} coil={_pair(r.coil_graphs)} "
              f"torch={_pair(r.torch_graphs)} fallbacks={r.fallbacks} {r.seconds:.0f}s",
              flush=True)
    print(markdown(rows))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in rows], f, indent=1)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
