"""CUDA graph trees: ``mode="reduce-overhead"``. The design (with a picture) is docs/cudagraphs.md; this is its summary.

Every compiled graph on a device (forwards, backwards, inference graphs, resume functions, one per size under dynamic
shapes) is replayed from a CUDA graph recorded into one memory pool per device. The recordings form a tree of the paths
a step takes: a call is served by a child of the last node run in this step (or a root) with the same graph, argument
sizes and argument addresses; when there is none a new node is recorded there. A node owns its outputs' memory;
intermediates go back to the pool for later recordings. The outputs a caller still holds from a node's previous replay
are poisoned when it replays (reading them raises :data:`STALE_MESSAGE`). A backward's recording reuses the memory of
the saved activations it reads last (:meth:`Tree._lend_saved`, ``config.cudagraph_reuse_saved``). A node is never
replayed while a later recording has live outputs that may share its intermediates' memory: that call runs un-graphed. A
new step starts at :func:`mark_step_begin` or when a forward already on the path is called again with no backward
pending. Parameters, buffers and fed-back outputs are read in place, guarded by address; other arguments are copied into
placeholders. Fallbacks (``cudagraph_skip``, with a reason) run the graph compiled, without a CUDA graph."""
from __future__ import annotations

import contextlib
import itertools
import operator
import weakref
from typing import Callable, Optional

import torch

from coil import trace
from coil.exc import warn_user
from coil.runtime.cudagraph_record import (STALE_MESSAGE, CudaRecorder, OutputPlan, SkipGraph,
                                           _tensor_over, ungraphable_reason)
from coil.config import config

__all__ = ["cudagraphify", "mark_step_begin", "reset", "GraphFunction", "Tree", "Node"]

_ids = itertools.count()


