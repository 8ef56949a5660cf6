"""Objects capture holds but does not trace (torch.Generator, unknown C functions): using
them is one graph break at the call, the rest is captured, and RNG/generator state
advances as in eager."""
import random
import sys

import torch

import coil
from coil.testing import CompileCounter


def with_generator(x, g):
    return x + torch.rand(3, generator=g), g


def test_generator_argument_is_a_break_and_advances_it():
    x = torch.randn(3)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    want, _ = with_generator(x, g1)
    cnt = CompileCounter()
    got, g_out = coil.compile(with_generator, backend=cnt)(x, g2)
    torch.testing.assert_close(got, want)
    assert g_out is g2 and torch.equal(g1.get_state(), g2.get_state())
    assert cnt.frame_count == 1


def seeds_inside(x):
    torch.manual_seed(5)
    return x + torch.rand(3)


def test_manual_seed_inside_frame():
    x = torch.randn(3)
    want = seeds_inside(x)
    after_eager = torch.get_rng_state()
    got = coil.compile(seeds_inside, backend="eager")(x)
    torch.testing.assert_close(got, want)
    assert torch.equal(after_eager, torch.get_rng_state())
    assert coil.capture.stats["fallbacks"] == 0


def c_method_of_object(x, rng):
    return x * rng.random()


def test_random_method_of_an_argument_is_drawn_at_run_time():
    # a C method of a random.Random is a draw the entry makes (test_random_draws.py), not a break
    x = torch.randn(3)
    r1, r2 = random.Random(1), random.Random(1)
    want = c_method_of_object(x, r1)
    got = coil.compile(c_method_of_object, backend="eager")(x, r2)
    torch.testing.assert_close(got, want)
    assert r1.getstate() == r2.getstate()
    assert coil.capture.stats["fallbacks"] == 0 and coil.capture.stats["graph_breaks"] == 0


def c_function_then_more(x):
    y = x * 2
    n = sys.getrefcount(y)
    return y + 1, n > 0


def test_unknown_c_function_resume_is_captured():
    cnt = CompileCounter()
    x = torch.randn(3)
    got = coil.compile(c_function_then_more, backend=cnt)(x)
    torch.testing.assert_close(got[0], x * 2 + 1)
    assert got[1] is True and cnt.frame_count == 2


def id_of_constants(x):
    a = (1, 2)
    b = a
    return x + (id(a) == id(b)) + (id(a) != id(a)), id(x) > 0


def test_id_of_constants_folds_and_id_of_tensor_breaks():
    x = torch.randn(3)
    e = coil.explain(id_of_constants, x)
    assert e.graph_break_count == 1 and "id()" in e.break_reasons[0]["reason"]
    got = coil.compile(id_of_constants, backend="eager")(x)
    torch.testing.assert_close(got[0], x + 1)
    assert got[1] is True
