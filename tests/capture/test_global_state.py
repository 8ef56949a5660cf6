"""Global state a compiled function reads or changes behaves as in eager (fresh-user trial)."""
import torch

import coil


def test_manual_seed_inside_a_compiled_function_runs_every_call():
    """torch._dynamo wraps torch.manual_seed after coil's import; the wrapped function was not
    recognised as a graph break, and the seed ran only once, while tracing."""
    def f(x):
        torch.manual_seed(0)
        return x + torch.rand(3)

    def g(x):
        torch.manual_seed(0)
        a = torch.rand(3)
        torch.manual_seed(0)
        return a - torch.rand(3)

    cf = coil.compile(f, options={"fallback_random": True})
    cg = coil.compile(g, options={"fallback_random": True})
    x = torch.zeros(3)
    torch.testing.assert_close(cf(x), f(x), rtol=0, atol=0)
    torch.testing.assert_close(cf(x), f(x), rtol=0, atol=0)
    torch.testing.assert_close(cg(x), torch.zeros(3), rtol=0, atol=0)
    torch.manual_seed(1)
    cf(x)
    after_compiled = torch.rand(2)
    torch.manual_seed(1)
    f(x)
    torch.testing.assert_close(after_compiled, torch.rand(2), rtol=0, atol=0)


def test_global_settings_read_in_the_function_are_guarded():
    """``torch.are_deterministic_algorithms_enabled()`` and ``torch.get_num_threads()`` were folded
    to their compile-time values: after changing them the compiled function took the old branch."""
    f = lambda x: x + (1 if torch.are_deterministic_algorithms_enabled() else 2)  # noqa: E731
    g = lambda x: x * torch.get_num_threads()  # noqa: E731
    cf, cg = coil.compile(f), coil.compile(g)
    x = torch.ones(1)
    cf(x), cg(x)
    threads = torch.get_num_threads()
    try:
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(threads + 1)
        torch.testing.assert_close(cf(x), f(x))
        torch.testing.assert_close(cg(x), g(x))
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)
    torch.testing.assert_close(cf(x), f(x))
    torch.testing.assert_close(cg(x), g(x))


def test_os_getenv_is_read_at_trace_time_and_guarded(monkeypatch):
    """``os.getenv(key, default)`` (transformers' ``torch_compilable_check``) was a graph break; its value is now a
    constant guarded on the variable, so setting or changing it recompiles."""
    import os

    def f(x):
        return x * 2 if os.getenv("COIL_TEST_GETENV", default="0") == "1" else x + int(os.getenv("COIL_TEST_N", "1"))

    cf, x = coil.compile(f), torch.ones(2)
    coil.reset()
    monkeypatch.delenv("COIL_TEST_GETENV", raising=False)
    monkeypatch.delenv("COIL_TEST_N", raising=False)
    for env in ({}, {"COIL_TEST_N": "5"}, {"COIL_TEST_GETENV": "1"}):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        torch.testing.assert_close(cf(x), f(x))
    assert coil.capture.stats["graph_breaks"] == 0 and coil.capture.stats["graphs"] == 3, coil.capture.stats