class Node:
    """One recorded graph: its placeholders, guards and output plan (module docstring)."""

    def __init__(self, tree: "Tree", fn: "GraphFunction", sig: tuple, parent: Optional["Node"], graph, plan: OutputPlan,
                 copied: list, placeholders: list, inplace: list, args: tuple = ()):
        self.tree, self.fn, self.sig, self.parent = tree, fn, sig, parent
        self.graph, self.plan = graph, plan
        self.copied, self.placeholders = copied, placeholders
        #: (index, placeholder) pairs in lists of one device and dtype (:func:`dtype_groups`; one list: one copy call)
        self._copy_groups = dtype_groups(list(enumerate(placeholders)))
        #: (argument index, data pointer) read in place
        self.inplace = inplace
        self.children: list = []
        self.depth = 0 if parent is None else parent.depth + 1
        #: recording order in the tree: a later recording may reuse memory this node's
        #: capture freed (its intermediates), so its live outputs forbid replaying this
        self.index = tree.nodes
        #: weak refs of the slot storages handed out by the last replay
        self.live: list = []
        #: (argument index, placeholder) of copied arguments the graph writes (Tree.record), in lists of one dtype
        self.writeback: list = []
        # storages only the backward holds: one that also backs a user output may be
        # kept by the caller long after the backward ran
        self.saved_slots = plan.slots_of(*fn.saved) - plan.slots_of(0, fn.saved[0]) if fn.saved else set()
        #: forward node -> its saved slots whose memory this backward's recording released and reused (Tree._lend_saved)
        self.consumes: dict = {}
        self._inplace_args = index_getter([i for i, _ in inplace])
        self._inplace_ptrs = tuple(p for _, p in inplace)
        # for torch's C check (_ptrs_at): the recorded pointers by argument index, the indices
        self._ptr_table, self._inplace_idx = [None] * len(args), [i for i, _ in inplace]
        for i, p in inplace:
            self._ptr_table[i] = p
        self._copied_args, self.nargs = index_getter(copied), len(args)
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        self._types = tuple(type(args[i]) for i in tensors)
        self._tensor_args = index_getter(tensors) if len(tensors) < len(args) else _same  # (no 175-tuple per call)
        # the signature holds a plain tensor's layout and only the kind of a Parameter (read in place, by address)
        self._plain_args = index_getter([i for i in tensors if not isinstance(args[i], torch.nn.Parameter)])
        self.others = [(i, (type(a), a)) for i, a in enumerate(args) if not isinstance(a, torch.Tensor)]
        self.tensor_check = _tensor_check(self._plain_args(args))

    def matches(self, args) -> bool:
        """Whether ``args`` has this recording's signature and in-place addresses: the fast path of :meth:`Tree.run`.
        Instead of a signature tuple, each tensor's exact type, and one C++ check of each plain tensor's dtype, device,
        sizes, strides and ``requires_grad``: a Parameter's layout is not in the signature (a GPT-2 decoding step
        passes ~150 parameters). It is stricter than the signature (False sends the call down the full path)."""
        if self.tensor_check is None or len(args) != self.nargs:
            return False
        try:
            if tuple(map(type, self._tensor_args(args))) != self._types or \
                    not self.tensor_check.check(*self._plain_args(args)):
                return False
        except TypeError:  # a tensor where this recording had something else
            return False
        return (not self.others or all((type(args[i]), args[i]) == v for i, v in self.others)) and not self.moved(args)

    def moved(self, args) -> list:
        """Indices of in-place arguments not at their recorded address."""
        if self.inplace and self._at_recorded(args):
            return []
        return [i for i, p in self.inplace if args[i].data_ptr() != p]

    def _at_recorded(self, args) -> bool:
        """Whether every in-place argument is at its recorded address: one C call (:data:`_ptrs_at`) once it has agreed
        with the Python check on a call and refused a wrong address, else a data pointer per argument from Python."""
        global _ptrs_at, _ptrs_at_checked
        if _ptrs_at_checked:
            try:
                return _ptrs_at(list(args), self._ptr_table, self._inplace_idx)
            except Exception:  # noqa: BLE001 - an argument it cannot read: the Python check from now on
                _ptrs_at_checked, _ptrs_at = False, None
        same = tuple(map(_data_ptr, self._inplace_args(args))) == self._inplace_ptrs
        if _ptrs_at is not None:
            i = self._inplace_idx[0]
            wrong = self._ptr_table[:i] + [args[i].data_ptr() + 1] + self._ptr_table[i + 1:]
            with contextlib.suppress(Exception):  # (another signature)
                _ptrs_at_checked = _ptrs_at(list(args), self._ptr_table, self._inplace_idx) is same and \
                    _ptrs_at(list(args), wrong, [i]) is False
            _ptrs_at = _ptrs_at if _ptrs_at_checked else None
        return same

    def busy(self) -> bool:
        """Something still holds an output of the last replay."""
        return not all(map(_expired, self.live))

    def poison_live(self) -> None:
        """Make what the last replay handed out raise when read (it is about to be overwritten)."""
        for c in itertools.filterfalse(_expired, self.live):
            self.tree.recorder.poison(c, STALE_MESSAGE)
        self.live = []

    def pending_backward(self) -> bool:
        """A forward whose saved tensors from the last replay are still held."""
        return any(not _expired(self.live[s]) for s in self.saved_slots) if self.live else False

    def _copy_in(self, srcs) -> None:
        if len(self._copy_groups) == 1:
            _copy_in(self.placeholders, srcs)
            return
        for group in self._copy_groups:
            _copy_in([p for _, p in group], tuple(srcs[k] for k, _ in group))

    def replay(self, args):
        """Copy the arguments in, poison what the last replay handed out, replay."""
        if self.copied:
            srcs = self._copied_args(args)
            if _grad_enabled():  # (the inference path runs without grad already)
                _set_grad_enabled(False)  # torch.no_grad() without its Python objects
                try:
                    self._copy_in(srcs)
                finally:
                    _set_grad_enabled(True)
            else:
                self._copy_in(srcs)
        self.poison_live()
        self.tree.recorder.replay(self.graph)
        if self.writeback:
            with torch.no_grad():
                for group in self.writeback:
                    torch._foreach_copy_([args[i] for i, _ in group], [p for _, p in group])
        self.tree.replays += 1
        outs, self.live = self.plan.build(args)
        return tuple(outs) if self.plan.is_tuple else outs


