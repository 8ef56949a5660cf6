"""coil's differential fuzzer: the generator, the comparison, the minimizer, and a
fixed-seed sample of programs through the C++ and Triton backends (docs/fuzzing.md)."""
import math

import pytest
import torch

from coil.bench import fuzz
from coil.bench.fuzz import Input, Program, Stmt, _drop, check, check_program, generate, minimize
from coil.bench.fuzz_ops import DTYPES, FAMILIES, literal

#: The CI sample: programs ``range(SAMPLE)`` of seed ``SEED``.
SEED, SAMPLE, TRITON_SAMPLE = 16, 40, 6
#: index -> why, for sample programs that hit a known open bug (strict: fixed -> remove).
KNOWN_CPP: dict = {}
KNOWN_TRITON: dict = {}


def _xfail(known: dict, i: int):
    marks = [pytest.mark.xfail(strict=True, reason=known[i])] if i in known else []
    return pytest.param(i, marks=marks)


@pytest.mark.parametrize("i", [_xfail(KNOWN_CPP, i) for i in range(SAMPLE)])
def test_sample_cpp(i):
    r = check_program(generate(SEED, i), "cpp")
    assert r.outcome in ("ok", "both_raise"), f"{r.outcome}: {r.kind}\n{r.detail}"


@pytest.mark.parametrize("i", [_xfail(KNOWN_TRITON, i) for i in range(TRITON_SAMPLE)])
def test_sample_triton(i):
    r = check_program(generate(SEED, i), "triton")
    assert r.outcome in ("ok", "both_raise"), f"{r.outcome}: {r.kind}\n{r.detail}"


#: The gradient-mode sample (``cpp+grad``, docs/fuzzing.md): programs ``range(GRAD_SAMPLE)`` of ``SEED``.
GRAD_SAMPLE = 20


@pytest.mark.parametrize("i", range(GRAD_SAMPLE))
def test_sample_cpp_gradients(i):
    r = check_program(generate(SEED, i), "cpp+grad")
    assert r.outcome in ("ok", "both_raise"), f"{r.outcome}: {r.kind}\n{r.detail}"


class _TwiceTheGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_grad_mode_reports_a_wrong_gradient_and_a_lost_requires_grad(monkeypatch):
    def fn(a):
        return (a * 3,)

    inputs = lambda: [torch.tensor([1.0, -2.0])]  # noqa: E731
    monkeypatch.setattr(fuzz, "compile_for", lambda f, b: lambda a: (_TwiceTheGradient.apply(f(a)[0]),))
    r = check(fn, inputs, "cpp+grad")
    assert (r.outcome, r.kind) == ("mismatch", "grad-value") and r.detail.startswith("grad of input 0:"), r
    assert check(fn, inputs, "cpp").outcome == "ok"  # the values are eager's
    monkeypatch.setattr(fuzz, "compile_for", lambda f, b: lambda a: (f(a)[0].detach(),))
    r = check(fn, inputs, "cpp+grad")
    assert (r.outcome, r.kind) == ("mismatch", "grad-requires"), r
    assert "grad of input 0: None vs eager tensor" in r.detail


def test_grad_mode_makes_inputs_leaves_or_views_of_a_cloned_leaf():
    """Half the keys: float inputs are leaves (in-place writes raise eager's error); the other half: views of a
    clone of a leaf holding their storage (the write goes through autograd and is copied back)."""
    def fn(a, n):
        a.mul_(2)
        return (a * a, n)

    seen = set()
    for key in range(8):
        a = torch.tensor([[1.0, 3.0], [5.0, 7.0]]).t()
        try:
            (out, n), rg, (ga, gn) = fuzz._with_grads(fn, key)(a, torch.tensor([1]))
        except RuntimeError as e:
            assert "leaf Variable" in str(e)
            seen.add("leaf")
            continue
        seen.add("view")
        assert a.tolist() == [[2.0, 10.0], [6.0, 14.0]] and a.stride() == (1, 2)  # written back, same layout
        assert rg == [True] and gn is None and ga.shape == (4,) and bool((ga != 0).all())
    assert seen == {"leaf", "view"}



def test_grad_mode_draws_come_from_seed_and_index_and_survive_minimization(monkeypatch):
    """Gradient mode's leaf-or-view draw and cotangents are seeded by the program's (seed, index), not by its source:
    a smaller variant the minimizer checks (a statement dropped) is checked under the original program's draws, and
    its repro file replays under them too."""
    keys = []
    real = fuzz._with_grads
    monkeypatch.setattr(fuzz, "_with_grads", lambda fn, key=0: (keys.append(key), real(fn, key))[1])
    prog = generate(SEED, 3)
    assert prog.grad_key is not None and prog.grad_key == generate(SEED, 3).grad_key != generate(SEED, 4).grad_key
    small = _drop(prog, len(prog.stmts) - 1)
    assert small.fn_source() != prog.fn_source() and small.grad_key == prog.grad_key
    monkeypatch.setattr(fuzz, "compile_for", lambda f, b: f)  # (eager twice: the draws are what is looked at)
    for p in (prog, small):
        keys.clear()
        check_program(p, "cpp+grad")
        assert keys and set(keys) == {prog.grad_key}, keys
    src = small.source(fuzz.Result("mismatch", "cpp+grad", "grad-value"))
    assert f"replay(fn, make_inputs, 'cpp+grad', grad_key={prog.grad_key})" in src
    keys.clear()
    exec(src.replace('__name__ == "__main__"', "True"), {})
    assert keys and set(keys) == {prog.grad_key}, keys
    # a function without a program (a hand-written repro) still draws from its source
    keys.clear()
    check(small.function(), small.make_inputs, "cpp+grad")
    assert keys and prog.grad_key not in keys


# ------------------------------------------------------------------ generator

def test_programs_are_replayable_from_seed_and_index():
    a, b = generate(3, 7), generate(3, 7)
    assert a.source() == b.source()
    assert generate(3, 8).source() != a.source()
    ns = {}
    exec(a.source(), ns)  # the repro text rebuilds the same inputs, bit for bit
    for x, y in zip(ns["make_inputs"](), a.make_inputs()):
        assert x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype
        assert torch.equal(x.isnan(), y.isnan()) and bool(((x == y) | x.isnan()).all())


def test_generator_covers_every_family_and_dtype():
    fams, dtypes, layouts = set(), set(), set()
    for i in range(120):
        p = generate(0, i)
        fams |= p.families()
        dtypes |= {inp.base.dtype for inp in p.inputs}
        layouts |= {inp.suffix[:2] if inp.suffix[:1] == "." else inp.suffix[:1] for inp in p.inputs}
        assert 1 <= len(p.inputs) <= 4 and 1 <= len(p.stmts) <= 8
    assert fams == set(FAMILIES)
    assert dtypes == set(DTYPES)
    assert layouts == {"", ".t", ".p", ".e", "["}


def test_family_filter():
    for i in range(10):
        assert generate(1, i, families=["reduction"]).families() == {"reduction"}
    with pytest.raises(ValueError):
        generate(1, 0, families=["nope"])


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.itemsize]) \
        if t.is_floating_point() else t


@pytest.mark.parametrize("dtype", DTYPES)
def test_literal_round_trips_special_values(dtype):
    vals = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 0.1, 1e-40, 65504.0, 3.0e38],
                        dtype=torch.float64)
    t = vals.to(dtype) if dtype.is_floating_point else torch.tensor([0, 1, 255, 7, 0, 1]).to(dtype)
    for x in (t, t.reshape(2, -1), t[:0].reshape(0, 3), t[0]):
        back = eval(literal(x), {"torch": torch, "nan": math.nan, "inf": math.inf})
        assert back.dtype == x.dtype and back.shape == x.shape
        assert torch.equal(_bits(back), _bits(x))


# ------------------------------------------------------------------ comparison

def _fake(transform):
    """A fake compiler: runs ``fn`` eagerly, then lets ``transform(source, out, args)`` act."""
    import inspect

    def compiler(fn):
        src = inspect.getsource(fn)

        def run(*args):
            return transform(src, fn(*args), args)
        return run
    return compiler


def _prog(lines, *inputs, returns=None):
    ins = [Input(n, t) for n, t in zip("abcd", inputs)]
    stmts = [Stmt(line, "pointwise") for line in lines]
    rets = returns if returns is not None else sorted({d for s in stmts for d in s.defs})
    return Program(ins, stmts, rets, "test")


def test_outcomes_are_classified():
    p = _prog(["v0 = a * 2"], torch.randn(3))
    assert check_program(p, _fake(lambda s, o, a: o)).outcome == "ok"
    bad = check_program(p, _fake(lambda s, o, a: (o[0] + 1,)))
    assert (bad.outcome, bad.kind) == ("mismatch", "out-value")
    assert check_program(p, _fake(lambda s, o, a: (o[0].half(),))).kind == "out-dtype"
    assert check_program(p, _fake(lambda s, o, a: (o[0][:2],))).kind == "out-shape"

    def boom(s, o, a):
        raise KeyError("planted")
    err = check_program(p, _fake(boom))
    assert err.outcome == "error" and err.kind.startswith("KeyError")
    raising = _prog(["v0 = a.view(5)"], torch.randn(3))
    assert check_program(raising, _fake(lambda s, o, a: o)).outcome == "both_raise"
    assert check_program(raising, lambda fn: (lambda *a: ())).outcome == "missing_error"


