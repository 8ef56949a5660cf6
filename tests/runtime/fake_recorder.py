"""``FakeRecorder``: the CUDA graph recorder contract of coil/runtime/cudagraph_record.py
on any device without CUDA, so the tree's tests run on CPU.

Capture runs the function once and keeps its outputs (and gives back the CPU generator's
draws, as a capture draws none); replay runs it again and copies the results into those
outputs, so replays write the recorded memory as a CUDA graph does; poisoned outputs are
remembered in ``stale``."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch


class FakeRecorder:
    """The recorder contract without CUDA (see module docstring); for tests."""

    def __init__(self, device_type: str = "cpu"):
        self.device_type = device_type
        self.captures = 0
        self.replays = 0
        self.releases = 0
        #: poisoned storages (their StorageImpl address) -> the message
        self.stale: dict = {}

    def placeholder(self, a: torch.Tensor) -> torch.Tensor:
        """An uninitialized tensor like ``a``, for a copied input (CudaRecorder: in the graphs' pool)."""
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)

    def release_cache(self) -> None:
        """Count a release of the default pool's cache (CudaRecorder: ``torch.cuda.empty_cache``)."""
        self.releases += 1

    def capture(self, fn: Callable, args: list, boxed: Optional[Callable] = None,
                written: tuple = ()) -> tuple[Any, Any]:
        """Run ``fn`` (``boxed(args)`` if given, as :meth:`CudaRecorder.capture`) once
        for the outputs' memory; replay reruns it into them, reading its tensor arguments
        by address as a CUDA graph does (holding them would keep them alive)."""
        self.captures += 1
        rng = torch.get_rng_state()
        by_address = [_by_address(a) if isinstance(a, torch.Tensor) else a for a in args]
        args = [a.clone() if i in written else a for i, a in enumerate(args)]  # the real one runs nothing
        outs = boxed(args) if boxed is not None else fn(*args)
        torch.set_rng_state(rng)  # a capture draws no numbers; its replays do
        return (fn, by_address, outs), outs

    def replay(self, graph) -> None:
        """Recompute and write into the captured outputs."""
        fn, args, outs = graph
        self.replays += 1
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        with torch.no_grad():
            for o, n in zip(outs, fn(*args)):
                if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in inputs:
                    o.copy_(n)

    def poison(self, cdata: int, message: str) -> None:
        """Remember the (live) storage ``cdata`` as stale."""
        self.stale[cdata] = message

    def is_stale(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives in memory a later replay overwrote."""
        return t.untyped_storage()._cdata in self.stale


def _by_address(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s memory that does not keep ``t``'s storage alive."""
    st = t.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(st.data_ptr(), t.device, st.nbytes())
    return torch.empty((0,), dtype=t.dtype, device=t.device).set_(
        alias, t.storage_offset(), t.shape, t.stride())
