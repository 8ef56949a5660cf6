"""``coil conformance``: every OpInfo of PyTorch's ``op_db`` through a compiler, vs eager.

For each OpInfo (``name`` or ``name.variant``), each dtype asked for and each sample
(``--samples first`` or ``all``), the sample becomes a small generated function whose
parameters are exactly the sample's tensors (non-tensor arguments are constants), e.g.
``def call(t0, t1): return op(t0, t1, alpha=c0)``; that function is compiled and run on
copies of the tensors, and its outputs (with ``--backward``: the gradients of the float
inputs for fixed random cotangents) are compared with eager's by
``torch.testing.assert_close`` at per-dtype tolerances (:data:`TOLERANCES`).

Status of a sample: ``pass``; ``mismatch`` (values, shapes or dtypes differ; the
message says how); ``error`` (compiling or running raised; its message);
``unsupported-by-eager`` (eager itself raised, or the OpInfo does not list the dtype);
``timeout``; ``skipped`` (the ``--budget`` ran out before it started). An op's status is the worst of its samples' (timeout > error > mismatch >
pass); ``unsupported-by-eager`` only when no sample ran in eager. RNG: both runs start
from ``torch.manual_seed(0)`` and compile with ``fallback_random`` (coil and Inductor),
so random ops are comparable. Ops returning uninitialized memory (:data:`UNINITIALIZED`,
e.g. ``empty``) are compared by shape, dtype and device only.

Native vs extern (compilers using coil's kernels: ``coil``, ``torch+coil``): the IR's
``GraphLowering`` counts, per ATen op, lowerings done natively and ops that fell back to
an extern kernel (no lowering in :data:`coil.ir.lowering.LOWERINGS`, or a lowering that
declined with ``FallbackToExtern``); the harness reads those counts after each
``lower()``. If the IR offers no counts, each op of the recorded ATen graphs is looked
up in the registry instead. Here ``compile_aten_graph`` is called directly, so a code
generation failure that the ``coil`` backend would hide by falling back to the FX
interpreter counts as an ``error``.

Timeouts: by default the ops run in a worker subprocess that reports each op as it
starts and ends; an op exceeding ``timeout`` (SIGALRM in the worker, or the parent's
watchdog if the hang is in C code) is recorded as ``timeout``, a crashed worker as
``error``, and a new worker continues with the next op.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any, Optional

import torch

from coil.bench import measure
from coil.bench.output import Progress, machine_info, meta_markdown, render_markdown, render_table

STATUS_ORDER = ["pass", "mismatch", "error", "timeout"]
ALL_STATUSES = STATUS_ORDER + ["unsupported-by-eager", "skipped"]
#: Ops whose outputs are uninitialized memory: only shapes, dtypes and devices compare.
UNINITIALIZED = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                 "new_empty_strided"}
TOLERANCES = {  # dtype -> (rtol, atol)
    torch.float64: (1e-7, 1e-7), torch.complex128: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5), torch.complex64: (1e-4, 1e-5),
    torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1e-2),
}


@dataclasses.dataclass
class ConformanceOptions:
    compiler: str = "coil"
    dtypes: list = dataclasses.field(default_factory=lambda: ["float32"])
    device: str = "cpu"
    backward: bool = False
    samples: str = "first"
    ops: Optional[list] = None
    shard: Optional[str] = None
    timeout: float = 60.0
    #: extra seconds the parent waits past ``timeout`` before killing a silent worker
    watchdog_grace: float = 60.0
    isolate: bool = True
    progress: bool = True
    #: wall-clock deadline (``time.time()``); ops not started by then are ``skipped``
    deadline: Optional[float] = None
    #: called with the result so far every ~20 ops (so a killed run leaves results)
    on_partial: Any = dataclasses.field(default=None, repr=False, compare=False)


# ---------------------------------------------------------------- op selection

def op_key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def op_table() -> "collections.OrderedDict[str, Any]":
    """``op_key`` -> OpInfo for every entry of ``op_db`` (imports it: ~10 s)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return collections.OrderedDict((op_key(op), op) for op in op_db)


