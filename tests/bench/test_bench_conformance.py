"""coil conformance: statuses from deliberately wrong compilers, the worker watchdog,
and a fixed small sample through the real pipeline."""
import json

import pytest
import torch

from coil.bench import conformance as conf


def _run(compiler, ops, **kw):
    opts = conf.ConformanceOptions(compiler=compiler, ops=ops, isolate=False, progress=False, **kw)
    res = conf.run_conformance(opts)
    return {r["op"]: r for r in res["ops"]}, res


def test_build_call_lifts_nested_tensors():
    a, b = torch.randn(3), torch.randn(3)
    call, tensors = conf.build_call(torch.cat, [a, b], (0,), {})
    assert len(tensors) == 2
    x, y = torch.randn(2), torch.randn(2)
    torch.testing.assert_close(call(x, y), torch.cat([x, y]))  # inputs are parameters
    call, tensors = conf.build_call(torch.add, a, (b,), {"alpha": 2})
    torch.testing.assert_close(call(a, b), a + 2 * b)


def test_worst_status_order():
    assert conf.worst(["pass", "mismatch", "pass"]) == "mismatch"
    assert conf.worst(["mismatch", "error"]) == "error"
    assert conf.worst(["unsupported-by-eager", "pass"]) == "pass"
    assert conf.worst(["unsupported-by-eager"]) == "unsupported-by-eager"
    assert conf.worst([]) == "skipped"


def test_statuses_from_fake_compilers():
    ok, _ = _run("fake_compilers:IDENTITY", ["sin", "sum"], backward=True)
    assert ok["sin"]["status"] == "pass" and ok["sum"]["status"] == "pass"
    wrong, _ = _run("fake_compilers:WRONG", ["sin"])
    assert wrong["sin"]["status"] == "mismatch" and wrong["sin"]["message"]
    err, res = _run("fake_compilers:RAISES", ["sin"])
    assert err["sin"]["status"] == "error" and "not built yet" in err["sin"]["message"]
    assert res["summary"]["counts"] == {"error": 1}


def test_dtype_unsupported_by_eager():
    # OpInfo for nn.functional.relu lists no bool support
    got, _ = _run("fake_compilers:IDENTITY", ["nn.functional.relu"], dtypes=["bool"])
    assert got["nn.functional.relu"]["status"] == "unsupported-by-eager"


def test_shard_and_select():
    keys = ["a", "b.x", "b.y", "c", "d"]
    assert conf.select_ops(keys, ["b"], None) == ["b.x", "b.y"]
    assert conf.select_ops(keys, None, "1/2") == ["b.x", "c"]
    with pytest.raises(ValueError):
        conf.select_ops(keys, ["zzz"], None)


@pytest.mark.slow  # three worker start-ups, each importing op_db (~15 s)
def test_worker_survives_crash_and_hang():
    opts = conf.ConformanceOptions(compiler="fake_compilers:BY_OP", ops=["sin", "cos", "tan", "exp"],
                                   timeout=2, watchdog_grace=3, progress=False)
    res = conf.run_conformance(opts)
    got = {r["op"]: r["status"] for r in res["ops"]}
    assert got == {"sin": "pass", "cos": "error", "tan": "timeout", "exp": "pass"}
    assert "crashed" in next(r for r in res["ops"] if r["op"] == "cos")["message"]


def test_fixed_sample_through_coil(tmp_path):
    """The CI sample: a handful of ops through the real coil compiler. Statuses must be
    well formed; once capture is built, the simple ones must pass."""
    ops = ["add", "mul", "sin", "exp", "sum", "amax", "softmax", "where"]
    got, res = _run("coil", ops, timeout=120)
    assert set(got) >= {"add", "sin"}
    assert all(r["status"] in ("pass", "mismatch", "error", "timeout", "unsupported-by-eager")
               for r in got.values())
    json.dumps(res)  # serialisable
    if any("NotImplementedError" in (r.get("message") or "") for r in got.values()):
        pytest.skip("a pipeline layer is not built yet")
    for op in ("add", "mul", "sin", "exp"):
        assert got[op]["status"] == "pass", got[op]
        assert got[op]["kind"] == "native", got[op]


def test_merge_shards_recounts(tmp_path):
    a = {"meta": {"shard": "0/2", "command": "x", "compiler": "c", "dtypes": ["float32"],
                  "backward": False, "samples": "first"},
         "ops": [{"op": "a", "status": "pass"}, {"op": "b", "status": "error", "kind": "native"}]}
    b = dict(a, meta=dict(a["meta"], shard="1/2"), ops=[{"op": "c", "status": "mismatch"}])
    m = conf.merge([a, b])
    assert m["summary"]["ops"] == 3
    assert m["summary"]["counts"] == {"pass": 1, "error": 1, "mismatch": 1}
    assert m["summary"]["pass_rate_of_eager_supported"] == pytest.approx(1 / 3)
    assert "| c | float32 |" in conf.format_markdown(m)


def test_uninitialized_ops_compare_metadata_only():
    a, b = torch.empty(3, 4).fill_(1.0), torch.empty(3, 4).fill_(2.0)
    assert conf.compare_results(a, b, torch.float32, values=False) is None
    assert conf.compare_results(a, b, torch.float32) is not None
    assert conf.compare_results(a, torch.empty(4, 3), torch.float32, values=False)
    assert "empty" in conf.UNINITIALIZED


def test_partial_results_every_20_ops():
    names = ["abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh",
             "exp", "expm1", "floor", "frac", "log", "log10", "log1p", "log2", "neg", "sin",
             "sinh", "sqrt"]
    partials = []
    opts = conf.ConformanceOptions(compiler="fake_compilers:IDENTITY", ops=names, isolate=False,
                                   progress=False)
    opts.on_partial = partials.append
    res = conf.run_conformance(opts)
    assert len(partials) == 1 and partials[0]["summary"]["ops"] == 20
    assert res["summary"]["ops"] == len(res["ops"]) >= 22
