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
        self._runs: dict = {}  # bucket -> run(*args)
        self._by_size: dict = {}  # (xnumel, [rnumel]) -> its bucket's run (a bounded cache)

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
        run = self._by_size.get(args[self.n_ptrs:self.n_ptrs + 1 + self.red])
        if run is None:
            run = self._bucket_run(args)
        return run(*args)

    def _bucket_run(self, args: tuple):
        n = args[self.n_ptrs]
        r = args[self.n_ptrs + 1] if self.red else 1
        bucket = (max(_pow2(n), MIN_X_BUCKET), _pow2(r))
        run = self._runs.get(bucket)
        if run is None:
            run = self._runs[bucket] = self._first_launch(bucket, args)
        if len(self._by_size) > 4096:
            self._by_size.clear()
        self._by_size[args[self.n_ptrs:self.n_ptrs + 1 + self.red]] = run
        return run

    def _first_launch(self, bucket: tuple, args: tuple):
        """``run(*args)`` for one bucket: through Triton's JIT, which compiles the kernel
        on its first call (``xnumel`` is not specialized, so every bucket with this config
        shares the binary); on a GPU, later calls launch the compiled kernel directly
        with the grid of their ``xnumel`` (the JIT's per-call argument binding costs tens
        of microseconds of host time), while they keep the first call's Triton
        specialization (pointer alignment, sizes divisible by 16 or equal to 1): a size
        of another class goes through the JIT, which picks or compiles its binary."""
        cfg = dict(self._for_bucket(bucket, args))
        xb, x = cfg["XBLOCK"], self.n_ptrs
        if self.interpret:
            cfg.pop("num_warps", None)

        def slow(*a):
            return self.fn[(-(-a[x] // xb),)](*a, **cfg)

        if not self.gpu or not config.triton_fast_launch:
            return slow

        def first(*a):
            kernel, self._runs[bucket] = self._launch_first(
                slow, a, cfg=cfg, grid=(f"-(-a{x} // {xb})", 1), unspecialized=(x,))
            self._by_size.clear()  # sizes of this bucket now take the fast launch
            return kernel
        return first
