"""L2 eviction hints in looped Triton reductions (codegen/triton/eviction.py)."""
import torch
import torch.nn.functional as F

from codegen_helpers import check
from coil.codegen.triton.eviction import add_eviction_hints


def test_hints_follow_later_and_earlier_loops():
    loops = [["tmp0 = tl.load(in_ptr0 + (rindex + 64 * xindex), rmask, other=0.0)",
              "tmp1 = tl.load(in_ptr1 + (rindex), rmask, other=0.0).to(tl.float32)"],
             ["tmp2 = tl.load(in_ptr0 + (rindex + 64 * xindex), rmask, other=0.0) * "
              "tl.load(in_ptr2 + (rindex))"]]
    first, second = add_eviction_hints(loops)
    assert first[0].endswith("other=0.0, eviction_policy='evict_last')")
    # loaded in one loop only: no hint, and the trailing .to() stays outside the call
    assert first[1] == loops[0][1]
    assert "tl.load(in_ptr0 + (rindex + 64 * xindex), rmask, other=0.0, eviction_policy='evict_first')" in second[0]
    assert second[0].endswith("tl.load(in_ptr2 + (rindex))")


def test_single_loop_unchanged():
    loops = [["a = tl.load(in_ptr0 + (rindex))", "b = tl.load(in_ptr0 + (rindex + 1))"]]
    assert add_eviction_hints(loops) == loops


def test_looped_layer_norm_and_softmax_hinted_and_correct():
    torch.manual_seed(0)
    # rows long enough to loop, and enough of them not to be split
    x, w, b = torch.randn(4096, 4100), torch.randn(4100), torch.randn(4100)
    for fn in (lambda x: torch.softmax(x * 2, -1), lambda x: F.layer_norm(x, (4100,), w, b)):
        c = check(fn, x, kernels=1, atol=1e-4, rtol=1e-4)
        src = c.kernels[0].source
        assert "for roffset in range" in src
        assert "eviction_policy='evict_last'" in src and "eviction_policy='evict_first'" in src, src
