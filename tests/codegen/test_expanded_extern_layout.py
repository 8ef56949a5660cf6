"""An extern op's output whose predicted layout is an expand (stride 0) but whose kernel returned another layout:
``ensure_layout`` copied it with ``copy_``, which refuses to write overlapping memory (found by
benchmarks/inference_mode_sweep.py, in every grad mode)."""
import pytest
import torch

import coil

_CASES = {
    "view_as_complex": lambda a: torch.view_as_complex((a[:1] * 1).expand_as(a)) + 1,
    "chunk": lambda a: [t + 1 for t in (a[:1] * 1).expand_as(a).chunk(2, 0)],
}


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_expanded_output_layout_of_an_extern_op(case, dynamic):
    fn, x = _CASES[case], torch.randn(4, 2)
    coil.reset()
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            torch.testing.assert_close(coil.compile(fn, dynamic=dynamic)(x), fn(x))