def select_ops(keys: list, names: Optional[list], shard: Optional[str]) -> list:
    """Filter by names (exact keys, or a name selecting all its variants), then take
    shard ``i/n`` (every n-th op starting at i). Raises ValueError on unknown names."""
    if names:
        chosen = [k for k in keys if k in names or k.split(".")[0] in names]
        unknown = [n for n in names if not any(k == n or k.split(".")[0] == n for k in keys)]
        if unknown:
            raise ValueError(f"unknown OpInfo name(s): {unknown}")
        keys = chosen
    if shard:
        i, n = (int(x) for x in shard.split("/"))
        if not 0 <= i < n:
            raise ValueError(f"bad shard {shard!r}: need 0 <= i < n")
        keys = keys[i::n]
    return keys


# ---------------------------------------------------------------- one sample

def build_call(fn, inp, args, kwargs):
    """Generate ``call(t0, t1, ...)`` calling ``fn`` with the sample's structure; returns
    (call, tensors). Tensors nested in lists/tuples/dicts become parameters too."""
    tensors: list = []
    consts: dict = {"fn": fn}

    def expr(v) -> str:
        if isinstance(v, torch.Tensor):
            tensors.append(v)
            return f"t{len(tensors) - 1}"
        if isinstance(v, list):
            return "[" + ", ".join(expr(x) for x in v) + "]"
        if isinstance(v, tuple):
            return "(" + "".join(expr(x) + ", " for x in v) + ")"
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return "{" + ", ".join(f"{k!r}: {expr(x)}" for k, x in v.items()) + "}"
        name = f"c{len(consts)}"
        consts[name] = v
        return name

    parts = [expr(inp)] + [expr(a) for a in args]
    parts += [f"{k}={expr(v)}" for k, v in kwargs.items()]
    params = ", ".join(f"t{i}" for i in range(len(tensors)))
    src = f"def call({params}):\n    return fn({', '.join(parts)})\n"
    exec(compile(src, f"<conformance {getattr(fn, '__name__', 'op')}>", "exec"), consts)
    return consts["call"], tensors


def _clone(tensors: list) -> list:
    out = []
    for t in tensors:
        c = t.detach().clone()
        if t.requires_grad:
            c.requires_grad_(True)
        out.append(c)
    return out


def _float_outputs(out) -> list:
    from coil.bench.models import flatten_outputs

    return [t for t in flatten_outputs(out) if t.requires_grad and
            (t.is_floating_point() or t.is_complex())]


class _FallbackRandom:
    def __enter__(self):
        from coil import config

        self._coil = config.patch(fallback_random=True)
        self._coil.__enter__()
        self._ind = None
        try:
            import torch._inductor.config as ic  # bench may import inductor (to compare)

            self._ind = ic.patch(fallback_random=True)
            self._ind.__enter__()
        except Exception:
            self._ind = None

    def __exit__(self, *exc):
        if self._ind is not None:
            self._ind.__exit__(*exc)
        self._coil.__exit__(*exc)


def run_forward_backward(call, tensors, backward: bool, seed: int = 0):
    """Run ``call`` on copies of ``tensors``; returns (outputs, grads or None)."""
    ts = _clone(tensors)
    torch.manual_seed(seed)
    out = call(*ts)
    if not backward:
        return out, None
    outs = _float_outputs(out)
    leaves = [t for t in ts if t.requires_grad]
    if not outs or not leaves:
        return out, None
    g = torch.Generator().manual_seed(seed + 1)
    cot = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype).to(o.device)
           for o in outs]
    grads = torch.autograd.grad(outs, leaves, cot, allow_unused=True)
    return out, list(grads)


def _metadata_only(x):
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: (tuple(t.shape), t.dtype, t.device.type)
                    if isinstance(t, torch.Tensor) else t, x)


