"""Measurement primitives: correctness against an fp64 reference, interleaved timing,
speedup, per-row time limits. Pure functions where possible, so tests can feed them
fake numbers.

Correctness (the rule PyTorch's benchmark harness uses). For every output tensor,
``ref`` is the model run in float64, ``eager`` the model run eagerly in the benchmark's
precision and ``res`` the compiled result. With ``rmse(a, b) = sqrt(mean((a-b)^2))``
computed in float64::

    eager_err = rmse(ref, eager);  res_err = rmse(ref, res)
    pass  <=>  res_err <= factor * eager_err + atol

``factor`` is 2 for float32 and 3 for 16-bit results, ``atol`` 1e-5 (float32) or
1e-3 (16-bit). Under autocast (``low_precision``) a float32 result went through 16-bit
arithmetic: factor 3, and ``atol`` the larger of 1e-5 and 1e-3 of the reference's rms
(an AMP step's float32 loss of about 7: eager's error on that one scalar was 2.5e-7 by
chance, and 1e-5 is a hundredth of a bf16 rounding step there; a gradient of rms 1e-4
keeps an ``atol`` of 1e-5); a one-element float32 result (the loss) at least 1e-4: timm models' loss is the mean
of the bf16 logits, about 1e-3, and over 8 random inputs eager's own error on it had an rms of 1.2e-5, so a 1e-5
floor failed a compiler whenever eager's rounding happened to cancel (ConvNeXt-T on an H100: eager 3e-7, coil
1.6e-5; over the 8 inputs coil's rms 1.25e-5, torch.compile's 1.12e-5; ``benchmarks/gpu_accuracy_diag.py
--seeds``). Shape differences, NaN/inf where the reference has finite values, and
any difference in non-floating outputs fail.

Speedup. Eager and compiled runs alternate (eager, compiled, eager, compiled, ...) after
warm-up, so drift (clock boost, thermal, other processes) hits both alike; each run is
timed alone (CUDA events around it on GPU, ``perf_counter`` after a synchronize
elsewhere). ``speedup = median(eager) / median(compiled)``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import signal
import statistics
import threading
import time
from typing import Callable, Iterator, Optional, Sequence

import torch


# ---------------------------------------------------------------- correctness

@dataclasses.dataclass
class Verdict:
    """Result of :func:`compare`. ``worst_ratio`` = max over tensors of
    ``res_err / (factor * eager_err + atol)``: the share of the allowed error used (at most 1
    passes; readable where eager's own error is ~0, as an exactly representable gradient's)."""

    ok: bool
    reason: str = ""
    worst_ratio: Optional[float] = None
    tensors: int = 0


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    """Root mean square difference, computed in float64 (0 for empty tensors)."""
    if a.numel() == 0:
        return 0.0
    d = a.detach().to(torch.float64) - b.detach().to(torch.float64)
    return float(torch.sqrt(torch.mean(d * d)))


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(factor, atol) for results of ``dtype``."""
    if dtype in (torch.float16, torch.bfloat16):
        return 3.0, 1e-3
    return 2.0, 1e-5


def compare(ref: Sequence[torch.Tensor], eager: Sequence[torch.Tensor],
            res: Sequence[torch.Tensor], low_precision: bool = False) -> Verdict:
    """Accept ``res`` when, tensor by tensor, its error against the float64 reference is
    within ``factor x`` eager's error (+ ``atol``); ``low_precision``: the results were
    computed under 16-bit autocast (see the module docstring)."""
    if not (len(ref) == len(eager) == len(res)):
        return Verdict(False, f"output count differs: ref {len(ref)}, eager {len(eager)}, "
                              f"compiled {len(res)}")
    worst = 0.0
    for i, (r, e, c) in enumerate(zip(ref, eager, res)):
        if tuple(c.shape) != tuple(r.shape):
            return Verdict(False, f"output {i}: shape {tuple(c.shape)} != {tuple(r.shape)}",
                           tensors=len(ref))
        if not r.is_floating_point() and not r.is_complex():
            if not torch.equal(c.cpu(), r.cpu().to(c.dtype)):
                return Verdict(False, f"output {i}: integer/bool values differ", tensors=len(ref))
            continue
        c64, r64 = c.detach().to(torch.float64), r.detach().to(torch.float64)
        bad = ~torch.isfinite(c64) & torch.isfinite(r64)
        if bool(bad.any()):
            return Verdict(False, f"output {i}: {int(bad.sum())} non-finite values where the "
                                  "reference is finite", tensors=len(ref))
        fin = torch.isfinite(r64)
        if not bool(fin.all()):
            if not torch.equal(torch.isnan(c64), torch.isnan(r64)):
                return Verdict(False, f"output {i}: NaN positions differ", tensors=len(ref))
            r64, c64, e64 = r64[fin], c64[fin], e.detach().to(torch.float64)[fin]
        else:
            e64 = e.detach().to(torch.float64)
        factor, atol = tolerance(c.dtype)
        if low_precision and c.dtype == torch.float32:
            factor, atol = 3.0, max(atol, 1e-3 * rmse(r64, torch.zeros_like(r64)), 1e-4 if r64.numel() == 1 else 0.0)
        e_err, c_err = rmse(r64, e64), rmse(r64, c64)
        allowed = factor * e_err + atol
        worst = max(worst, c_err / allowed)
        if c_err > allowed:
            return Verdict(False, f"output {i}: rmse {c_err:.3g} vs eager's {e_err:.3g} "
                                  f"(allowed {factor:g}x + {atol:g})", worst, len(ref))
    return Verdict(True, "", worst, len(ref))


