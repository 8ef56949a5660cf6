"""Findings of tests/user_reports/FINDINGS_77.md: layouts eager gives that coil's fakes or decompositions did not."""
import pytest
import torch
import torch.nn.functional as F

import coil


def _same(fn, x, dynamic):
    coil.reset()
    got, want = coil.compile(fn, dynamic=dynamic)(x), fn(x)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()


@pytest.mark.parametrize("dynamic", [False, True])
def test_index_fill_of_a_permuted_non_dense_input_keeps_its_layout(dynamic):
    """#3: eager clones ``self`` with preserve_format; torch's decomposition returned it contiguous, so a ``.view``
    eager refuses succeeded with the data in another order."""
    def mk():
        return torch.arange(36.).view(3, 2, 6)[..., ::2].permute(2, 1, 0)   # (3, 2, 3), strides (2, 6, 12)

    _same(lambda a: a.index_fill(0, torch.tensor([0]), -2.), mk(), dynamic)
    _same(lambda a: a.index_fill(2, torch.tensor([1]), torch.tensor(-2.)), mk(), dynamic)

    def flat(a):
        return a.index_fill(0, torch.tensor([0]), -2.).view(-1)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        flat(mk())
    coil.reset()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        coil.compile(flat, dynamic=dynamic)(mk())


@pytest.mark.parametrize("dynamic", [False, True])
def test_channel_shuffle_keeps_channels_last(dynamic):
    """#4b: ShuffleNet's channel shuffle of a channels-last input came back NCHW."""
    x = torch.arange(96.).view(2, 4, 3, 4).contiguous(memory_format=torch.channels_last)
    _same(torch.nn.ChannelShuffle(2), x, dynamic)
    _same(lambda t: F.channel_shuffle(t, 2), x, dynamic)
    _same(torch.nn.ChannelShuffle(2), x.contiguous(), dynamic)


def test_list_loop_resumed_after_a_break_is_compiled():
    """#6: after a break inside a loop over a list, the rest of the frame ran eagerly (the resume function's list
    iterator was not read), and the reason named an internal tracker. Its items are now read lazily, as a tuple's."""
    def f(x, caches):
        for c in caches:
            x = torch.tanh(x @ c)
            if x.abs().max() > 100:
                x = x / 100
        return torch.sin(x) * 2 + x

    x, caches = torch.randn(4, 8), [torch.randn(8, 8) for _ in range(3)]
    r = coil.explain(f, x, caches)
    assert r.graph_count == 4 and not r.eager_frames
    coil.reset()
    torch.testing.assert_close(coil.compile(f)(x, caches), f(x, caches))


@pytest.mark.parametrize("write", ["append", "setitem", "through_iter"])
def test_a_list_written_while_a_resumed_loop_reads_it_sees_the_writes(write):
    """A write to the list the resumed loop iterates breaks the graph there: eager's iterator sees appended and
    replaced items (the lazily read items would not)."""
    def f(x, caches):
        it = iter(caches) if write == "through_iter" else caches
        for c in it:
            x = x @ c
            if x.sum() > -1e9:                # always true, read from data
                if write == "append" and len(caches) < 5:
                    caches.append(c * 0.5)
                elif write != "append":
                    caches[-1] = caches[-1] * 0.5
        return x, len(caches)

    x = torch.randn(4, 8)
    a = [torch.randn(8, 8) * 0.3 for _ in range(3)]
    b = [t.clone() for t in a]
    coil.reset()
    got, want = coil.compile(f)(x, a), f(x, b)
    torch.testing.assert_close(got, want)
    for u, v in zip(a, b, strict=True):
        torch.testing.assert_close(u, v)



@pytest.mark.parametrize("env", ["COIL_CPU_BACKEND=trition", "COIL_FALLBACK_RANDOM=bogus"])
def test_a_misspelled_option_in_the_environment_warns(env):
    """#8: ``COIL_<OPTION>`` values were not checked: a misspelled backend silently meant C++."""
    import os
    import subprocess
    import sys
    name, value = env.split("=")
    r = subprocess.run([sys.executable, "-W", "always", "-c", "import coil"], capture_output=True, text=True,
                       env={**os.environ, name: value}, timeout=120)
    assert r.returncode == 0 and f"{name}={value!r} is not a value of option" in r.stderr, r.stderr
