"""One recorded CUDA graph: capture, the plans that map a call's arguments onto it and
its memory back onto fresh output tensors, and what cannot be captured.

Used by :mod:`coil.runtime.cudagraph_trees` (docs/cudagraphs.md). A *recorder* does the device side:
:class:`CudaRecorder` captures a ``torch.cuda.CUDAGraph`` into one memory pool (one ``graph_pool_handle`` for the whole
tree) and replays it on the current stream; a stale output's storage is poisoned with
``torch._C._set_storage_data_ptr_access_error_msg`` so that touching its data, through any view, raises. The tree's
tests run on CPU with ``FakeRecorder`` (tests/runtime/fake_recorder.py), the same contract without CUDA.

Outputs come back as *fresh storages over the recorded memory* on every replay
(``torch._C._construct_storage_from_data_pointer``): the node keeps the tensors made during capture (so the pool never
hands that memory out again), the caller gets tensors whose storage belongs to this replay alone, whose liveness can be
watched with a weak reference and which can be poisoned when a later replay overwrites them."""
from __future__ import annotations

import collections
import contextlib
from typing import Any, Callable, Optional

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from coil import trace
from coil.config import config

#: ATen ops whose result the host must read (a device sync) or whose output size
#: depends on the data; a graph holding one is not recorded.
SYNC_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::nonzero_static", "aten::masked_select",
    "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::equal",
    "aten::is_nonzero", "aten::bincount", "aten::repeat_interleave", "aten::_assert_scalar", "aten::histogram",
})

STALE_MESSAGE = (
    "coil: this tensor is an output of a CUDA graph (mode=\"reduce-overhead\") and a later replay of that graph has "
    "overwritten it. Outputs of a replay live in the CUDA graph pool until the same graph runs again. What to do: "
    "clone what you keep across calls (out.clone()), or call coil.cudagraph_mark_step_begin() where a new iteration "
    "starts, before the next call.")


class SkipGraph(Exception):
    """This graph cannot be recorded; ``str(exc)`` is the reason (it runs un-graphed)."""


def ungraphable_reason(gm: Optional[torch.fx.GraphModule]) -> Optional[str]:
    """Why the ATen graph ``gm`` cannot be captured as a CUDA graph as a whole, or None:
    a graph with no CUDA tensor says so; otherwise the first of :func:`ungraphable_node`'s reasons."""
    if gm is None:
        return None
    vals = [n.meta.get("val") for n in gm.graph.nodes]
    if (devices := {v.device.type for v in vals if isinstance(v, torch.Tensor)}) == {"cpu"}:
        # a whole-CPU graph: say that, not which CPU op the per-node scan meets first
        return "the graph runs on the CPU only (no CUDA tensor in it); CUDA graphs replay CUDA work"
    return next((r for r in map(ungraphable_node, gm.graph.nodes) if r is not None), None)


def ungraphable_node(node: torch.fx.Node) -> Optional[str]:
    """Why the ATen op ``node`` cannot be captured into a CUDA graph, or None.

    Host syncs and data-dependent sizes (:data:`SYNC_OPS`, unbacked symbols in the node's value or in a value it reads),
    CPU tensors computed or read (a CUDA graph would keep the value of capture time), and random ops drawing from an
    explicit ``torch.Generator`` (only the default CUDA generator is graph-safe: its Philox offset advances on every
    replay)."""
    if node.op != "call_function":
        return None
    if (name := getattr(getattr(node.target, "_schema", None), "name", "")) in SYNC_OPS:
        return f"op {name} syncs with the host or has a data-dependent shape ({node.name})"
    val = node.meta.get("val")
    read = [i.meta.get("val") for i in node.all_input_nodes]
    for v in [val] + read:
        with contextlib.suppress(Exception):  # (a value free_unbacked_symbols cannot walk)
            if v is not None and free_unbacked_symbols(v):
                return f"data-dependent shape at {node.name} ({name or node.target})"
    if isinstance(val, torch.Tensor) and val.device.type == "cpu":
        return f"CPU tensor computed in the graph at {node.name} ({name or node.target})"
    if any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in read):
        return f"CPU tensor read at {node.name} ({name or node.target})"
    if node.kwargs.get("generator") is not None:
        return f"unsupported RNG: {node.name} draws from an explicit torch.Generator"
    return None