# ---------------------------------------------------------------- timing

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_once(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes (CUDA events on GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_interleaved(fns: Sequence[Callable[[], object]], repeat: int,
                     timer: Callable[[Callable[[], object]], float],
                     max_seconds: Optional[float] = None, min_rounds: int = 3,
                     rotate: bool = False) -> list[list[float]]:
    """Run ``fns[0], fns[1], ..., fns[0], fns[1], ...`` ``repeat`` rounds; per-fn seconds.
    With ``max_seconds``, stop early once the timed calls add up to more than that (but
    after at least ``min_rounds`` rounds). ``rotate``: round ``r`` starts at ``fns[r %
    len(fns)]``, so that no fn always runs right after the same other one (a slow
    neighbour's leftover GPU queue or cache state would otherwise always fall on it).
    Python's cyclic garbage collector is paused while timing, as ``timeit`` does: a
    collection walks the whole process's heap (every model and compiled graph the harness
    holds), and whichever call it lands in reads slower."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _interleaved(fns, repeat, timer, max_seconds, min_rounds, rotate)
    finally:
        if paused:
            gc.enable()


def _interleaved(fns, repeat, timer, max_seconds, min_rounds, rotate) -> list[list[float]]:
    out: list[list[float]] = [[] for _ in fns]
    total = 0.0
    n = len(fns)
    for r in range(repeat):
        start = r % n if rotate and n else 0
        for i in [(start + k) % n for k in range(n)]:
            fn = fns[i]
            t = timer(fn)
            out[i].append(t)
            total += t
        if max_seconds is not None and total > max_seconds and r + 1 >= min_rounds:
            break
    return out


@dataclasses.dataclass
class Speed:
    eager_s: float
    compiled_s: float
    speedup: float


def summarize(eager_times: Sequence[float], compiled_times: Sequence[float]) -> Speed:
    """Medians and ``speedup = median(eager) / median(compiled)``. Raises ValueError on
    empty or non-positive timings (a missing number must not become one)."""
    if not eager_times or not compiled_times:
        raise ValueError("no timings")
    e, c = statistics.median(eager_times), statistics.median(compiled_times)
    if not (e > 0 and c > 0) or math.isnan(e) or math.isnan(c):
        raise ValueError(f"non-positive timing (eager {e}, compiled {c})")
    return Speed(e, c, e / c)


def geomean(values: Sequence[float]) -> Optional[float]:
    """Geometric mean of positive values, None for none."""
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


# ---------------------------------------------------------------- time limits

class RowTimeout(Exception):
    """A benchmark row or conformance op ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: Optional[float]) -> Iterator[None]:
    """Raise :class:`RowTimeout` in the main thread after ``seconds`` (SIGALRM; only
    interrupts Python code; a hang inside C code is left to the subprocess watchdogs).
    No-op when ``seconds`` is falsy, off the main thread, or without SIGALRM."""
    usable = (seconds and hasattr(signal, "SIGALRM")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def on_alarm(signum, frame):
        raise RowTimeout(f"timed out after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def is_timeout(e: BaseException) -> bool:
    """True for :class:`RowTimeout`, also when a compiler re-raised it wrapped in its own
    exception type (Inductor does)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, RowTimeout) or "RowTimeout:" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def short_error(e: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line (plus the innermost ``__cause__``), cut to ``limit``
    characters."""
    def one(x: BaseException) -> str:
        msg = " ".join(line.strip() for line in str(x).strip().splitlines() if line.strip())
        return f"{type(x).__name__}: {msg}"

    text = one(e)
    cause = e.__cause__
    while cause is not None and cause.__cause__ is not None:
        cause = cause.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text += " <- " + one(cause)
    return text if len(text) <= limit else text[: limit - 3] + "..."
