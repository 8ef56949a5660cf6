"""Loading and launching generated Triton kernels; autotuning with a disk cache.

A kernel's source is written to ``<cache>/triton/<sha256 of source>.py`` and imported (Triton's JIT needs a real file).
On CPU tensors the module is imported with ``TRITON_INTERPRET=1`` so Triton's interpreter runs it.

:class:`TritonLauncher` holds the precomputed grid and launch options, so a call is one Triton launch. On a GPU with
``config.autotune`` the first call times each candidate config (block sizes, warps) on copies of the arguments with the
same layout (:func:`scratch_copies`; :func:`time_launches`: back-to-back launches in a CUDA graph), keeps the fastest,
and records it in ``<cache>/triton/<sha>.tune.json`` for later processes."""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import torch

from coil import trace
from coil.config import config
from coil.runtime import compile_pool
from coil.exc import KernelCompileError


def _ensure_interpreter_if_no_gpu() -> None:
    """Triton decides at import time whether its own library functions (tl.sum...) are
    interpreted: with no CUDA device, turn the interpreter on before triton loads."""
    if "triton" not in sys.modules and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_ensure_interpreter_if_no_gpu()

_lock = threading.Lock()
_modules: dict[tuple, object] = {}


def cache_dir() -> str:
    path = os.path.join(config.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "coil"), "triton")
    os.makedirs(path, exist_ok=True)
    return path


def source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:32]


def module_location(source: str, interpret: bool) -> tuple[str, str]:
    """``(file path, module name)`` kernel ``source`` is imported from and as."""
    key = source_key(source)
    return os.path.join(cache_dir(), f"k{key}.py"), f"coil_triton_{key}_{int(interpret)}"


def load_module(source: str, interpret: bool):
    """Import kernel ``source`` as a module (cached per process)."""
    key = (source_key(source), interpret)
    with _lock:
        if key in _modules:
            return _modules[key]
        path, modname = module_location(source, interpret)
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(source)
            os.replace(tmp, path)
        old = os.environ.get("TRITON_INTERPRET")
        if interpret:
            os.environ["TRITON_INTERPRET"] = "1"
        try:
            spec = importlib.util.spec_from_file_location(modname, path)
            mod = sys.modules[modname] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        finally:
            if interpret and old is None:
                os.environ.pop("TRITON_INTERPRET", None)
            elif interpret:
                os.environ["TRITON_INTERPRET"] = old
        _modules[key] = mod
        return mod


#: The placeholder name a kernel's body is hashed under (see canonical_name).
CANONICAL_NAME = "coil_kernel"
#: Autotuning results of this process, by canonical source key.
_tuned_in_process: dict[str, dict] = {}
#: Compile-worker pool jobs by canonical source key (runtime/compile_pool.py); an
#: empty list once claimed, so each body is queued once per process.
_pool_jobs: dict[str, list] = {}


def canonical_name(source: str, name: str) -> str:
    """The name kernel ``name`` is compiled under: ``coil_<kind>_<hash of its body>``, e.g. ``coil_poi_3f2a91c0d4``
    (``kind`` from ``triton_<kind>_...``). Generated names carry buffer names (``triton_poi_3_buf17``); the body's
    hash (with the name replaced by :data:`CANONICAL_NAME`) gives the same fused body in twelve layers one module,
    compilation and autotuning run, while different bodies stay distinguishable in profiler output. The ``autotune``
    event records which generated kernel runs under which name."""
    placeholder = re.sub(rf"\b{re.escape(name)}\b", CANONICAL_NAME, _without_comment_lines(source))
    parts = name.split("_")
    kind = parts[1] if len(parts) > 2 and parts[0] == "triton" else "kernel"
    return f"coil_{kind}_{source_key(placeholder)[:10]}"


def _without_comment_lines(source: str) -> str:
    # the header names the fused nodes' buffers: copies of a body differ only there
    return re.sub(r"(?m)^[ \t]*#.*\n", "", source)