def test_input_mutation_aliasing_and_metadata_are_compared():
    p = _prog(["a.add_(1)", "v0 = a.t()"], torch.randn(2, 3))
    assert check_program(p, _fake(lambda s, o, a: o)).outcome == "ok"
    copied = check_program(p, _fake(lambda s, o, a: (o[0].clone(),)))
    assert copied.kind == "out-alias"  # the output must stay a view of input 0
    forgot = _prog(["a.add_(1)", "v0 = a * 1"], torch.randn(2, 3))
    assert check_program(forgot, _fake(lambda s, o, a: (a[0].sub_(1), o)[1])).kind == "input-value"
    meta = _prog(["a.t_()"], torch.randn(2, 3), returns=[])
    assert check_program(meta, _fake(lambda s, o, a: (a[0].t_(), o)[1])).kind == "input-meta"


def test_low_precision_accepts_fp32_intermediates_only():
    p = _prog(["v0 = a * 3", "v1 = v0 / 7", "v2 = v1 > 0.4"], torch.randn(64).half(),
              returns=["v1", "v2"])

    def fp32_inside(s, o, a):  # what a fusing compiler does: no rounding in between
        v1 = (a[0].float() * 3 / 7)
        return v1.half(), v1 > 0.4
    assert check_program(p, _fake(fp32_inside)).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, a: (o[0] * 1.01, o[1]))).kind == "out-value"


def test_low_precision_nan_from_eagers_rounding_accepts_the_fp32_value_only():
    """fuzz seed 95 #689: bf16 logsumexp of (-0.1123, -2.23) rounds to -0.0015 in eager
    (fp32: +0.00083), so ``v0 ** a`` is NaN in eager and 2.22 with fp32 intermediates:
    accepted where it matches the fp32 reference, not a value that does not."""
    a = torch.tensor([[-0.1123], [-2.23]], dtype=torch.bfloat16)
    p = _prog(["v0 = torch.logsumexp(a, dim=0)", "v1 = v0 ** a"], a, returns=["v1"])

    def fp32_inside(s, o, args):
        x = args[0].float()
        return ((torch.logsumexp(x, 0) ** x).bfloat16(),)
    assert torch.isnan(p.function()(*p.make_inputs())[0]).any()
    assert check_program(p, _fake(fp32_inside)).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, args: (fp32_inside(s, o, args)[0] * 1.5,))
                         ).kind == "out-value"


# ------------------------------------------------------------------ minimizer

def test_minimizer_shrinks_a_planted_failure_to_its_statement():
    def sigmoid_is_wrong(src, out, args):
        return tuple(o + 1 if "sigmoid" in src and o.is_floating_point() else o for o in out)
    p = _prog(["v0 = a * 2", "v1 = torch.cumsum(v0, 0)", "v2 = torch.sigmoid(b)",
               "v3 = v1 + v2", "a.mul_(3)", "v4 = v3.sum(1)"],
              torch.randn(4, 5, dtype=torch.float64), None, returns=["v4", "v1"])
    p.inputs[1] = Input("b", torch.full((5, 4), 0.37, dtype=torch.float16), ".t()")
    sig = check_program(p, _fake(sigmoid_is_wrong)).signature
    assert sig.startswith("mismatch:")
    small = minimize(p, _fake(sigmoid_is_wrong), sig)
    assert [s.text for s in small.stmts] == ["v2 = torch.sigmoid(b)"]
    assert small.returns == ["v2"] and [i.name for i in small.inputs] == ["b"]
    b = small.inputs[0]
    assert b.suffix == "" and b.base.numel() == 1 and b.base.dtype == torch.float32
    assert "def fn(b):" in small.source() and check_program(small, _fake(sigmoid_is_wrong)).signature == sig


def _broken(fn, backend):  # a planted compiler: every program "fails"
    return lambda *a: (_ for _ in ()).throw(ValueError("planted"))


def test_cli_writes_repros_and_a_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fuzz, "compile_for", _broken)
    rc = fuzz.main(["--count", "3", "--seed", "5", "--backends", "cpp",
                    "--out", str(tmp_path), "--no-minimize"])
    out = capsys.readouterr().out
    assert rc == 1 and "all programs" in out and "distinct failure signature" in out
    repros = sorted(tmp_path.glob("error-cpp-s5-*.py"))
    assert repros and "ValueError: planted" in repros[0].read_text()
    ns = {}
    exec(repros[0].read_text(), ns)
    assert callable(ns["fn"]) and ns["make_inputs"]()


def test_aot_eager_failures_torch_shares_are_upstream(tmp_path, capsys, monkeypatch):
    real = fuzz.compile_for
    monkeypatch.setattr(fuzz, "compile_for", _broken)  # coil's aot_eager and torch's alike
    rc = fuzz.main(["--count", "2", "--seed", "5", "--backends", "aot_eager",
                    "--out", str(tmp_path), "--no-minimize"])
    out = capsys.readouterr().out
    assert rc == 0 and "upstream on aot_eager" in out and "0 distinct failure" in out
    assert len(list(tmp_path.glob("upstream-aot_eager-s5-*.py"))) == 2

    def coil_only(fn, backend):  # torch's compiler runs it: coil's failure
        return _broken(fn, backend) if backend == "aot_eager" else real(fn, backend)
    monkeypatch.setattr(fuzz, "compile_for", coil_only)
    assert fuzz.main(["--count", "1", "--seed", "5", "--backends", "aot_eager", "--out",
                      str(tmp_path / "b"), "--no-minimize"]) == 1


def test_eager_error_in_dead_code_is_not_a_missing_error():
    dead = _prog(["v0 = torch.argmin(a > 0, dim=0)", "v1 = a + 1"], torch.randn(3), returns=["v1"])
    assert check_program(dead, lambda fn: (lambda *a: (a[0] + 1,))).outcome == "ok"
    live = _prog(["v0 = torch.argmin(a > 0, dim=0)"], torch.randn(3), returns=["v0"])
    assert check_program(live, lambda fn: (lambda *a: (a[0],))).outcome == "missing_error"
    # read only by dead code (fuzz seed 90 #1299), or by a live in-place update
    chain = _prog(["v0 = a.as_strided((2,), (0,), 3)", "v1 = torch.isinf(v0)"], torch.tensor(3.0),
                  returns=[])
    assert check_program(chain, lambda fn: (lambda *a: ())).outcome == "ok"
    used = _prog(["v0 = a.as_strided((2,), (0,), 3)", "v1 = a.add_(v0.sum())"], torch.tensor(3.0),
                 returns=[])
    assert check_program(used, lambda fn: (lambda *a: ())).outcome == "missing_error"


def test_overflow_only_in_eager_is_accepted_but_not_the_reverse():
    p = _prog(["v0 = a * 2"], torch.tensor([2e38, 1.0]))
    more_exact = check_program(p, _fake(lambda s, o, a: (torch.tensor([3e38, 2.0]),)))
    assert more_exact.outcome == "ok"
    q = _prog(["v0 = a * 1"], torch.tensor([2e38, 1.0]))
    assert check_program(q, _fake(lambda s, o, a: (o[0] * 2,))).kind == "out-value"


def _layer_norm_huge(c):
    return (torch.nn.functional.layer_norm(c, (2, 1, 2)),)


def _huge():
    return [torch.tensor([[[1.0, 1.0]], [[1.0, -1.839752e+38]]])]


def test_float64_statistics_are_compared_with_the_float64_reference():
    """eager's float32 layer_norm statistics overflow (NaN); coil's follow float64
    (docs/ir.md, Numerics): accepted where compiled is the float64 result, not otherwise."""
    assert check(_layer_norm_huge, _huge, "cpp").outcome == "ok"
    truth = _fake(lambda s, o, a: (torch.nn.functional.layer_norm(a[0].double(), (2, 1, 2)).float(),))
    assert check(_layer_norm_huge, _huge, truth).outcome == "ok"
    off = _fake(lambda s, o, a: (torch.nn.functional.layer_norm(a[0].double(), (2, 1, 2)).float() + 1,))
    assert check(_layer_norm_huge, _huge, off).kind == "out-value"
    p = _prog(["v0 = a * a - a * a"], torch.tensor([3e38, 1.0]))  # eager nan, no statistics
    assert check_program(p, _fake(lambda s, o, a: (torch.zeros(2),))).kind == "out-value"


