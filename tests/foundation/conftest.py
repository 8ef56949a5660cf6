"""Fixtures for the foundation tests.

``fake_capture`` stands in for coil.capture where the
point of a test is the API wrapper, not capture: it traces the function with
``torch.fx.symbolic_trace`` on the first call, hands the graph to the backend inside
a compile context (so the compile log gets a compile id and a ``capture`` stage),
caches the result, and supports ``reset``/``disable`` the way the seam promises.
"""
import pytest
import torch

from coil import trace


class FakeCapture:
    def __init__(self):
        self.caches = []
        self.calls = []  # (target, fullgraph, dynamic) per wrap_callable call
        self.disabled = set()

    def wrap_callable(self, fn, *, backend, fullgraph=False, dynamic=None, options=None):
        self.calls.append((fn, fullgraph, dynamic))
        if id(fn) in self.disabled:
            return fn
        cache = {}
        self.caches.append(cache)
        frame = trace.next_frame_id()
        name = type(fn).__name__ if isinstance(fn, torch.nn.Module) else fn.__name__

        def run(*args):
            if "compiled" not in cache:
                attempt = cache.get("attempts", 0)
                cache["attempts"] = attempt + 1
                with trace.compile_context(frame, attempt):
                    with trace.stage("capture"):
                        gm = torch.fx.symbolic_trace(fn)
                        trace.log("capture", fn=name, num_nodes=len(gm.graph.nodes))
                        trace.artifact("fx_graph", lambda: gm.code, kind="python")
                    cache["compiled"] = backend(gm, list(args))
            return cache["compiled"](*args)

        return run

    def reset(self):
        for c in self.caches:
            c.pop("compiled", None)

    def disable(self, fn):
        self.disabled.add(id(fn))
        return fn

    def explain(self, fn, *args, **kwargs):
        return "explained"


@pytest.fixture
def fake_capture(monkeypatch):
    import coil.capture

    fake = FakeCapture()
    for name in ("wrap_callable", "reset", "disable", "explain"):
        monkeypatch.setattr(coil.capture, name, getattr(fake, name))
    return fake


@pytest.fixture
def trace_dir(tmp_path):
    """Turn the compile log on into a temporary directory for one test."""
    d = tmp_path / "log"
    old = trace.trace_dir()
    trace.set_dir(str(d))
    yield d
    trace.set_dir(old)
