"""Regressions from new-user trial 56b (FINDINGS_56b.md): dynamic shapes and training loops as a new user writes
them (symbolic slicing and views, cat/split, unbacked sizes, `.item()` control flow, pooling and convolutions over
dynamic spatial sizes, causal attention, optimizers over variable batches, changing Python numbers)."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn

import coil
from coil.capture.frame import stats


def _calls(fn, cf, argss):
    """Run ``fn`` eagerly and ``cf`` on deep copies of each argument tuple; compare outputs."""
    for args in argss:
        ae, ac = copy.deepcopy(args), copy.deepcopy(args)
        torch.testing.assert_close(cf(*ac), fn(*ae))


# ----------------------------------------------------------------------------- fixed


@pytest.mark.parametrize("dynamic", [None, True])
def test_as_tensor_of_a_changing_number_compiles_once(dynamic, coil_reset):
    """FINDINGS_56b #1: ``torch.as_tensor(n)`` of a symbolic int or float was traced into a constant, so every new
    value recompiled (the recompile limit then ran the frame eagerly); ``torch.tensor(n)`` kept one graph."""
    fn = lambda x, n: torch.as_tensor(n) + x  # noqa: E731
    cf = coil.compile(fn, dynamic=dynamic)
    _calls(fn, cf, [(torch.ones(2), n) for n in (1, 2, 3, 4, 5)])
    _calls(fn, cf, [(torch.ones(2), n) for n in (1.5, 2.5, 3.5, 4.5)])
    assert stats["frames"] <= (4 if dynamic is None else 2)


class _Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.step = 0

    def forward(self, x):
        self.step += 1
        return x * self.step


class _Memory(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mem", torch.zeros(0, 3))

    def forward(self, x):
        self.mem = torch.cat([self.mem, x])[-8:]
        return self.mem.mean(0) + x


@pytest.mark.parametrize("cls", [_Counter, _Memory])
def test_dynamic_true_makes_a_changing_module_attribute_symbolic(cls, coil_reset):
    """FINDINGS_56b #2: under ``dynamic=True`` a module's int attribute (a step counter) and a buffer that grows were
    never made symbolic (automatic dynamic ran only for ``dynamic=None``): one compile per value, then the recompile
    limit ran the module eagerly, while the default compiled twice."""
    me, mc = cls(), cls()
    cf = coil.compile(mc, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # (the recompile limit's warning)
        for _ in range(10):
            x = torch.randn(2, 3)
            torch.testing.assert_close(cf(x), me(x))
    assert stats["frames"] <= 3 and stats["eager_limit"] == 0


def test_divmod_and_shifts_of_a_symbolic_int_keep_one_graph(coil_reset):
    """FINDINGS_56b #3: ``divmod(n, 3)`` of a symbolic int was folded to constants (a guard ``n == 2``: one compile
    per value, then eager at the recompile limit); ``n >> 1`` and ``n << 2`` were graph breaks."""
    fn = lambda x, n: (x * divmod(n, 3)[1], x * divmod(17, n)[0], x * (n >> 1), x * (n << 2))  # noqa: E731
    cf = coil.compile(fn, dynamic=True)
    _calls(fn, cf, [(torch.randn(4), n) for n in (2, 3, 4, 5, 7, 9, -3, -8)])
    assert stats["frames"] <= 2 and stats["graph_breaks"] == 0


def test_negative_shift_count_still_raises(coil_reset):
    """The control of #3: a shift by a symbolic count stays a graph break, so ``3 >> n`` raises eager's ValueError for a
    negative ``n``."""
    cf = coil.compile(lambda x, n: x * (3 >> n), dynamic=True)
    torch.testing.assert_close(cf(torch.ones(2), 1), torch.ones(2))
    torch.testing.assert_close(cf(torch.ones(2), 2), torch.zeros(2))
    with pytest.raises(ValueError, match="negative shift count"):
        cf(torch.ones(2), -1)


def test_tensor_method_left_on_the_stack_by_a_break_is_traced(coil_reset):
    """FINDINGS_56b #4: a graph break inside a tensor method's argument list (``x.reshape(-1, int(k.item()))``) left
    the bound method on the stack; the resumed frame called it as an unknown C function, a second graph break that ran
    the method and everything after it in that frame eagerly."""
    def fn(x, w, k):
        h = x @ w
        return h.reshape(-1, int(k.item())).softmax(-1) * 2
    cf = coil.compile(fn)
    for k in (2, 3):
        args = (torch.randn(4, 3, requires_grad=True), torch.randn(3, 6, requires_grad=True), torch.tensor(k))
        ae, ac = copy.deepcopy(args), copy.deepcopy(args)
        want, got = fn(*ae), cf(*ac)
        torch.testing.assert_close(got, want)
        want.pow(2).sum().backward()
        got.pow(2).sum().backward()
        torch.testing.assert_close(ac[0].grad, ae[0].grad)
        torch.testing.assert_close(ac[1].grad, ae[1].grad)
    assert stats["graph_breaks"] == 1    # the .item() alone


# ----------------------------------------------------------------------------- open (xfail, strict)


def test_triu_indices_of_a_dynamic_size_compiles_once(coil_reset):
    """FINDINGS_56b #5."""
    fn = lambda x: torch.triu_indices(x.shape[0], x.shape[0]) * 2  # noqa: E731
    cf = coil.compile(fn, dynamic=True)
    _calls(fn, cf, [(torch.randn(n),) for n in (4, 6, 7, 9)])
    assert stats["frames"] == 1