class CudaRecorder:
    """Captures into one memory pool shared by every graph it records."""

    device_type = "cuda"

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        if self.device.index is None:  # (use_mem_pool wants an index)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.mem_pool = torch.cuda.MemPool()
        self.pool = self.mem_pool.id
        #: the stream every capture runs on; placeholders are allocated on it too
        self.stream = torch.cuda.Stream(self.device)

    def placeholder(self, a: torch.Tensor) -> torch.Tensor:
        """An uninitialized tensor like ``a`` (shape, strides, dtype) in the graphs' pool, for a copied input: it shares
        the pool's segments with the graphs' intermediates instead of holding a segment of the default pool (a 0.3 MB
        ResNet-50 image held a 2 MB one). It is allocated on the capture stream: the caching allocator serves a free
        block only to the stream that made its segment, so a placeholder made on the current stream held a 2 MiB segment
        of the pool that no capture could share (LLaMA 1x64 reserved 2 MiB more than torch.compile's trees)."""
        with torch.cuda.stream(self.stream), torch.cuda.use_mem_pool(self.mem_pool, self.device):
            return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=self.device)

    def capture(self, fn: Callable, args: list, boxed: Optional[Callable] = None,
                written: tuple = ()) -> tuple[Any, Any]:
        """``(graph, outputs)`` of capturing ``fn(*args)``; ``args`` hold real values. With ``boxed`` (``fn``'s
        ``call_boxed``), the capture runs ``boxed(args)``, which empties ``args`` and releases each input after its last
        use, so the capture may reuse the memory of inputs that only ``args`` held. ``written``: indices of the
        arguments ``fn`` writes in place; the dry run writes copies of them.

        First a dry run with ``torch.cuda.set_sync_debug_mode("error")``: a host sync (``.item()``, a copy to pageable
        host memory, an op with a data-dependent size) raises there, outside any capture, and the graph is skipped
        cleanly. A capture that still fails is skipped too (:meth:`_recover`).

        RNG: the dry run's draws are given back (the device generator's state is restored after it) and a capture draws
        nothing (replays advance the generator), so the recording call, like every call, consumes exactly what one run
        of ``fn`` does: after ``torch.manual_seed`` the numbers are the same with or without CUDA graphs."""
        with torch.cuda.device(self.device):
            mode = torch.cuda.get_sync_debug_mode()
            rng = torch.cuda.get_rng_state(self.device)
            torch.cuda.set_sync_debug_mode("error")
            dry = [a.clone() if i in written else a for i, a in enumerate(args)]
            try:
                boxed(dry) if boxed is not None else fn(*dry)
            except Exception as e:  # noqa: BLE001 - the reason goes to the log
                raise SkipGraph(f"syncs with the host or fails (dry run): {type(e).__name__}: {str(e)[:300]}") from e
            finally:
                torch.cuda.set_sync_debug_mode(mode)
                torch.cuda.set_rng_state(rng, self.device)
            graph = torch.cuda.CUDAGraph()
            torch.cuda.synchronize()
            self.release_cache()
            stream = torch.cuda.current_stream()
            try:
                with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                    outs = boxed(args) if boxed is not None else fn(*args)
            except Exception as e:  # noqa: BLE001 - the reason goes to the log
                self._recover(stream)
                raise SkipGraph(f"capture failed: {type(e).__name__}: {str(e)[:300]}") from e
            finally:
                # the workspace cuBLAS made for the capture stream goes back to the pool as an intermediate
                _clear_cublas_workspaces()
        return graph, outs

    def release_cache(self) -> None:
        """Hand the default pool's unused cached memory back to the device before a
        capture (``config.cudagraph_release_cache``): the un-graphed warm-up call and the
        dry run ran there and left the graph's working set cached, which its replays,
        running in the tree's pool, never use (it held as much memory again as the pool); again at the start of the
        next step (``Tree.new_step``), for the warm-up outputs that were still held at the capture."""
        if not config.cudagraph_release_cache:
            return
        before = torch.cuda.memory_reserved(self.device)
        _clear_cublas_workspaces()  # the warm-up's 32 MiB workspace per stream, which replays never use
        torch.cuda.empty_cache()
        if (freed := before - torch.cuda.memory_reserved(self.device)):
            trace.log("cudagraph_release_cache", stage="runtime", freed_mb=round(freed / 2**20, 1),
                      reason="the warm-up and dry run left this cached in the default pool; "
                             "replays run in the CUDA graph pool")

    def _recover(self, stream) -> None:
        """Undo what a failed capture leaves behind: its ``capture_end`` raised before making the capture stream current
        again and before taking the default CUDA generator out of capture mode (every later random op then raised
        "Offset increment outside graph capture"), and before ending the routing of allocations to the pool (a later
        ``MemPool`` destructor asserted ``captures_underway.empty()`` and aborted the process). A tiny capture that
        succeeds does the first two; the routing is ended here."""
        with contextlib.suppress(AttributeError, RuntimeError):  # (capture_end got that far: nothing left to end)
            torch._C._cuda_endAllocateToPool(self.device.index, self.pool)
        torch.cuda.set_stream(stream)
        try:
            torch.cuda.synchronize()
            probe = torch.empty(1, device=self.device)
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                probe.add_(1)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - best effort; the skip is logged anyway
            trace.log("cudagraph_recover_failed", stage="runtime", error=str(e)[:300])
        finally:
            torch.cuda.set_stream(stream)

    def replay(self, graph) -> None:
        """Run a captured graph on the current stream."""
        graph.replay()

    def poison(self, cdata: int, message: str) -> None:
        """Make reading the live storage ``cdata`` (a :class:`SlotRefs` entry) raise
        ``message``; every tensor over it, views included, sees the error. The storage
        does not own its memory (:meth:`OutputPlan.build`), so releasing its data frees nothing."""
        poison = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)
        if poison is not None:  # CUDA builds have it
            poison(cdata, message)


