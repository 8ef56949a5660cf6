"""Regressions for open observations of new-user trials 63-65 (FINDINGS_63.md, FINDINGS_64.md, FINDINGS_65.md),
closed afterwards: random draws of a graph that reruns eagerly inside ``try``, ...
"""

import contextlib
import random

import pytest
import torch

import coil


# ---------------------------------------------------------------------------------------------------------------
# FINDINGS_63 (trial 63's limit of finding 4): a graph made inside ``try`` that raises at run time reruns the frame
# eagerly; the graph's draws (torch's default generator, Python's ``random``) were drawn a second time, so the stream
# after the call differed from eager's.
# ---------------------------------------------------------------------------------------------------------------

def test_graph_rerun_eagerly_in_try_draws_once(coil_reset):
    def f(x, i):
        try:
            return torch.rand(3) + x[i] * random.random()
        except IndexError:
            return torch.zeros(3)

    cf = coil.compile(f)
    x = torch.ones(4)
    for i in (0, 9):
        streams = []
        for fn in (f, cf):
            torch.manual_seed(0)
            random.seed(0)
            fn(x, torch.tensor(i))
            streams.append((torch.rand(2), random.random()))
        if i == 9:      # (the graph's own draws differ from eager's unless fallback_random; its error path does not)
            torch.testing.assert_close(streams[1][0], streams[0][0], rtol=0, atol=0)
        assert streams[1][1] == streams[0][1]


# ---------------------------------------------------------------------------------------------------------------
# FINDINGS_64: ``1.0 / n.item()`` with ``capture_scalar_outputs`` and ``n`` 0 gave inf where Python raises
# ZeroDivisionError (trial 63's nonzero guard covers backed symbols only; an ``.item()`` is unbacked).
# ---------------------------------------------------------------------------------------------------------------

def test_python_division_by_an_item_that_is_zero_raises(coil_reset):
    fns = [lambda x, n: x * (1.0 / n.item()),        # an int read: "float division by zero"
           lambda x, n: x * (3 / n.item()),          # int / int: "division by zero"
           lambda x, n: x * (n.item() ** -1)]        # "0.0 cannot be raised to a negative power"
    with coil.config.patch(capture_scalar_outputs=True):
        for fn, n in [(f, torch.tensor(2)) for f in fns] + [(fns[0], torch.tensor(2.0))]:    # (and a float read)
            cf = coil.compile(fn)
            x = torch.ones(3)
            torch.testing.assert_close(cf(x, n), fn(x, n))
            with pytest.raises(ZeroDivisionError) as ref:
                fn(x, n * 0)
            with pytest.raises(ZeroDivisionError, match=str(ref.value)):
                cf(x, n * 0)


# ---------------------------------------------------------------------------------------------------------------
# FINDINGS_63 (trial 63's limit of finding 4): ``with contextlib.suppress(IndexError):`` around an op whose error is
# data-dependent (``x[i]`` out of range) let coil's kernel error out: only ``try`` blocks marked a graph to rerun
# eagerly. A with block whose ``__exit__`` may swallow the error (not coil's no_grad / autocast regions, nor a
# @contextmanager whose generator catches nothing) marks it now.
# ---------------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _catching():
    try:
        yield
    except IndexError:
        pass


def test_suppress_around_a_data_dependent_error(coil_reset):
    for cm in (lambda: contextlib.suppress(IndexError), _catching):
        def f(x, i):
            y = x * 2
            with cm():
                y = x[i]
            return y

        cf = coil.compile(f)
        x = torch.ones(4)
        for i in (1, 9):
            torch.testing.assert_close(cf(x, torch.tensor(i)), f(x, torch.tensor(i)))


class _ExitFalse:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _ExitTrue(_ExitFalse):
    def __exit__(self, *exc):
        return True


def test_with_blocks_whose_exit_swallows_nothing_stay_out_of_try(coil_reset, tmp_path):
    """contextlib.nullcontext (common: ``ctx = autocast() if amp else nullcontext()``), a context manager object passed
    in, and an ``__exit__`` returning False cannot swallow an error: their graphs keep in-place input writes and are
    not marked to rerun eagerly (``graph_in_try``); one whose ``__exit__`` returns True is."""
    import json
    import os

    from coil import trace

    def f(x, ctx):
        with ctx:
            x.add_(1)
            return x.sin()

    old = trace.trace_dir()
    for k, (ctx, marked) in enumerate([(contextlib.nullcontext(), False), (torch.no_grad(), False),
                                       (_ExitFalse(), False), (_ExitTrue(), True)]):
        coil.reset()
        trace.set_dir(str(tmp_path / str(k)))
        try:
            x = torch.randn(4)
            ref = x + 1
            torch.testing.assert_close(coil.compile(f)(x, ctx), ref.sin())
            torch.testing.assert_close(x, ref)
        finally:
            trace.set_dir(old)
        events = [json.loads(line)["event"] for n in os.listdir(tmp_path / str(k)) if n.endswith(".jsonl")
                  for line in open(tmp_path / str(k) / n)]
        assert ("graph_in_try" in events) == marked, (type(ctx).__name__, events)