def test_overflow_of_a_sum_order_only_in_compiled_is_accepted_near_max():
    big = torch.tensor([8.342427329182142e+307, 5.438791412164458e+307, 4.600727226807608e+307,
                        -1.52426936791223e+308], dtype=torch.float64)
    p = _prog(["v0 = a.sum(0, keepdim=True)"], big)
    assert check_program(p, _fake(lambda s, o, a: (torch.full((1,), math.inf, dtype=torch.float64),))
                         ).outcome == "ok"
    wrong_sign = _fake(lambda s, o, a: (torch.full((1,), -math.inf, dtype=torch.float64),))
    assert check_program(p, wrong_sign).kind == "out-value"
    nan = _fake(lambda s, o, a: (torch.full((1,), math.nan, dtype=torch.float64),))
    assert check_program(p, nan).outcome == "ok"  # +inf and -inf partial sums met
    small = _prog(["v0 = a.sum(0, keepdim=True)"], torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert check_program(small, nan).kind == "out-value"
    q = _prog(["v0 = a[:1] * 1"], big)  # no sum: an overflow is a mismatch
    assert check_program(q, _fake(lambda s, o, a: (o[0] * math.inf,))).kind == "out-value"


def test_sum_that_cancels_is_compared_within_the_summation_error_bound():
    """fuzz seed 24 #392: float32 mean of int64 values near ±2^63 that cancel: eager's
    lanes give 2/5, coil's 0, both within float32's rounding of the summands (eager gives
    0 too for the same values followed by zeros). Accepted within n * eps * sum(|x|) for
    an output that a sum returns, and what it feeds (``_Bounds._spread``); not beyond."""
    big = torch.tensor([[4, -5, -9223372036854775803, 2, 9223372036854775804]]).t()
    p = _prog(["v0 = torch.mean(a, dim=0, dtype=torch.float32)"], big)
    assert check_program(p, _fake(lambda s, o, a: (torch.zeros(1),))).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, a: (torch.full((1,), 1e15),))).kind == "out-value"
    q = _prog(["v0 = torch.mean(a, dim=0, dtype=torch.float32) + 0.5"], big)  # the bound follows
    assert check_program(q, _fake(lambda s, o, a: (torch.full((1,), 0.5),))).outcome == "ok"
    assert check_program(q, _fake(lambda s, o, a: (torch.full((1,), 1e15),))).kind == "out-value"
    small = _prog(["v0 = a.sum(0)"], torch.tensor([1.0, -1.0, 1e-3]))
    assert check_program(small, _fake(lambda s, o, a: (o[0] + 1e-4,))).kind == "out-value"


def test_summation_bound_follows_views_and_casts_in_the_sum_dtype():
    """fuzz seed 90 #3523: a float32 row sum whose summands of each sign pass float32's max,
    read through ``split``: an order that overflows to -inf is accepted as for the sum
    itself. #4942: a float32 sum cast to float64 differs by float32's rounding (2.4e-7
    relative): the bound uses the dtype the sum was computed in, not the output's. An
    in-place update of the sum drops it; other ops on it still get no allowance."""
    row = torch.tensor([[1.0] * 5, [-8.8585e37, -2.5474775e38, 1.4195666e38, 1.0, 2.800384e38]])
    p = _prog(["v0 = torch.sum(a, dim=1)", "v1, v2 = torch.split(v0, [1, 1], 0)"], row,
              returns=["v2"])
    assert check_program(p, _fake(lambda s, o, a: (o[0] * 0 - math.inf,))).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, a: (o[0] * 0 + 1e30,))).kind == "out-value"
    x = torch.linspace(-3, 2, 30)
    q = _prog(["v0 = torch.sum(a).to(torch.float64)"], x)
    assert check_program(q, _fake(lambda s, o, a: (o[0] * (1 + 2.4e-7),))).outcome == "ok"
    assert check_program(q, _fake(lambda s, o, a: (o[0] * (1 + 1e-4),))).kind == "out-value"
    r = _prog(["v0 = torch.sum(a).to(torch.float64)", "v0.mul_(2)"], x, returns=["v0"])
    assert check_program(r, _fake(lambda s, o, a: (o[0] * (1 + 2.4e-7),))).kind == "out-value"


def test_remainder_by_a_computed_divisor_moves_by_the_quotient():
    """fuzz seed 81 #2280: fmod(a, gelu(a)) at -3: eager's vectorized GELU is 143 ulp from
    the exact value (its scalar tail 1), coil's 48; the quotient 740 carries that into the
    remainder (-0.00283 vs -0.00310). Accepted within the divisor's tolerance times the
    dividend; not beyond it, nor where the divisor is an input (the same bits both sides)."""
    x = torch.tensor([1.0, -3.0, 5.0])
    p = _prog(["v0 = torch.nn.functional.gelu(a)", "v1 = torch.fmod(a, v0)"], x, returns=["v1"])
    near = _fake(lambda s, o, a: (torch.fmod(a[0], torch.nn.functional.gelu(a[0]) * (1 + 3e-5)),))
    assert check_program(p, near).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, a: (o[0] + 1e-3,))).kind == "out-value"
    q = _prog(["v1 = torch.fmod(a, b)"], x, torch.tensor([1.0, -0.00405, 4.9]), returns=["v1"])
    assert check_program(q, _fake(lambda s, o, a: (o[0] + 2e-4,))).kind == "out-value"


def test_prod_carries_its_factors_bounds():
    """fuzz seed 326 #850: a float64 ``prod`` of a float32 0-d GELU at -3.52: eager's scalar
    GELU (libm's erf) is -7.57758e-4, coil's (eager's vector formula) -7.57967e-4, both within
    GELU's tail bound; the prod dropped that bound. Accepted within it, not beyond."""
    p = _prog(["v0 = torch.nn.functional.gelu(a)", "v1 = torch.prod(v0, dtype=torch.float64)"],
              torch.tensor(-3.520649), returns=["v1"])
    assert check_program(p, _fake(lambda s, o, a: (o[0] - 2.1e-7,))).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, a: (o[0] - 1e-5,))).kind == "out-value"


def test_gelu_of_values_past_half_the_max_is_not_generated():
    """Eager's GELU of x >= max/2 is inf in its vector lanes and x in its scalar tail
    (fuzz s81 #2280: fmod(x, gelu(x)) was x in eager, 0 compiled); +inf: NaN or inf."""
    from coil.bench.fuzz_ops import Ctx, Skip, unary

    for v in (torch.tensor([1.0, 2e38]), torch.tensor([1.0, math.inf], dtype=torch.bfloat16)):
        for seed in range(40):
            try:
                line = unary(Ctx(__import__("random").Random(seed), {"a": v}, ["a"]))
            except Skip:
                continue
            assert "gelu" not in line


def test_argmax_of_computed_non_integer_ties_is_not_generated():
    """fuzz seed 81 #2967: logsumexp of rows with equal multisets of 0/1 gave equal floats
    in eager's summation order and an ulp apart in coil's, so argmax broke the tie
    differently. Ties of an input, or of integer values (exact in any order), are kept."""
    from coil.bench.fuzz_ops import Ctx, Skip, reduction

    def lines(env, inputs):
        out = []
        for seed in range(200):
            try:
                out.append(reduction(Ctx(__import__("random").Random(seed), dict(env), inputs)))
            except Skip:
                pass
        return " ".join(out)
    tied = torch.tensor([[0.5, 1.7, 1.7], [2.0, 2.0, 1.0]])
    assert "torch.arg" not in lines({"v1": tied}, []) and "torch.max(" not in lines({"v1": tied}, [])
    assert "argmax(v1" in lines({"v1": tied.round()}, []) and "argmax(a" in lines({"a": tied}, ["a"])


def test_nan_bits_read_through_an_int_view_are_not_compared():
    """IEEE 754 leaves a NaN result's sign and payload open: eager's maximum of NaNs is
    0xffffffff contiguous and 0x7fc00000 strided; the Triton interpreter and GPUs give
    the canonical NaN. Through ``.view(torch.int32)`` both NaN is equal; other bits not."""
    p = _prog(["v0 = torch.maximum(a, a * 2).view(torch.int32)"], torch.full((4,), math.nan))
    canonical = torch.full((4,), 0x7FC00000, dtype=torch.int32)
    assert check_program(p, _fake(lambda s, o, a: (canonical,))).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, a: (canonical - (1 << 23),))).kind == "out-value"
    q = _prog(["v0 = torch.maximum(a, a * 2).to(torch.int32)"], torch.ones(4))
    assert check_program(q, _fake(lambda s, o, a: (o[0] + 1,))).kind == "out-value"


def test_overflowed_statistics_accept_only_degenerate_results_on_both_sides():
    """fuzz seeds 50/51: float64 layer_norm of values near ±1e308 (eager's Welford state
    overflows: 0 or NaN depending on the order) and a float64 prod of int64s near 2^63
    that contains a zero: both sides NaN, ±inf or 0 is accepted; a finite nonzero value
    against eager's degenerate one still is a mismatch, as it is for ordinary inputs."""
    huge = torch.tensor([[1.0, 1.0, -1.4264838059751346e+308, 1.0]], dtype=torch.float64)
    p = _prog(["v0 = torch.nn.functional.layer_norm(a, (4,))"], huge)
    eager = torch.nn.functional.layer_norm(huge, (4,))
    degenerate = torch.where(eager.isnan(), torch.zeros_like(eager), torch.full_like(eager, math.nan))
    assert check_program(p, _fake(lambda s, o, a: (degenerate,))).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, a: (torch.ones_like(eager),))).kind == "out-value"
    small = torch.tensor([[1.0, 2.0, 3.0, 5.0]], dtype=torch.float64)
    q = _prog(["v0 = torch.nn.functional.layer_norm(a, (4,))"], small)
    assert check_program(q, _fake(lambda s, o, a: (torch.zeros(1, 4, dtype=torch.float64),))
                         ).kind == "out-value"
    ints = torch.tensor([0, -9223372036854775803, 9223372036854775802] * 10)
    r = _prog(["v0 = torch.prod(a, dtype=torch.float64)"], ints)
    assert check_program(r, _fake(lambda s, o, a: (torch.tensor(math.nan, dtype=torch.float64),))
                         ).outcome == "ok"


