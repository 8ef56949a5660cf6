"""Python's ``random`` inside a compiled frame (docs/capture.md, "Draws from Python's random"): the entry draws
each value before the graph, in program order, into a graph input; nothing guards on its value, so a new value
never recompiles, and the state of ``random`` after a call is eager's."""
import random

import pytest
import torch

import coil


@pytest.fixture(autouse=True)
def _keep_random_state():
    state = random.getstate()
    yield
    random.setstate(state)


def _same_as_eager(fn, make_args, calls=4, seed=0, **options):
    """Run ``fn`` eagerly then compiled from the same seed; compare results and the state after."""
    random.seed(seed)
    want = [fn(*make_args()) for _ in range(calls)]
    after = random.getstate()
    cf = coil.compile(fn, **options)
    random.seed(seed)
    got = [cf(*make_args()) for _ in range(calls)]
    assert random.getstate() == after
    _compare(got, want)


def _compare(got, want):
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            _compare(g, w)
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    else:
        assert type(got) is type(want) and got == want


class Layer(torch.nn.Module):
    def __init__(self, layerdrop):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.layerdrop = layerdrop

    def forward(self, x):
        p = random.uniform(0, 1)       # LayerDrop (transformers' Musicgen, Wav2Vec2...)
        if self.training and p < self.layerdrop:
            return x
        return self.lin(x).relu()


@pytest.mark.parametrize("train", [True, False])
def test_layerdrop_off_is_one_graph_without_recompiles(train):
    m = torch.nn.Sequential(*[Layer(0.0) for _ in range(4)]).train(train)
    x = torch.randn(2, 8)
    _same_as_eager(m, lambda: (x,))
    # uniform(0, 1) >= 0: ``p < 0.0`` is decided by the value's range, with no guard
    assert coil.capture.stats["graphs"] == 1 and coil.capture.stats["graph_breaks"] == 0
    assert coil.capture.stats["recompiles"] == 0


def drop(x, rate):
    p = random.uniform(0, 1)
    if p < rate:
        return x
    return x.sin() * p


def test_branch_on_a_draw_is_a_break_decided_per_call():
    x = torch.randn(3)
    _same_as_eager(drop, lambda: (x, 0.5), calls=10)
    # the frame, and one resume function for each side of the branch: none recompiles
    assert coil.capture.stats["frames"] <= 3, coil.capture.stats
    assert coil.capture.stats["recompiles"] == 0 and coil.capture.stats["graph_breaks"] == 1


def scale(x):
    a = random.random()
    b = random.gauss(0.0, 1.0)
    n = random.randint(1, 4)
    return x * a + b * n, a


def test_draws_are_graph_inputs():
    x = torch.randn(3)
    _same_as_eager(scale, lambda: (x,), calls=5)
    assert coil.capture.stats["frames"] == 1 and coil.capture.stats["recompiles"] == 0
    assert coil.capture.stats["graph_breaks"] == 0


def around_a_break(x):
    a = random.random()
    random.shuffle(ORDER)          # not a draw the entry makes: a break, run in between
    b = random.random()
    return x * a + b, list(ORDER)


ORDER = [0, 1, 2, 3]


def test_draws_keep_their_order_around_a_break():
    x = torch.randn(3)

    def args():
        ORDER[:] = [0, 1, 2, 3]
        return (x,)
    _same_as_eager(around_a_break, args, backend="eager")


class Owner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rng = random.Random(3)

    def forward(self, x):
        return x * self.rng.random() + self.rng.uniform(-1, 1)


def test_a_random_instance_is_drawn_from_at_run_time():
    x = torch.randn(3)
    m, m2 = Owner(), Owner()
    want = [m(x) for _ in range(3)]
    cm = coil.compile(m2, backend="eager")
    for w in want:
        torch.testing.assert_close(cm(x), w)
    assert m.rng.getstate() == m2.rng.getstate()
    m2.rng = random.Random(3)      # another instance: drawn from, not the old one
    m.rng = random.Random(3)
    torch.testing.assert_close(cm(x), m(x))
    assert coil.capture.stats["recompiles"] == 0
