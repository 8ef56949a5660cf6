"""The GPU fast-launch paths of runtime/triton_runtime.py, with fake Triton launchers
(no GPU needed): argument order of the direct C launch, the alignment fallback, and
the fallback to ``CudaLauncher.__call__`` for launchers of another shape."""
from coil.runtime.triton_runtime import _direct_launch, _specialized_launch


class _Ptr:
    is_cuda = True

    def __init__(self, p):
        self.p = p

    def data_ptr(self):
        return self.p


class _Launcher36:
    """Shaped like Triton 3.6's CudaLauncher."""
    global_scratch_size = 0
    profile_scratch_size = 0
    launch_cooperative_grid = 0
    launch_pdl = 1

    def __init__(self):
        self.calls, self.direct = [], []
        self.launch = lambda *a: self.direct.append(a)

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.calls.append((gridX, gridY, gridZ, stream, function) + args)


class _LauncherOther(_Launcher36):
    """A launcher whose __call__ has another signature (Triton 3.9 names its metadata)."""

    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                 launch_enter_hook, launch_exit_hook, *args):
        self.calls.append((gridX, gridY, gridZ, stream, function, kernel_metadata,
                           launch_metadata, launch_enter_hook, launch_exit_hook) + args)


def _fast(run, slow_calls, ints=False):
    return _specialized_launch(run, (_Ptr(0), _Ptr(16)), (7, 3), [128, 16], "FN", "META",
                               lambda dev: f"stream{dev}", 0,
                               lambda *a: slow_calls.append(a), pointers_as_ints=ints)


def test_direct_launch_argument_order():
    run, slow = _Launcher36(), []
    a, b = _Ptr(1024), _Ptr(4096)
    _fast(run, slow)(a, b)
    assert run.calls == [] and slow == []
    assert run.direct == [(7, 3, 1, "stream0", "FN", 0, 1, None, None, "META", None, None, None,
                           a, b, 128, 16)]


def test_direct_launch_with_pointers_as_ints():
    run, slow = _Launcher36(), []
    a, b = _Ptr(1024), _Ptr(4096)
    _fast(run, slow, ints=True)(a, b)
    assert slow == [] and run.direct == [(7, 3, 1, "stream0", "FN", 0, 1, None, None, "META",
                                          None, None, None, 1024, 4096, 128, 16)]


def test_one_argument_kernel_with_pointers_as_ints():
    run, slow = _Launcher36(), []
    f = _specialized_launch(run, (_Ptr(32),), (5, 1), [64], "FN", "META", lambda dev: "s", 0,
                            lambda *a: slow.append(a), pointers_as_ints=True)
    f(_Ptr(512))
    assert run.direct == [(5, 1, 1, "s", "FN", 0, 1, None, None, "META", None, None, None, 512, 64)]


def test_misaligned_pointer_goes_through_the_jit():
    for ints in (False, True):
        run, slow = _Launcher36(), []
        a, b = _Ptr(1024), _Ptr(4100)
        _fast(run, slow, ints)(a, b)
        assert slow == [(a, b)] and run.direct == [] and run.calls == []


def test_other_launcher_shape_uses_its_call():
    run, slow = _LauncherOther(), []
    assert _direct_launch(run) is None
    a, b = _Ptr(0), _Ptr(16)
    _fast(run, slow, ints=True)(a, b)  # tensors, not ints, outside the direct path
    assert run.direct == [] and slow == []
    assert run.calls == [(7, 3, 1, "stream0", "FN", "META", None, None, None, a, b, 128, 16)]


def test_scratch_needing_launcher_is_not_bypassed():
    run = _Launcher36()
    run.global_scratch_size = 64
    assert _direct_launch(run) is None


def test_misaligned_first_call_keeps_its_binary_only_for_misaligned_pointers():
    run, slow = _Launcher36(), []
    f = _specialized_launch(run, (_Ptr(0), _Ptr(4)), (2, 1), [64], "FN", "META",
                            lambda dev: "s", 0, lambda *a: slow.append(a), pointers_as_ints=True)
    f(_Ptr(32), _Ptr(36))
    assert len(run.direct) == 1 and run.direct[0][-3:] == (32, 36, 64) and slow == []
    a, b = _Ptr(32), _Ptr(48)  # now aligned: another binary, through the JIT
    f(a, b)
    assert slow == [(a, b)] and len(run.direct) == 1


def _dynamic_fast(run, slow):
    """A dynamic kernel's launch: two pointers, xnumel, two sizes; first compiled with
    xnumel 4096 and sizes 256 (divisible by 16) and 7."""
    return _specialized_launch(run, (_Ptr(0), _Ptr(16), 4096, 256, 7), ("-(-a2 // 128)", 1), [128],
                               "FN", "META", lambda dev: "s", 0, lambda *a: slow.append(a[2:]),
                               pointers_as_ints=True)