def test_tril_indices_of_two_dynamic_sizes_and_an_offset_compiles_once(coil_reset):
    """FINDINGS_56b #5: the closed-form count of a rectangle's lower triangle past its diagonal (offset 1), int32."""
    fn = lambda x, y: torch.tril_indices(x.shape[0], y.shape[0], 1, dtype=torch.int32) + 1  # noqa: E731
    cf = coil.compile(fn, dynamic=True)
    _calls(fn, cf, [(torch.randn(n), torch.randn(m)) for n, m in ((4, 3), (6, 9), (7, 2), (9, 9), (2, 5))])
    assert stats["frames"] == 1


def test_clamp_of_half_by_a_changing_float_out_of_range_raises(coil_reset):
    """FINDINGS_56b #6: eager raises 'value cannot be converted to type c10::Half without overflow'; compiled with the
    float symbolic, the call returns a tensor (the same call with the float a constant runs eagerly and raises)."""
    fn = lambda h, s: torch.clamp(h, max=s)  # noqa: E731
    cf = coil.compile(fn, dynamic=True)
    h = torch.randn(4).half()
    torch.testing.assert_close(cf(h, 1.0), fn(h, 1.0))
    with pytest.raises(RuntimeError, match="without overflow"):
        fn(h, 70000.0)
    with pytest.raises(RuntimeError, match="without overflow"):
        cf(h, 70000.0)


def test_a_changing_float_checked_against_the_type_eager_converts_it_to(coil_reset):
    """FINDINGS_56b #6: masked_fill converts its value to float16 (70000.0 raises), leaky_relu its slope to float32
    (70000.0 runs, -1e300 raises); an in-range value after an out-of-range one compiles again."""
    h = torch.randn(4).half()
    fill = lambda h, s: h.masked_fill(h > 0, s)  # noqa: E731
    slope = lambda h, s: torch.nn.functional.leaky_relu(h, s)  # noqa: E731
    for fn, fmax in ((fill, 65504.0), (slope, 3.4e38)):
        cf = coil.compile(fn, dynamic=True)
        for s in (2.0, 70000.0, -1e300, 3.0):
            if abs(s) <= fmax:
                torch.testing.assert_close(cf(h, s), fn(h, s))
            else:
                with pytest.raises(RuntimeError, match="without overflow"):
                    cf(h, s)


def test_bitwise_and_of_a_symbolic_int_stays_in_the_graph(coil_reset):
    """FINDINGS_56b #7."""
    fn = lambda x, n: x * (n & 3)  # noqa: E731
    cf = coil.compile(fn, dynamic=True)
    _calls(fn, cf, [(torch.randn(4), n) for n in (2, 5, 7)])
    assert stats["graph_breaks"] == 0


def test_bitwise_or_xor_of_a_negative_symbolic_int_as_a_size(coil_reset):
    """FINDINGS_56b #7: `|` and `^` of a negative symbolic int, printed into a size, keep one graph."""
    fn = lambda x, n: torch.zeros((n | 1) + (n ^ -5) + 12) + x.sum()  # noqa: E731
    cf = coil.compile(fn, dynamic=True)
    _calls(fn, cf, [(torch.randn(4), n) for n in (-6, -3, 2, 5)])
    assert stats["graph_breaks"] == 0 and stats["frames"] == 1


def test_invert_of_a_symbolic_int_stays_in_the_graph(coil_reset):
    """``~n`` of a symbolic int was a graph break (the note on FINDINGS_56b #7): it is ``-n - 1``, negative values
    included."""
    fn = lambda x, n: x * (~n) + torch.zeros(~n + 20)[:4]  # noqa: E731
    cf = coil.compile(fn, dynamic=True)
    _calls(fn, cf, [(torch.randn(4), n) for n in (-6, -3, 2, 5)])
    assert stats["graph_breaks"] == 0 and stats["frames"] == 1