class Tree:
    """The recorded graphs of one device, their shared pool and the current path."""

    def __init__(self, recorder):
        self.recorder, self.roots, self.path = recorder, [], []
        #: the mark_step_begin count this tree's step started after: a new count starts a step
        self.marks = _marks[0]
        #: storage data pointer of every node output -> node
        self.pool_storages: dict = {}
        #: storage data pointers some node reads in place (parameters, buffers): a view
        #: of them (a forward saving ``weight.t()``) is read in place too
        self.stable_storages: set = set()
        self.steps, self.nodes = 0, 0
        #: forward node -> recording index from which recordings may overlap the memory
        #: of its saved slots that a backward's recording released (Tree._lend_saved)
        self.released: dict = {}
        self.all_nodes: list = []   # by index: all_nodes[k].index == k
        self.replays = 0
        self.recorded = False   # in this step (new_step)

    def new_step(self) -> None:
        """Go back to the roots: the next call starts a step. The first step after a recording releases the default
        pool's cache again (``recorder.release_cache``): the un-graphed warm-up call's outputs were still held at the
        capture, so their segments stayed cached there (GPT-2 at 8 x 64: the 49 MiB logits)."""
        if self.recorded:
            self.recorded = False
            self.recorder.release_cache()
        self.path, self.marks = [], _marks[0]
        self.steps += 1

    def run(self, fn: "GraphFunction", args: tuple):
        """Serve one call of ``fn`` (module docstring)."""
        if (node := fn.last if fn.last is not None and fn.last.matches(args) else None) is not None:
            sig, warm = node.sig, None   # warmed up: the node was recorded for this signature
        else:
            sig = _signature(args)
            if (warm := fn.warm.get(sig)) is None:
                if (reason := _device_reason(args, self.recorder.device_type)) is not None:
                    fn.skip_with(reason)
                else:
                    fn.warm[sig] = [weakref.ref(a) if isinstance(a, torch.Tensor) else None for a in args]
                return fn.fn(*args)
        if self.marks != _marks[0] or (self.path and fn.kind != "backward" and
                               any(n.fn is fn for n in self.path) and
                               not any(n.pending_backward() for n in self.path)):
            self.new_step()
        siblings = self.path[-1].children if self.path else self.roots
        if node is not None and (node.parent is not (self.path[-1] if self.path else None) or
                                 (fn.kind == "backward" and node.busy())):
            node, warm = None, fn.warm.get(sig)
        held = False
        for cand in siblings if node is None else ():
            if cand.fn is fn and cand.sig == sig:
                if fn.kind == "backward" and cand.busy():
                    held = True  # its gradients still sit in .grad (accumulation)
                    continue
                if not (moved := cand.moved(args)):
                    node = cand
                    break
                fn.copy_always.setdefault(sig, set()).update(moved)
                trace.log("cudagraph_rerecord", stage="runtime", graph=fn.name,
                          reason=f"arguments {moved} moved since recording")
        if self.released and (node is None or node.consumes or node.index >= min(self.released.values())):
            if (why := self._overlaps_pending_saved(node)) is not None:
                fn.log_skip("saved", why)
                return fn.fn(*args)
        if node is None and held:
            # gradient accumulation: the last replay's gradients are still held in .grad; this backward runs un-graphed
            # rather than in a second recording (a sibling recording gave wrong tied-weight gradients on the H200)
            fn.log_skip("held", "gradients of the last replay still held (accumulation): this backward runs un-graphed")
            return fn.fn(*args)
        if (later := [m for m in self.all_nodes[node.index + 1:] if m.busy()] if node is not None else []):
            # nodes recorded after this one still have outputs alive; their memory may be this node's intermediates.
            # Gradients (held in .grad across micro-batches) and this call's own arguments must survive: the call runs
            # un-graphed. Other outputs belong to an earlier step and go stale, as a replay's own do.
            ptrs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            if any(m.fn.kind == "backward" for m in later) or any(self.pool_storages.get(p) in later for p in ptrs):
                fn.log_skip("later", "outputs of a later recording are still alive (gradients "
                                     "held in .grad, or this call's arguments): runs un-graphed")
                return fn.fn(*args)
            for m in later:
                m.poison_live()
        if node is None and (node := self.record(fn, sig, args, warm)) is None:
            return fn.fn(*args)
        self.path.append(node)
        fn.last = node
        return node.replay(args)

    def record(self, fn: "GraphFunction", sig: tuple, args: tuple, warm: list) -> Optional[Node]:
        """Record ``fn`` for these arguments as a child of the path's last node."""
        if fn.records >= fn.limit:
            fn.log_skip("limit", f"record limit: {fn.records} recordings "
                                 "(config.cudagraph_record_limit); new ones run without a CUDA graph")
            return None
        parent = self.path[-1] if self.path else None
        lent: dict = {}
        try:
            static_args, copied, placeholders, inplace = self._inputs(fn, sig, args, warm)
            plan_args = list(static_args)
            if (boxed := getattr(fn.fn, "call_boxed", None) if fn.kind == "backward" else None) is not None:
                lent = self._lend_saved(static_args)
                boxed = boxed if lent else None
                # a lent argument's memory is released during the capture: an output found
                # there is a new allocation of this node (a slot), not a view of the argument
                plan_args = [a if a is b else None for a, b in zip(plan_args, static_args)]
            written = getattr(fn.fn, "writes_inputs", ())
            graph, outs = self.recorder.capture(fn.fn, static_args, boxed, written)
            plan = OutputPlan(outs, plan_args, self.recorder.device_type)
        except SkipGraph as e:
            fn.skip_with(str(e))
            return None
        except Exception as e:  # noqa: BLE001 - e.g. an input a placeholder cannot copy
            fn.skip_with(f"cannot record: {type(e).__name__}: {str(e)[:300]}")
            return None
        finally:
            for f in lent:  # from here on, recordings may overlap their memory
                self.released[f] = self.nodes + 1
        fn.records += 1
        self.recorded = True
        node = Node(self, fn, sig, parent, graph, plan, copied, placeholders, inplace, args)
        node.consumes = lent
        # an argument copied into a placeholder that the graph writes in place: copied back after each replay
        node.writeback = dtype_groups([(i, p) for i, p in zip(copied, placeholders) if i in written])
        (parent.children if parent is not None else self.roots).append(node)
        self.all_nodes.append(node)
        for ptr, _, _ in plan.slots:
            self.pool_storages[ptr] = node
        self.nodes += 1
        trace.log("cudagraph_record", stage="runtime", graph=fn.name, kind=fn.kind, depth=node.depth,
                  recording=fn.records, copied_inputs=len(copied), inplace_inputs=len(inplace), outputs=len(plan.items),
                  reuses_saved_of=[f.fn.name for f in lent])
        return node

    def _lend_saved(self, static_args: list) -> dict:
        """Before a backward's capture: for each argument over a saved-only output of a forward node (memory the forward
        node owns, which this backward is the last to read), put a view of the forward's own tensor in ``static_args``
        and drop the node's reference, so that the boxed call, releasing each input after its last use, hands that
        memory to the backward's later allocations (torch.compile's trees reuse saved activations in the backward
        alike). Returns ``{forward node: its slots lent}``. Not done when ``config.cudagraph_reuse_saved`` is off or the
        backward keeps its graph (``retain_graph``: the saved values are read again)."""
        if not config.cudagraph_reuse_saved or _keep_graph():
            return {}
        lent: dict = {}
        for i, a in enumerate(static_args):
            if not isinstance(a, torch.Tensor):
                continue
            f = self.pool_storages.get(a.untyped_storage().data_ptr())
            if f is None or f.fn.kind != "forward" or f in self.released:
                continue
            slot = next((k for k, (p, _, _) in enumerate(f.plan.slots) if p == a.untyped_storage().data_ptr()), None)
            if slot not in f.saved_slots:
                continue
            own = next(o for o in f.plan.owned if o.untyped_storage().data_ptr() == f.plan.slots[slot][0])
            static_args[i] = _tensor_over(own.untyped_storage(), a.dtype, a.shape, a.stride(), a.storage_offset())
            lent.setdefault(f, set()).add(slot)
        for f, slots in lent.items():
            ptrs = {f.plan.slots[k][0] for k in slots}
            f.plan.owned = [o for o in f.plan.owned if o.untyped_storage().data_ptr() not in ptrs]
        return lent

    def _overlaps_pending_saved(self, node: Optional[Node]) -> Optional[str]:
        """Why this call must run un-graphed to keep a forward's saved values whose memory a backward's
        recording released (:meth:`_lend_saved`) intact while they wait for their backward, or None: a new
        recording (``node`` None) or a node recorded since the release may overlap that memory; the backward
        that reused it must not run while the graph is kept (``retain_graph``) or twice."""
        for f, since in self.released.items():
            if f is node or not f.pending_backward():
                continue
            if node is None or node.index >= since:
                return (f"the saved activations of {f.fn.name} wait for their backward and "
                        "a recording made after its backward reused their memory may overlap them")
        if node is not None and node.consumes and _keep_graph():
            return "retain_graph: the saved activations this backward reuses are read again"
        return None

    def _inputs(self, fn: "GraphFunction", sig: tuple, args: tuple, warm: list) -> tuple:
        """``(static_args, copied, placeholders, inplace)`` for a recording: which arguments are read in place
        (module docstring) and the placeholders, holding this call's values, of the others."""
        forced = fn.copy_always.get(sig, ())
        static_args = list(args)
        copied, placeholders, inplace = [], [], []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                continue
            same = warm[i] is not None and warm[i]() is a
            sp = a.untyped_storage().data_ptr()
            if i not in forced and (sp in self.pool_storages or sp in self.stable_storages or
                                    isinstance(a, torch.nn.Parameter) or same):
                inplace.append((i, a.data_ptr()))
                if sp not in self.pool_storages:
                    self.stable_storages.add(sp)
                continue
            p = self.recorder.placeholder(a)
            with torch.no_grad():
                p.copy_(a)  # the recorder may run the function once before capturing it
            copied.append(i)
            placeholders.append(p)
            static_args[i] = p
        return static_args, copied, placeholders, inplace