def _clear_cublas_workspaces() -> None:
    """Release the workspace cuBLAS keeps per (handle, stream) (32 MiB each on an H200): one made in a capture
    stays allocated in the graph pool, one made by an un-graphed call in the default pool; the next matmul
    outside a capture makes a new one. torch.compile's trees clear them around each recording too."""
    if (clear := getattr(torch._C, "_cuda_clearCublasWorkspaces", None)) is not None:
        clear()


class SlotRefs(tuple):
    """Weak references (``cdata``) to one replay's slot storages, freed together when this is dropped: torch's
    ``StorageWeakRef`` is a Python object per storage, and its ``__init__``/``__del__`` were the largest host cost of a
    training step's replays (190 outputs a step). Test an entry with ``torch._C.StorageBase._expired(cdata)``."""

    def __new__(cls, storages):
        return super().__new__(cls, map(_weak_ref, storages))   # (C maps: ~-0.25 µs a storage)

    def __del__(self, _drain=collections.deque, _free=torch.UntypedStorage._free_weak_ref):
        _drain(map(_free, self), 0)


_weak_ref = torch.UntypedStorage._weak_ref


_storage_over = torch._C._construct_storage_from_data_pointer
#: torch's C constructor of a CUDA tensor over a given storage (CUDA builds; about a
#: quarter of ``empty((0,)).set_(...)``'s cost). Checked on first use; None once it
#: is missing, raises or builds something else, and ``set_`` is used instead.
_from_metadata = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)
_from_metadata_checked = False


def _tensor_over(storage, dtype, size, stride, offset: int, meta: Optional[dict] = None, blank=None):
    """A tensor of ``dtype``/``size``/``stride`` at element ``offset`` of ``storage``; ``blank``: an empty tensor of
    that dtype and device, whose ``new()`` starts it for less than a third of ``torch.empty``'s parsing."""
    global _from_metadata, _from_metadata_checked
    if meta is not None and _from_metadata is not None:
        try:
            t = _from_metadata(meta, storage)
        except Exception:  # noqa: BLE001 - another torch's signature: use set_
            _from_metadata = None
        else:
            if _from_metadata_checked:
                return t
            if (t.untyped_storage()._cdata == storage._cdata and t.dtype == dtype and
                    tuple(t.shape) == tuple(size) and t.stride() == tuple(stride) and
                    t.storage_offset() == offset):
                _from_metadata_checked = True
                return t
            _from_metadata = None
    t = blank.new() if blank is not None else torch.empty((0,), dtype=dtype, device=storage.device)
    return t.set_(storage, offset, size, stride)


