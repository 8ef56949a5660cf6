"""KernelPlan: everything a kernel backend needs about one fused group, precomputed.

See docs/codegen.md for the contract. Built from a scheduler FusedGroup:

- each node's loop variables in kernel symbols (``xindex``/``rindex``) and whether it runs inside the reduction loop
  (``in_loop``);
- loop sections: consecutive in-loop nodes share one loop over ``rindex``; a node that reads a reduction result of this
  kernel, or an out-of-loop node, starts after the loop it depends on. With ``persistent`` (the whole reduction fits in
  one block) there is a single section and no loop;
- which buffers must be stored (read after the kernel, graph outputs, or read in a later loop section of a looped
  reduction) and which are removed (live only in registers)."""
from __future__ import annotations

import dataclasses

from coil.ir.handlers import DependencyRecorder
from coil.ir.nodes import ComputedBuffer
from coil.ir.symbols import RINDEX, XINDEX, as_size, current_shape_env, is_size_symbol, is_static
from coil.ir.virtualized import set_ops_handler
from coil.schedule.indexing import kernel_deps, kernel_index

def layout_key(layout) -> tuple:
    """What two buffers must share for one to take the other's memory: sizes, strides, offset, dtype, device."""
    return (tuple(map(as_size, layout.size)), tuple(map(as_size, layout.stride)), layout.offset, layout.dtype,
            str(layout.device))


#: Reductions up to this many elements run as one block per output ("persistent").
PERSISTENT_RNUMEL = 4096


@dataclasses.dataclass
class PlannedNode:
    buffer: ComputedBuffer
    index: list
    rindex: list
    in_loop: bool
    loop_id: int

    @property
    def name(self) -> str:
        return self.buffer.get_name()

    def run(self, handler) -> None:
        """Run this node's body on ``handler`` (indices already in kernel symbols)."""
        with set_ops_handler(handler):
            self.buffer.store_body(self.index, self.rindex)


