"""Deliberately broken or instrumented compilers for the harness tests.

Each is a :class:`coil.bench.compilers.Compiler`; tests name them as
``"fake_compilers:NAME"`` (this directory is on ``sys.path`` under pytest, and the
conformance worker inherits the parent's ``sys.path``).
"""
import os
import signal
import time

import torch

from coil.bench.compilers import Compiler
from coil.bench.models import flatten_outputs


def _shift(out, delta):
    if isinstance(out, torch.Tensor):
        return out + delta if out.is_floating_point() else out
    if isinstance(out, (list, tuple)):
        return type(out)(_shift(o, delta) for o in out)
    if isinstance(out, dict):
        return {k: _shift(v, delta) for k, v in out.items()}
    return out


def _wrong(fn, probe):
    """Runs eagerly, then adds 0.1 to every float output: must be flagged as mismatch."""
    return lambda *a, **k: _shift(fn(*a, **k), 0.1)


def _raises(fn, probe):
    raise NotImplementedError("this layer is not built yet")


def _slow(fn, probe):
    """Correct but 20 ms slower per call: speedup must come out below 1."""
    def run(*a, **k):
        time.sleep(0.02)
        return fn(*a, **k)
    return run


def _identity(fn, probe):
    return fn


def _torch_eager(fn, probe):
    """torch.compile's capture with a counted eager backend (graph-count tests)."""
    return torch.compile(fn, backend=probe.counting(lambda gm, ex: gm.forward))


def _by_op(fn, probe):
    """Crashes the process on cos, hangs (SIGALRM blocked) on tan, else identity."""
    name = fn.__code__.co_filename
    if "cos" in name:
        os._exit(3)
    if "tan" in name:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
        time.sleep(600)
    return fn


def _crash(fn, probe):
    os._exit(5)


CRASH = Compiler("crash", "none", "kills the process", _crash)
WRONG = Compiler("wrong", "none", "adds 0.1 to outputs", _wrong)
RAISES = Compiler("raises", "none", "raises NotImplementedError", _raises)
SLOW = Compiler("slow", "none", "sleeps 20 ms per call", _slow)
IDENTITY = Compiler("identity", "none", "no compilation", _identity)
TORCH_EAGER = Compiler("torch_eager", "torch", "torch capture, eager backend", _torch_eager)
BY_OP = Compiler("by_op", "none", "crash on cos, hang on tan", _by_op)
