"""Launching Triton kernels generated for symbolic sizes (dynamic shapes).

Such a kernel takes ``xnumel`` (``rnumel``) and the size symbols its indices use as trailing integer arguments: no
binary per size, only per Triton specialization class (divisibility by 16, ``== 1``, the int32 range), whose other
binaries are queued to the compile pool after a config's first launch. :class:`DynamicTritonLauncher` computes the grid
per call and picks its launch config per *bucket* (the next powers of two of ``xnumel`` and ``rnumel``; autotuned once
per bucket on a GPU, nearest tuned bucket reused), so a new size in a known bucket costs one dictionary lookup.
docs/dynamic_shapes.md ("Launching dynamic Triton kernels") has the details and the measurements."""
from __future__ import annotations

from operator import itemgetter
from typing import Optional, Sequence

from coil import trace
from coil.config import config
from coil.runtime import triton_runtime
from coil.runtime.triton_runtime import TritonLauncher, _pow2, launch_configs


#: Row counts below this share one bucket: launch configs differ only by how far XBLOCK
#: is capped for tiny grids, which is not worth a binary of its own per power of two.
MIN_X_BUCKET = 1024


def _bucket(xnumel: int, rnumel: int) -> tuple:
    """The size bucket ``(n, r)`` of a launch: powers of two, ``n >= MIN_X_BUCKET``."""
    return max(_pow2(xnumel), MIN_X_BUCKET), _pow2(rnumel)


