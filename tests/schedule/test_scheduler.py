"""Scheduler: fusion decisions (made and refused, with reasons), ordering, memory reuse."""
import torch
import torch.nn.functional as F

from codegen_helpers import check, compile_fn
from coil.config import patch
from coil.ir.symbols import FloorDiv, Mod, XINDEX, simplify_index
from coil.schedule.indexing import split_ranges


def r(*s):
    return torch.randn(*s)


def test_transposed_read_is_refused_with_reason():
    def f(x):
        y = (x * 2).exp()          # realized: read twice in different orders
        return y + 1, (y.t() * 3).contiguous()
    c = check(f, r(16, 16), atol=1e-4, max_inline_reads=0)   # realize y
    refused = [d for d in c.scheduler.decisions if d["decision"] == "refused"]
    assert any("written at" in d.get("reason", "") or "iteration spaces" in d.get("reason", "")
               for d in refused), c.scheduler.decisions


def test_refusal_reason_names_the_first_mismatched_read():
    # both transposed reads mismatch; the reason named whichever a set of names gave first, which changed between
    # processes (string hashes): the compile log differed run to run
    def f(x):
        a, b = (x * 2).exp(), (x * 3).exp()
        return a + b, (a.t() + b.t() * 3).contiguous()
    c = check(f, r(16, 16), atol=1e-4, max_inline_reads=0)
    reasons = [d["reason"] for d in c.scheduler.decisions if "written at" in d.get("reason", "")]
    assert reasons and all(x.startswith("buf3 reads buf0[") for x in reasons), c.scheduler.decisions


def test_every_decision_logged_with_bytes_saved():
    c = check(lambda x, w, b: F.layer_norm(x.relu() + 1, (32,), w, b), r(8, 32), r(32), r(32))
    assert c.kernel_count == 1
    for d in c.scheduler.decisions:
        assert d["decision"] in ("fused", "refused") and "bytes_saved" in d


def test_fusion_off_gives_one_kernel_per_buffer():
    f = lambda x: torch.softmax(x, -1)
    c = check(f, r(4, 8), fusion=False)
    assert c.kernel_count > 1


def test_reduction_epilogue_and_horizontal_fusion():
    def f(x, y):
        return x.sum(1) * 2, (x * y).sum(1), x.amax(1)   # three reductions over one read of x
    c = check(f, r(8, 64), r(8, 64), atol=1e-4)
    assert c.kernel_count == 1


def test_no_cycle_through_extern():
    def f(x, w):
        a = x.relu()
        b = a @ w              # extern between a and the add below
        return a.sum(1, keepdim=True) + b.sum(1, keepdim=True)
    check(f, r(8, 16), r(16, 4), atol=1e-4)


def test_buffer_reuse_in_wrapper():
    def f(x, w):
        a = (x @ w).relu()
        b = (a @ w).sigmoid()
        c = (b @ w).tanh()
        return (c @ w) + 1
    c = check(f, r(8, 8), r(8, 8), atol=1e-4)
    assert "# reuse" in c.source or "del " in c.source, c.source


def test_simplify_and_split_helpers():
    b = {XINDEX: 64}
    assert simplify_index(FloorDiv(XINDEX, 16) * 16 + Mod(FloorDiv(XINDEX, 4), 4) * 4 + Mod(XINDEX, 4), b) == XINDEX
    assert split_ranges([4, 8], 4) is not None and split_ranges([3, 5], 2) is None


def test_floordiv_pulls_out_exact_multiples():
    """``(r + 1024*(x // 3072)) // 512`` (GPT-2's split bias-gradient reductions on an
    H200) keeps the multiple of 512 inside the division unless the rest is provably
    below 512; floor division of ``m*b + rest`` is ``m + rest // b`` for any integer
    ``rest``, so it comes out, and the whole load index then folds to
    ``3072*r + 3145728*(x // 3072) + x % 3072``."""
    import random
    from coil.ir.symbols import RINDEX as r, XINDEX as x, FloorDiv, Mod, simplify_index
    e = 1572864 * FloorDiv(r + 1024 * FloorDiv(x, 3072), 512) + 3072 * Mod(r, 512) + Mod(x, 3072)
    s = simplify_index(e, {x: 12288, r: 1024})
    assert str(s) == "3072*rindex + 3145728*(xindex // 3072) + (xindex % 3072)", s
    rng = random.Random(0)
    for _ in range(300):
        xv, rv = rng.randrange(12288), rng.randrange(1024)
        assert int(s.subs({x: xv, r: rv})) == \
            1572864 * ((rv + 1024 * (xv // 3072)) // 512) + 3072 * (rv % 512) + xv % 3072


def test_dependency_cache_holds_only_the_last_graphs_buffers():
    """``indexing._deps_cache`` kept every scheduled buffer of every graph alive (a leak per
    compile); each scheduler now starts it afresh."""
    import weakref

    from coil.schedule import indexing

    c = check(lambda x: (x * 2).exp().sum(1) + 1, r(8, 16))
    old = [weakref.ref(b) for b, _ in indexing._deps_cache.values()]
    assert old, "the first graph's scheduling cached nothing"
    del c
    check(lambda x: torch.softmax(x + 1, -1), r(4, 8))
    import gc
    gc.collect()
    assert not any(w() is not None for w in old), "the first graph's buffers are still alive"
