"""The GPU fast-launch paths of runtime/triton_runtime.py, with fake Triton launchers
(no GPU needed): argument order of the direct C launch, the alignment fallback, and
the fallback to ``CudaLauncher.__call__`` for launchers of another shape."""
from coil.runtime.triton_runtime import _direct_launch, _specialized_launch


class _Ptr:
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
    return _specialized_launch(run, 2, (7, 3), [128, 16], "FN", "META",
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
    f = _specialized_launch(run, 1, (5, 1), [64], "FN", "META", lambda dev: "s", 0,
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
