"""Regressions found by the lead (smallest failing inputs)."""
import torch

import coil


def test_bench_models_are_traced_like_user_code():
    """The bench suite's own SmallGPT broke into 4 graphs with 4 breaks ("call to
    coil.bench.models.forward (not traced)"): capture skipped every coil.* module."""
    from coil.bench.models import SmallGPT

    torch.manual_seed(0)
    m = SmallGPT(100, 32, 4, 2, 32).eval()
    ids = torch.randint(0, 100, (2, 16))
    e = coil.explain(m, ids)
    assert e.graph_count == 1 and e.graph_break_count == 0, str(e)[:2000]
    out = coil.compile(m, backend="eager")(ids)
    torch.testing.assert_close(out, m(ids))


def test_nested_tensor_list_in_op_result_is_real():
    """torch.histogramdd returns a structseq whose bin_edges is a list of tensors; those
    came back to the user as FakeTensors (conformance's one mismatch)."""
    import coil

    def f(x):
        return torch.histogramdd(x, bins=[3, 3])

    x = torch.randn(10, 2)
    for backend in ("eager", "coil"):
        coil.reset()
        out = coil.compile(f, backend=backend)(x)
        ref = f(x)
        assert type(out) is type(ref)
        torch.testing.assert_close(out.hist, ref.hist)
        for a, b in zip(out.bin_edges, ref.bin_edges):
            assert type(a) is torch.Tensor
            torch.testing.assert_close(a, b)


def test_record_function_block_is_captured():
    """Optimizers wrap step() in torch.autograd.profiler.record_function; it was an
    unsupported context manager, so the whole wrapper frame ran eagerly (user report 2,
    finding 7; step() still breaks later, at itertools.chain)."""
    import coil

    def f(x):
        with torch.autograd.profiler.record_function("my_range"):
            y = x * 2
        return y + 1

    x = torch.randn(4)
    e = coil.explain(f, x)
    assert e.graph_count == 1 and e.graph_break_count == 0, e
    coil.reset()
    torch.testing.assert_close(coil.compile(f)(x), f(x))


def test_itertools_chain_is_traced():
    """itertools.chain was an unsupported class construction (a graph break); optimizers
    use it over their step hooks."""
    import itertools

    import coil

    def f(a, b):
        return sum(itertools.chain([a, b], (a * 2,)))

    x, y = torch.randn(3), torch.randn(3)
    e = coil.explain(f, x, y)
    assert e.graph_count == 1 and e.graph_break_count == 0, e
    coil.reset()
    torch.testing.assert_close(coil.compile(f)(x, y), f(x, y))


def test_explain_after_the_recompile_limit_captures_afresh():
    """A frame past its recompile limit runs eagerly; coil.explain of it reused that state and reported
    "Graph count: 0" with no reason. explain captures with a fresh cache (the frame's own is kept)."""
    import warnings

    def f(x, n):
        return x * n + len(str(n))  # n specialized: a recompile per value

    cf = coil.compile(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in range(12):
            cf(torch.ones(2), n)
    e = coil.explain(f, torch.ones(2), 3)
    assert e.graph_count == 1 and e.graph_break_count == 0
    torch.testing.assert_close(cf(torch.ones(2), 20), torch.full((2,), 22.0))  # still eager, still right