def test_mean_whose_summands_reach_the_max_accepts_an_overflowed_order():
    """fuzz seed 51 #3365: a float32 mean over values near ±3e38 whose magnitudes add up
    past float32's max: eager's order stayed finite, another order's partial sums overflow.
    Accepted only as the signs allow: +inf where the positive summands reach the max, NaN
    where the negative ones do too (eager at the max: NaN is accepted as before)."""
    x = torch.tensor([[3.3e38], [2.9e38], [-3.1e38], [1.0]])
    p = _prog(["v0 = torch.mean(a, dim=0)"], x)
    assert check_program(p, _fake(lambda s, o, a: (torch.full((1,), math.inf),))).outcome == "ok"
    # only the positive summands reach the max: -inf cannot happen
    assert check_program(p, _fake(lambda s, o, a: (torch.full((1,), -math.inf),))).kind == "out-value"
    both = _prog(["v0 = torch.mean(a, dim=0)"], torch.tensor([[3.3e38], [2.9e38], [-3.1e38], [-3e38]]))
    assert check_program(both, _fake(lambda s, o, a: (torch.full((1,), math.nan),))).outcome == "ok"
    y = torch.tensor([[3.3e36], [2.9e36], [-3.1e36], [1.0]])
    q = _prog(["v0 = torch.mean(a, dim=0)"], y)
    assert check_program(q, _fake(lambda s, o, a: (torch.full((1,), math.nan),))).kind == "out-value"


def test_mean_that_overflowed_only_in_eagers_order_accepts_a_finite_large_result():
    """fuzz seed 83 #2135: a float32 mean of six values near ±2e38: eager's partial sums
    overflow to -inf, the float64 mean is -4.58e37; a finite result of that sign near the
    max is accepted, a small one or one of the other sign is not."""
    x = torch.tensor([-2.746337e+38, 1.0, 1.8660304e+38, 1.0, 1.0, -1.8658898e+38])
    p = _prog(["v0 = torch.mean(a, dim=0, keepdim=True)"], x)
    assert torch.mean(x, 0, keepdim=True).isinf().all()  # eager's order
    assert check_program(p, _fake(lambda s, o, a: (torch.tensor([-4.576994e37]),))).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, a: (torch.tensor([4.576994e37]),))).kind == "out-value"
    assert check_program(p, _fake(lambda s, o, a: (torch.tensor([-1.0]),))).kind == "out-value"


def test_sum_whose_eager_order_overflowed_accepts_the_float64_sum_only():
    """fuzz seed 94 #1870: a float32 nansum of (-1.75e38, 1.85e38, 2.79e38, 1.08e38,
    -3.19e38): positive and negative partial sums can overflow (eager: -inf); a finite
    compiled result is accepted within the summation error bound of the float64 sum
    (7.78e37), not elsewhere."""
    x = torch.tensor([-1.7546e+38, 1.8476e+38, 2.7914e+38, -2.4061e-38, 1.0833e+38, -3.1901e+38])
    p = _prog(["v0 = torch.nansum(a, dim=0)"], x)
    exact = x.double().sum().float()
    assert check_program(p, _fake(lambda s, o, a: (exact,))).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, a: (exact * 1.5,))).kind == "out-value"
    assert check_program(p, _fake(lambda s, o, a: (-exact,))).kind == "out-value"


def test_sum_bounds_survive_writes_and_freed_tensors():
    """fuzz seed 96 #191 (cumsum, then ``unsqueeze_`` and more ops): the float64 sums were
    kept by tensor id apart from the bound entries, so a freed tensor's id, reused by an
    output, found a sum without a bound (KeyError: the fuzzer process died) or could have
    lent an unrelated sum to an output; they now live in the entry that holds the tensor."""
    lines = ["v0 = torch.scatter(c, 1, torch.empty((2, 0), dtype=torch.int64), c)", "v1 = d.clone()",
             "v2 = torch.cumsum(a, dim=-1)", "v3 = torch.min(v1)", "a.unsqueeze_(1)", "v4 = v1 // v0"]
    f64 = torch.float64
    ins = [Input("a", torch.empty((0, 4), dtype=f64), ".t()"),
           Input("b", torch.empty((1, 0), dtype=f64), ".expand(4, 0)"),
           Input("c", torch.empty((4, 0), dtype=f64), "[:, 0:0]"),
           Input("d", torch.tensor(0.07888897101070765, dtype=f64))]
    p = Program(ins, [Stmt(x, "reduction") for x in lines], ["v2", "v3", "v4"], "s96 #191")
    assert check_program(p, _fake(lambda s, o, a: o)).outcome == "ok"


def test_values_downstream_of_an_overflowed_statistic_have_no_reference():
    """fuzz seed 92 #2193: float64 layer_norm of [-9.6e307, 1] (eager's rstd NaN, coil's
    0), compared by ``ge`` and divided by: outcome ``no_reference``, not a mismatch; the
    same program on ordinary values still is a mismatch."""
    stmts = ["v0 = torch.nn.functional.layer_norm(a, (2,))", "v1 = torch.ge(a, v0).double()"]
    huge = _prog(stmts, torch.tensor([-9.587582518751557e+307, 1.0], dtype=torch.float64), returns=["v1"])
    flip = lambda s, o, a: tuple(1 - v for v in o)  # noqa: E731
    assert check_program(huge, _fake(flip)).outcome == "no_reference"
    small = _prog(stmts, torch.tensor([-2.0, 1.0], dtype=torch.float64), returns=["v1"])
    assert check_program(small, _fake(flip)).outcome == "mismatch"
    # eager's rstd 0 (its float64 var overflowed), coil's NaN (its mean did), summed (s98 #950)
    a = torch.ones(3, 6, dtype=torch.float64)
    a[1, 5], a[2, 0] = 1.193338306969202e+308, 9.218385685453604e+307
    ln = _prog(["v0 = torch.nn.functional.layer_norm(a, (3, 6), a)", "v1 = torch.sum(v0) - 18"],
               a, returns=["v1"])
    assert check_program(ln, _fake(lambda s, o, a: (torch.tensor(math.nan, dtype=torch.float64),))
                         ).outcome == "no_reference"
    # a NaN statistic of small values (var of one element) in a program with huge ones
    one = _prog(["v0 = torch.var(a[1:])", "v1 = torch.ge(a, v0).double()"],
                torch.tensor([-9.587582518751557e+307, 1.0], dtype=torch.float64), returns=["v1"])
    assert check_program(one, _fake(flip)).outcome == "mismatch"


def test_float64_statistics_reference_rounds_like_eager_elsewhere():
    """fuzz seed 81 #1159: bf16 layer_norm of values near 3e38 (eager's float32 statistics
    overflow: NaN), then ``v0 ** v0``: coil's float64 statistics give -2.0 in bf16 and
    (-2)^-2 = 0.25; a whole-program float64 reference kept -1.9976 and gave NaN. The
    reference runs only the statistics in float64: 0.25 is accepted, 0.5 is not."""
    x = torch.tensor([[-2.09e38, -8.64e37, -3.03e-39, -1.65e38], [-3.14, -1.156e38, -1.99e38, -1.077e38],
                      [-3.32e38, 4.5e-39, -0.906, 1.416e38]], dtype=torch.bfloat16)

    def truth(s, o, a, extra=0.0):
        v = torch.nn.functional.layer_norm(a[0].double(), (3, 4)).to(torch.bfloat16)
        return ((v ** v) + extra,)
    p = _prog(["v0 = torch.nn.functional.layer_norm(a, (3, 4))", "v1 = v0 ** v0"], x, returns=["v1"])
    assert check_program(p, _fake(truth)).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, a: truth(s, o, a, 0.25))).kind == "out-value"


def test_float64_reference_promotes_integers_to_float64():
    """fuzz seed 51 #1171: erf of an int64 is float32 in eager, so a float64 reference has
    to run with float64 as the default dtype: layer_norm over 1e30 entries then has
    finite statistics, which coil's float64 CPU statistics match (eager's overflow: 0)."""
    def fn(b):
        return (torch.nn.functional.layer_norm(torch.erf(b).index_fill(1, torch.tensor([1]), 1e30),
                                               (4, 2)),)
    make = lambda: [torch.tensor([[-3, 0], [1, 2], [0, 3], [-1, 5]])]  # noqa: E731
    assert check(fn, make, "cpp").outcome == "ok"
    off = _fake(lambda s, o, a: (torch.zeros(4, 2) + 0.5,))
    assert check(fn, make, off).kind == "out-value"


def test_float_bits_viewed_as_ints_are_compared_as_floats():
    """fuzz seed 50 #4787: exp_ then .view(torch.int32): eager's and coil's exp differ by an
    ulp, which the int bits show exactly; compared as the floats they are, within the float
    tolerance (a difference beyond it is still a mismatch)."""
    p = _prog(["v0 = a.exp().view(torch.int32)"], torch.tensor([0.32209504, -1.1148136]))
    ulp = _fake(lambda s, o, a: (o[0] + torch.tensor([1, 0], dtype=torch.int32),))
    assert check_program(p, ulp).outcome == "ok"
    far = _fake(lambda s, o, a: (o[0] + torch.tensor([1 << 16, 0], dtype=torch.int32),))
    assert check_program(p, far).kind == "out-value"


