"""AOT under ``torch.inference_mode()``: composite ops reach coil's dispatch modes undecomposed there (no autograd key
decomposes them first, as under ``torch.no_grad()``); found by benchmarks/inference_mode_sweep.py."""
import pytest
import torch

import coil

_LINALG = {
    "inv": lambda a, b: torch.linalg.inv(a) + 1,
    "solve": lambda a, b: torch.linalg.solve(a, b) * 2,
    "cholesky": lambda a, b: torch.linalg.cholesky(a @ a.mT + 3 * torch.eye(3)) - 1,
    "lu_factor": lambda a, b: torch.linalg.lu_factor(a)[0] + 1,
    "tensorinv": lambda a, b: torch.linalg.tensorinv(a.reshape(3, 3), ind=1) + 1,
}


@pytest.mark.parametrize("case", sorted(_LINALG))
def test_linalg_error_check_under_inference_mode(case):
    """``linalg.inv`` & co. (composite) decomposed inside functionalization under inference_mode, past the mode that
    replaces their ``_linalg_check_errors``: "Could not find a token for effect EffectType.ORDERED" (no_grad compiled)."""
    fn = _LINALG[case]
    torch.manual_seed(0)
    a, b = torch.randn(3, 3) + 3 * torch.eye(3), torch.randn(3, 2)
    for ctx in (torch.no_grad, torch.inference_mode):
        coil.reset()
        with ctx():
            torch.testing.assert_close(coil.compile(fn)(a, b), fn(a, b), rtol=1e-4, atol=1e-5)


def test_singular_input_raises_under_inference_mode():
    """The error check still runs (as an assert in the graph): a singular matrix raises as in eager."""
    fn = _LINALG["inv"]
    coil.reset()
    with torch.inference_mode():
        with pytest.raises(torch.linalg.LinAlgError):
            fn(torch.zeros(3, 3), None)
        with pytest.raises(torch.linalg.LinAlgError):
            coil.compile(fn)(torch.zeros(3, 3), None)
