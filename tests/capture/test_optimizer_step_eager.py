"""``coil.compile(opt.step)``: optimizer steps are not compiled yet; the call says so (a warning and an
``eager_fallback`` event) and the step runs eagerly, equal to eager's."""
import copy
import json
import warnings

import pytest
import torch

import coil


def test_compiled_optimizer_step_warns_and_matches_eager(tmp_path):
    coil.reset()
    old = coil.trace.trace_dir()
    coil.trace.set_dir(str(tmp_path))
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    m2 = copy.deepcopy(m)
    opt, opt2 = torch.optim.AdamW(m.parameters(), lr=0.1), torch.optim.AdamW(m2.parameters(), lr=0.1)
    try:
        with pytest.warns(UserWarning, match="AdamW.step: optimizer steps are not compiled"):
            step = coil.compile(opt.step)
    finally:
        coil.trace.set_dir(old)
    for _ in range(3):
        x = torch.randn(2, 4)
        m(x).sum().backward()
        m2(x).sum().backward()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            step()
        opt2.step()
        opt.zero_grad()
        opt2.zero_grad()
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    events = [json.loads(line) for f in tmp_path.rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert any(e.get("event") == "eager_fallback" and "optimizer steps" in e.get("reason", "") for e in events)