def test_float64_reference_nan_equals_compiled_nan():
    """fuzz seed 51 #5306: the variance of equal values is 0 in coil and in float64, so
    ``a % var`` is NaN; eager's float32 variance is 1.1e-13 and ``a % 1.1e-13`` finite.
    Compiled NaN where the float64 reference is NaN is accepted."""
    def fn(a, b):
        return (a % torch.var(b, dim=(0, 1), correction=2),)
    make = lambda: [torch.tensor([[0.2054131]]).expand(3, 1),  # noqa: E731
                    torch.tensor([[-3.4610667]]).expand(3, 1)]
    assert check(fn, make, "cpp").outcome == "ok"


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_exp_of_a_cat_also_summed(backend):
    """fuzz seed 92 #2381: the sum fuses with the exp into one reduction kernel whose rows
    (2 elements) are all scalar tail; g++ 12.2 -O3 SLP-vectorized the cat's guarded loads
    with the first vector's mask for every vector, so the second half read as 0 (exp 1.0).
    Such kernels are compiled without loop if-conversion (docs/cpp_backend.md)."""
    def fn(a):
        v0 = torch.cat([a, a], 0)
        v2 = torch.exp(v0)
        v3 = torch.sum(v0, dim=(-1, -2))  # noqa: F841 (fused with exp into one kernel)
        return (v2,)
    r = check(fn, lambda: [torch.tensor([[4, 3], [2, 4]])], backend)
    assert r.outcome == "ok", f"{r.outcome}: {r.kind}\n{r.detail}"


# ------------------------------------------------- known open bugs (fuzzer-found)
# Minimized repros of failures the fuzzer finds in the current tree, one per class,
# as strict xfails: fixing the bug makes the test fail until its entry is removed.

KNOWN_BUGS: dict = {}  # name -> (fn, make_inputs[, backend])


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=n))
                                  for n in KNOWN_BUGS])
def test_known_bug(name):
    fn, make_inputs, *backend = KNOWN_BUGS[name]
    r = check(fn, make_inputs, *(backend or ["cpp"]))
    assert r.outcome in ("ok", "both_raise"), f"{r.outcome}: {r.kind}\n{r.detail}"


def test_float_result_of_a_narrow_input_one_narrow_ulp_apart_is_accepted_only_then():
    """``_one_narrow_ulp``: a float32 output whose values both hold bf16 values one bf16
    ulp apart (the two roundings near a midpoint) is not a mismatch when the program
    has bf16 inputs; two ulps apart, values not representable in bf16, or a program
    without bf16 inputs still are."""
    e_args = [torch.tensor([1.0], dtype=torch.bfloat16)]
    e = torch.tensor([-0.8046875, 3.0, 1.0])
    for c, ok in ((torch.tensor([-0.80859375, 3.0, 1.0]), True),
                  (torch.tensor([-0.8125, 3.0, 1.0]), False),        # two bf16 ulps
                  (torch.tensor([-0.8046875, 3.0, 1.003]), False)):  # not a bf16 value
        assert (fuzz._compare([c], [e], e_args, e_args, None) == []) == ok, c
    f32_args = [torch.tensor([1.0])]
    assert fuzz._compare([torch.tensor([-0.80859375, 3.0, 1.0])], [e], f32_args, f32_args, None)


def test_float64_output_of_a_named_float32_cast_one_float32_ulp_apart_is_accepted_only_then():
    """``prod(b, dtype=torch.float32)`` of a float64 ``b`` then promoted back (s200 #11658):
    coil's and eager's float32 products were one float32 ulp apart in a float64 output.
    One ulp is accepted when the program names float32; two, or a float32 output, not."""
    e_args = [torch.tensor([1.0], dtype=torch.float64)]
    e = torch.tensor([1075.3702392578125], dtype=torch.float64)
    one, two = torch.tensor([1075.3701171875], dtype=torch.float64), torch.tensor(
        [1075.3699951171875], dtype=torch.float64)  # two ulps
    assert fuzz._compare([one], [e], e_args, e_args, None, casts=["float32"]) == []
    assert fuzz._compare([two], [e], e_args, e_args, None, casts=["float32"])
    assert fuzz._compare([one], [e], e_args, e_args, None)


def test_accumulation_at_duplicate_indices_is_compared_within_its_rounding_bound():
    """fuzz seed 100 #5064: fp16 ``index_add_`` of four equal values into one element:
    eager's 2-D path sums in float (-12.2890625), its 1-D path and coil round each add
    (-12.296875). Accepted within eps * (values added) * their magnitudes; a dropped
    contribution, or any difference where no index repeats, is still a mismatch."""
    a, d = torch.tensor(-2.45, dtype=torch.float16), torch.tensor(-2.492, dtype=torch.float16)
    p = _prog(["v2 = b.reshape(1, -1)",
               "v2.index_add_(0, torch.tensor([0, 0, 0, 0]), a.expand((4, 1)))",
               "v3 = v2.index_put((torch.tensor([0]),), torch.tensor(7, dtype=torch.float16), "
               "accumulate=True)"], a, d, returns=["v3"])
    step = torch.tensor([[-5.296875]], dtype=torch.float16)
    assert check_program(p, _fake(lambda s, o, x: (step,))).outcome == "ok"
    dropped = torch.tensor([[-2.84]], dtype=torch.float16)  # one a missing
    assert check_program(p, _fake(lambda s, o, x: (dropped,))).kind == "out-value"
    q = _prog(["v0 = b.index_add(0, torch.tensor([0, 1]), a)"], torch.tensor([1.5, -2.25], dtype=torch.float16),
              torch.tensor([3.0, 4.0], dtype=torch.float16))
    assert check_program(q, _fake(lambda s, o, x: (o[0] + 0.01,))).kind == "out-value"


def test_sum_of_computed_values_carries_their_tolerance():
    """fuzz seed 101 #6047: a float64 sum of a float32 ``layer_norm``'s three outputs,
    which cancel: eager's 1.8e-7, coil's -8.9e-8, each output within float32's tolerance.
    A sum of computed summands is allowed their tolerance summed; a sum of an input is
    not (the summands are the same bits on both sides)."""
    b = torch.tensor([[-1.0, 2.0, 0.0]])
    p = _prog(["v0 = torch.nn.functional.layer_norm(a, (3,))",
               "v1 = torch.sum(v0, dim=1, keepdim=True, dtype=torch.float64)"], b, returns=["v1"])
    assert check_program(p, _fake(lambda s, o, x: (o[0] * 0 - 8.940696716308594e-08,))).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, x: (o[0] * 0 + 1e-3,))).kind == "out-value"
    q = _prog(["v1 = torch.sum(a, dim=1, keepdim=True, dtype=torch.float64)"], b, returns=["v1"])
    assert check_program(q, _fake(lambda s, o, x: (o[0] + 1e-5,))).kind == "out-value"


def test_in_place_write_drops_the_bounds_of_the_elements_it_writes_only():
    """fuzz seed 102 #767: ``scatter_`` into a float32 mean whose summands of both signs
    reach the max (eager's order: -inf): the write dropped the summation bound of the
    whole mean, so another order's +inf where it did not write was a mismatch. It now
    drops it where it writes (the value written there is compared as any other)."""
    x = torch.tensor([[-9.051398e+37, 2.474863e+38, 0.7809534, 2.0797187e+38, -2.914518e+38],
                      [1.0, 2.0, 3.0, 4.0, 5.0]])
    p = _prog(["v0 = torch.mean(a, dim=1)", "v0.scatter_(0, torch.tensor([1]), torch.tensor([-0.5]))"],
              x, returns=["v0"])
    assert check_program(p, _fake(lambda s, o, a: (torch.tensor([math.inf, -0.5]),))).outcome == "ok"
    for wrong in ([5.0, -0.5], [math.inf, -0.49], [math.inf, 3.0]):
        assert check_program(p, _fake(lambda s, o, a: (torch.tensor(wrong),))).kind == "out-value"
    q = _prog(["v0 = torch.mean(a, dim=1)", "v0.scatter_(0, torch.tensor([0]), torch.tensor([-0.5]))"],
              x, returns=["v0"])
    assert check_program(q, _fake(lambda s, o, a: (torch.tensor([math.inf, 3.0]),))).kind == "out-value"
    r = _prog(["v0 = torch.mean(a, dim=1)", "v1 = v0[1:]", "v1.fill_(2)"], x, returns=["v0"])
    assert check_program(r, _fake(lambda s, o, a: (torch.tensor([math.inf, 2.0]),))).outcome == "ok"
    t = _prog(["v0 = torch.mean(a, dim=1)", "a.t_()"], x, returns=["v0"])  # writes no element
    assert check_program(t, _fake(lambda s, o, a: (torch.tensor([math.inf, 3.0]),))).outcome == "ok"