class GraphFunction:
    """A compiled graph as the tree sees it: ``kind`` is ``"inference"``, ``"forward"``
    (``saved``: the range of its outputs saved for the backward) or ``"backward"``."""

    def __init__(self, fn: Callable, kind: str, saved: Optional[tuple] = None,
                 tree: Optional[Tree] = None, name: Optional[str] = None, limit: int = 8):
        self.fn, self.kind, self.saved, self.tree = fn, kind, saved, tree
        self.name, self.limit = name or f"{kind}_{next(_ids)}", limit
        self.skip: Optional[str] = None
        self.warm, self.copy_always, self.records = {}, {}, 0
        #: the node that served the last call: tried first (Node.matches)
        self.last: Optional[Node] = None
        self.logged: set = set()    # kinds of skip already logged (log_skip)

    def log_skip(self, kind: str, reason: str) -> None:
        """Log event ``cudagraph_skip`` with ``reason``, once per ``kind`` of skip."""
        if kind not in self.logged:
            self.logged.add(kind)
            trace.log("cudagraph_skip", stage="runtime", graph=self.name, reason=reason)

    def skip_with(self, reason: str) -> None:
        """Run un-graphed from now on, logged once; the first graph skipped for a given
        reason also warns (the user asked for CUDA graphs and should see they are off)."""
        self.skip = reason
        trace.log("cudagraph_skip", stage="runtime", graph=self.name, reason=reason)
        if (kind := reason.split(" at ")[0]) not in _WARNED:   # one warning per kind of reason, not per node
            _WARNED.add(kind)
            warn_user(f"coil: CUDA graphs (mode='reduce-overhead' / 'max-autotune') are not used "
                      f"for graph {self.name}: {reason}. It runs compiled, without CUDA graphs "
                      "(the compile log's cudagraph_skip events list every such graph).")

    def __call__(self, *args):
        if self.skip is not None:
            return self.fn(*args)
        if (tree := self.tree) is None:
            tree = self.tree = pick_tree(args)
            if tree is None:
                self.skip_with("CPU tensors: no CUDA tensor among the inputs")
                return self.fn(*args)
        return tree.run(self, args)


