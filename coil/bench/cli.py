"""The bench front ends of the ``coil`` command (:mod:`coil.cli`): ``coil demo``, ``coil bench`` and
``coil conformance``, argparse over :mod:`coil.bench.demo`, :mod:`coil.bench.suite` and
:mod:`coil.bench.conformance`. Each ``add_*`` adds a subcommand's parser, each ``run_*`` runs it
and returns the exit status.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Optional


def add_bench(sub) -> None:
    from coil.bench.compilers import BENCH_DEFAULT, COMPILERS
    from coil.bench.models import MODELS, SUITES
    from coil.bench.suite import MODES

    p = sub.add_parser("bench", help="model suite: correctness, speedup, compile time",
                       description="Run the model suite. Models: " + ", ".join(MODELS)
                       + ". Compilers: " + ", ".join(COMPILERS) + ".")
    p.add_argument("--model", nargs="+", help="models to run, from any suite (default: all of --suite)")
    p.add_argument("--suite", default="default", choices=list(SUITES),
                   help="default: the models above; broad: coil/bench/broad.py (47 "
                        "transformers and timm models; default modes bf16 train)")
    p.add_argument("--mode", nargs="+", choices=[*MODES, "reduce-overhead", "dynamic"],
                   help=f"modes (default: {' '.join(MODES)}; broad suite: bf16 train); "
                        "reduce-overhead (alone): CUDA graph workloads, eager vs "
                        "torch.compile vs coil in one process (coil/bench/reduce_overhead.py; "
                        "--model picks workloads from it); dynamic (alone): GPT-2 and LLaMA "
                        "over ten sequence lengths, compiles and ms per length for coil, "
                        "coil dynamic=False and torch.compile (coil/bench/dynamic.py; "
                        "--model gpt2/llama, --compiler coil coil-static inductor)")
    p.add_argument("--lengths", type=int, nargs="+", help="--mode dynamic: sequence lengths "
                   "(default: ten, 64..512 full, 8..64 small)")
    p.add_argument("--compiler", nargs="+", default=list(BENCH_DEFAULT),
                   help=f"compilers (default: {' '.join(BENCH_DEFAULT)}); also "
                        "'package.module:attr' naming a coil.bench.compilers.Compiler")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    p.add_argument("--size", choices=["small", "full"], help="model sizes (default: small on "
                   "CPU, full on CUDA)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=10, help="timed interleaved rounds")
    p.add_argument("--max-timing", type=float, default=60.0, help="seconds of timed runs "
                   "per row after which the rounds stop early (at least 3 rounds)")
    p.add_argument("--no-warm-compile", action="store_true", help="skip the second (warm-cache) compile")
    p.add_argument("--keep-caches", action="store_true",
                   help="use the existing on-disk compile caches (default: fresh empty ones)")
    p.add_argument("--row-timeout", type=float, default=600.0, help="seconds per row")
    p.add_argument("--memory-jobs", type=int, default=4, help="reduce-overhead on CUDA: peak "
                   "memory of each copy measured alone in its own process, this many at a time "
                   "(0: in the shared process)")
    p.add_argument("--budget", type=float, help="total seconds; rows not started by then "
                   "are reported as skipped")
    p.add_argument("--isolate", action="store_true", help="run each model in its own subprocess")
    p.add_argument("--paired", action="store_true",
                   help="per model and mode, time every compiler in the same interleaved "
                        "rounds against one shared eager series (speedups comparable "
                        "across compilers); with --isolate, each model's subprocess runs "
                        "its compilers paired")
    p.add_argument("--threads", type=int, help="torch.set_num_threads(N) for the run "
                   "(CPU; coil's C++ kernels follow it)")
    p.add_argument("--json", metavar="PATH", help="write rows as JSON ('-' for stdout)")
    p.add_argument("--markdown", metavar="PATH", help="write a markdown block ('-' for stdout)")
    p.add_argument("--rows-jsonl", metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no table on stdout")
    p.add_argument("--strict", action="store_true", help="exit 1 unless every row passes")


def _run_alone(a, mod, compilers, **run_kw) -> int:
    """A bench mode that runs alone, in one process (``--mode reduce-overhead``:
    coil/bench/reduce_overhead.py; ``--mode dynamic``: coil/bench/dynamic.py): ``mod.run``
    with the common options, ``--json``/``--markdown`` rewritten after each workload."""
    if len(a.mode) > 1 or a.isolate or a.paired:
        print(f"coil bench: --mode {mod.MODE} runs alone, in one process (no other modes, "
              "--isolate or --paired)", file=sys.stderr)
        return 2
    try:
        result = mod.run(a.model, device=a.device, size=a.size, compilers=compilers,
                         warmup=a.warmup, repeat=a.repeat, budget_s=a.budget,
                         progress=not a.no_progress,
                         on_workload=_partial_writer(a, mod) if a.json or a.markdown else None, **run_kw)
    except ValueError as e:
        print(f"coil bench: {e}", file=sys.stderr)
        return 2
    _report(a, mod, result)
    return 1 if a.strict and any(r["status"] not in ("pass", "skipped") for r in result["rows"]) else 0


def _run_reduce_overhead(a) -> int:
    """``coil bench --mode reduce-overhead`` (coil/bench/reduce_overhead.py)."""
    from coil.bench import reduce_overhead as ro
    from coil.bench.compilers import BENCH_DEFAULT

    compilers = list(ro.COMPILERS) if a.compiler == list(BENCH_DEFAULT) else \
        [c for c in a.compiler if c != "eager"]
    return _run_alone(a, ro, compilers, max_timing_s=a.max_timing, row_timeout=a.row_timeout,
                      memory_jobs=a.memory_jobs)


def _run_dynamic(a) -> int:
    """``coil bench --mode dynamic`` (coil/bench/dynamic.py)."""
    from coil.bench import dynamic as dyn
    from coil.bench.compilers import BENCH_DEFAULT

    compilers = list(dyn.COMPILERS) if a.compiler == list(BENCH_DEFAULT) else a.compiler
    return _run_alone(a, dyn, compilers, lengths=a.lengths)


def run_bench(a) -> int:
    from coil.bench import suite

    if a.mode is not None and "reduce-overhead" in a.mode:
        return _run_reduce_overhead(a)
    if a.mode is not None and "dynamic" in a.mode:
        return _run_dynamic(a)
    if a.mode is None:
        from coil.bench.broad import BROAD_MODES
        a.mode = list(BROAD_MODES if a.suite == "broad" else suite.MODES)
    if a.threads:
        import torch
        torch.set_num_threads(a.threads)

    opts = suite.BenchOptions(models=a.model, suite=a.suite, modes=a.mode, compilers=a.compiler,
                              device=a.device, size=a.size, warmup=a.warmup, repeat=a.repeat,
                              max_timing_s=a.max_timing, warm_compile=not a.no_warm_compile,
                              row_timeout=a.row_timeout, budget_s=a.budget, progress=not a.no_progress,
                              fresh_caches=not a.keep_caches, rows_jsonl=a.rows_jsonl, paired=a.paired)
    if a.isolate:
        common = ["--mode", *a.mode, "--compiler", *a.compiler, "--device", a.device,
                  "--warmup", str(a.warmup), "--repeat", str(a.repeat), "--max-timing", str(a.max_timing),
                  "--row-timeout", str(a.row_timeout)] + (["--size", a.size] if a.size else [])
        common += ["--threads", str(a.threads)] if a.threads else []
        common += [flag for flag, on in (("--no-warm-compile", a.no_warm_compile),
                                         ("--keep-caches", a.keep_caches), ("--paired", a.paired)) if on]
        result = suite.run_bench_isolated(opts, common, on_model=_partial_writer(a, suite))
    else:
        result = suite.run_bench(opts)
    _report(a, suite, result)
    return int(a.strict and any(r["status"] != "pass" for r in result["rows"]))


def add_conformance(sub) -> None:
    p = sub.add_parser("conformance", help="OpInfo operator conformance vs eager")
    p.add_argument("--compiler", default="coil",
                   help="coil (default), aot_eager, inductor, torch+coil, coil+eager, ...")
    p.add_argument("--dtype", nargs="+", default=["float32"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--backward", action="store_true", help="also compare gradients")
    p.add_argument("--samples", choices=["first", "all"], default="first")
    p.add_argument("--ops", nargs="+", help="OpInfo names (default: all of op_db)")
    p.add_argument("--shard", default=None, help="i/n: run the i-th of n slices (0-based)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per op")
    p.add_argument("--no-isolate", action="store_true",
                   help="run in this process (per-op SIGALRM timeout only)")
    p.add_argument("--budget", type=float, help="total seconds; ops not started by then "
                   "are reported as skipped")
    p.add_argument("--json", metavar="PATH", help="write results as JSON ('-' for stdout)")
    p.add_argument("--markdown", metavar="PATH", help="write a markdown summary")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--strict", action="store_true", help="exit 1 unless every op passes")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="do not run: merge result files (e.g. shards) and report them")


def run_conformance(a) -> int:
    from coil.bench import conformance

    opts = conformance.ConformanceOptions(
        compiler=a.compiler, dtypes=a.dtype, device=a.device, backward=a.backward,
        samples=a.samples, ops=a.ops, shard=a.shard, timeout=a.timeout,
        isolate=not a.no_isolate, progress=not a.no_progress,
        deadline=(time.time() + a.budget) if a.budget else None)
    opts.on_partial = _partial_writer(a, conformance)
    if a.merge:
        result = conformance.merge([json.loads(open(path).read()) for path in a.merge])
    else:
        result = conformance.run_conformance(opts)
    _report(a, conformance, result)
    return int(a.strict and any(r["status"] not in ("pass", "unsupported-by-eager", "skipped")
                                for r in result["ops"]))


def _positive_int(text: str) -> int:
    """argparse type: an int >= 1 (``coil demo --repeat 0`` compiled, then crashed)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def add_demo(sub) -> None:
    p = sub.add_parser("demo", help="compile GPT-2 (random weights), eager vs coil, report")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda if available)")
    p.add_argument("--out", default="coil_demo", help="directory for the log and report")
    p.add_argument("--backend", default="coil", help="coil backend to demo (default coil)")
    p.add_argument("--repeat", type=_positive_int, default=10,
                   help="timed interleaved rounds of eager and coil (medians reported; default 10)")


def run_demo(a) -> int:
    from coil.bench import demo

    return demo.main(device=a.device, out_dir=a.out, backend=a.backend, repeat=a.repeat)


def _partial_writer(a, mod):
    """Rewrites ``--json``/``--markdown`` files (not stdout) with a partial result."""
    def write_partial(partial):
        _emit(a.json, json.dumps(partial, indent=1), quiet_stdout=True)
        if a.markdown:
            _emit(a.markdown, mod.format_markdown(partial), quiet_stdout=True)
    return write_partial


def _report(a, mod, result) -> None:
    """Writes the final ``result`` to ``--json``/``--markdown`` and, unless ``--quiet``,
    its table to stdout."""
    _emit(a.json, json.dumps(result, indent=1))
    if a.markdown:
        _emit(a.markdown, mod.format_markdown(result))
    if not a.quiet:
        print(mod.format_text(result))


def _emit(dest: Optional[str], text: str, quiet_stdout: bool = False) -> None:
    if dest == "-" and not quiet_stdout:
        print(text)
    elif dest and dest != "-":
        with open(dest, "w") as f:
            f.write(text + "\n")