def test_sign_of_a_computed_nan_is_either_sign():
    """fuzz seed 102 #3793: ``copysign`` by a float32 ``layer_norm`` of a row with -inf,
    inf and NaN. IEEE 754 leaves the sign of an arithmetic NaN to the implementation
    (eager's float32 sum of [-inf, inf, nan] is -NaN, of [nan, -inf, inf] +NaN; a GPU's
    is +NaN), so ``copysign``/``signbit`` by a NaN the program computed may give either
    sign there, nothing else; by an input's NaN, only eager's."""
    a, b = torch.tensor([math.inf, 1.0, math.nan]), torch.tensor([2.0, 3.0, 4.0])
    p = _prog(["v0 = torch.copysign(b, a - a)", "v1 = (a - a).signbit()"], a, b)
    flipped = (torch.tensor([2.0, 3.0, -4.0]), torch.tensor([False, False, True]))
    assert check_program(p, _fake(lambda s, o, x: flipped)).outcome == "ok"
    for wrong in ((torch.tensor([-2.0, -3.0, 4.0]), o1 := torch.tensor([True, False, False])),
                  (torch.tensor([-2.5, 3.0, 4.0]), o1), (torch.tensor([-2.0, 3.0, 4.0]), ~o1)):
        assert check_program(p, _fake(lambda s, o, x: wrong)).kind == "out-value"
    q = _prog(["v0 = torch.copysign(b, a)"], a, b)
    assert check_program(q, _fake(lambda s, o, x: (torch.tensor([2.0, 3.0, -4.0]),))).kind == "out-value"


def test_sign_of_a_computed_nan_carries_through_later_ops():
    """fuzz seed 216 #1820: ``minimum(any(a).int(), sqrt(b).signbit())`` with b = -3. Eager's
    float32 ``sqrt(-3.0)`` is +NaN on this CPU, x86's ``sqrtss`` -NaN (coil's C++ and Triton), and
    eager's own scalar and vector loops disagree for other ops (``fmod(1, 0)``). The other
    sign's answer carries through the ops that read the signbit; other values still differ."""
    a, b = torch.tensor(True), torch.tensor([-3.0, 4.0])
    p = _prog(["v0 = torch.minimum(a.to(torch.int32), torch.sqrt(b).signbit())",
               "v1 = torch.sqrt(b).signbit() * 3"], a, b)
    flipped = (torch.tensor([1, 0], dtype=torch.int32), torch.tensor([3, 0]))
    assert check_program(p, _fake(lambda s, o, x: flipped)).outcome == "ok"
    for wrong in ((torch.tensor([1, 1], dtype=torch.int32), flipped[1]), (flipped[0], torch.tensor([3, 3]))):
        assert check_program(p, _fake(lambda s, o, x: wrong)).kind == "out-value"



def test_sign_of_a_computed_nan_carries_through_integer_ops():
    """fuzz seed 302 #771: ``square(cat([a, a, sqrt(a).signbit()]))`` with int64 a = -2: the
    signbit's other value carries through the int64 ``cat`` and ``square`` (it stopped at the
    first integer tensor); the other elements still count."""
    a = torch.tensor([-2])
    p = _prog(["v0 = torch.square(torch.cat([a, a, torch.sqrt(a).signbit()], 0))"], a)
    assert check_program(p, _fake(lambda s, o, x: (torch.tensor([4, 4, 1]),))).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, x: (torch.tensor([4, 9, 1]),))).kind == "out-value"

def test_max_of_signed_zeros_is_either_zero():
    """fuzz seed 216 #10785: ``reciprocal(amax([-0.0, 0.0]))``: eager's -inf, the Triton
    kernel's inf. IEEE 754 lets max/min of zeros of both signs be either (eager's binary
    ``maximum`` already differs between its loops, s202 #13189); the other zero's answer
    carries through later ops (a reciprocal's jump to the other infinity makes anything
    acceptable there: the bound of a change that reached inf). Elsewhere values still count."""
    a = torch.tensor([-0.0, 0.0])
    p = _prog(["v0 = torch.reciprocal(torch.amax(a).double())", "v1 = torch.amin(a) + 1"], a)
    assert check_program(p, _fake(lambda s, o, x: (-o[0], o[1]))).outcome == "ok"
    wrong = (torch.tensor(-math.inf, dtype=torch.float64), torch.tensor(2.0))
    assert check_program(p, _fake(lambda s, o, x: wrong)).kind == "out-value"


def test_a_sum_that_overflows_both_ways_may_be_nan_downstream():
    """fuzz seed 217 #1622: a float32 sum of values near +-3e38 is inf in eager's order, NaN
    (inf + -inf) in the Triton kernel's; ``atan2(a, sum)`` is then 0 or NaN. NaN is one of the
    sum's alternatives now; the program's other values still count."""
    a = torch.tensor([[2.5e38, 2.5e38, -2.5e38, -2.5e38, 1.0]])
    p = _prog(["v0 = torch.atan2(a, torch.sum(a, dim=1, keepdim=True))", "v1 = a * 2"], a)
    nan_sum = lambda s, o, x: (torch.atan2(x[0], torch.full((1, 1), math.nan)), o[1])  # noqa: E731
    assert check_program(p, _fake(nan_sum)).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, x: (o[0], o[1] + 1))).kind == "out-value"


def test_a_comparison_that_may_flip_spreads_into_what_reads_it():
    """fuzz call sequences seed 406 #11: ``c.masked_fill(nansum(b) < 1, 2.5)`` of bf16 summands
    near +-2.5e38: eager's sum is -1.26e38 (True), coil's lanes met +inf and -inf (NaN: False).
    The comparison carries bound 1 and its flip is the bool's alternative in what reads it (it
    raised, so masked_fill got no bound). A value beyond either choice is still a mismatch."""
    p = _prog(["v0 = torch.nansum(a)", "v1 = b.masked_fill(v0 < 1, 2.5)"],
              torch.tensor([2.5e38, -2.5e38, 2.5e38, -2.5e38, -1e38]), torch.tensor([1.0, 2.0]), returns=["v1"])
    assert check_program(p, _fake(lambda s, o, a: (a[1].clone(),))).outcome == "ok"
    assert check_program(p, _fake(lambda s, o, a: (a[1] + 10,))).kind == "out-value"


def _cat_of_an_int_logsumexp(a, c):  # fuzz seed 217 #7072
    return (torch.cat([a, torch.logsumexp(c, dim=0, keepdim=True)], 1),)


def test_an_ulp_of_float32_logsumexp_carries_into_a_float64_cat():
    """fuzz seed 217 #7072: ``cat([a64, logsumexp(c_int)])``: coil's float32 logsumexp (of an
    int64 tensor) was an ulp off eager's in 2 of 30 elements, compared in the float64 output's
    tolerance. logsumexp is compared within 2 ulp of its dtype, like exp and log."""
    c = torch.tensor([[[[1, 1, 4, 5, 6], [5, 9, 8, 4, 0], [5, 7, 2, 2, 5], [4, 3, 6, 7, 6], [2, 1, 6, 9, 5], [3, 5, 5, 0, 6]]], [[[4, 8, 5, 2, 8], [6, 8, 0, 6, 0], [3, 7, 5, 5, 6], [5, 8, 4, 6, 1], [1, 5, 4, 4, 4], [3, 6, 3, 9, 5]]], [[[4, 7, 7, 3, 0], [4, 4, 4, 7, 9], [1, 7, 5, 4, 8], [8, 5, 0, 1, 8], [6, 0, 2, 1, 8], [2, 9, 0, 3, 2]]], [[[4, 8, 7, 4, 0], [5, 3, 3, 0, 3], [3, 7, 1, 4, 5], [5, 3, 0, 3, 8], [5, 2, 3, 6, 5], [8, 6, 2, 8, 6]]], [[[1, 0, 8, 6, 7], [1, 8, 6, 7, 6], [1, 8, 3, 2, 4], [0, 6, 3, 6, 9], [7, 0, 6, 9, 9], [1, 8, 9, 3, 7]]], [[[1, 2, 5, 4, 4], [7, 1, 6, 2, 8], [8, 3, 4, 0, 7], [6, 2, 8, 1, 0], [2, 5, 0, 6, 3], [3, 2, 6, 3, 5]]]])  # noqa: E501
    make = lambda: [torch.tensor([[[[0.14744962761924446]]]], dtype=torch.float64).expand(1, 1, 6, 5),  # noqa: E731
                    c.clone()]
    assert fuzz.check(_cat_of_an_int_logsumexp, make, "cpp").outcome == "ok"


def _var_of_filled(c):
    c.fill_(1e30)
    return (torch.var(c, correction=2),)


def test_variance_is_compared_within_any_algorithms_rounding(monkeypatch):
    """Eager's float64 var of three 1e30s is 5.9e28, coil's 0 (s201 #405): both within
    rounding of values whose squares are 1e60. A value far outside it is still a mismatch."""
    make = lambda: [torch.tensor([2.0, 0.0, -1.0], dtype=torch.float64)]  # noqa: E731
    assert fuzz.check(_var_of_filled, make, "cpp").outcome == "ok"
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda c: (_var_of_filled(c)[0] + 1e50,))
    assert fuzz.check(_var_of_filled, make, "cpp").outcome == "mismatch"


def _tan_of_sum(b):
    return (torch.tan(torch.nansum(b, dim=(-2, 1), keepdim=True)),)