def compare_results(expected, actual, dtype, values: bool = True) -> Optional[str]:
    """None when ``actual`` matches ``expected``; else a one-line reason. With
    ``values=False`` only shapes, dtypes and devices are compared."""
    if not values:
        e, a = _metadata_only(expected), _metadata_only(actual)
        return None if e == a else f"metadata differs: {a} != {e}"[:300]
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   check_dtype=True, check_stride=False)
    except AssertionError as e:
        return " ".join(str(e).split())[:300]
    except Exception as e:  # structure differences raise other types
        return measure.short_error(e)
    return None


def check_sample(op, sample, dtype, compiler, backward: bool) -> dict:
    """Status of one sample: pass | mismatch | error | unsupported-by-eager."""
    call, tensors = build_call(op.op, sample.input, sample.args, sample.kwargs)
    try:
        exp_out, exp_grads = run_forward_backward(call, tensors, backward)
    except Exception as e:
        return {"status": "unsupported-by-eager", "message": measure.short_error(e)}
    try:
        with _FallbackRandom():
            compiled, _ = compiler.compile(call)
            out, grads = run_forward_backward(compiled, tensors, backward)
    except measure.RowTimeout:
        raise
    except Exception as e:
        return {"status": "error", "message": measure.short_error(e)}
    finally:
        compiler.reset()
    reason = compare_results(exp_out, out, dtype, values=op.name not in UNINITIALIZED)
    if reason is None and backward and exp_grads is not None:
        if grads is None:
            reason = "compiled result has no gradient"
        else:
            reason = compare_results(exp_grads, grads, dtype)
            reason = reason and "backward: " + reason
    if reason:
        return {"status": "mismatch", "message": reason}
    return {"status": "pass"}


def worst(statuses: list) -> str:
    """An op's status from its samples' (see the module docstring)."""
    ran = [s for s in statuses if s in STATUS_ORDER]
    if not ran:
        return "unsupported-by-eager" if statuses else "skipped"
    return max(ran, key=STATUS_ORDER.index)


# ---------------------------------------------------------------- native vs extern

_RECORDED: list = []
_LOWERED: list = []  # (native counts, fallback counts) per GraphLowering run


class _ObserveLowering:
    """While active, record each ``coil.ir.graph.GraphLowering``'s ``native`` and
    ``fallbacks`` op counts after ``lower()`` (read only; a no-op if the IR lacks them)."""

    def __enter__(self):
        self.cls = self.orig = None
        try:
            from coil.ir.graph import GraphLowering
        except Exception:
            return self
        self.cls, self.orig = GraphLowering, GraphLowering.lower
        orig = self.orig

        def lower(graph_self, *a, **k):
            out = orig(graph_self, *a, **k)
            native, fallbacks = getattr(graph_self, "native", None), getattr(graph_self, "fallbacks", None)
            if native is not None and fallbacks is not None:
                _LOWERED.append((dict(native), dict(fallbacks)))
            return out

        GraphLowering.lower = lower
        return self

    def __exit__(self, *exc):
        if self.cls is not None:
            self.cls.lower = self.orig


def _lowering_table():
    try:
        from coil.ir import lowering
    except Exception:
        return None
    try:
        import coil.ir.lowering_views  # noqa: F401  (registers more lowerings)
    except Exception:
        pass
    return lowering.LOWERINGS


def observed_kinds() -> Optional[dict]:
    """{"native": [...], "extern": [...]} from what the IR actually did (lowered vs fell
    back to an extern kernel, including lowerings that declined with FallbackToExtern)."""
    if not _LOWERED:
        return None
    native = sorted({k for n, _ in _LOWERED for k in n})
    extern = sorted({k for _, f in _LOWERED for k in f})
    return {"native": native, "extern": extern}


