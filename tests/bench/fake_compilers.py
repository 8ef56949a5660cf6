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


def _after_first_call(then):
    """A compile_with whose functions run correctly once, then call ``then(n)`` first
    on every later (n-th) call."""
    def compile_with(fn, probe):
        calls = [0]

        def run(*a, **k):
            calls[0] += 1
            if calls[0] > 1:
                then(calls[0])
            return fn(*a, **k)
        return run
    return compile_with


def _raise_on(n):
    raise RuntimeError(f"fails on call {n}")


def _hangs(fn, probe):
    """Compiles for 30 s (interruptible by the row's SIGALRM)."""
    time.sleep(30)
    return fn


#: the tag of every call of a RECORD_A / RECORD_B compiled function, in order
CALLS = []


def _recorder(tag):
    def compile_with(fn, probe):
        def run(*a, **k):
            CALLS.append(tag)
            return fn(*a, **k)
        return run
    return compile_with


CRASH = Compiler("crash", "none", "kills the process", _crash)
WRONG = Compiler("wrong", "none", "adds 0.1 to outputs", _wrong)
RAISES = Compiler("raises", "none", "raises NotImplementedError", _raises)
SLOW = Compiler("slow", "none", "sleeps 20 ms per call", _slow)
IDENTITY = Compiler("identity", "none", "no compilation", _identity)
TORCH_EAGER = Compiler("torch_eager", "torch", "torch capture, eager backend", _torch_eager)
BY_OP = Compiler("by_op", "none", "crash on cos, hang on tan", _by_op)
FAILS_LATER = Compiler("fails_later", "none", "raises from the second call on",
                       _after_first_call(_raise_on))
HANGS_LATER = Compiler("hangs_later", "none", "sleeps 30 s from the second call on",
                       _after_first_call(lambda n: time.sleep(30)))
HANGS = Compiler("hangs", "none", "compiles for 30 s", _hangs)
RECORD_A = Compiler("record_a", "none", "appends 'a' to CALLS per call", _recorder("a"))
RECORD_B = Compiler("record_b", "none", "appends 'b' to CALLS per call", _recorder("b"))