def test_a_sum_that_overflowed_only_in_eagers_order_is_no_reference(monkeypatch):
    """float32 sum of [1, 3.4e38, 1.1e38, -1.76e38, 1]: eager's order passed the max
    (tan(inf): NaN), another order stays finite (s201 #1703): not a reference. A sum
    that overflows in every order is still compared."""
    make = lambda: [torch.tensor([[1.0], [3.3999813e+38], [1.1060689e+38], [-1.7644104e+38], [1.0]])]  # noqa: E731
    finite = lambda fn, b: lambda x: (torch.tan(torch.full((1, 1), 0.5)),)  # noqa: E731
    monkeypatch.setattr(fuzz, "compile_for", finite)  # (its bound spreads through tan: ok)
    assert fuzz.check(_tan_of_sum, make, "cpp").outcome in ("no_reference", "ok")
    big = lambda: [torch.full((5, 1), 3e38)]  # noqa: E731
    assert fuzz.check(_tan_of_sum, big, "cpp").outcome == "mismatch"


def test_bounds_spread_through_the_ops_that_read_them():
    """A value another correct run may compute otherwise (a sum's order, a duplicate
    index's accumulation, layer_norm's float32 rounding, a signed-zero tie) carries that
    freedom into what it feeds (``_Bounds._spread``): s202 #2954 (an overflowed ``nansum``
    into ``maximum``), #4050 (fp16 ``index_add_`` into ``matmul``), #11374 (a mean
    compared with its summands), #5348 (``floor_divide`` by a normalized zero), #13189
    (``div_`` by ``maximum(0, -0.0)``). A difference beyond it is still a mismatch."""
    x = torch.tensor([[-0.25059718]]).expand(3, 2)
    p = _prog(["v0 = torch.mean(a)", "v1 = torch.ge(v0, a)"], x, returns=["v1"])
    assert check_program(p, _fake(lambda s, o, a: (torch.ones(3, 2, dtype=torch.bool),))).outcome == "ok"
    q = _prog(["v0 = torch.mean(a)", "v1 = torch.ge(v0, a + 1)"], x, returns=["v1"])  # far apart
    assert check_program(q, _fake(lambda s, o, a: (torch.ones(3, 2, dtype=torch.bool),))).kind == "out-value"
    c = torch.tensor([[0.0, -0.0, 1.0], [2.0, -0.0, 3.0]])
    r = _prog(["v0 = torch.sum(a, dtype=torch.int64) * 0", "v1 = torch.maximum(v0, b)", "v2 = 1 / v1"],
              torch.tensor([1.0]), c, returns=["v2"])
    tie = c.signbit() & (c == 0)  # maximum(0, -0.0): either zero; maximum(0, 0.0): +0 only
    assert check_program(r, _fake(lambda s, o, a: (torch.where(tie, -math.inf, o[0]),))).outcome == "ok"
    assert check_program(r, _fake(lambda s, o, a: (-o[0].abs(),))).kind == "out-value"
    b = torch.tensor([[1.0], [-0.7954], [2.934]], dtype=torch.float16)
    t = _prog(["v0 = a.clone()", "v0.index_add_(1, torch.tensor([0, 0, 0, 0]), torch.full((3, 4), 9.0, dtype=torch.float16))",
               "v1 = torch.matmul(v0, v0.mT)"], b, returns=["v1"])
    assert check_program(t, _fake(lambda s, o, a: (o[0] + o[0].abs() * 2e-3 * (o[0].abs() > 1000),))).outcome == "ok"
    assert check_program(t, _fake(lambda s, o, a: (o[0] * 1.05,))).kind == "out-value"


def _prod_of_bits_of_a_layer_norm(a):  # s202 #18233
    v0 = a.view(torch.int32)
    a.copy_(torch.nn.functional.layer_norm(a, (6,)))
    return (torch.prod(v0),)


def _prod_of_bits(a):
    return (torch.prod(a.view(torch.int32)),)


def test_integers_made_from_bits_of_rounded_floats_have_no_reference(monkeypatch):
    """The product of the int32 bits of a float32 layer_norm: one ulp of its rounding is
    any product. Bits of a program's inputs (no rounding) are still compared."""
    make = lambda: [torch.tensor([[1.0, 1.0, 1.0, -1.0998816, -0.6669363, -3.2321062]])]  # noqa: E731
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a: (fn(a)[0] + 0x4000000000000000,))
    assert fuzz.check(_prod_of_bits_of_a_layer_norm, make, "cpp").outcome == "no_reference"
    assert fuzz.check(_prod_of_bits, make, "cpp").outcome == "mismatch"


def _div_by_gelu(a):  # s203 #10433
    a.div_(torch.nn.functional.gelu(a))
    return ()


def _prod(a):  # s203 #11361
    return (torch.prod(a),)


def test_gelu_tail_and_prods_past_the_range_are_compared_within_their_freedom(monkeypatch):
    """float64 ``gelu(-8.18)`` is ``x/2 * (1 + erf)``, which cancels: any erf's rounding
    moves it by ``eps |x|``, more than its value, so ``x / gelu(x)`` is any number. A
    product whose partial products pass the max or the smallest normal in some order is
    0 (eager), inf or the exact value (coil). Ordinary values are still compared."""
    tail = lambda: [torch.tensor(-8.175616431510353, dtype=torch.float64)]  # noqa: E731
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a: a.mul_(1.1) and ())
    assert fuzz.check(_div_by_gelu, tail, "cpp").outcome == "ok"
    assert fuzz.check(_div_by_gelu, lambda: [torch.tensor(2.0, dtype=torch.float64)], "cpp").outcome == "mismatch"
    wide = lambda: [torch.tensor([1.7e-310, 1.9e-308, -1.376e308, 1.53e308], dtype=torch.float64)]  # noqa: E731
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a: (torch.tensor(-0.069, dtype=torch.float64),))
    assert fuzz.check(_prod, wide, "cpp").outcome == "ok"
    assert fuzz.check(_prod, lambda: [torch.tensor([2.0, 3.0], dtype=torch.float64)], "cpp").outcome == "mismatch"
    zero = lambda: [torch.tensor([0.0, 1.9e-308, -1.376e308, 1.53e308], dtype=torch.float64)]  # noqa: E731
    assert fuzz.check(_prod, zero, "cpp").outcome != "ok"  # a zero factor: 0 (or NaN) in every order


def _tan_of_sinh(a):  # s204 #14768
    return (torch.tan(torch.sinh(a)),)


def test_an_ulp_of_a_transcendental_spreads_through_an_ill_conditioned_op(monkeypatch):
    """Eager's float32 ``sinh(7)`` is an ulp off the nearest float (548.31616 against the
    interpreter's correctly rounded 548.31610), and ``tan`` there multiplies an ulp by 85:
    the correctly rounded path's ``tan`` is accepted; a value off by more is not, nor is
    one off at a well-conditioned point."""
    seven = lambda: [torch.tensor([7.0])]  # noqa: E731
    nearest = torch.tan(torch.tensor([548.3161010742188]))
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a: (nearest.clone(),))
    assert fuzz.check(_tan_of_sinh, seven, "cpp").outcome == "ok"
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a: (nearest * 1.01,))
    assert fuzz.check(_tan_of_sinh, seven, "cpp").outcome == "mismatch"
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a: (torch.tan(torch.sinh(a)) * 1.001,))
    assert fuzz.check(_tan_of_sinh, lambda: [torch.tensor([0.5])], "cpp").outcome == "mismatch"


def _log_softmax_of_a_product(b):  # s231 #237
    v0 = torch.log_softmax(b, -1)
    return (torch.log_softmax(torch.matmul(v0, v0.mT), 0),)


def test_eagers_log_softmax_rounds_the_rows_logsumexp_first(monkeypatch):
    """Eager's CPU ``log_softmax`` takes ``x - (max + log(sum))`` with ``max + log(sum)`` rounded to the dtype first:
    fp16 ``-1.3730`` where the correctly rounded value is ``-1.3740`` (s231 #237). Through ``matmul`` and another
    ``log_softmax`` over rows that nearly cancel, that half ulp of the row's logsumexp moved an output from -0.1112 to
    the correctly rounded chain's -0.1096 (10 times further from the fp32 reference than eager's): accepted. A
    value off by more is not, nor one off where nothing was rounded that way."""
    b = lambda: [torch.tensor([[1.0, 1.0, -0.1163, 1.484], [-0.285, 1.663, -0.9463, -2.004],  # noqa: E731
                               [0.603, 0.5205, -1.807, -1.649]], dtype=torch.float16)]

    def rounded_once(b):  # each op in float32, rounded to fp16 once, as coil's kernels
        v0 = torch.log_softmax(b.float(), -1).half()
        return (torch.log_softmax(torch.matmul(v0, v0.mT).float(), 0).half(),)
    assert rounded_once(*b())[0][1, 2].item() == -0.109619140625
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, be: rounded_once)
    assert fuzz.check(_log_softmax_of_a_product, b, "cpp").outcome == "ok"
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, be: lambda b: (rounded_once(b)[0] * 1.3,))
    assert fuzz.check(_log_softmax_of_a_product, b, "cpp").outcome == "mismatch"
    one = lambda: [torch.tensor([[0.0, 0.0]], dtype=torch.float16)]  # noqa: E731  (-log 2 exactly)
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, be: lambda b: (
        torch.log_softmax(b, -1) * (1 + 2 ** -7),))
    assert fuzz.check(lambda b: (torch.log_softmax(b, -1),), one, "cpp").outcome == "mismatch"


def _mean_eq(c):  # s205 #3181
    return (torch.eq(torch.mean(c, dim=0), c),)


