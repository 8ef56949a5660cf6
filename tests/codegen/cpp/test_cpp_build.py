"""Tests of coil.runtime.cpp_build: compile, load, disk cache, parallel builds, errors."""
import ctypes
import os
import random

import pytest

from coil.config import patch
from coil.runtime import cpp_build


def _src(tag: int) -> str:
    return f"""
#include <cstdint>
#include <omp.h>
extern "C" int64_t add_tag(int64_t x) {{ return x + {tag}; }}
extern "C" int max_threads() {{ return omp_get_max_threads(); }}
"""


@pytest.fixture
def cache(tmp_path):
    with patch(cache_dir=str(tmp_path)):
        yield tmp_path


def _call(lib, x):
    f = lib.add_tag
    f.argtypes = [ctypes.c_int64]
    f.restype = ctypes.c_int64
    return f(x)


def test_build_and_call(cache):
    tag = random.randrange(1 << 30)
    lib = cpp_build.build(_src(tag))
    assert _call(lib, 5) == 5 + tag
    assert lib.max_threads() >= 1
    # the .so and its source are in the cache dir
    files = [f for _, _, fs in os.walk(cache) for f in fs]
    assert any(f.endswith(".so") for f in files) and any(f.endswith(".cpp") for f in files)


def test_memory_and_disk_cache_skip_compiler(cache):
    tag = random.randrange(1 << 30)
    before = dict(cpp_build.stats)
    lib1 = cpp_build.build(_src(tag))
    assert cpp_build.stats["compiles"] == before["compiles"] + 1
    lib2 = cpp_build.build(_src(tag))
    assert lib2 is lib1 and cpp_build.stats["compiles"] == before["compiles"] + 1
    # a "new process": forget the loaded libraries, the disk copy is used
    cpp_build._loaded.clear()
    lib3 = cpp_build.build(_src(tag))
    assert cpp_build.stats["compiles"] == before["compiles"] + 1
    assert cpp_build.stats["disk_hits"] == before["disk_hits"] + 1
    assert _call(lib3, 1) == 1 + tag


def test_flags_are_in_key(cache):
    s = _src(7)
    k1 = cpp_build.cache_key(s, cpp_build.compile_flags())
    with patch(cpp_extra_flags="-DFOO=1"):
        k2 = cpp_build.cache_key(s, cpp_build.compile_flags())
    assert k1 != k2


def test_compile_error_is_specific(cache):
    with pytest.raises(cpp_build.CppCompileError) as info:
        cpp_build.build("this is not C++;")
    assert "error" in info.value.detail


def test_missing_compiler(cache, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/compiler-xyz")
    cpp_build._reset_compiler()
    try:
        with pytest.raises(cpp_build.CompilerNotFound):
            cpp_build.build(_src(1))
    finally:
        monkeypatch.delenv("CXX")
        cpp_build._reset_compiler()


def test_num_threads_follows_torch():
    import torch

    assert cpp_build.num_threads() == torch.get_num_threads()
    with patch(cpp_threads=3):
        assert cpp_build.num_threads() == 3