def classify_ops(targets) -> Optional[dict]:
    """{"native": [...], "extern": [...]} for ATen op targets, from the lowering registry
    (None when the IR is not importable)."""
    table = _lowering_table()
    if table is None:
        return None
    native, extern = set(), set()
    for t in targets:
        if not isinstance(t, torch._ops.OpOverload):
            continue
        (native if (t in table or t.overloadpacket in table) else extern).add(str(t))
    return {"native": sorted(native), "extern": sorted(extern)}


def recording_coil_backend(gm, example_inputs):
    """The coil backend, with codegen called directly and ATen ops recorded."""
    from coil.aot import aot_compile
    from coil.backends.coil_backend import _graph_device
    from coil.codegen import compile_aten_graph

    def fw(aten_gm, inputs):
        _RECORDED.extend(n.target for n in aten_gm.graph.nodes if n.op == "call_function")
        return compile_aten_graph(aten_gm, inputs, _graph_device(inputs))

    return aot_compile(gm, example_inputs, fw_compiler=fw, bw_compiler=fw)


def conformance_compiler(name: str):
    """The Compiler used for ``name``: ``coil``/``torch+coil`` use
    :func:`recording_coil_backend`; others come from :mod:`coil.bench.compilers`."""
    from coil.bench.compilers import Compiler, resolve_compiler

    if name == "coil":
        def comp(fn, probe):
            import coil
            return coil.compile(fn, backend=recording_coil_backend)
        return Compiler("coil", "coil", "coil (recording)", comp), True
    if name == "torch+coil":
        def comp(fn, probe):
            return torch.compile(fn, backend=recording_coil_backend)
        return Compiler("torch+coil", "torch", "torch+coil (recording)", comp), True
    return resolve_compiler(name), False


def check_op(op, opts: ConformanceOptions, compiler, records: bool) -> dict:
    """All dtypes and samples of one OpInfo → ``{"op", "status", "dtypes", ...}``."""
    t0 = time.perf_counter()
    device = opts.device
    supported = op.supported_dtypes(device)
    per_dtype, statuses, first_msg = {}, [], None
    _RECORDED.clear()
    _LOWERED.clear()
    for dname in opts.dtypes:
        dtype = getattr(torch, dname)
        if dtype not in supported:
            per_dtype[dname] = {"status": "unsupported-by-eager", "samples": 0,
                                "message": "dtype not supported by the OpInfo"}
            statuses.append("unsupported-by-eager")
            continue
        bwd = bool(opts.backward and op.supports_autograd and
                   (dtype.is_floating_point or dtype.is_complex))
        samples = []
        try:
            for s in op.sample_inputs(device, dtype, requires_grad=bwd):
                samples.append(s)
                if opts.samples == "first":
                    break
        except Exception as e:
            per_dtype[dname] = {"status": "unsupported-by-eager", "samples": 0,
                                "message": "sample_inputs failed: " + measure.short_error(e)}
            statuses.append("unsupported-by-eager")
            continue
        with _ObserveLowering():
            results = [check_sample(op, s, dtype, compiler, bwd) for s in samples]
        st = worst([r["status"] for r in results])
        msg = next((r["message"] for r in results if r["status"] == st and "message" in r), None)
        per_dtype[dname] = {"status": st, "samples": len(results), "message": msg,
                            "counts": dict(collections.Counter(r["status"] for r in results))}
        statuses.append(st)
        if st not in ("pass", "skipped") and first_msg is None:
            first_msg = f"{dname}: {msg}"
    status = worst(statuses)
    out = {"op": op_key(op), "status": status, "message": first_msg if status != "pass" else None,
           "dtypes": per_dtype, "seconds": round(time.perf_counter() - t0, 3)}
    if records:
        lowering = observed_kinds() or (classify_ops(set(_RECORDED)) if _RECORDED else None)
        out["lowering"] = lowering
        if lowering is not None:
            out["kind"] = ("native" if not lowering["extern"] else
                           "extern" if not lowering["native"] else "mixed")
    return out


