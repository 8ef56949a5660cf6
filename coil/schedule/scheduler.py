"""The scheduler: from IR buffers to an ordered list of fused kernels and extern calls.

Input: a lowered :class:`~coil.ir.graph.GraphLowering`. Output: ``self.steps``, a list of :class:`FusedGroup` (one
generated kernel each) and :class:`ExternStep` (an ATen call or a MultiOutput unpacking), in a valid execution order.
Fusion is greedy, best first by the memory traffic saved, under the rules of docs/scheduler.md ("Fusion"), launch-saving
horizontal fusion included; every decision is logged (event ``fusion``)."""
from __future__ import annotations

import bisect
import dataclasses
import functools
from collections import defaultdict
from typing import Optional

import torch

from coil import trace
from coil.config import config
from coil.ir.nodes import (Buffer, ComputedBuffer, InputBuffer, ScatterBuffer)
from coil.ir.symbols import as_size, hint, product
from coil.schedule.indexing import _deps_cache, kernel_deps, kernel_index


@dataclasses.dataclass
class ExternStep:
    """One ExternKernel (or MultiOutput unpacking) in execution order."""

    buffer: Buffer
    order: int

    @property
    def names(self):
        return [self.buffer.get_name()]

    def read_names(self):
        return self.buffer.get_read_names()


class FusedGroup:
    """ComputedBuffers generated as one kernel over (numel, rnumel)."""

    def __init__(self, nodes: list[ComputedBuffer], numel: int, rnumel: int, order: int):
        # ints, or sympy expressions with symbolic sizes (coil.ir.symbols.as_size)
        self.nodes, self.numel, self.rnumel, self.order = nodes, as_size(numel), as_size(rnumel), order
        self.names = [n.get_name() for n in nodes]     # (a group's nodes never change)

    def read_names(self):
        own = set(self.names)
        return list(dict.fromkeys(r for n in self.nodes for r in n.get_read_names() if r not in own))

    def __repr__(self):
        return f"FusedGroup({self.names}, numel={self.numel}, rnumel={self.rnumel})"


def buffer_bytes(buf: Buffer, memo: dict) -> int:
    """Bytes of ``buf``'s elements from its sizes' hints (0 without a hint: unbacked), cached in ``memo``."""
    if buf not in memo:  # (read again for every candidate pair of every fusion round)
        try:
            memo[buf] = hint(product(buf.get_size())) * buf.get_dtype().itemsize
        except Exception:
            memo[buf] = 0
    return memo[buf]


#: an index expression's text (the same few are printed in many refusal reasons: sympy's printer is slow)
_text = functools.lru_cache(maxsize=4096)(str)
#: iterations (x times r) up to which a kernel is launch-bound: two such groups of one size fed by one group fuse
#: whatever they read (Scheduler._tiny_siblings)
_TINY = 1 << 16