class KernelPlan:
    """One kernel's plan (see module docstring)."""

    def __init__(self, group, graph, live_after: set, persistent_limit: int = PERSISTENT_RNUMEL,
                 tiled: bool = False, persistent: bool = False, dead_inputs: dict | None = None):
        # ints; sympy expressions in the ShapeEnv's symbols when sizes are dynamic
        self.numel, self.rnumel = as_size(group.numel), as_size(group.rnumel)
        #: a 2-D tiled pointwise kernel over (numel, rnumel) (codegen/tiling.py): one
        #: section like a persistent reduction, each program one [XBLOCK, RBLOCK] tile
        self.tiled, self.graph, self.group, self.live_after = tiled, graph, group, live_after
        # a symbolic row length loops (``persistent``: a twin whose RBLOCK the launcher sets per size bucket)
        self.persistent = persistent or tiled or (is_static(self.rnumel) and self.rnumel <= persistent_limit)
        self.nodes: list[PlannedNode] = []
        own = {n.get_name() for n in group.nodes}
        reduction_section, produced_in = {}, {}
        section, section_has_loop = 0, False
        cross_section: set[str] = set()
        for buf in group.nodes:
            index, rindex, in_loop = kernel_index(buf, self.numel, self.rnumel)
            deps = kernel_deps(buf, self.numel, self.rnumel)
            reads_own = [n for n, _ in deps.loads if n in own]
            if self.rnumel != 1 and not self.persistent:
                # an in-loop node reading a reduction of this section, or an out-of-loop
                # node after a loop, starts the next section
                if (in_loop and any(reduction_section.get(n) == section for n in reads_own)
                        or not in_loop and section_has_loop):
                    section += 1
                section_has_loop = in_loop
                for n in reads_own:
                    producer = self._node(n)
                    if (produced_in[n] != section and producer.in_loop and not producer.buffer.is_reduction()):
                        cross_section.add(n)  # in-loop value re-read by a later loop
            self.nodes.append(PlannedNode(buf, index, rindex, in_loop, section))
            produced_in[buf.get_name()] = section
            if buf.is_reduction():
                reduction_section[buf.get_name()] = section
        self.section_count = section + 1
        self.input_names = list(dict.fromkeys(
            n for pn in self.nodes for n, _ in kernel_deps(pn.buffer, self.numel, self.rnumel).loads
            if n not in own))
        self.output_names = [pn.name for pn in self.nodes if pn.name in live_after or pn.name in cross_section]
        self.removed_names = [pn.name for pn in self.nodes if pn.name not in self.output_names]
        #: {output: input}: an output stored over an input's memory (the caller's ``dead_inputs``, {name: None, or
        #: the only output that may take it}: buffers of this graph's own kernels or non-aliasing extern ops that no
        #: later step reads; a graph input for its new value). Backends address both through the input's pointer;
        #: the wrapper binds the output's name to the input's tensor
        self.dead_inputs, self.inplace = dead_inputs, self._inplace_pairs(dead_inputs) if dead_inputs else {}

    def _inplace_pairs(self, dead: dict) -> dict:
        """Pairs whose element-by-element overwrite is safe: every load of the input, in this kernel, is at the
        index the output is stored at (so each element is read by the program that writes it, before it writes
        it), no node after the storing one loads the input, both buffers have one layout, and the output is the
        one ``dead`` names for the input, if any."""
        loads: dict = {}   # input -> (its load indices, position of the last node loading it)
        for pos, pn in enumerate(self.nodes):
            for n, e in kernel_deps(pn.buffer, self.numel, self.rnumel).loads:
                if n in dead:
                    loads[n] = (loads.get(n, (set(), 0))[0] | {e}, pos)
        pairs: dict = {}
        for pos, pn in enumerate(self.nodes):
            stores = kernel_deps(pn.buffer, self.numel, self.rnumel).stores
            if type(pn.buffer) is not ComputedBuffer or pn.name not in self.output_names or len(stores) != 1:
                continue
            lay = layout_key(pn.buffer.layout)
            for n, (idx, last) in loads.items():
                if n not in pairs.values() and last <= pos and idx == {stores[0][1]} and \
                        layout_key(self.buffer(n).layout) == lay and dead[n] in (None, pn.name):
                    pairs[pn.name] = n
                    break
        return pairs

    @property
    def arg_output_names(self) -> list:
        """The outputs that are kernel arguments (those stored over an input are not)."""
        return [n for n in self.output_names if n not in self.inplace]

    def replan(self, persistent_limit: int) -> None:
        """Plan the same group again, in place, with another persistent-reduction limit (a backend that finds,
        while generating, that a persistent tile would be too large). In place because the wrapper reads this
        object's output/input names (a looped plan may store extra cross-loop buffers)."""
        self.__init__(self.group, self.graph, self.live_after, persistent_limit, self.tiled,
                      dead_inputs=self.dead_inputs)

    @property
    def symbolic(self) -> bool:
        """Whether this kernel's sizes or indices hold size symbols (dynamic shapes)."""
        return bool(self.size_symbols())

    def size_symbols(self) -> list:
        """The ShapeEnv symbols this kernel needs at run time (numel, rnumel, index expressions, sizes of indirect-index
        bounds), sorted by name: backends take them as kernel arguments, the wrapper passes their values."""
        if getattr(self, "_size_symbols", None) is None and current_shape_env() is None:
            self._size_symbols = []  # a static graph (no ShapeEnv): nothing to look for
        if getattr(self, "_size_symbols", None) is None:
            syms = set().union(*(getattr(e, "free_symbols", set()) for e in (self.numel, self.rnumel)))
            for pn in self.nodes:
                rec = DependencyRecorder.record(pn.buffer, pn.index, pn.rindex)
                for _, e in list(rec.loads) + list(rec.stores):
                    syms |= getattr(e, "free_symbols", set())
                syms |= rec.size_symbols
            self._size_symbols = sorted((s for s in syms if is_size_symbol(s) and s not in (XINDEX, RINDEX)),
                                        key=lambda s: s.name)
        return self._size_symbols

    def _node(self, name) -> PlannedNode:
        return next(p for p in self.nodes if p.name == name)

    def buffer(self, name: str):
        return self.graph.name_to_buffer[name]

    def describe(self) -> str:
        kind = "pointwise" if self.rnumel == 1 else ("persistent reduction" if self.persistent else "looped reduction")
        return (f"{kind} numel={self.numel} rnumel={self.rnumel} nodes="
                f"{[p.name for p in self.nodes]} stores={self.output_names} removed={self.removed_names}"
                + (f" over_inputs={self.inplace}" if self.inplace else ""))