class DynamicTritonLauncher(TritonLauncher):
    """``launcher(*pointers, xnumel, [rnumel], *sizes)`` for a symbolic-size kernel."""
    wrapper_entry = None  # (the wrapper calls the launcher: its __call__ picks the size bucket's run)

    def __init__(self, name: str, source: str, numel_hint: int, rnumel_hint: int, n_ptrs: int, device_type: str,
                 outer: bool = False, elem_bytes: int = 4, tiled: bool = False, arg_dtypes: Optional[list] = None,
                 size_hints: Sequence[int] = (), other_sizes: Sequence[Sequence[int]] = (), twin: bool = False,
                 persistent: bool = False):
        """``arg_dtypes``: the torch dtype of each tensor argument; ``size_hints``: the example inputs' value of each
        int argument (``xnumel``, [``rnumel``], symbols). ``tiled``: a 2-D tiled pointwise kernel (grid ``(xnumel /
        XBLOCK, rnumel / RBLOCK)``). With both, on a GPU, the configs of the hint sizes' bucket are queued to the
        compile pool now (:meth:`TritonLauncher._submit_to_pool`). ``other_sizes``: the int arguments at other values of
        the symbols; once a config is compiled, the binaries of the specialization classes they reach (``xnumel`` not
        divisible by 16 where the hint's was) are queued to the pool behind it, so a later size of that class finds its
        binary compiled (:meth:`_queue_other_classes`). ``twin``: a looped reduction with a persistent twin under the
        constexpr ``PERSISTENT``, which buckets of rows up to ``config.triton_persistent_rnumel`` run. ``persistent``: a
        reduction with no loop over its (static) row: every config's RBLOCK covers the row (a looped kernel's RBLOCK 16
        reduced 16 of a 25-element row: eval BatchNorm + average pooling at a dynamic batch on an H100)."""
        self.n_ptrs, self.red, self.twin, self.outer = n_ptrs, rnumel_hint != 1, twin, outer
        self.persistent = persistent and not twin
        # configs for the example sizes; each bucket chooses again (_for_bucket)
        super().__init__(name, source, numel_hint, rnumel_hint, self.persistent, device_type, outer=outer,
                         elem_bytes=elem_bytes, tiled=tiled, arg_dtypes=None)
        self.arg_dtypes = list(arg_dtypes) if arg_dtypes is not None else None
        self.base_key, self.other_sizes = self.key, [list(v) for v in other_sizes]
        self._runs: dict = {}  # (bucket, class of each int argument) -> run(*args)
        self._tuned: list = []  # ((log2 n, log2 r) of a bucket, its config)
        self._by_size: dict = {}  # xnumel or (xnumel, rnumel) -> its bucket's run (bounded)
        self._size_key = itemgetter(n_ptrs, n_ptrs + 1) if self.red else itemgetter(n_ptrs)
        pool = self.gpu and self.arg_dtypes is not None and size_hints
        if pool or twin:  # (a twin's configs name PERSISTENT: offline compiles read them)
            # the graph was compiled for the hint sizes: its first call is in their bucket
            preset = self._enter_bucket(_bucket(numel_hint, rnumel_hint))
            if pool:
                self._submit_to_pool(self.arg_dtypes + [int(s) for s in size_hints], preset)

    def _enter_bucket(self, bucket: tuple) -> Optional[dict]:
        """Make ``bucket``'s candidates and key (``<source key>.b<n>x<r>``: tuning results, on disk and in process, and
        pool jobs are per bucket) current; the config to run untimed (:meth:`TritonLauncher._preset`) or None."""
        n, r = bucket
        per = self.persistent or (self.twin and r <= config.triton_persistent_rnumel)  # (RBLOCK: the bucket's r >= rnumel)
        self.configs = launch_configs(n, r, per, self.gpu or config.triton_check_configs, self.outer, self.elem_bytes,
                                      self.tiled)
        if self.twin:
            self.configs = [dict(c, PERSISTENT=per) for c in self.configs]
        self.key = f"{self.base_key}.b{n}x{r}"
        return self._preset(n * r)

    def _for_bucket(self, bucket: tuple, args: tuple) -> dict:
        """The launch config of size bucket ``(next_pow2(xnumel), next_pow2(rnumel))``."""
        self.numel, self.rnumel = args[self.n_ptrs], (args[self.n_ptrs + 1] if self.red else 1)
        self.chosen = None
        if (preset := self._enter_bucket(bucket)) is None:
            # as one tuning for all sizes does: the config of the nearest tuned bucket
            n2, r2 = bucket[0].bit_length(), bucket[1].bit_length()
            # (any XBLOCK suits a plain pointwise kernel; a reduction's must be a candidate)
            anyfits = not self.red and not self.tiled
            near = sorted((abs(n - n2) + abs(r - r2), i) for i, ((n, r), c)
                          in enumerate(self._tuned) if anyfits or c in self.configs)
            preset = self._tuned[near[0][1]][1] if near else None
        if preset is None:
            self._autotune(args)  # times each candidate at this call's sizes
        else:
            self._claim_pool_jobs()  # its first launch compiles next
            self.chosen = dict(preset)
        self._tuned.append(((bucket[0].bit_length(), bucket[1].bit_length()), self.chosen))
        trace.log("dynamic_launch_bucket", stage="runtime", kernel=self.name, bucket=list(bucket), config=self.chosen)
        return self.chosen

    def __call__(self, *args):
        # per launch: one C-level key fetch and one dict subscript (a known size's run)
        try:
            run = self._by_size[self._size_key(args)]
        except KeyError:
            run = self._bucket_run(args)
        return run(*args)

    def _bucket_run(self, args: tuple):
        bucket = _bucket(args[self.n_ptrs], max(args[self.n_ptrs + 1], 2) if self.red else 1)
        # Triton's specialization class of xnumel and rnumel (symbols: int32 or not): a binary (and direct launch) each
        key = (bucket,) + self._class(args[self.n_ptrs:])
        if (run := self._runs.get(key)) is None:
            run = self._runs[key] = self._first_launch(bucket, key, args)
        if len(self._by_size) > 4096:
            self._by_size.clear()
        self._by_size[self._size_key(args)] = run
        return run

    def _class(self, ints: Sequence[int]) -> tuple:
        """Triton's specialization class of int args ``ints`` (``xnumel``, [``rnumel``], symbols): one binary each."""
        n = 1 + self.red
        return (tuple((v == 1, v % 16 == 0, v >> 31 == 0) for v in ints[:n]), tuple(v >> 31 == 0 for v in ints[n:]))

    def _class_key(self, cfg: dict, cls: tuple) -> str:
        """The compile-pool key of one config's binary for one specialization class."""
        return f"{self.base_key}.{sorted(cfg.items())}.{cls}"

    def _queue_other_classes(self, cfg: dict, cls: tuple) -> None:
        """Queue ``cfg``'s binaries for the other classes ``other_sizes`` reach (same
        int32 range) to the compile pool, behind the jobs queued before."""
        for ints in self.other_sizes:
            other = self._class(ints)
            key = self._class_key(cfg, other)
            if other != cls and other[1] == cls[1] and [c[2] for c in other[0]] == [c[2] for c in cls[0]] \
                    and key not in triton_runtime._pool_jobs:
                trace.log("dynamic_class_ahead", stage="runtime", kernel=self.name, config=cfg, sizes=ints)
                self._submit_to_pool(self.arg_dtypes + list(ints), cfg, key)

    def _first_launch(self, bucket: tuple, key: tuple, args: tuple):
        """``run(*args)`` for one bucket and class of int arguments (``key``): through Triton's JIT, which
        compiles the kernel on its first call (every bucket with this config and class shares the binary); on
        a GPU, later calls launch the compiled kernel directly with the grid of their ``xnumel`` (the JIT's
        per-call argument binding costs tens of microseconds of host time), while they keep the first call's
        pointer alignment (another alignment goes through the JIT)."""
        cfg = dict(self._for_bucket(bucket, args))
        xb, x = cfg["XBLOCK"], self.n_ptrs
        rb = cfg["RBLOCK"] if self.tiled else None  # (a tiled kernel's r tiles: grid axis 1)
        if self.interpret:
            cfg.pop("num_warps", None)

        def grid(c: dict, a: tuple) -> tuple:
            return (-(-a[x] // c["XBLOCK"]),) + ((-(-a[x + 1] // c["RBLOCK"]),) if self.tiled else ())

        def slow(*a):
            return self.fn[grid(cfg, a)](*a, **cfg)
        if not self.gpu:
            if config.triton_check_configs:   # (this bucket's candidates)
                return self._checked(slow, lambda c, a: self.fn[grid(c, a)](*a, **triton_runtime._interpreted(c)))
            return slow

        def first(*a):
            own = self._class_key(cfg, key[1:])
            self._claim_pool_jobs(own)  # queued ahead (below)
            triton_runtime._pool_jobs[own] = []  # compiled here: not to be queued again
            kernel, self._runs[key] = self._launch_first(
                slow, a, cfg=cfg, grid=(f"-(-a{x} // {xb})", f"-(-a{x + 1} // {rb})" if rb else 1),
                free=len(a) - x - 1 - self.red)  # the size symbols
            self._by_size.clear()  # sizes of this bucket now take the fast launch
            if self.arg_dtypes is not None:
                self._queue_other_classes(cfg, key[1:])
            return kernel
        return first