class OutputPlan:
    """How a recorded graph's outputs are rebuilt after each replay.

    Each output is a constant (not a tensor), a view of one of the call's arguments (the graph returned an input or a
    view of it: rebuilt on the argument of this call), or a view into a *slot*: one storage the graph wrote, rebuilt
    over the recorded memory as a fresh storage per replay (module docstring)."""

    def __init__(self, outs, static_args: list, device_type: str):
        arg_of = {}
        for i, a in enumerate(static_args):
            if isinstance(a, torch.Tensor):
                arg_of.setdefault(a.untyped_storage().data_ptr(), i)
        self.slots: list = []  # (data_ptr, nbytes, device)
        slot_of: dict = {}
        self.items: list = []
        self.is_tuple = isinstance(outs, tuple)
        for o in outs:
            if not isinstance(o, torch.Tensor):
                self.items.append(("const", o))
                continue
            if o.device.type != device_type:
                raise SkipGraph(f"an output is a {o.device.type} tensor")
            st = o.untyped_storage()
            key = st.data_ptr()
            meta = (o.dtype, tuple(o.shape), tuple(o.stride()))
            if key in arg_of:
                i = arg_of[key]
                a = static_args[i]
                if o.data_ptr() == a.data_ptr() and meta == (a.dtype, tuple(a.shape), tuple(a.stride())):
                    # the argument itself (a forward saving a parameter for the backward):
                    # handed back as the caller's object, so it stays a Parameter there
                    self.items.append(("self", i))
                else:
                    self.items.append(("arg", i, meta, o.data_ptr() - a.data_ptr()))
                continue
            if key not in slot_of:
                slot_of[key] = len(self.slots)
                self.slots.append((key, st.nbytes(), o.device))
            # (CUDA) what torch's constructor of a tensor over a storage reads
            fast = {"nbytes": st.nbytes(), "data_ptr": key, "size": o.shape, "stride": o.stride(),
                    "dtype": o.dtype, "device": o.device, "storage_offset": o.storage_offset()} \
                if o.is_cuda else None
            self.items.append(("slot", slot_of[key], meta, o.storage_offset(), fast))
        #: the tensors made during capture, kept so the pool never reuses their memory
        self.owned = [o for o in outs if isinstance(o, torch.Tensor)]
        # for build, computed once: the constants in place, the arguments handed back, the tensors made per replay
        # (output index, slot or argument, layout, offset, C constructor's metadata (CUDA slots), an empty tensor)
        self._template = [it[1] if it[0] == "const" else None for it in self.items]
        self._selves = [(k, it[1]) for k, it in enumerate(self.items) if it[0] == "self"]
        made = [(it[0], k, *it[1:4], it[4] if it[0] == "slot" else None, torch.empty(0, dtype=o.dtype, device=o.device))
                for k, (it, o) in enumerate(zip(self.items, outs)) if it[0] in ("slot", "arg")]
        self._over_slots = [m[1:] for m in made if m[0] == "slot"]
        self._over_args = [m[1:] for m in made if m[0] == "arg"]
        self._cuda = all(m[4] is not None for m in self._over_slots)  # (every one has the C constructor's metadata)

    def build(self, args) -> tuple[list, list]:
        """``(outputs, weak refs of this replay's slot storages)``."""
        storages = [_storage_over(p, dev, n) for p, n, dev in self.slots]
        outs = self._template.copy()
        for k, i in self._selves:
            outs[k] = args[i]
        if _from_metadata_checked and _from_metadata is not None and self._cuda:  # seen to build what is asked
            for k, i, _, _, fast, _ in self._over_slots:
                outs[k] = _from_metadata(fast, storages[i])
        else:
            for k, i, (dtype, size, stride), offset, fast, blank in self._over_slots:
                outs[k] = blank.new().set_(storages[i], offset, size, stride) if fast is None else \
                    _tensor_over(storages[i], dtype, size, stride, offset, fast, blank)
        for k, i, (dtype, size, stride), offset, _, blank in self._over_args:
            base = args[i]
            storage = base.untyped_storage()
            offset = (base.data_ptr() - storage.data_ptr() + offset) // dtype.itemsize
            outs[k] = _tensor_over(storage, dtype, size, stride, offset, None, blank)
        return outs, SlotRefs(storages)

    def slots_of(self, start: int, stop: int) -> set:
        """The slots holding outputs ``start..stop-1``."""
        return {it[1] for it in self.items[start:stop] if it[0] == "slot"}
