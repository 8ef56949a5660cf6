"""Launching Triton kernels generated for symbolic sizes (dynamic shapes).

A kernel generated with symbolic sizes takes ``xnumel`` (and ``rnumel`` for a
reduction) and the size symbols its indices use as trailing integer arguments
(``@triton.jit(do_not_specialize=['xnumel'])``: no binary per size; Triton may
specialize the others on divisibility by 16, at most two binaries per config). The
wrapper passes their values; :class:`DynamicTritonLauncher` computes the grid from
``xnumel`` on every call.

Launch configs depend on sizes only through a *bucket*: the next power of two of
``xnumel`` and ``rnumel``. Each bucket picks its config once (the first candidate on
CPU; on a GPU with ``config.autotune``, the fastest candidate for that bucket, timed on
the first call that falls in it, and remembered per bucket on disk), so new sizes in a
known bucket cost one dictionary lookup, and no size ever compiles a new kernel source;
Triton compiles one binary per distinct launch config (a handful), not per size. Row
counts below :data:`MIN_X_BUCKET` share one bucket.
"""
from __future__ import annotations

from coil import trace
from coil.config import config
from coil.runtime.triton_runtime import TritonLauncher, _cdiv, _pow2, launch_configs


#: Row counts below this share one bucket: launch configs differ only by how far XBLOCK
#: is capped for tiny grids, which is not worth a binary of its own per power of two.
MIN_X_BUCKET = 1024


class DynamicTritonLauncher(TritonLauncher):
    """``launcher(*pointers, xnumel, [rnumel], *sizes)`` for a symbolic-size kernel."""

    def __init__(self, name: str, source: str, numel_hint: int, rnumel_hint: int, n_ptrs: int,
                 device_type: str, outer: bool = False, elem_bytes: int = 4):
        self.n_ptrs, self.red = n_ptrs, rnumel_hint != 1
        self.outer = outer
        # configs for the example sizes; each bucket chooses again (_for_bucket)
        super().__init__(name, source, numel_hint, rnumel_hint, False, device_type, outer=outer,
                         elem_bytes=elem_bytes, tiled=False, arg_dtypes=None)
        self.base_key = self.key
        self._runs: dict = {}

    def _grid(self, cfg: dict) -> tuple:
        return (_cdiv(self.numel, cfg["XBLOCK"]),)

    def _tune_path(self) -> str:
        return super()._tune_path().replace(".tune.json", f".b{self.numel}x{self.rnumel}.tune.json")

    def _for_bucket(self, bucket: tuple, args: tuple) -> dict:
        """The launch config of size bucket ``(next_pow2(xnumel), next_pow2(rnumel))``."""
        n, r = bucket
        self.configs = launch_configs(n, r, False, self.gpu, self.outer, self.elem_bytes, False)
        self.key = f"{self.base_key}.b{n}x{r}"
        self.numel, self.rnumel = args[self.n_ptrs], (args[self.n_ptrs + 1] if self.red else 1)
        self.chosen = None
        tuned = self._read_tuned() if self.gpu else None
        if tuned is not None:
            self.chosen = tuned
        elif len(self.configs) > 1 and config.autotune and self.gpu \
                and n * r >= config.autotune_min_elements:
            self._autotune(args)  # times each candidate at this call's sizes
        else:
            self.chosen = dict(self.configs[0])
        trace.log("dynamic_launch_bucket", stage="runtime", kernel=self.name, bucket=[n, r],
                  config=self.chosen)
        return self.chosen

    def __call__(self, *args):
        n = args[self.n_ptrs]
        r = args[self.n_ptrs + 1] if self.red else 1
        bucket = (max(_pow2(n), MIN_X_BUCKET), _pow2(r))
        run = self._runs.get(bucket)
        if run is None:
            cfg = dict(self._for_bucket(bucket, args))
            xb = cfg["XBLOCK"]
            if self.interpret:
                cfg.pop("num_warps", None)
            run = self._first_launch(bucket, cfg, xb)
            self._runs[bucket] = run
        return run(n, *args)

    def _first_launch(self, bucket: tuple, cfg: dict, xb: int):
        """``run(xnumel, *args)`` for one bucket: through Triton's JIT, which compiles
        the kernel on its first call (sizes are not specialized, so every bucket with
        this config shares the binary); on a GPU, later calls launch the compiled
        kernel directly with the grid of their ``xnumel`` (the JIT's per-call argument
        binding costs tens of microseconds of host time), re-checking the 16-byte
        pointer alignment Triton specializes on."""
        fn, n_ptrs = self.fn, self.n_ptrs

        def slow(n, *a):
            return fn[(-(-n // xb),)](*a, **cfg)

        if not self.gpu or not config.triton_fast_launch:
            return slow
        state: dict = {}

        def first(n, *a):
            try:
                kernel = slow(n, *a)
            except Exception as e:  # the GPU compiler rejected the kernel
                from coil.exc import KernelCompileError
                raise KernelCompileError(f"Triton kernel {self.name} failed to compile: "
                                         f"{type(e).__name__}: {str(e)[-1500:]}") from e
            try:
                state["fast"] = self._direct(kernel, a, n_ptrs, cfg, slow)
            except Exception as e:  # noqa: BLE001 - another Triton version: JIT every call
                trace.log("fast_launch_unavailable", stage="runtime", kernel=self.name, error=str(e))
                state["fast"] = slow
            self._runs[bucket] = state["fast"]
            return kernel
        return first

    def _direct(self, kernel, args, n_ptrs: int, cfg: dict, slow):
        from triton.runtime.driver import driver
        xb = cfg["XBLOCK"]
        consts = [xb] + ([cfg["RBLOCK"]] if "RBLOCK" in cfg else [])
        run, function, packed = kernel.run, kernel.function, kernel.packed_metadata
        get_stream, device = driver.active.get_current_stream, driver.active.get_current_device()
        aligned = tuple(t.data_ptr() % 16 == 0 for t in args[:n_ptrs])

        def fast(n, *a):
            if tuple(t.data_ptr() % 16 == 0 for t in a[:n_ptrs]) != aligned:
                return slow(n, *a)
            run(-(-n // xb), 1, 1, get_stream(device), function, packed, None, None, None, *a, *consts)
        return fast
