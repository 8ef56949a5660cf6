"""Corpus: RNG ops inside the frame. Eager and compiled runs start from the same global
generator seed; the outputs must be the same numbers and the global generator must be
advanced exactly as eager advanced it (the harness compares torch.get_rng_state()).

PYTEST_DONT_REWRITE: the corpus programs must stay plain Python (no assertion rewriting).
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from corpus_harness import C, R, cases, randn


def x34():
    return (randn(3, 4),)


def rand_ops(x):
    return x + torch.rand(3, 4), torch.randn(2) * 2, torch.randint(0, 10, (5,))


def rand_like_ops(x):
    return x * torch.rand_like(x), torch.randn_like(x) + x, torch.randint_like(x, 5)


def dropout_functional_train(x):
    return F.dropout(x, 0.5, training=True)


def dropout_then_more_rng(x):
    y = F.dropout(x, 0.3)
    return y + torch.rand_like(y)


def bernoulli_ops(x):
    p = torch.sigmoid(x)
    return torch.bernoulli(p), p.bernoulli(), torch.rand(2) < 0.5


def inplace_rng(x):
    y = torch.empty(3, 4)
    y.uniform_(-1, 1)
    z = torch.empty(5).normal_(2.0, 0.5)
    w = x.clone().exponential_()
    return y + x, z, w


def normal_fn(x):
    return torch.normal(x, 0.1), torch.normal(0.0, 1.0, size=(3,))


def multinomial_fn(x):
    probs = x.softmax(-1)
    return torch.multinomial(probs, 2), torch.randperm(6)


def rng_in_loop(x):
    out = x
    for _ in range(3):
        out = out + torch.rand_like(out) * 0.1
    return out


def dropout_module():
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.ReLU())


def rng_order_interleaved(x):
    a = torch.rand(2)
    b = x.sin()
    c = torch.rand(2)
    return a, b, c, a - c


def rng_with_generator_arg(x, g):
    return x + torch.rand(3, 4, generator=g)


def _gen():
    g = torch.Generator()
    g.manual_seed(7)
    return g


def rng_mixed_with_break(x):
    a = torch.rand(3)
    print("rng break", end="\r")
    return x.sum() + a + torch.rand(3)


def rng_state_query(x):
    return x + torch.rand(1)


def alpha_dropout_and_feature(x):
    return F.alpha_dropout(x, 0.2, training=True), F.dropout1d(x.view(3, 4, 1), 0.5, training=True)


CASES = cases(
    C(rand_ops, x34),
    C(rand_like_ops, x34),
    C(dropout_functional_train, x34),
    C(dropout_then_more_rng, x34),
    C(bernoulli_ops, x34),
    C(inplace_rng, x34),
    C(normal_fn, x34),
    C(multinomial_fn, x34),
    C(rng_in_loop, x34),
    C(dropout_module, x34, module=True),
    C(rng_order_interleaved, x34),
    C(rng_with_generator_arg, lambda: (randn(3, 4), _gen()), graphs=1, breaks=(0, 1), torch_breaks=1,
      note="an explicit torch.Generator argument: torch breaks at the call; coil may capture it or break"),
    C(rng_mixed_with_break, x34, graphs=2, breaks=1),
    R(rng_state_query, [lambda f: (randn(2),), lambda f: (randn(2),), lambda f: (randn(2),)], graphs=1,
      name="rng_repeated_calls_advance"),
    C(alpha_dropout_and_feature, x34),
)


@pytest.mark.parametrize("case", CASES)
def test_rng(case, check):
    check(case)
