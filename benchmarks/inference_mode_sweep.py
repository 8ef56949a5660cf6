"""OpInfo sweep of coil under ``torch.inference_mode()`` (vs eager, and vs coil under ``torch.no_grad()``).

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/inference_mode_sweep.py \\
        [--ops add,mul] [--jobs 2] [--timeout 20] [--budget 1800] [--out /tmp/infmode.jsonl] [--models] [--dynamic]

For each entry of ``op_db`` supporting float32 on CPU, the first 3 sample inputs are run eagerly and through
``coil.compile`` (``coil.reset()`` per case) under ``torch.inference_mode()``, in these cases:

* ``pw<i>``: sample i, wrapped as ``op(...) + 1`` on each floating output (so the result is not a passthrough);
* ``raw0``: sample 0, the op's result returned as is (views included: aliasing with the inputs is compared too);
* ``nc0``: sample 0 with every tensor input of 2+ dims replaced by a non-contiguous (transposed-storage) copy;
* ``exp0``: sample 0 with every tensor input of 2+ rows replaced by its first row expanded (stride 0);
* ``pre_exp0`` / ``pre_nc0``: sample 0 with every floating argument an intermediate of the graph: its first row
  expanded (``(a[:1] * 1).expand_as(a)``) / a non-contiguous copy (``(a.transpose(0, 1) * 1).transpose(0, 1)``);
* ``infin0``: sample 0 with the inputs themselves inference tensors (created under inference_mode);
* ``inplace0``: ``op.inplace_variant`` on sample 0 (the mutated input and the result are compared), also on
  inference-tensor inputs (``inplace_infin0``) and non-contiguous ones (``inplace_nc0``).

Compared: values (NaN-aware, fp32 tolerances as coil.testing.TOLERANCES), dtype, shape, strides (of dims of size > 1),
which inputs each output aliases, and the inputs after the call (mutations). A case whose eager result differs between
two runs is ``nondet`` (values not compared); one where eager raises is ``eager-error``. A failing case is re-run the
same way under ``torch.no_grad()``: ``infonly`` in the result marks a failure that happens only under inference_mode.

Each op runs in a worker subprocess with a per-op timeout (SIGALRM, plus a watchdog in the parent that kills and
restarts a silent worker); ``--budget`` (seconds) stops starting new ops. Results: one JSON line per op in ``--out``;
a summary of failing cases is printed. ``--models`` also runs tiny random-weight BERT / GPT-2 / T5 / MPNet / BART /
Llama (transformers, eval, batch 2 with a padding mask) under inference_mode and no_grad, eager vs coil
(``--models --ops none``: the models alone).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

import torch
import torch.utils._pytree as pytree

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import coil  # noqa: E402
from coil.bench import measure  # noqa: E402
from coil.bench.conformance import UNINITIALIZED, build_call, op_key  # noqa: E402
from coil.testing import TOLERANCES  # noqa: E402

ATOL, RTOL = TOLERANCES[torch.float32]


def _noncontig(t):
    if not isinstance(t, torch.Tensor) or t.dim() < 2:
        return t
    return t.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_(t.requires_grad)


def _expanded(t):
    if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] < 2:
        return t
    return t.detach()[:1].expand_as(t)


def _pre(how, call):
    """``call`` on intermediates: each floating tensor argument ``a`` computed in the graph as ``a * 1``, its first
    row expanded (``exp``) or its transpose's copy transposed back (``nc``). (No pytree here: coil's capture breaks
    the graph at ``tree_map`` of the arguments.)"""
    def one(a):
        if not a.is_floating_point() or a.layout != torch.strided:
            return a
        if how == "exp" and a.dim() >= 1 and a.shape[0] >= 2:
            return (a[:1] * 1).expand_as(a)
        if how == "nc" and a.dim() >= 2:
            return (a.transpose(0, 1) * 1).transpose(0, 1)
        return a * 1
    return lambda *ts: _pw(call(*[one(a) for a in ts]))


def _pw(out):
    """``out + 1`` for each floating output (no pytree: see :func:`_pre`)."""
    if isinstance(out, torch.Tensor):
        return out + 1 if out.is_floating_point() or out.is_complex() else out
    if isinstance(out, (tuple, list)):
        return [_pw(o) for o in out]
    return out


def _copy(t):  # same layout (stride 0 kept), own storage
    try:
        return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage().clone(), t.storage_offset(), t.shape, t.stride())
    except Exception:  # noqa: BLE001 - sparse...
        return t.clone()


def _clone(ts, inference):
    with torch.inference_mode(inference):
        return [_copy(t) for t in ts]


def _run(call, tensors, ctx, inference_inputs=False):
    ins = _clone(tensors, inference_inputs)
    torch.manual_seed(0)
    with ctx():
        out = call(*ins)
    return out, ins


def _aliases(out, ins):
    ptrs = [t.untyped_storage().data_ptr() if t.numel() else None for t in ins]
    return [[i for i, p in enumerate(ptrs) if p is not None and o.numel() and
             o.untyped_storage().data_ptr() == p] for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]


def _compare(exp, got, values=True):
    """None or a one-line reason."""
    (eo, ei), (go, gi) = exp, got
    el, gl = pytree.tree_leaves(eo), pytree.tree_leaves(go)
    if len(el) != len(gl):
        return f"structure: {len(gl)} leaves != {len(el)}"
    for k, (e, g) in enumerate(zip(el, gl)):
        if isinstance(e, torch.Tensor) != isinstance(g, torch.Tensor):
            return f"out{k}: type {type(g).__name__} != {type(e).__name__}"
        if not isinstance(e, torch.Tensor):
            if values and e != g and not (e != e and g != g):
                return f"out{k}: {g!r} != {e!r}"
            continue
        if (e.dtype, e.shape) != (g.dtype, g.shape):
            return f"out{k}: {g.dtype}{tuple(g.shape)} != {e.dtype}{tuple(e.shape)}"
        if values:
            try:
                torch.testing.assert_close(g, e, atol=ATOL, rtol=RTOL, equal_nan=True, check_stride=False)
            except AssertionError as err:
                return f"out{k} values: " + " ".join(str(err).split())[:200]
        if e.numel() > 1 and [st for st, n in zip(e.stride(), e.shape) if n > 1] != \
                [st for st, n in zip(g.stride(), g.shape) if n > 1]:
            return f"out{k}: stride {g.stride()} != {e.stride()} (shape {tuple(e.shape)})"
    if _aliases(eo, ei) != _aliases(go, gi):
        return f"aliasing: {_aliases(go, gi)} != eager {_aliases(eo, ei)}"
    for k, (e, g) in enumerate(zip(ei, gi)):
        try:
            torch.testing.assert_close(g, e, atol=ATOL, rtol=RTOL, equal_nan=True)
        except AssertionError as err:
            return f"input {k} after the call: " + " ".join(str(err).split())[:200]
    return None


DYNAMIC = None  # --dynamic: coil.compile(..., dynamic=True)


def check_case(call, tensors, ctx, values, inference_inputs=False):
    try:
        exp = _run(call, tensors, ctx, inference_inputs)
        exp2 = _run(call, tensors, ctx, inference_inputs)
    except Exception as e:  # noqa: BLE001
        return "eager-error", measure.short_error(e, 160)
    nondet = values and _compare(exp, exp2) is not None
    coil.reset()
    try:
        with coil.config.patch(fallback_random=True):
            got = _run(coil.compile(call, dynamic=DYNAMIC), tensors, ctx, inference_inputs)
    except measure.RowTimeout:
        raise
    except Exception as e:  # noqa: BLE001
        return "error", measure.short_error(e, 200)
    finally:
        coil.reset()
    reason = _compare(exp, got, values and not nondet)
    if reason:
        return "fail", reason
    return ("nondet" if nondet else "pass"), None


def check_op(op, nsamples=3):
    if torch.float32 not in op.supported_dtypes("cpu"):
        return {"status": "unsupported"}
    samples = []
    try:
        for s in op.sample_inputs("cpu", torch.float32, requires_grad=False):
            samples.append(s)
            if len(samples) >= nsamples:
                break
    except Exception as e:  # noqa: BLE001
        return {"status": "unsupported", "message": measure.short_error(e)}
    values = op.name not in UNINITIALIZED
    cases = []
    for i, s in enumerate(samples):
        call, ts = build_call(lambda *a, **k: _pw(op.op(*a, **k)), s.input, s.args, s.kwargs)
        cases.append((f"pw{i}", call, ts, False))
        if i == 0:
            call, ts = build_call(op.op, s.input, s.args, s.kwargs)
            cases.append(("raw0", call, ts, False))
            nc = pytree.tree_map(_noncontig, (s.input, s.args, s.kwargs))
            call, ts = build_call(lambda *a, **k: _pw(op.op(*a, **k)), *nc)
            if any(not t.is_contiguous() for t in ts):
                cases.append(("nc0", call, ts, False))
            ex = pytree.tree_map(_expanded, (s.input, s.args, s.kwargs))
            call, ts = build_call(lambda *a, **k: _pw(op.op(*a, **k)), *ex)
            if any(0 in t.stride() for t in ts):
                cases.append(("exp0", call, ts, False))
            call, ts = build_call(op.op, s.input, s.args, s.kwargs)
            for how in ("exp", "nc"):
                cases.append((f"pre_{how}0", _pre(how, call), ts, False))
            call, ts = build_call(lambda *a, **k: _pw(op.op(*a, **k)), s.input, s.args, s.kwargs)
            cases.append(("infin0", call, ts, True))
            if op.inplace_variant is not None:
                call, ts = build_call(op.inplace_variant, s.input, s.args, s.kwargs)
                cases.append(("inplace0", call, ts, False))
                cases.append(("inplace_infin0", call, ts, True))
                call, ts = build_call(op.inplace_variant, *nc)
                if any(not t.is_contiguous() for t in ts):
                    cases.append(("inplace_nc0", call, ts, False))
    res = {}
    for name, call, ts, infin in cases:
        st, msg = check_case(call, ts, torch.inference_mode, values, infin)
        r = {"status": st, "message": msg}
        if st in ("fail", "error"):
            ng, ngmsg = check_case(call, ts, torch.no_grad, values, infin)
            r["no_grad"] = ng
            r["infonly"] = ng == "pass"  # ("nondet": eager differs from itself under no_grad; e.g. native_group_norm /
            # median of a stride-0 weight / input read garbage in eager)
            if ng != st or ngmsg != msg:
                r["no_grad_message"] = ngmsg
        res[name] = r
    bad = [n for n, r in res.items() if r["status"] in ("fail", "error")]
    return {"status": "bad" if bad else "ok", "infonly": any(res[n].get("infonly") for n in bad), "cases": res}


def _worker(keys, timeout):
    from torch.testing._internal.common_methods_invocations import op_db
    table = {op_key(op): op for op in op_db}
    for k in keys:
        print("@@start " + json.dumps(k), flush=True)
        t0 = time.time()
        try:
            with measure.time_limit(timeout):
                r = check_op(table[k])
        except measure.RowTimeout as e:
            r = {"status": "timeout", "message": str(e)}
        except Exception as e:  # noqa: BLE001
            r = {"status": "harness-error", "message": measure.short_error(e)}
        r.update(op=k, seconds=round(time.time() - t0, 2))
        print("@@result " + json.dumps(r), flush=True)


def _drive(keys, timeout, deadline, emit):
    """Run ``keys`` in worker subprocesses, restarting after a crash or a hang."""
    done = set()
    while True:
        rest = [k for k in keys if k not in done]
        if not rest or time.time() > deadline:
            for k in rest:
                emit({"op": k, "status": "skipped"})
            return
        proc = subprocess.Popen([sys.executable, __file__, "--worker", "--timeout", str(timeout)]
                                + (["--dynamic"] if DYNAMIC else []),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        proc.stdin.write(json.dumps(rest))
        proc.stdin.close()
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)], daemon=True).start()
        current, wait = None, 300.0
        while True:
            try:
                line = lines.get(timeout=wait)
            except queue.Empty:
                proc.kill()
                proc.wait()
                r = {"op": current, "status": "timeout", "message": "worker killed by the watchdog"}
                break
            if line is None:
                proc.wait()
                r = {"op": current, "status": "crash", "message": f"worker exit {proc.returncode}"} if current else None
                break
            if line.startswith("@@start "):
                current, wait = json.loads(line[8:]), timeout + 30
                if time.time() > deadline:
                    proc.kill()
                    proc.wait()
                    r = None
                    break
            elif line.startswith("@@result "):
                r = json.loads(line[9:])
                done.add(r["op"])
                emit(r)
                current = None
        if r is not None and r["op"] is not None:
            done.add(r["op"])
            emit(r)
        elif current is None and not [k for k in keys if k not in done]:
            return


def run_models():
    import transformers as tf
    out = {}
    torch.manual_seed(0)
    ids = torch.randint(5, 99, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    models = {
        "bert": lambda: tf.BertModel(tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                   num_attention_heads=4, intermediate_size=64)),
        "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4)),
        "t5": lambda: tf.T5Model(tf.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                             num_heads=4)),
        "mpnet": lambda: tf.MPNetModel(tf.MPNetConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                      num_attention_heads=4, intermediate_size=64)),
        "bart": lambda: tf.BartModel(tf.BartConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
                                                   encoder_attention_heads=4, decoder_attention_heads=4,
                                                   encoder_ffn_dim=64, decoder_ffn_dim=64)),
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                                            num_hidden_layers=2, num_attention_heads=4,
                                                            num_key_value_heads=2)),
    }
    for name, mk in models.items():
        torch.manual_seed(0)
        m = mk().eval()
        kw = {"input_ids": ids, "attention_mask": mask}
        if name in ("t5", "bart"):
            kw["decoder_input_ids"] = ids[:, :5]
        coil.reset()
        try:
            for ctx in (torch.inference_mode, torch.no_grad):
                with ctx():
                    exp = m(**kw)
                    got = coil.compile(m)(**kw)
                e = [t for t in pytree.tree_leaves(dict(exp)) if isinstance(t, torch.Tensor)]
                g = [t for t in pytree.tree_leaves(dict(got)) if isinstance(t, torch.Tensor)]
                torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-3, equal_nan=True)
                coil.reset()
            out[name] = "pass"
        except Exception as e:  # noqa: BLE001
            out[name] = f"{ctx.__name__}: " + measure.short_error(e, 300)
        print(name, out[name], flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=None, help="comma-separated op_db names (all variants) or op keys")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--budget", type=float, default=1800.0, help="seconds; no op starts after that")
    ap.add_argument("--out", default="/tmp/inference_mode_sweep.jsonl")
    ap.add_argument("--models", action="store_true")
    ap.add_argument("--dynamic", action="store_true", help="compile with dynamic=True (symbolic sizes)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    global DYNAMIC
    DYNAMIC = True if a.dynamic else None
    if a.worker:
        return _worker(json.loads(sys.stdin.read()), a.timeout)
    if a.models:
        run_models()
    if a.ops == "none":
        return
    from torch.testing._internal.common_methods_invocations import op_db
    keys = list(dict.fromkeys(op_key(op) for op in op_db))
    if a.ops:
        names = set(a.ops.split(","))
        keys = [k for k in keys if k in names or k.split(".")[0] in names]
    deadline, t0 = time.time() + a.budget, time.time()
    lock, results = threading.Lock(), []
    fh = open(a.out, "w")

    def emit(r):
        with lock:
            results.append(r)
            fh.write(json.dumps(r) + "\n")
            fh.flush()
            if r["status"] not in ("ok", "unsupported"):
                bad = {n: c for n, c in r.get("cases", {}).items() if c["status"] in ("fail", "error")}
                print(f"[{len(results)}/{len(keys)}] {r['op']}: {r['status']}"
                      + (" INFERENCE-ONLY" if r.get("infonly") else "") + f" {r.get('message') or bad}"[:400],
                      flush=True)

    threads = [threading.Thread(target=_drive, args=(keys[j::a.jobs], a.timeout, deadline, emit))
               for j in range(a.jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts: dict = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    ncases = sum(len(r.get("cases", {})) for r in results)
    print(f"{len(results)} ops, {ncases} cases in {time.time() - t0:.0f} s: {counts}")
    print("inference-only failures:", [r["op"] for r in results if r.get("infonly")])


if __name__ == "__main__":
    main()
