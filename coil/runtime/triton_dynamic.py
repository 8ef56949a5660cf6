"""Launching Triton kernels generated for symbolic sizes (dynamic shapes).

A kernel generated with symbolic sizes takes ``xnumel`` (and ``rnumel`` for a
reduction) and the size symbols its indices use as trailing integer arguments
(``@triton.jit(do_not_specialize=...)``: one compiled binary for every size). The
wrapper passes their values; :class:`DynamicTritonLauncher` computes the grid from
``xnumel`` on every call.

Launch configs depend on sizes only through a *bucket*: the next power of two of
``xnumel`` and ``rnumel``. Each bucket picks its config once (the first candidate on
CPU; on a GPU with ``config.autotune``, the fastest candidate for that bucket, timed on
the first call that falls in it, and remembered per bucket on disk), so new sizes in a
known bucket cost one dictionary lookup, and no size ever compiles a new kernel source.
"""
from __future__ import annotations

from coil import trace
from coil.config import config
from coil.runtime.triton_runtime import TritonLauncher, _cdiv, _pow2, launch_configs


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
        bucket = (_pow2(n), _pow2(r))
        run = self._runs.get(bucket)
        if run is None:
            cfg = dict(self._for_bucket(bucket, args))
            xb = cfg["XBLOCK"]
            if self.interpret:
                cfg.pop("num_warps", None)
            fn = self.fn

            def run(n, *a, _cfg=cfg, _xb=xb):
                return fn[(-(-n // _xb),)](*a, **_cfg)
            self._runs[bucket] = run
        return run(n, *args)