# ---------------------------------------------------------------- running many ops

def _run_in_process(keys, table, opts, on_start, on_result) -> None:
    compiler, records = conformance_compiler(opts.compiler)
    for k in keys:
        on_start(k)
        if opts.deadline is not None and time.time() > opts.deadline:
            on_result({"op": k, "status": "skipped", "message": "time budget used up"})
            continue
        try:
            with measure.time_limit(opts.timeout):
                res = check_op(table[k], opts, compiler, records)
        except measure.RowTimeout as e:
            res = {"op": k, "status": "timeout", "message": str(e)}
            compiler.reset()
        except Exception as e:  # a harness failure on this op; keep going
            res = {"op": k, "status": "error", "message": "harness: " + measure.short_error(e)}
        on_result(res)


def _worker_main() -> int:
    """``python -m coil.bench.conformance --worker``: options on stdin, ``@@`` lines out."""
    spec = json.loads(sys.stdin.read())
    for p in reversed(spec.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    opts = ConformanceOptions(**spec["opts"])
    table = op_table()
    keys = spec.get("keys") or select_ops(list(table), opts.ops, opts.shard)
    out = sys.stdout

    def emit(kind, obj):
        out.write(f"@@{kind} {json.dumps(obj)}\n")
        out.flush()

    emit("keys", keys)
    _run_in_process(keys, table, opts, lambda k: emit("start", k), lambda r: emit("result", r))
    emit("done", None)
    return 0


def _record(res: dict, results: list, done: set, progress_cb) -> None:
    results.append(res)
    done.add(res["op"])
    progress_cb(res)


def _run_isolated(opts: ConformanceOptions, progress_cb) -> list:
    """Drive worker subprocesses; restart after a crash or a hang (see module docstring)."""
    results: list = []
    keys: Optional[list] = None
    done: set = set()
    while True:
        remaining = None if keys is None else [k for k in keys if k not in done]
        if remaining is not None and not remaining:
            return results
        spec = {"opts": {k: v for k, v in dataclasses.asdict(opts).items() if k != "on_partial"},
                "keys": remaining, "sys_path": sys.path}
        proc = subprocess.Popen([sys.executable, "-m", "coil.bench.conformance", "--worker"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        lines: "queue.Queue" = queue.Queue()
        err_tail: collections.deque = collections.deque(maxlen=20)
        threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)],
                         daemon=True).start()
        threading.Thread(target=lambda: [err_tail.append(l) for l in proc.stderr],
                         daemon=True).start()
        proc.stdin.write(json.dumps(spec))
        proc.stdin.close()
        current, wait = None, 600.0  # generous until the op table is imported
        finished = False
        while True:
            try:
                line = lines.get(timeout=wait)
            except queue.Empty:
                proc.kill()
                proc.wait()
                if current is None:
                    raise RuntimeError("conformance worker did not start: "
                                       + "".join(err_tail)[-500:])
                res = {"op": current, "status": "timeout",
                       "message": f"no result after {wait:.0f} s (worker killed)"}
                _record(res, results, done, progress_cb)
                break
            if line is None:  # worker exited
                proc.wait()
                if finished:
                    return results
                if current is None:
                    raise RuntimeError(f"conformance worker exited {proc.returncode}: "
                                       + "".join(err_tail)[-1000:])
                res = {"op": current, "status": "error",
                       "message": f"worker crashed (exit {proc.returncode}): "
                                  + " ".join("".join(err_tail).split())[-300:]}
                _record(res, results, done, progress_cb)
                break
            if not line.startswith("@@"):
                continue
            kind, _, payload = line[2:].partition(" ")
            obj = json.loads(payload)
            if kind == "keys":
                keys = keys or obj
                progress_cb(("total", len(keys)))
            elif kind == "start":
                current, wait = obj, opts.timeout + opts.watchdog_grace
            elif kind == "result":
                _record(obj, results, done, progress_cb)
                current = None
            elif kind == "done":
                finished = True


