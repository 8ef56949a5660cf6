"""Arguments eager refuses but torch's meta kernels accept raise eager's error at
capture, at the user's line (coil/capture/meta_checks.py; user report 16)."""
import traceback

import pytest
import torch

import coil

I = torch.tensor([0, 1, 0, 2])


@pytest.mark.parametrize("name, fn", [
    ("index_add", lambda t, h: t.index_add(0, I, h)),
    ("index_add_fn", lambda t, h: torch.index_add(t, 0, I, h)),
    ("index_add_", lambda t, h: t.clone().index_add_(0, I, h)),
    ("index_copy", lambda t, h: t.index_copy(0, I, h)),
    ("index_put", lambda t, h: t.index_put((I,), h)),
    ("index_put_", lambda t, h: t.clone().index_put_((I,), h)),
])
def test_dtype_mismatch_raises_eagers_error(name, fn):
    t = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    h = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).bfloat16()
    with pytest.raises(RuntimeError) as ref:
        fn(t, h)
    with pytest.raises(RuntimeError) as got:
        coil.compile(fn)(t, h)
    assert str(got.value) == str(ref.value)
    # same dtypes still compile and match
    torch.testing.assert_close(coil.compile(fn)(t, h.float()), fn(t, h.float()))


def test_error_names_the_user_line():
    def user_fn(t, h):
        y = t.index_add(0, I, h)   # the line
        return y * 2
    with pytest.raises(RuntimeError) as ei:
        coil.compile(user_fn)(torch.randn(4, 8), torch.randn(4, 8).bfloat16())
    text = "".join(traceback.format_exception(ei.value))
    assert "y = t.index_add(0, I, h)   # the line" in text