# ---------------------------------------------------------------------------------------------------------------
# FINDINGS_65: ``x.detach()`` of an input came back as an autograd view (``_is_view()`` True, ``_base`` the input)
# where eager's is none; ``x.detach()[1:]`` of an input that requires grad came back as no view where eager's is one.
# ---------------------------------------------------------------------------------------------------------------

def test_detach_of_an_input_is_no_view(coil_reset):
    fns = [lambda x: x.detach(), lambda x: x[1:].detach(), lambda x: x.detach()[1:],
           lambda x: (x.exp(), x.exp().detach())[1]]
    for fn in fns:
        for rg in (False, True):
            cf = coil.compile(fn)
            x = torch.randn(2, 4, requires_grad=rg)
            ref, out = fn(x), cf(x)
            assert (out._is_view(), out.requires_grad, out.storage_offset()) == \
                (ref._is_view(), ref.requires_grad, ref.storage_offset())
            torch.testing.assert_close(out, ref)
    y = coil.compile(fns[0])(x)
    v = x._version
    y.add_(1)       # (shares the input's version counter, as eager's)
    assert x._version > v


# ---------------------------------------------------------------------------------------------------------------
# FINDINGS_65: an output written in place whose memory holds a value eager's autograd saved for the backward that
# then runs (``x.exp().t()``: exp saves its result): eager's backward raises its version error; coil's backward used
# its own saved copy and succeeded (with the gradient of the unwritten value).
# ---------------------------------------------------------------------------------------------------------------

def test_backward_after_writing_an_output_eager_saved_raises(coil_reset):
    def views(x):
        b = x * 3
        return x.exp().t(), b.t(), b.sin()

    cf = coil.compile(views)
    for loss, raises in [(lambda o: o[0].sum(), True),     # exp's saved result, through the output's view
                         (lambda o: o[2].sum(), True),     # sin's saved input b, written through the output b.t()
                         (lambda o: o[1].sum(), False)]:   # b's own backward (a product by 3) saves nothing of b
        results = []
        for fn in (views, cf):
            x = torch.randn(2, 3, requires_grad=True)
            out = fn(x)
            out[0].add_(1)
            out[1].add_(1)
            try:
                loss(out).backward()
                results.append("ok")
            except RuntimeError as e:
                assert "modified by an inplace operation" in str(e)
                results.append("raise")
        assert results == ["raise" if raises else "ok"] * 2


# ---------------------------------------------------------------------------------------------------------------
# FINDINGS_64, left open there: ``1.0 / x.nonzero().shape[0]`` at no nonzero element (AOT retraced nonzero into a
# new symbol, which capture's divisor check did not name) gave nan; it raises eager's ZeroDivisionError now.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("grad", [False, True])
def test_division_by_a_count_of_nonzeros_that_is_zero_raises(coil_reset, grad):
    def f(x):
        return x * (1.0 / x.nonzero().shape[0])
    cf = coil.compile(f)
    x = torch.tensor([1.0, 0.0, 2.0], requires_grad=grad)
    torch.testing.assert_close(cf(x), f(x))
    with pytest.raises(ZeroDivisionError):
        cf(torch.zeros(3, requires_grad=grad))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 0), (0, 3), (2, 0, 4)])
def test_low_precision_log_softmax_of_an_empty_tensor(coil_reset, dtype, shape):
    """Trial 66's CPU rounding decomposition of fp16 / bf16 log_softmax took amax over an empty last dim and failed
    to compile (fuzz seed 2028 #341); eager returns the empty result."""
    x = torch.empty(shape, dtype=dtype)
    for fn in (lambda t: torch.log_softmax(t, -1), lambda t: torch.log_softmax(t, 0)):
        out = coil.compile(fn)(x)
        assert out.shape == fn(x).shape and out.dtype == dtype