def run_conformance(opts: ConformanceOptions) -> dict:
    """Run the op list; returns ``{"meta", "summary", "ops": [per-op dict]}``."""
    for d in opts.dtypes:
        if not isinstance(getattr(torch, d, None), torch.dtype):
            raise ValueError(f"unknown dtype {d!r}")
    bar = Progress(1, opts.progress)

    seen: list = []

    def progress_cb(item):
        if isinstance(item, tuple):
            bar.total = max(item[1], 1)
            return
        bar.advance(f"{item['op']}: {item['status']}")
        seen.append(item)
        if opts.on_partial is not None and len(seen) % 20 == 0:
            opts.on_partial(_result(opts, list(seen)))

    if opts.isolate:
        results = _run_isolated(opts, progress_cb)
    else:
        table = op_table()
        keys = select_ops(list(table), opts.ops, opts.shard)
        bar.total = max(len(keys), 1)
        results = []
        _run_in_process(keys, table, opts, lambda k: bar.show(k),
                        lambda r: (results.append(r), progress_cb(r)))
    bar.close()
    return _result(opts, results)


def _result(opts: ConformanceOptions, results: list) -> dict:
    meta = machine_info()
    meta.update({k: getattr(opts, k) for k in
                 ("compiler", "dtypes", "device", "backward", "samples", "shard")})
    return {"meta": meta, "summary": summarize(results), "ops": results}


def merge(results: list) -> dict:
    """One result from several (e.g. the shards of one run): ops concatenated, summary
    recomputed, meta of the first with ``shard`` set to the shards merged."""
    ops = [o for r in results for o in r["ops"]]
    meta = dict(results[0]["meta"])
    meta["shard"] = "+".join(str(r["meta"].get("shard")) for r in results)
    meta["command"] = " ; ".join(r["meta"].get("command", "") for r in results)
    return {"meta": meta, "summary": summarize(ops), "ops": ops}


def summarize(results: list) -> dict:
    counts = collections.Counter(r["status"] for r in results)
    kinds = collections.Counter(r.get("kind") for r in results if r.get("kind"))
    ran = sum(counts[s] for s in STATUS_ORDER)
    return {"ops": len(results), "counts": dict(counts), "kinds": dict(kinds),
            "pass_rate_of_eager_supported": (counts["pass"] / ran) if ran else None}


def format_text(result: dict) -> str:
    rows = [[r["op"], r["status"], r.get("kind") or "—", (r.get("message") or "")[:100]]
            for r in result["ops"] if r["status"] != "pass"]
    s = result["summary"]
    head = (f"{s['ops']} ops: " + ", ".join(f"{k} {v}" for k, v in sorted(s["counts"].items()))
            + (f"; lowered: " + ", ".join(f"{k} {v}" for k, v in sorted(s["kinds"].items()))
               if s["kinds"] else ""))
    if not rows:
        return head
    return render_table(["op", "status", "kind", "message"], rows) + "\n\n" + head


def format_markdown(result: dict) -> str:
    s, m = result["summary"], result["meta"]
    rate = s["pass_rate_of_eager_supported"]
    lines = [meta_markdown(m), "",
             render_markdown(["compiler", "dtypes", "backward", "samples", "ops"]
                             + ALL_STATUSES
                             + ["pass rate", "native/mixed/extern"],
                             [[m["compiler"], ",".join(m["dtypes"]), str(m["backward"]),
                               m["samples"], str(s["ops"])]
                              + [str(s["counts"].get(k, 0))
                                 for k in ALL_STATUSES]
                              + ["—" if rate is None else f"{100 * rate:.1f}%",
                                 "/".join(str(s["kinds"].get(k, 0))
                                          for k in ("native", "mixed", "extern"))
                                 if s["kinds"] else "—"]])]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(_worker_main())
    from coil.cli import main

    sys.exit(main(["conformance"] + sys.argv[1:]))