def canonical_source(source: str, name: str) -> tuple[str, str]:
    """``(source without whole-line comments, its kernel's name replaced by the compiled name; that name)``
    (:func:`canonical_name`; whole-word occurrences only). Copies of a body get one text, so one module, one
    launcher key, one compile-pool job and one autotuning run: with the header's buffer names they got one each
    (MobileNetV2's training step: 266 keys for 126 bodies)."""
    compiled = canonical_name(source, name)
    return re.sub(rf"\b{re.escape(name)}\b", compiled, _without_comment_lines(source)), compiled


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def tiled_configs(numel: int, rnumel: int, gpu: bool) -> list[dict]:
    """Launch configs of a 2-D tiled pointwise kernel over (numel, rnumel) = (Y, X): square-ish tiles of 1k-4k
    elements (each side a power of two no larger than its axis needs), best guess first; one config on CPU."""
    ycap, xcap = _pow2(numel), _pow2(rnumel)
    if not gpu:
        return [dict(XBLOCK=min(ycap, 32), RBLOCK=min(xcap, 32), num_warps=4)]
    out: list[dict] = []
    for yb, xb, nw in ((32, 32, 4), (64, 64, 8), (16, 128, 4), (128, 16, 4)):
        c = dict(XBLOCK=min(yb, ycap), RBLOCK=min(xb, xcap), num_warps=nw)
        c["num_warps"] = max(1, min(nw, c["XBLOCK"] * c["RBLOCK"] // 128))
        if c not in out:
            out.append(c)
    return out


#: Grids of fewer programs than this (about an H200's 132 SMs) cannot fill the GPU; their
#: persistent reductions get more warps per row (:func:`candidate_configs`).
FEW_PROGRAMS = 128


def candidate_configs(numel: int, rnumel: int, persistent: bool, gpu: bool,
                      outer: bool = False, elem_bytes: int = 4) -> list[dict]:
    """Launch configs to try, best guess first: dicts with XBLOCK, (RBLOCK), num_warps.

    At most 3 for pointwise kernels and 4 for reductions (each candidate is one Triton compilation). ``outer``: a
    reduction whose loads are contiguous along x (``x.sum(0)``), tiled wide along x and short along r so that a warp
    reads consecutive addresses. ``elem_bytes``: the widest element size of the kernel's full-size buffers; with 2-byte
    (fp16/bf16) streams the blocks hold twice the elements per thread, so each thread still has 32 bytes per stream in
    flight (16 bytes reached 60% of copy bandwidth on an H200). On CPU (Triton interpreter) one config, sized for
    NumPy."""
    xcap = _pow2(numel)
    wide = gpu and elem_bytes <= 2 and not outer
    out: list[dict] = []

    def add(c):
        if c not in out:
            out.append(c)
    if rnumel == 1:
        if not gpu:
            return [dict(XBLOCK=min(xcap, 4096), num_warps=4)]
        # small kernels: smaller blocks keep more SMs busy
        sizes = ((1024, 4), (512, 4), (2048, 8)) if numel >= 1 << 20 else ((512, 4), (256, 2), (1024, 4))
        if wide and numel >= 1 << 20:
            sizes = ((2048, 4), (1024, 4), (4096, 8))
        for xb, nw in sizes:
            xb = min(xb, max(xcap, 128))
            add(dict(XBLOCK=xb, num_warps=min(nw, max(1, xb // 128))))
        return out
    if persistent:
        rb = _pow2(rnumel)
        if not gpu:
            return [dict(XBLOCK=max(1, min(xcap, 8192 // rb)), RBLOCK=rb, num_warps=4)]
        for elems in (1024, 2048, 4096, 8192):
            xb = max(1, min(xcap, elems // rb))
            # too few programs to fill the GPU (a final reduction over a few hundred partials, one loss value):
            # latency-bound, so more warps each with a shorter chain of loads (2 elements per thread)
            per_thread = 2 if _cdiv(numel, xb) < FEW_PROGRAMS else 16 if wide else 8
            nw = max(1, min(16, (xb * rb) // (32 * per_thread)))
            add(dict(XBLOCK=xb, RBLOCK=rb, num_warps=nw))
        if len(out) < 4 and out[0]["num_warps"] > 2:  # long rows: also fewer warps per row
            add(dict(out[0], num_warps=out[0]["num_warps"] // 2))
        return out[:4]
    if not gpu:
        return [dict(XBLOCK=min(xcap, 64), RBLOCK=1024, num_warps=4)]  # NumPy: big tiles
    rcap = _pow2(rnumel)
    if outer:
        for xb, rb, nw in ((128, 16, 4), (64, 32, 4), (256, 16, 8), (32, 64, 4)):
            add(dict(XBLOCK=min(xb, xcap), RBLOCK=min(rb, rcap), num_warps=nw))
        return out[:4]
    # one row per program with 16-32 warps: an H200 sweep (benchmarks/gpu_sweep.py, BENCHMARKS.md) timed 8192x32768
    # softmax 548 µs at (1, 2048, 32) against 746 µs at the earlier best (1, 2048, 8), and 32768x4096 layer_norm 251 µs
    # at (1, 4096, 16) against 262 µs; blocks of several short rows were slower on all rows
    looped = ((1, 2048, 16), (1, 4096, 16), (1, 2048, 32), (1, 1024, 8))
    if wide:  # 2-byte streams: the same bytes per thread take twice the elements; no RBLOCK 8192: (1, 8192, 16)
        # raised an illegal memory access under Triton 3.6 on the H200 (HF Swin-T training's LayerNorm gradient, 6272
        # rows, in-bounds at every config: benchmarks/gpu_kernel_replay.py), ending the process's CUDA context
        looped = ((1, 4096, 16), (1, 4096, 8), (1, 4096, 32), (1, 2048, 8))
    for xb, rb, nw in looped:
        xb, rb = min(xb, xcap), min(rb, rcap)
        add(dict(XBLOCK=xb, RBLOCK=rb, num_warps=max(1, min(nw, xb * rb // 64))))
    return out[:4]


def launch_configs(numel: int, rnumel: int, persistent: bool, gpu: bool, outer: bool = False,
                   elem_bytes: int = 4, tiled: bool = False) -> list[dict]:
    """Every launch config the runtime may run a kernel with: :func:`tiled_configs` for a 2-D tiled kernel, else
    :func:`candidate_configs`. :class:`TritonLauncher` chooses only among these (a disk-cached autotuning result outside
    them is ignored), so the code generator may rely on properties all of them share (:func:`blocks_divide`)."""
    return tiled_configs(numel, rnumel, gpu) if tiled else candidate_configs(numel, rnumel, persistent, gpu, outer,
                                                                              elem_bytes)


def blocks_divide(configs: list[dict], numel, rnumel) -> tuple[bool, bool]:
    """``(x exact, r exact)``: whether every config's XBLOCK divides ``numel`` (the grid then covers exactly ``numel``,
    so ``xmask`` is all true) and, for kernels with an r axis, every RBLOCK divides ``rnumel`` (a persistent block is
    the whole row, each loop step / r tile is full). Symbolic (non-integer) sizes are never exact."""
    def static(n):
        return isinstance(n, int) or getattr(n, "is_Integer", False)
    x = static(numel) and all(int(numel) % c["XBLOCK"] == 0 for c in configs)
    r = static(rnumel) and int(rnumel) > 1 and all("RBLOCK" in c and int(rnumel) % c["RBLOCK"] == 0 for c in configs)
    return bool(configs) and x, bool(configs) and r


def _direct_launch(run):
    """``(launch, cooperative, pdl)`` when ``run`` (a Triton ``CudaLauncher``) can be bypassed: its ``__call__`` only
    allocates scratch buffers (none needed here) and forwards to the C ``launch(gridX, gridY, gridZ, stream, function,
    cooperative, pdl, global_scratch, profile_scratch, kernel_metadata, launch_metadata, enter_hook, exit_hook, *args)``
    (Triton 3.4-3.6); None for any other shape of launcher."""
    try:
        params = list(inspect.signature(type(run).__call__).parameters)
    except (TypeError, ValueError):
        return None
    if params != ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]:
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    launch = getattr(run, "launch", None)
    if launch is None or not hasattr(run, "launch_cooperative_grid") or not hasattr(run, "launch_pdl"):
        return None
    return launch, run.launch_cooperative_grid, run.launch_pdl


def _specialized_launch(run, first: tuple, grid: tuple, consts: list, function, packed,
                        get_stream, device, slow, pointers_as_ints: bool = False, free: int = 0):
    """Generated ``fast(a0, ..., aN)`` for a compiled kernel: one launch through :func:`_direct_launch`'s C function
    (or, failing that, ``run``) while the call keeps the Triton specialization of ``first``, the arguments of the call
    that compiled it; else ``slow`` (the JIT, which picks or compiles the matching binary). docs/codegen.md ("Runtime")
    describes the check. ``first`` holds the tensors, then the ints (a dynamic kernel's ``xnumel`` and size arguments);
    the last ``free`` ints are ``do_not_specialize`` (only their 32-bit range is checked). ``grid`` items are ints or
    Python expressions in the argument names (``-(-a3 // 128)``). ``pointers_as_ints`` (every tensor was a CUDA tensor
    on the first call): the direct launch gets the data pointers the check already read, as ints."""
    names = [f"a{i}" for i in range(len(first))]
    params = ", ".join(names)
    launch = _direct_launch(run)
    env = dict(slow=slow, get_stream=get_stream, device=device, function=function, packed=packed)
    as_ints = pointers_as_ints and launch is not None
    body, passed, zero_low, nonzero_low, narrow, other = [], [], [], [], [], []
    for i, (n, v) in enumerate(zip(names, first)):
        if isinstance(v, int):
            passed.append(n)
            if v >> 31 == 0:
                narrow.append(n)  # Triton's i32
            else:
                other.append(f"not {n} >> 31")
            if i >= len(first) - free:
                continue
            if v == 1:
                other.append(f"{n} != 1")
            else:
                (zero_low if v % 16 == 0 else nonzero_low).append(n)
                if v % 16:
                    other.append(f"{n} == 1")
            continue
        ptr = f"{n}.data_ptr()"
        if as_ints:
            body.append(f"    p{i} = {ptr}")
            ptr = f"p{i}"
        passed.append(ptr if as_ints else n)
        (zero_low if v.data_ptr() % 16 == 0 else nonzero_low).append(ptr)
    checks = ([f"({' | '.join(zero_low)}) & 15"] if zero_low else []) + \
        [f"not {n} & 15" for n in nonzero_low] + \
        ([f"({' | '.join(narrow)}) >> 31"] if narrow else []) + other
    tail = ", ".join(passed + [repr(int(c)) for c in consts])
    g0, g1 = grid
    if launch is not None:
        env.update(launch=launch[0], coop=launch[1], pdl=launch[2])
        call = (f"launch({g0}, {g1}, 1, get_stream(device), function, coop, pdl, None, None, "
                f"packed, None, None, None, {tail})")
    else:
        env.update(run=run)
        call = f"run({g0}, {g1}, 1, get_stream(device), function, packed, None, None, None, {tail})"
    src = "\n".join([f"def fast({params}):"] + body +
                     ([f"    if {' or '.join(checks)}:", f"        return slow({params})"] if checks else [])
                     + [f"    {call}", ""])
    exec(compile(src, "<coil launcher>", "exec"), env)
    return env["fast"]


def time_launches(launch: Callable[[], object], budget_ms: float = 1.0, rounds: int = 3) -> float:
    """Milliseconds one call of ``launch`` (a kernel launch) takes on the GPU, for autotuning: ``launch`` is captured
    ``n`` times back to back in a CUDA graph (``n`` sized so that one replay takes about ``budget_ms``) and the median
    replay of ``rounds`` is divided by ``n``.

    Timing single launches between CUDA events (``triton.testing.do_bench``) measures the host's launch latency instead
    of a kernel shorter than it (a 3 µs kernel read 16-38 µs per config on an H200: BENCHMARKS.md). In the graph the
    kernels run back to back, L2-warm as in a model. Falls back to ``do_bench`` when capture fails (a kernel that
    syncs)."""
    launch()  # compiled and warm
    torch.cuda.synchronize()
    try:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            launch()
        end.record()
        torch.cuda.synchronize()
        est = max(start.elapsed_time(end) / 3, 1e-3)  # host-bound for short kernels: an upper bound
        # (GPT-2's training step autotuned 234 kernels; at 2 ms x 5 rounds and up to 200
        # launches captured per config that took 29 s of its 49 s first step)
        n = int(min(max(budget_ms / est, 3), 100))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                for _ in range(n):
                    launch()
            graph.replay()  # warm
            times = []
            for _ in range(rounds):
                start.record(stream)
                graph.replay()
                end.record(stream)
                end.synchronize()
                times.append(start.elapsed_time(end) / n)
        torch.cuda.current_stream().wait_stream(stream)
        del graph
        return sorted(times)[len(times) // 2]
    except Exception as e:  # noqa: BLE001 - capture unsupported here: time launches singly
        trace.log("autotune_graph_timing_unavailable", stage="runtime", error=str(e)[:300])
        from triton.testing import do_bench
        return do_bench(launch, warmup=3, rep=10)


def scratch_copies(args, written: Optional[frozenset] = None) -> tuple:
    """Copies of a kernel's arguments for timed launches that index exactly like the originals: each tensor keeps its
    size, strides and storage offset over a copy of its whole storage, and arguments that share a storage share one copy
    (a kernel reading a view of a buffer it also writes sees the same aliasing). Non-tensors are passed through.
    ``written``: the positions of the arguments the kernel stores to (None: all). Only storages some written argument
    lives in are copied; arguments only read are passed as they are (timing reads them, never changes them), so
    autotuning does not allocate a copy of every weight and activation a kernel reads (that memory stayed reserved
    in the caching allocator afterwards).

    ``Tensor.clone()`` is not enough: a clone of a non-dense view (input ids ``ids[:, :128]`` of an ``(8, 512)`` tensor)
    is contiguous and smaller, while the kernel was generated for the view's strides (``in_ptr0 + 512 * (x // 128) + x %
    128``) and reads past the clone's end (an illegal memory access on a GPU)."""
    def key(a):
        st = a.untyped_storage()
        return a.device, st.data_ptr(), st.nbytes()
    keys = [key(a) if isinstance(a, torch.Tensor) else None for a in args]
    copied = {k for i, k in enumerate(keys) if k is not None and (written is None or i in written)}
    storages: dict[tuple, object] = {}
    out = []
    for a, k in zip(args, keys):
        if k not in copied:     # (a non-tensor's None is not in it)
            out.append(a)
            continue
        if k not in storages:
            storages[k] = a.untyped_storage().clone()
        out.append(torch.empty(0, dtype=a.dtype, device=a.device).set_(
            storages[k], a.storage_offset(), a.size(), a.stride()))
    return tuple(out)


def _interpreted(cfg: dict) -> dict:
    """A launch config's keyword arguments under Triton's interpreter (no ``num_warps``)."""
    return {k: v for k, v in cfg.items() if k != "num_warps"}


class TritonLauncher:
    """Callable ``launcher(*tensors)`` running one generated kernel."""

    def __init__(self, name: str, source: str, numel: int, rnumel: int, persistent: bool, device_type: str,
                 outer: bool = False, elem_bytes: int = 4, tiled: bool = False, arg_dtypes: Optional[list] = None):
        self.name, self.source = name, source
        self.interpret, self.gpu = device_type == "cpu", device_type != "cpu"
        self.numel, self.rnumel, self.elem_bytes, self.tiled = numel, rnumel, elem_bytes, tiled
        #: dtypes of the tensor arguments, in order (None if the caller did not say)
        self.arg_dtypes = list(arg_dtypes) if arg_dtypes is not None else None
        # the code generator dropped masks that are redundant for all of these
        # (codegen/triton/backend.py, mask_exactness): only they may run
        self.configs = launch_configs(numel, rnumel, persistent, self.gpu or config.triton_check_configs, outer,
                                      elem_bytes, tiled)
        # Kernels whose bodies are identical (the same block in every transformer layer) share one module, one
        # JIT-compiled binary and one autotuning result: the name is replaced by a fixed one before hashing.
        canonical, self.compiled_name = canonical_source(source, name)
        self.fn = getattr(load_module(canonical, self.interpret), self.compiled_name)
        self.key = source_key(canonical)
        self.chosen: Optional[dict] = None
        self._call: Callable = self._untuned  # (_choose replaces it)
        self._module_at = module_location(canonical, self.interpret)
        if (preset := self._preset(numel * rnumel)) is not None:
            self._choose(preset)
        if self.gpu and arg_dtypes is not None:
            self._submit_to_pool(self.arg_dtypes, preset)

    def _known_tuned(self) -> Optional[dict]:
        """The config tuned for ``self.key`` before, among ``self.configs``: in this process
        (another copy of the body, the same block in another layer), else on disk; None."""
        if not self.gpu:
            return None
        tuned, where = _tuned_in_process.get(self.key), "process"
        if tuned not in self.configs:  # (None, or tuned for another candidate set)
            tuned, where = self._read_tuned(), "disk"
        if tuned is not None:
            trace.log("autotune_reused", stage="runtime", kernel=self.name, key=self.key, config=tuned, tuned_in=where)
        return tuned

    def _preset(self, elements: int) -> Optional[dict]:
        """The config to run without timing candidates: one tuned before (:meth:`_known_tuned`), the only
        candidate, or the first when not autotuning (CPU, ``config.autotune`` off, fewer than
        ``config.autotune_min_elements`` ``elements``); None: autotune at the first call."""
        if (tuned := self._known_tuned()) is not None:
            return tuned
        if len(self.configs) == 1 or not (config.autotune and self.gpu) or elements < config.autotune_min_elements:
            return self.configs[0]
        return None

    def _submit_to_pool(self, args: list, preset: Optional[dict], key: Optional[str] = None) -> None:
        """Queue the configs this kernel will be compiled with (``preset``, or every candidate) to the compile-worker
        pool (runtime/compile_pool.py), once per ``key`` (default ``self.key``) and process. ``args``: a torch dtype per
        tensor argument and the value of each int argument (Triton specializes the binary on it)."""
        if (key := key or self.key) in _pool_jobs:
            return
        todo = [preset] if preset is not None else self.configs
        names = [a if isinstance(a, int) else str(a).replace("torch.", "") for a in args]
        try:
            _pool_jobs[key] = compile_pool.submit(*self._module_at, self.compiled_name, names, todo)
        except Exception as e:  # noqa: BLE001 - optional: the launcher compiles itself
            _pool_jobs[key] = []
            trace.log("compile_pool_broken", stage="runtime", kernel=self.name, error=str(e))

    def _claim_pool_jobs(self, key: Optional[str] = None) -> None:
        """Before compiling here, reclaim or await this body's pool jobs (under ``key``, default ``self.key``)."""
        key = key or self.key
        if jobs := _pool_jobs.get(key):
            _pool_jobs[key] = []
            compile_pool.claim(self.name, jobs)

    def _choose(self, cfg: dict) -> None:
        self.chosen = dict(cfg)
        kwargs = _interpreted(cfg) if self.interpret else cfg
        launch = self.fn[self._grid(cfg)]
        self._slow = lambda *args: launch(*args, **kwargs)
        self._call = self._first_call if self.gpu else self._slow
        if config.triton_check_configs and self.interpret:
            self._call = self._checked(self._slow, lambda c, a: self.fn[self._grid(c)](*a, **_interpreted(c)))

    def _checked(self, run: Callable, launch: Callable) -> Callable:
        """``run``, first checking (``config.triton_check_configs``) that every candidate config gives the values of the
        first: each runs as ``launch(cfg, args)`` on :func:`scratch_copies` of the first call's arguments; a written
        argument that differs (beyond reduction-order rounding) raises AssertionError naming kernel and config."""
        checked = []

        def first(*args):
            if checked:
                return run(*args)
            checked.append(True)
            ref = None
            for cfg in self.configs:
                scratch = scratch_copies(args, getattr(self, "written", None))
                launch(cfg, scratch)
                outs = [(i, t) for i, t in enumerate(scratch) if isinstance(t, torch.Tensor) and t is not args[i]]
                if ref is None:
                    ref, ref_cfg = outs, cfg
                    continue
                for (i, a), (_, b) in zip(ref, outs):
                    tol = 1e-2 if a.dtype in (torch.float16, torch.bfloat16) else 1e-4
                    same = torch.allclose(a, b, rtol=tol, atol=tol, equal_nan=True) if a.is_floating_point() \
                        else torch.equal(a, b)
                    if not same:
                        raise AssertionError(f"Triton kernel {self.name}: argument {i} under launch config {cfg} "
                                             f"differs from {ref_cfg} (max |diff| "
                                             f"{float((a.double() - b.double()).abs().max()):.3g})")
            if self._call is first:
                self._call = run
            return run(*args)
        return first

    def _grid(self, cfg: dict) -> tuple:
        """Programs per axis: x blocks, and for a tiled kernel r blocks too."""
        return (_cdiv(self.numel, cfg["XBLOCK"]),) + ((_cdiv(self.rnumel, cfg["RBLOCK"]),) if self.tiled else ())

    def _first_call(self, *args):
        """Launch through Triton's JIT once, then switch to the compiled kernel's own launcher (:meth:`_make_fast`)."""
        self._claim_pool_jobs()
        kernel, self._call = self._launch_first(self._slow, args)
        return kernel

    def _launch_first(self, slow: Callable, args, **fast_options) -> tuple:
        """``(kernel, fast)``: ``slow(*args)`` (the JIT launch, which compiles the kernel;
        a GPU compiler's error is raised as ``KernelCompileError``) and the fast launch
        of :meth:`_make_fast` (``slow`` itself on an unexpected Triton version, logged)."""
        try:
            kernel = slow(*args)
        except Exception as e:  # the GPU compiler rejected the kernel
            raise KernelCompileError(f"Triton kernel {self.name} failed to compile: "
                                     f"{type(e).__name__}: {str(e)[-1500:]}") from e
        try:
            return kernel, self._make_fast(kernel, args, slow=slow, **fast_options)
        except Exception as e:  # noqa: BLE001 - another Triton version: the JIT every call
            trace.log("fast_launch_unavailable", stage="runtime", kernel=self.name, error=str(e))
            return kernel, slow

    def _make_fast(self, kernel, args, cfg: Optional[dict] = None, grid: Optional[tuple] = None,
                   slow: Optional[Callable] = None, free: int = 0):
        """A launch function for the compiled ``kernel`` (:func:`_specialized_launch`): the constexprs of ``cfg``
        (default: the chosen config) and ``grid`` (default: this launcher's) on every call, while the call keeps the
        Triton specialization of ``args`` (the first call's; the last ``free`` ints are not specialized); else ``slow``
        (default: the JIT launch). On Triton versions whose launcher takes its scratch buffers as arguments (3.x with
        ``CudaLauncher.__call__(gridX, gridY, gridZ, stream, function, *args)``) and needs none, the C launch function
        is called directly, skipping ``CudaLauncher.__call__``: about 2-4 µs of Python per launch on an H200 host."""
        from triton.runtime.driver import driver
        cfg = cfg or self.chosen
        consts = [cfg[k] for k in ("XBLOCK", "RBLOCK", "PERSISTENT") if k in cfg]
        grid = grid or self._grid(cfg)
        on_gpu = all(getattr(a, "is_cuda", False) for a in args if not isinstance(a, int))
        return _specialized_launch(kernel.run, args, (grid[0], grid[1] if len(grid) > 1 else 1), consts,
                                   kernel.function, kernel.packed_metadata, driver.active.get_current_stream,
                                   driver.active.get_current_device(), slow or self._slow, pointers_as_ints=on_gpu,
                                   free=free)

    #: what the wrapper calls (``k3._call(buf0)``): the launch itself, without a ``__call__`` frame per launch
    wrapper_entry = "_call"

    def __call__(self, *args):
        return self._call(*args)

    def _untuned(self, *args):  # _call until _choose: another copy of this body may have been tuned since
        if (tuned := self._known_tuned()) is None:
            self._autotune(args)
        else:
            self._choose(tuned)
        return self._call(*args)

    # -------------------------------------------------------------- autotuning
    def _tune_path(self) -> str:
        """``k<source sha>.<gpu>.c<candidates sha>.tune.json``: the candidate set is part of the key, so changing
        :func:`candidate_configs` re-tunes kernels with unchanged source instead of reusing the old set's winner."""
        dev = torch.cuda.get_device_name().replace(" ", "_") if self.gpu else "cpu"
        cands = source_key(json.dumps(self.configs, sort_keys=True))[:8]
        return os.path.join(cache_dir(), f"k{self.key}.{dev}.c{cands}.tune.json")

    def _read_tuned(self) -> Optional[dict]:
        try:
            with open(self._tune_path()) as f:
                cfg = json.load(f)
            return cfg if cfg in self.configs else None
        except (OSError, ValueError):
            return None

    def _precompile(self, args) -> None:
        """Compile every candidate config in a thread pool before timing them (Triton's MLIR passes and ptxas run
        outside the GIL), through ``JITFunction.warmup`` (Triton 3.x: ``warmup(*args, grid=...,
        **constexprs_and_options)``); the timed launches then hit Triton's in-memory cache. Any failure (another Triton
        API, a config that does not compile) only loses the overlap: timing compiles serially."""
        if len(self.configs) < 2 or config.autotune_compile_threads < 2:
            return
        def one(cfg):
            self.fn.warmup(*args, grid=(1,), **cfg)
        try:
            # the first one alone: Triton creates its per-device kernel cache lazily, and
            # threads racing on that would each fill a different cache
            try:
                one(self.configs[0])
                errors = []
            except Exception as e:  # noqa: BLE001 - config too large, or another API
                errors = [e]
            rest = self.configs[1:]
            with ThreadPoolExecutor(max_workers=min(len(rest), config.autotune_compile_threads)) as pool:
                errors += [f.exception() for f in [pool.submit(one, c) for c in rest]]
            if bad := [str(e) for e in errors if e is not None]:
                trace.log("autotune_precompile_error", stage="runtime", kernel=self.name, errors=bad[:2])
        except Exception as e:  # noqa: BLE001 - an API we do not know: compile serially
            trace.log("autotune_precompile_unavailable", stage="runtime", kernel=self.name, error=str(e))

    def _autotune(self, args) -> None:
        """Time every candidate config and keep the fastest. The timed launches run on *copies* of the tensor arguments
        (:func:`scratch_copies`: same size, strides and storage offset, over a copy of the whole storage): a kernel that
        accumulates into its output (atomic scatter-add, embedding backward) or updates a buffer in place would
        otherwise be applied once per timed launch, and the caller's real launch would start from a corrupted buffer.
        Raises KernelCompileError (naming the kernel and each config's error) when no candidate compiles."""
        scratch = scratch_copies(args, getattr(self, "written", None))
        with trace.stage("autotune_compile"):
            self._claim_pool_jobs()
            self._precompile(scratch)
        timings, errors = [], []
        for cfg in self.configs:
            self._choose(cfg)
            try:
                ms = time_launches(lambda: self._slow(*scratch))
            except Exception as e:  # a config that does not compile (registers, smem)
                trace.log("autotune_error", stage="runtime", kernel=self.name, config=cfg, error=str(e))
                msg = str(e)  # Triton puts the source excerpt first and the reason last
                errors.append(f"{cfg}: {type(e).__name__}: "
                              f"{msg if len(msg) < 1500 else msg[:300] + ' ... ' + msg[-1200:]}")
                continue
            timings.append((ms, cfg))
        scratch = None  # (the copies: freed before the winner runs)
        if not timings:
            raise KernelCompileError(f"no launch config of Triton kernel {self.name} compiled:\n  "
                               + "\n  ".join(errors))
        timings.sort(key=lambda t: t[0])
        best = timings[0][1]
        self._choose(best)
        _tuned_in_process[self.key] = best
        trace.log("autotune", stage="runtime", kernel=self.name, compiled_name=self.compiled_name,
                  timings=[{"config": c, "ms": m} for m, c in timings], chosen=best,
                  heuristic_ms=next((m for m, c in timings if c == self.configs[0]), None))
        with contextlib.suppress(OSError), open(self._tune_path(), "w") as f:
            json.dump(best, f)
