"""Autotuning's timed launches run on copies of the kernel arguments that index exactly
like the originals (runtime/triton_runtime.py, ``scratch_copies``): a copy of a
non-dense view made with ``clone()`` is contiguous and smaller, and a kernel generated
for the view's strides read past its end (illegal memory access on an H200, GPT-2 called
with ``ids[:, :128]`` of an ``(8, 512)`` tensor)."""
import torch

from coil.runtime.triton_runtime import scratch_copies


def _same_layout(copy, orig):
    assert copy.shape == orig.shape and copy.stride() == orig.stride()
    assert copy.storage_offset() == orig.storage_offset()
    assert copy.dtype == orig.dtype and copy.device == orig.device
    assert copy.untyped_storage().nbytes() == orig.untyped_storage().nbytes()
    assert copy.untyped_storage().data_ptr() != orig.untyped_storage().data_ptr()
    # (``torch.empty`` outputs hold whatever was in memory, NaN included: NaN == NaN here)
    torch.testing.assert_close(copy, orig, rtol=0, atol=0, equal_nan=True)


def test_scratch_copies_keep_layout_of_sliced_ids():
    ids = torch.randint(0, 50257, (8, 512))
    view = ids[:, :128]
    (copy,) = scratch_copies((view,))
    _same_layout(copy, view)
    # what a kernel generated for the view reads: in_ptr0 + 512 * (x // 128) + x % 128
    x = torch.arange(8 * 128)
    flat = torch.empty(0, dtype=copy.dtype).set_(copy.untyped_storage())
    assert torch.equal(flat[512 * (x // 128) + x % 128], view.reshape(-1))


def test_scratch_copies_offsets_transposes_aliases_and_scalars():
    base = torch.randn(6, 10, dtype=torch.bfloat16)
    args = (base[2:, 3:7], base.t(), base[1], 7, 0.5, base.as_strided((3, 2), (0, 5), 4))
    out = scratch_copies(args)
    for c, a in zip(out, args):
        if isinstance(a, torch.Tensor):
            _same_layout(c, a)
        else:
            assert c is a
    # views of one storage share one copy (the kernel sees the same aliasing)
    ptrs = {c.untyped_storage().data_ptr() for c in out if isinstance(c, torch.Tensor)}
    assert len(ptrs) == 1
    # writes to the copies never reach the originals
    before = base.clone()
    for c in out:
        if isinstance(c, torch.Tensor):
            c.fill_(3)
    assert torch.equal(base, before)


def test_scratch_copies_copy_only_what_the_kernel_writes():
    """Arguments only read are passed as they are (autotuning allocated a copy of every weight a kernel read, memory
    the caching allocator kept reserved afterwards); a read argument sharing a storage with a written one shares that
    argument's copy, so the kernel still sees its aliasing."""
    w, x, out = torch.randn(64, 8), torch.randn(8), torch.empty(8)
    buf = torch.randn(16)
    args = (w, x, buf[:8], out, buf[8:])
    copies = scratch_copies(args, written=frozenset({3, 4}))
    for i in (0, 1):
        assert copies[i] is args[i]
    for i in (2, 3, 4):
        _same_layout(copies[i], args[i])
    assert copies[2].untyped_storage().data_ptr() == copies[4].untyped_storage().data_ptr()


def test_triton_launcher_knows_which_arguments_it_writes():
    """The Triton backend tells the launcher the positions of the arguments it stores to: its outputs, and an input
    an output is stored over in place."""
    import sys
    sys.path.insert(0, __file__.rsplit("/runtime/", 1)[0] + "/codegen")
    from codegen_helpers import aten_graph
    from coil.codegen import compile_aten_graph
    from coil.config import patch

    def fn(x, w):
        return torch.relu(x @ w).sum(-1), torch.sigmoid(x) * 2

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with patch(cpu_backend="triton"):
        c = compile_aten_graph(aten_graph(fn, x, w), [x, w], torch.device("cpu"))
    assert c.kernels
    for k in c.kernels:   # (no in-place outputs here) the outputs: the trailing arguments; inputs only read
        n, w = len(k.arg_names), k.launcher.written
        assert 0 < len(w) < n and w == frozenset(range(n - len(w), n)), (k.name, k.arg_names, w)