def test_a_mean_may_be_its_exact_value(monkeypatch):
    """Eager's mean of six equal float32 values 1.1105258 is an ulp off (its sum rounds);
    another order's is the value itself, so ``mean == c`` may be True there. Where the
    mean is not any order's value, a True is still a mismatch."""
    c = lambda: [torch.tensor([[-0.20593151], [1.1105258], [-0.0], [math.inf]]).expand(6, 4, 1)]  # noqa: E731
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a: (torch.eq(a[0], a),))
    assert fuzz.check(_mean_eq, c, "cpp").outcome == "ok"
    d = lambda: [torch.tensor([[1.0], [2.0]]).expand(2, 2, 1) + torch.tensor([[[0.0]], [[1.0]]])]  # noqa: E731
    assert fuzz.check(_mean_eq, d, "cpp").outcome == "mismatch"


def _sqrt_into_f64(a, c):  # s206 #3922
    return (torch.where(c > 5, c, torch.sqrt(a)),)


def _layer_norm_of_an_accumulated_row(a):  # s206 #8553
    a.index_put_((torch.tensor([0, -1, -1, -1]),), torch.tensor(7, dtype=torch.bfloat16), accumulate=True)
    return (torch.nn.functional.layer_norm(a, (1, 6), a),)


def test_eager_sqrt_ulp_and_layer_norm_of_uncertain_rows(monkeypatch):
    """Eager's float32 ``sqrt(1.1813231e38)`` is an ulp below the correctly rounded one,
    which a float64 output shows. A bf16 ``index_put_`` accumulated in another order moves
    a row of values near 29 by an ulp each, and ``layer_norm`` (rstd ~2) amplifies it;
    both are accepted, values off by more are not."""
    sq = lambda: [torch.tensor([1.1813231e38, 2.0]), torch.ones(2, dtype=torch.float64)]  # noqa: E731
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a, c: (torch.sqrt(a.double()),))
    assert fuzz.check(_sqrt_into_f64, sq, "cpp").outcome == "ok"
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a, c: (torch.sqrt(a.double()) * (1 + 1e-5),))
    assert fuzz.check(_sqrt_into_f64, sq, "cpp").outcome == "mismatch"
    row = lambda: [torch.tensor([[1.0, 2.0, 1.0, 0.318, 1.0, 0.391]], dtype=torch.bfloat16)]  # noqa: E731

    def other_order(a):  # the four adds summed first, rounded once
        a.copy_((a.float() + 28).to(torch.bfloat16))
        return (torch.nn.functional.layer_norm(a, (1, 6), a),)
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: other_order)
    assert fuzz.check(_layer_norm_of_an_accumulated_row, row, "cpp").outcome == "ok"
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a: (other_order(a)[0] + 500,))
    assert fuzz.check(_layer_norm_of_an_accumulated_row, row, "cpp").outcome == "mismatch"


_BIG64 = [-8.906943891308253e-309, -3.284238930096607, -1.4324744878593973, -1.76596383728622e+308,
          -1.7572395534618265e+308, -1.7037351586373308, 1.4123696831678598e+308, -0.7433333512201103,
          -1.299280966128971e+308, 7.406995640730664e+307, 1.4035917364508083e+308, 3.4333946571410263,
          1.5819795936371468, 1.4779757475887415e+308, 0.26558013033319156]


def _mean64(a):  # s210 #1419
    return (torch.mean(a),)


def _fmod_by_mean64(a):
    return (torch.fmod(a, torch.mean(a)),)


def test_float64_sums_past_the_max_in_eager_order_and_fmod_by_them(monkeypatch):
    """Eager's float64 mean of values near +-1.7e308 is NaN (+inf and -inf partial sums); the
    exact mean is 1.41e306 (the float64 'exact' sum overflowed too: it is now taken scaled by
    2**-64), and fmod by it is anything eager's NaN allows. A wrong mean is still rejected."""
    big = lambda: [torch.tensor(_BIG64, dtype=torch.float64)]  # noqa: E731
    exact = torch.tensor(_BIG64, dtype=torch.float64).mul(2.0 ** -64).mean().mul(2.0 ** 64)
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a: (exact.clone(),))
    assert fuzz.check(_mean64, big, "cpp").outcome == "ok"
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a: (exact * 3,))
    assert fuzz.check(_mean64, big, "cpp").outcome == "mismatch"
    monkeypatch.setattr(fuzz, "compile_for", lambda fn, b: lambda a: (torch.fmod(a, exact),))
    assert fuzz.check(_fmod_by_mean64, big, "cpp").outcome == "ok"


def test_dynamic_backends_compile_with_symbolic_sizes(tmp_path):
    """``cpp_dynamic`` / ``triton_dynamic``: the program compiled with ``dynamic=True`` (the campaign's
    view of dynamic shapes), one graph serving two sizes."""
    import json

    import coil
    from coil import trace
    from coil.bench.fuzz import compile_for

    old = trace.trace_dir()
    for backend in ("cpp_dynamic", "triton_dynamic"):
        d = tmp_path / backend
        trace.set_dir(str(d))
        try:
            coil.reset()
            f = compile_for(lambda x: x.sin() * x.shape[0], backend)
            for n in (3, 5):
                x = torch.randn(n, 2)
                torch.testing.assert_close(f(x), x.sin() * n)
        finally:
            trace.set_dir(old)
        events = [json.loads(line)["event"] for p in d.glob("*.jsonl") for line in p.read_text().splitlines()]
        assert events.count("backend_compile") == 1, backend


def _layer_norm_of_an_expanded_constant(b):  # gradient fuzzer s1010 #98
    v2 = torch.nn.functional.layer_norm(b, (5, 3))
    return (v2,)


def test_a_bound_written_through_a_view_is_read_through_another():
    """s1010 #98: b's gradient is the sum of 15 layer_norm gradients near ±100 that cancel (eager -1.8e-4, coil's
    kernel the exact 0). Autograd's as_strided backward copies that sum into a view of new zeros and returns
    another view of the buffer as ``.grad``: the sum's bound now follows the storage, not just the first view."""
    mi = lambda: [torch.tensor([1.8441281]).expand(5, 3)]  # noqa: E731
    assert check(_layer_norm_of_an_expanded_constant, mi, "cpp+grad").outcome == "ok"


def test_gradient_mode_inputs_over_their_storage_get_bounds():
    """s1010 #98 on the fixed tree: with a leaf holding each input's storage (key 0), ``_flat``'s ``set_`` on an empty
    tensor was compared as a write of 2 values into 0 and failed the bounds run, so no gradient had a bound."""
    mi = lambda: [torch.tensor(0.0), torch.tensor([1.8441281]).expand(5, 3), torch.tensor([-3.0, 2.0])]  # noqa: E731
    fn = lambda a, b, c: (torch.copysign(a, c), torch.nn.functional.layer_norm(b, (5, 3)))  # noqa: E731
    bounds = fuzz._error_bounds(fuzz._with_grads(fn, 0), mi)
    assert bounds is not None and float(bounds[0][2][1]) > 0, bounds


def _layer_norm_of_one_element(a):  # gradient fuzzer s1015 #174
    v0 = a.as_strided((1,), (3,), 0)
    v0.index_put_((torch.tensor([-1, 0], dtype=torch.int64),), torch.tensor(300, dtype=torch.float32), accumulate=True)
    v3 = torch.nn.functional.layer_norm(v0, (1,), v0)
    return (v3,)


def test_layer_norm_backward_is_compared_within_its_rounding():
    """s1015 #174: a layer_norm of one element (601, weight 601): its input gradient is exactly 0 (coil), eager's
    kernel cancels ``rstd g`` (rstd 316) against its other terms to 0.0099. ``native_layer_norm_backward`` now
    carries the rounding bound of those terms, through the index_put_ and as_strided backwards to ``a.grad``."""
    assert check(_layer_norm_of_one_element, lambda: [torch.tensor(1.0)], "cpp+grad").outcome == "ok"


def _mv_of_expanded(b, c):  # s1045 #921
    return (torch.matmul(b.unflatten(-2, (1, -1)), c),)


def test_a_product_whose_partial_sums_overflowed_only_in_eagers_order_accepts_the_float64_sum():
    """fuzz seed 1045 #921: a bf16 ``mv`` of six products near +-2e38 that cancel to -1.24e37: eager's order
    overflows to inf, coil's float32 ``mul`` + ``sum`` gives the float64 value. A matrix product is a sum of
    products: the float64 value is accepted (within the summation bound), a value of the other sign is not."""
    inputs = lambda: [torch.tensor([[1.734, 1.76, 0.0, -0.0, -2.17, -1.43]], dtype=torch.bfloat16),  # noqa: E731
                      torch.tensor([1.13e+38], dtype=torch.bfloat16).expand(6)]
    assert _mv_of_expanded(*inputs())[0].isinf().all()  # eager's order
    exact = lambda b, c: torch.matmul(b.double().unflatten(-2, (1, -1)), c.double()).bfloat16()  # noqa: E731
    assert fuzz.check(_mv_of_expanded, inputs, lambda fn: lambda b, c: (exact(b, c),)).outcome == "ok"
    assert fuzz.check(_mv_of_expanded, inputs, lambda fn: lambda b, c: (-exact(b, c),)).outcome == "mismatch"
    assert fuzz.check(_mv_of_expanded, inputs, "aot_eager").outcome == "ok"  # (coil's float32 mul + sum)