def _keep_graph() -> bool:
    """Whether the running backward keeps its graph (``retain_graph``)."""
    try:
        return bool(torch._C._autograd._get_current_graph_task_keep_graph())
    except RuntimeError:  # not inside a backward
        return False


_data_ptr = torch.Tensor.data_ptr
#: torch's C check that tensors sit at given data pointers (CUDA builds; torch.compile's trees use it), used once it is
#: seen to agree with the Python check (Node._at_recorded); None where it is missing, raises or disagrees
_ptrs_at = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
_ptrs_at_checked = False
_grad_enabled, _set_grad_enabled = torch.is_grad_enabled, torch._C._set_grad_enabled
#: ``StorageWeakRef.expired`` without its two Python frames (called per output per call)
_expired = getattr(torch._C.StorageBase, "_expired", None) or torch.UntypedStorage._expired


def _same(args):
    return args


def dtype_groups(pairs: list) -> list:
    """``pairs`` of (anything, tensor) in lists of one device and tensor dtype, in first-seen order:
    ``_foreach_copy_`` takes its multi-tensor fast path for one dtype only, and a list that mixes float and int64
    tensors (BatchNorm's running stats and counters; token ids beside float inputs) ran one copy launch each."""
    groups: dict = {}
    for i, p in pairs:
        groups.setdefault((p.device, p.dtype), []).append((i, p))
    return list(groups.values())