class Scheduler:
    """Build, fuse and order kernel groups (see module docstring)."""

    def __init__(self, graph):
        self.graph = graph
        _deps_cache.clear()  # the last graph's buffers (it kept every graph's IR alive)
        self.output_names = {o.name for o in graph.outputs if o.name is not None}
        self.steps, self.decisions = [], []
        self.groups: list = [FusedGroup([b], product(b.get_ranges()), product(b.get_reduction_ranges())
                                        if b.is_reduction() else 1, i) if isinstance(b, ComputedBuffer)
                             else ExternStep(b, i) for i, b in enumerate(graph.buffers)]
        self.order_of = {b.get_name(): i for i, b in enumerate(graph.buffers)}
        self._owner = None
        self._memo: dict = {}  # buffer -> bytes, group -> input-only pattern (a group's nodes never change)
        self.users: dict[str, set] = defaultdict(set)   # buffer -> reader buffer names
        for b in graph.buffers:
            for r in b.get_read_names():
                self.users[r].add(b.get_name())
        owner = self._owner_map()
        # group id -> ids of the groups that read what it writes, and the reverse (kept up to date by _merge)
        self._succ = {id(g): {id(og) for n in g.names for u in self.users.get(n, ())
                              if (og := owner.get(u)) is not None and og is not g} for g in self.groups}
        self._pred: dict[int, set] = {id(g): set() for g in self.groups}
        draws = [id(g) for g in self.groups if isinstance(g, ExternStep) and
                 torch.Tag.nondeterministic_seeded in getattr(getattr(g.buffer, "op", None), "tags", ())]
        for a, b in zip(draws, draws[1:]):   # eager's generator draws in program order (fallback_random)
            self._succ[a].add(b)
        for gid, ss in self._succ.items():
            for s in ss:
                self._pred[s].add(gid)
        self._byid = {id(g): g for g in self.groups}   # the groups alive, by id
        with trace.stage("schedule"):
            if config.fusion:
                self.fuse()
            self.steps = sorted(self.groups, key=lambda g: g.order)
        if trace.enabled():
            trace.log("schedule", stage="schedule", kernels=sum(isinstance(s, FusedGroup) for s in self.steps),
                      externs=sum(isinstance(s, ExternStep) for s in self.steps), groups=[s.names for s in self.steps])

    # ------------------------------------------------------------------ graph helpers
    def _owner_map(self) -> dict[str, object]:
        if self._owner is None:     # (updated by each merge)
            self._owner = {n: g for g in self.groups for n in g.names}
        return self._owner

    def _reaches(self, src, dst, skip_direct: bool) -> bool:
        """True if a path src -> ... -> dst exists through some other group. ``order`` is
        topological (:meth:`_reorder`): a path only visits groups ordered before ``dst``."""
        succ = self._successors
        stack = [g for g in succ(src) if g is not dst] if skip_direct else [src]
        seen = set()
        while stack:
            if id(g := stack.pop()) in seen or g.order > dst.order:
                continue
            seen.add(id(g))
            if g is dst:
                return True
            stack.extend(succ(g))
        return False

    def _successors(self, g):
        return [self._byid[s] for s in self._succ[id(g)]]

    # ------------------------------------------------------------------ fusion
    def fuse(self) -> None:
        """Fusion rounds until one fuses nothing (at most 32: a launch-fusion bucket
        halves per round, so 2**32 kernels; ordinary graphs stop after a few)."""
        for _ in range(32):
            if not self._fuse_round():
                break

    def _candidates(self) -> list[tuple[int, object, object, str]]:
        owner = self._owner_map()
        kernels = [g for g in self.groups if isinstance(g, FusedGroup)]
        seen, cands = set(), []

        def add(a, b, kind):
            if (key := (id(a), id(b))) not in seen:
                seen.add(key)
                cands.append((self._score(a, b), a, b, kind))
        readers: dict[str, list] = defaultdict(list)
        for g in kernels:
            for r in g.read_names():
                readers[r].append(g)
        for g in kernels:
            for n in g.names:
                for u in self.users.get(n, ()):
                    if isinstance(h := owner.get(u), FusedGroup) and h is not g:
                        add(g, h, "vertical")
        for gs in readers.values():
            for i in range(len(gs)):
                for j in range(i + 1, len(gs)):
                    add(*sorted((gs[i], gs[j]), key=lambda g: g.order), "horizontal")
        cands += [(1, a, b, "horizontal (launch)") for a, b in self._launch_candidates(kernels)
                  if (id(a), id(b)) not in seen]
        cands.sort(key=lambda c: (-c[0], c[1].order, c[2].order))
        return cands

    # ---------------------------------------------- launch-saving horizontal fusion
    def _input_only_pattern(self, g: FusedGroup) -> Optional[tuple]:
        """The access pattern of a pointwise group that reads only graph inputs (a parameter's autocast cast, a weight's
        channels-last copy) and is small enough for ``config.launch_fusion_max_numel``: ``(numel, (load index
        expressions, store index expressions))`` without buffer names, when all its nodes share one such pattern; else
        None. Such groups depend on nothing computed in the graph: they can run anywhere before their first reader."""
        if g not in self._memo:
            self._memo[g] = self._pattern_of(g)
        return self._memo[g]

    def _pattern_of(self, g: FusedGroup) -> Optional[tuple]:
        limit = config.launch_fusion_max_numel
        if g.rnumel != 1 or limit <= 0 or hint(g.numel) > limit:
            return None
        if any(r == "seeds" or not isinstance(self.graph.name_to_buffer.get(r), InputBuffer) for r in g.read_names()):
            return None
        pats = set()
        for n in g.nodes:
            if (deps := kernel_deps(n, g.numel, 1)) is None:
                return None
            pats.add((tuple(sorted(str(e) for _, e in deps.loads)), tuple(sorted(str(e) for _, e in deps.stores))))
        return (g.numel, pats.pop()) if len(pats) == 1 else None

    def _launch_candidates(self, kernels: list) -> list[tuple]:
        """Pairs of input-only groups with the same pattern (:meth:`_input_only_pattern`), consecutive in program order:
        fusing them saves a kernel launch (host time, which bounds small-batch inference and training steps) and no
        memory traffic; each round halves a bucket, so the rounds of :meth:`fuse` merge it into one."""
        buckets: dict[tuple, list] = defaultdict(list)
        for g in kernels:
            if (pat := self._input_only_pattern(g)) is not None:
                buckets[pat].append(g)
        out = []
        for gs in buckets.values():
            gs.sort(key=lambda g: g.order)
            out += [(gs[i], gs[i + 1]) for i in range(len(gs) - 1)]
        # tiny siblings: groups of one size fed by one group (the second stages of split reductions)
        for g in kernels if config.launch_fusion_max_numel > 0 else ():
            sibs = sorted((s for s in self._successors(g) if isinstance(s, FusedGroup) and self._tiny(s)),
                          key=lambda s: (s.numel, s.rnumel, s.order))
            out += [(a, b) for a, b in zip(sibs, sibs[1:]) if (a.numel, a.rnumel) == (b.numel, b.rnumel)]
        return out

    def _tiny_siblings(self, a: FusedGroup, b: FusedGroup) -> bool:
        return self._tiny(a) and self._tiny(b) and bool(self._pred[id(a)] & self._pred[id(b)])

    @staticmethod
    def _tiny(g: FusedGroup) -> bool:
        """Static sizes and at most ``_TINY`` iterations: such a kernel's time is its launch, whatever it reads."""
        sizes = (g.numel, g.rnumel)
        return all(isinstance(v, int) or getattr(v, "is_number", False) for v in sizes) and product(sizes) <= _TINY

    def _score(self, a: FusedGroup, b: FusedGroup) -> int:
        """Bytes of memory traffic saved by running a and b as one kernel."""
        names_a, names_b = set(a.names), set(b.names)
        saved, both = 0, names_a | names_b
        for n in a.nodes + b.nodes:
            name = n.get_name()
            readers = self.users.get(name, set())
            if (name in names_a and readers & names_b) or (name in names_b and readers & names_a):
                saved += buffer_bytes(n, self._memo)  # the read
                if readers <= both and name not in self.output_names:
                    saved += buffer_bytes(n, self._memo)  # the write
        shared = [self.graph.name_to_buffer.get(s) for s in set(a.read_names()) & set(b.read_names())]
        return saved + sum(buffer_bytes(buf, self._memo) for buf in shared if buf is not None) + 1

    def _fuse_round(self) -> bool:
        changed = False
        for score, a, b, kind in self._candidates():
            if id(a) not in self._byid or id(b) not in self._byid:
                continue
            reason = self._why_not(a, b)
            rec = {"decision": "refused" if reason else "fused", "kind": kind, "a": a.names, "b": b.names,
                   "bytes_saved": score - 1, **({"reason": reason} if reason else {})}
            self.decisions.append(rec)
            trace.log("fusion", stage="schedule", **rec)
            if reason is None:
                self._merge(a, b)
                changed = True
        return changed

    def combined_group(self, a: FusedGroup, b: FusedGroup) -> Optional[tuple[int, int]]:
        if a.rnumel != 1 and b.rnumel != 1:
            return (a.numel, a.rnumel) if (a.numel, a.rnumel) == (b.numel, b.rnumel) else None
        if a.rnumel == 1 and b.rnumel == 1:
            return (a.numel, 1) if a.numel == b.numel else None
        red, pw = (a, b) if a.rnumel != 1 else (b, a)
        return (red.numel, red.rnumel) if pw.numel in (red.numel, as_size(red.numel * red.rnumel)) else None

    def _why_not(self, a: FusedGroup, b: FusedGroup) -> Optional[str]:
        if any(isinstance(n, ScatterBuffer) for n in a.nodes + b.nodes):
            return "a scatter writes into its target's storage and runs as its own kernel"
        if a.nodes[0].get_device().type != b.nodes[0].get_device().type:
            return "they run on different kinds of device (a CPU group in a GPU graph)"
        if (grp := self.combined_group(a, b)) is None:
            return f"iteration spaces differ ({a.numel}x{a.rnumel} vs {b.numel}x{b.rnumel})"
        numel, rnumel = grp
        for n in a.nodes + b.nodes:
            if kernel_index(n, numel, rnumel) is None:
                return f"{n.get_name()} cannot be split into {numel}x{rnumel}"
        first, second = sorted((a, b), key=lambda g: g.order)
        if self._reaches(first, second, skip_direct=True):   # (none from second to first)
            return "a path between them leaves the pair (would create a cycle)"
        crossing = False  # element-wise agreement of every cross read
        for prod_g, cons_g in ((a, b), (b, a)):
            produced = {n.get_name(): n for n in prod_g.nodes}
            for c in cons_g.nodes:
                cdeps = kernel_deps(c, numel, rnumel)
                for name in [n for n in dict.fromkeys(c.get_read_names()) if n in produced]:  # (read order)
                    crossing, p = True, produced[name]
                    pdeps = kernel_deps(p, numel, rnumel)
                    store = pdeps.stores[0][1]
                    if (p_in_loop := pdeps.in_loop and not p.is_reduction()) and not cdeps.in_loop and rnumel != 1:
                        return f"{c.get_name()} reads {name} once per output but it is computed in the loop"
                    for read, e in cdeps.loads:
                        if read == name and e != store:
                            return f"{c.get_name()} reads {name}[{_text(e)}] but it is written at [{_text(store)}]"
        if not crossing and not self._shares_an_element(a, b, numel, rnumel) and not self._tiny_siblings(a, b):
            if (pa := self._input_only_pattern(a)) is None or pa != self._input_only_pattern(b):
                return "their shared reads are of different elements per iteration (nothing reused)"
        return None

    @staticmethod
    def _shares_an_element(a: FusedGroup, b: FusedGroup, numel: int, rnumel: int) -> bool:
        """Whether some buffer both groups read is read at the same kernel index by both (a horizontal fusion
        only saves traffic then: e.g. a gelu backward over ``(x, r)`` rows and a bias-gradient sum over
        columns of the same inputs load different elements per iteration, and fusing them forced one access
        pattern onto both: uncoalesced loads, 2-3x slower on an H200)."""
        def loads(g):
            return {load for n in g.nodes if (deps := kernel_deps(n, numel, rnumel)) is not None for load in deps.loads}
        return bool(loads(a) & loads(b))

    def _merge(self, a: FusedGroup, b: FusedGroup) -> None:
        numel, rnumel = self.combined_group(a, b)
        nodes = sorted(a.nodes + b.nodes, key=lambda n: self.order_of[n.get_name()])
        lo, hi = sorted((a.order, b.order))
        g = FusedGroup(nodes, numel, rnumel, lo)
        self._owner_map().update((n, g) for n in g.names)
        ia, ib, ig = id(a), id(b), id(g)
        self._succ[ig] = (self._succ.pop(ia) | self._succ.pop(ib)) - {ia, ib}
        self._pred[ig] = (self._pred.pop(ia) | self._pred.pop(ib)) - {ia, ib}
        for s in self._succ[ig]:
            self._pred[s] -= {ia, ib}
            self._pred[s].add(ig)
        for p in self._pred[ig]:
            self._succ[p] -= {ia, ib}
            self._succ[p].add(ig)
        del self._byid[ia], self._byid[ib]
        self._byid[ig] = g
        self._reorder(g, lo, hi)

    def _reorder(self, g: FusedGroup, lo: int, hi: int) -> None:
        """Order the groups topologically again after the groups ordered ``lo`` and ``hi`` became ``g`` (in ``lo``'s
        place): the producers of the ``hi`` one ordered after ``lo`` (``up``; none consumes the ``lo`` one: that would
        be a cycle) must now come before ``g``. Up to the last of them, the groups that do not depend on ``g`` move
        before it, in their order; nothing else moves. This is the order sorting all groups again gives (Kahn's
        algorithm, smallest order first), found without visiting them all; orders stay increasing, not contiguous."""
        groups, byid, order = self.groups, self._byid, (lambda x: x.order)
        del groups[bisect.bisect_left(groups, hi, key=order)]
        i = bisect.bisect_left(groups, lo, key=order)
        up, stack = set(), [id(g)]
        while stack:
            for p in self._pred[stack.pop()]:
                if p not in up and byid[p].order > lo:
                    up.add(p)
                    stack.append(p)
        if not up:
            groups[i] = g
            return
        last = max(byid[p].order for p in up)
        j = bisect.bisect_right(groups, last, key=order)
        down, stack = set(), [id(g)]
        while stack:
            for c in self._succ[stack.pop()]:
                if c not in down and lo < byid[c].order <= last:
                    down.add(c)
                    stack.append(c)
        between = groups[i + 1:j]
        out = [x for x in between if id(x) not in down] + [g] + [x for x in between if id(x) in down]
        for x, o in zip(out, [lo] + [x.order for x in between]):
            x.order = o
        groups[i:j] = out
