"""Compile a generated C++ kernel and launch it cheaply from Python.

``CppLauncher(source, func_name, n_args, has_checks)`` starts the build at once on a
shared thread pool (so the kernels of one graph compile in parallel while the rest
of the graph is generated) and resolves it on :meth:`wait` or the first call.

Launch cost is what matters for small models: the ctypes function gets its
``argtypes``/``restype`` once; a call is ``fn(t0.data_ptr(), t1.data_ptr(), ...)``
through a small Python function generated for the kernel's arity (no ``*args``
list building). Kernels that bounds-check indirect indices take an ``int64[4]``
error record and return nonzero on error; the launcher then raises ``IndexError``.
"""
from __future__ import annotations

import ctypes
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional

from coil.runtime import cpp_build

_PRELUDE: Optional[str] = None
_pool: Optional[ThreadPoolExecutor] = None


def prelude() -> str:
    """The text of ``prelude.h`` (inlined into every source so it is in the cache key)."""
    global _PRELUDE
    if _PRELUDE is None:
        with open(os.path.join(os.path.dirname(__file__), "prelude.h")) as f:
            _PRELUDE = f.read()
    return _PRELUDE


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1),
                                   thread_name_prefix="coil-cxx")
    return _pool


class CppLauncher:
    """A compiled (or compiling) C++ kernel callable as ``launcher(*tensors)``."""

    def __init__(self, source: str, func_name: str, n_args: int, has_checks: bool,
                 describe: str = ""):
        self.source = source
        self.func_name = func_name
        self.n_args = n_args
        self.has_checks = has_checks
        self.describe = describe or func_name
        self._future: Future = _executor().submit(cpp_build.build, source)
        self._call: Optional[Callable] = None

    def wait(self) -> "CppLauncher":
        """Finish the build; raises :class:`coil.runtime.cpp_build.CppBuildError`."""
        if self._call is None:
            lib = self._future.result()
            fn = getattr(lib, self.func_name)
            fn.argtypes = [ctypes.c_void_p] * self.n_args + [ctypes.c_void_p]
            fn.restype = ctypes.c_int64
            self._call = self._make_call(fn)
        return self

    def _make_call(self, fn) -> Callable:
        names = [f"a{i}" for i in range(self.n_args)]
        ptrs = ", ".join(f"{n}.data_ptr()" for n in names)
        ns = {"fn": fn}
        if self.has_checks:
            err = (ctypes.c_int64 * 4)()
            ns.update(err=err, err_ptr=ctypes.addressof(err), fail=self._fail)
            src = (f"def call({', '.join(names)}):\n"
                   f"    if fn({ptrs}{', ' if ptrs else ''}err_ptr):\n"
                   f"        fail(err)\n")
        else:
            src = (f"def call({', '.join(names)}):\n"
                   f"    fn({ptrs}{', ' if ptrs else ''}None)\n")
        exec(compile(src, f"<coil launcher {self.func_name}>", "exec"), ns)
        return ns["call"]

    def _fail(self, err) -> None:
        idx, size, site = err[1], err[2], err[3]
        for i in range(4):
            err[i] = 0
        raise IndexError(f"index {idx} is out of bounds for dimension with size {size} "
                         f"(coil C++ kernel {self.func_name}, check #{site})")

    def __call__(self, *tensors):
        if self._call is None:
            self.wait()
        return self._call(*tensors)