def _copy_in(placeholders: list, srcs: tuple) -> None:
    torch._foreach_copy_(placeholders, srcs) if len(srcs) > 1 else placeholders[0].copy_(srcs[0])


def index_getter(idx: list) -> Callable:
    """``args -> tuple(args[i] for i in idx)``, in C."""
    if len(idx) == 1:
        return lambda args, i=idx[0]: (args[i],)
    return operator.itemgetter(*idx) if idx else (lambda args: ())


def _tensor_check(tensors: tuple):
    """torch's C++ checker of tensor metadata (``torch._C._dynamo.guards.TensorGuards``)
    for ``tensors`` as they are now, or None where this torch lacks it."""
    try:
        from torch._C._dynamo.guards import TensorGuards
        return TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                            dynamic_dims_strides=[list(t.stride()) for t in tensors])
    except Exception:  # noqa: BLE001 - another torch: the signature path only
        return None


def _signature(args) -> tuple:
    # a scalar by type and value: 1, 1.0 and True are equal but give other dtypes
    return tuple((a.shape, a.stride(), a.dtype) if isinstance(a, torch.Tensor) and
                 not isinstance(a, torch.nn.Parameter) else
                 (None if isinstance(a, torch.Tensor) else (type(a), a)) for a in args)


def _device_reason(args, device_type: str) -> Optional[str]:
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.device.type != device_type:
            return f"{'CPU tensors: ' if a.device.type == 'cpu' else ''}input {i} is on {a.device}"
    return None


_TREES: dict = {}
#: calls of mark_step_begin: each tree compares it with the count its step started after
_marks = [0]


def pick_tree(args) -> Optional[Tree]:
    """The tree (and pool) of the CUDA device of the first CUDA tensor in ``args``."""
    if (dev := next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)) is None:
        return None
    if (key := dev.index or 0) not in _TREES:
        _TREES[key] = Tree(CudaRecorder(torch.device("cuda", key)))
    return _TREES[key]


#: skip reasons already warned about in this process (GraphFunction.skip_with)
_WARNED: set = set()


def cuda_available() -> bool:
    """Whether CUDA graphs can be recorded in this process."""
    return torch.cuda.is_available()


def cudagraphify(fn: Callable, kind: str, saved: Optional[tuple] = None) -> Callable:
    """``fn`` (one compiled graph) replayed from CUDA graphs when ``config.cudagraphs``
    is on, else ``fn`` itself. Called by the AOT runtime for each graph it runs."""
    if not config.cudagraphs or getattr(fn, "cudagraph_partitioned", False):
        return fn  # (a PartitionedGraph's pieces are wrapped already)
    gf = GraphFunction(fn, kind, saved, limit=config.cudagraph_record_limit)
    gm = getattr(fn, "gm", None) or getattr(fn, "__self__", None)
    if not cuda_available():   # first: the one reason that holds for every graph of the process
        gf.skip_with("CUDA is not available")
    elif (reason := ungraphable_reason(gm if isinstance(gm, torch.fx.GraphModule) else None)) is not None:
        gf.skip_with(reason)
    return gf


def mark_step_begin() -> None:
    """Start a new step: the next compiled call starts again from the tree's roots, and outputs of the last
    step become stale once their graphs replay (clone what you keep)."""
    _marks[0] += 1


def reset() -> None:
    """Forget every recorded graph and pool, and which skip reasons have warned (they warn again)."""
    _TREES.clear()
    _WARNED.clear()