def test_dynamic_kernel_grid_from_xnumel_and_sizes_passed_through():
    run, slow = _Launcher36(), []
    _dynamic_fast(run, slow)(_Ptr(64), _Ptr(128), 1008, 512, 9)
    assert slow == [] and run.direct == [(8, 1, 1, "s", "FN", 0, 1, None, None, "META", None, None,
                                          None, 64, 128, 1008, 512, 9, 128)]


def test_dynamic_kernel_size_of_another_specialization_goes_through_the_jit():
    # Triton compiled the binary for size 256 % 16 == 0 and 7 != 1: a size 250 (or 1, or
    # xnumel beyond int32) needs another binary; launching the first one was wrong values
    for sizes in [(1008, 250, 7), (1008, 256, 16), (1008, 256, 1), (2 ** 31, 256, 7)]:
        run, slow = _Launcher36(), []
        _dynamic_fast(run, slow)(_Ptr(64), _Ptr(128), *sizes)
        assert slow == [sizes] and run.direct == [], sizes


def test_dynamic_kernel_size_symbols_are_not_specialized_but_xnumel_is():
    # the sizes 256 and 7 are do_not_specialize (free=2): 250, 16 or 1 launch the same
    # binary directly (checking them sent a new sequence length's calls through the JIT);
    # an xnumel of another class, or a size beyond int32 (Triton's i64), needs another
    run, slow = _Launcher36(), []
    f = _specialized_launch(run, (_Ptr(0), _Ptr(16), 4096, 256, 7), ("-(-a2 // 128)", 1), [128],
                            "FN", "META", lambda dev: "s", 0, lambda *a: slow.append(a[2:]),
                            pointers_as_ints=True, free=2)
    for sizes in [(1008, 250, 7), (1008, 256, 16), (1008, 1, 1)]:
        f(_Ptr(64), _Ptr(128), *sizes)
    assert slow == [] and [d[15:18] for d in run.direct] == [(1008, 250, 7), (1008, 256, 16), (1008, 1, 1)]
    for sizes in [(1000, 256, 7), (1008, 2 ** 31, 7)]:
        f(_Ptr(64), _Ptr(128), *sizes)
    assert slow == [(1000, 256, 7), (1008, 2 ** 31, 7)] and len(run.direct) == 3


def test_dynamic_kernel_first_compiled_beyond_int32_keeps_its_direct_launch():
    run, slow = _Launcher36(), []
    f = _specialized_launch(run, (_Ptr(0), 2 ** 31 + 5), ("-(-a1 // 1024)", 1), [1024], "FN", "META",
                            lambda dev: "s", 0, lambda *a: slow.append(a[1:]), pointers_as_ints=True)
    f(_Ptr(0), 2 ** 31 + 100)
    f(_Ptr(0), 100)  # an int32 xnumel: another binary
    assert len(run.direct) == 1 and slow == [(100,)]


def test_dynamic_launcher_uses_one_fast_launch_per_bucket(monkeypatch):
    import importlib
    from coil.runtime.triton_dynamic import DynamicTritonLauncher

    class Active:
        get_current_stream = staticmethod(lambda dev: "s")
        get_current_device = staticmethod(lambda: 0)

    monkeypatch.setattr(importlib.import_module("triton.runtime.driver"), "driver", type("D", (), {"active": Active})())
    run, jit = _Launcher36(), []

    class Kernel:
        function, packed_metadata = "FN", "META"

    Kernel.run = run

    class Fn:
        def __getitem__(self, grid):
            return lambda *a, **cfg: (jit.append((grid, a[2:], cfg)), Kernel)[1]

    k = object.__new__(DynamicTritonLauncher)
    k.name, k.n_ptrs, k.red, k.gpu, k.interpret, k._runs, k._by_size, k.fn = "k", 2, False, True, False, {}, {}, Fn()
    k.tiled, k.base_key, k.arg_dtypes = False, "k", None
    k._size_key = lambda args: args[2]
    k._for_bucket = lambda bucket, args: {"XBLOCK": 256, "num_warps": 4}
    k(_Ptr(0), _Ptr(16), 5000, 64)      # compiles through the JIT
    k(_Ptr(0), _Ptr(16), 6008, 80)      # same bucket, same specialization: direct
    k(_Ptr(0), _Ptr(16), 6000, 81)      # xnumel 6000 % 16 == 0: the JIT again
    k(_Ptr(0), _Ptr(16), 6016, 97)      # that class again (any size): its own direct launch
    k(_Ptr(0), _Ptr(16), 6016, 96)      # the size symbol is not specialized: direct
    k(_Ptr(0), _Ptr(16), 100000, 64)    # another bucket: the JIT first
    k(_Ptr(0), _Ptr(16), 6008, 80)      # a size seen before: direct again
    assert [j[:2] for j in jit] == [((20,), (5000, 64)), ((24,), (6000, 81)), ((391,), (100000, 64))]
    assert [d[:3] + d[-5:] for d in run.direct] == [(24, 1, 1, 0, 16, 6008, 80, 256), (24, 1, 1, 0, 16, 6016, 97, 256),
                                                    (24, 1, 1, 0, 16, 6016, 96, 256),
                                                    (24, 1, 1, 0, 16, 6008, 80, 256)]
