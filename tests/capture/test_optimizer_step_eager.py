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


def test_optimizer_step_inside_a_compiled_function_warns_once_naming_the_line(tmp_path):
    """``o.step()`` inside a compiled function: the same warning (once per code object, attributed to the line of
    the call), a graph break and an ``eager_fallback`` event naming it in the compile log; the step equals eager's."""
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2)
    m2 = copy.deepcopy(m)
    o, o2 = torch.optim.Adam(m.parameters(), lr=0.1), torch.optim.Adam(m2.parameters(), lr=0.1)

    def step():
        o.step()

    old = coil.trace.trace_dir()
    coil.trace.set_dir(str(tmp_path))
    try:
        compiled = coil.compile(step)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(2):
                m(torch.ones(3, 4)).sum().backward()
                m2(torch.ones(3, 4)).sum().backward()
                compiled()
                o2.step()
    finally:
        coil.trace.set_dir(old)
    [msg] = [x for x in w if "optimizer steps are not compiled" in str(x.message)]
    assert "Adam.step" in str(msg.message)
    assert (msg.filename, msg.lineno) == (__file__, step.__code__.co_firstlineno + 1)
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    events = [json.loads(line) for f in tmp_path.rglob("*.jsonl") for line in f.read_text().splitlines()]
    for kind in ("graph_break", "eager_fallback"):
        assert any(e.get("event") == kind and "Adam.step: optimizer steps" in e.get("reason", "") for e in events)
