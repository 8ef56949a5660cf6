"""The compilers the benchmarks compare, by name.

A :class:`Compiler` turns a callable (an ``nn.Module`` or a function) into a compiled one
and counts what happened on the way, through a :class:`StatsProbe`:

=================  =================  ===========================================
name               capture            backend
=================  =================  ===========================================
``eager``          none               none (the reference; nothing compiled)
``coil``           coil               coil (the whole pipeline)
``inductor``       torch.compile      inductor (PyTorch's own stack)
``coil+inductor``  coil               torch's Inductor
``torch+coil``     torch.compile      coil's backend
``aot_eager``      coil               coil's AOT autograd, FX-interpreted halves
``coil+eager``     coil               none (capture only)
=================  =================  ===========================================

Counting. ``graphs`` is the number of graphs handed to a backend (each backend call is
counted by a wrapper, so it means the same thing for both captures; for ``inductor`` it
is Dynamo's ``unique_graphs`` counter because the backend is passed by name). Graph
breaks come from the capture layer: ``torch._dynamo.utils.counters["graph_break"]`` for
torch's capture and ``coil.capture.stats["graph_breaks"]`` (when the capture layer provides it) for
coil's; when a capture layer offers no count the value is ``None`` and is printed as
"—", never as a number.

A compiler may also be given as ``"package.module:attr"`` naming a :class:`Compiler`
(tests use this to plug in deliberately wrong compilers).
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Optional


@dataclasses.dataclass
class Counts:
    """Counts read from a probe; ``None`` = not available from this capture layer."""

    graphs: Optional[int] = None
    graph_breaks: Optional[int] = None


class StatsProbe:
    """Counts graphs and graph breaks since :meth:`start`."""

    def __init__(self, capture: str):
        self.capture = capture
        self.backend_calls = 0
        self._base: dict[str, Any] = {}
        self.count_backend_calls = True

    def counting(self, backend: Callable) -> Callable:
        """Wrap ``backend(gm, example_inputs)`` so each call is counted."""

        def counted(gm, example_inputs):
            self.backend_calls += 1
            return backend(gm, example_inputs)

        counted.__name__ = getattr(backend, "__name__", "backend")
        return counted

    def _raw(self) -> dict[str, Optional[int]]:
        if self.capture == "torch":
            from torch._dynamo.utils import counters  # bench may import dynamo (to compare)

            return {"graphs": int(counters["stats"]["unique_graphs"]),
                    "graph_breaks": int(sum(counters["graph_break"].values()))}
        if self.capture == "coil":
            return {"graphs": None, "graph_breaks": _coil_graph_breaks()}
        return {"graphs": 0, "graph_breaks": 0}

    def start(self) -> None:
        self.backend_calls = 0
        self._base = self._raw()

    def read(self) -> Counts:
        now = self._raw()

        def delta(key):
            if now[key] is None or self._base.get(key) is None:
                return None
            return now[key] - self._base[key]

        graphs = self.backend_calls if self.count_backend_calls else delta("graphs")
        if self.capture == "none":
            graphs = 0
        return Counts(graphs=graphs, graph_breaks=delta("graph_breaks"))


def _coil_graph_breaks() -> Optional[int]:
    """Graph breaks counted by coil's capture layer, if it exposes a counter."""
    try:
        from coil import capture
    except Exception:
        return None
    counters = getattr(capture, "stats", None)
    if not isinstance(counters, dict):
        counters = getattr(capture, "counters", None)
    if counters is None:
        return None
    for key in ("graph_breaks", "graph_break"):
        try:
            value = counters[key]
        except (KeyError, TypeError):
            value = getattr(counters, key, None)
        if value is None:
            continue
        if isinstance(value, dict):
            return int(sum(value.values()))
        return int(value)
    return None


@dataclasses.dataclass
class Compiler:
    """A named way to compile. ``compile(fn, probe) -> compiled`` (``fn`` is a module or a
    function); ``reset()`` drops in-memory compile caches (disk caches are kept)."""

    name: str
    capture: str  # "none" | "coil" | "torch"
    description: str
    compile_with: Callable[[Any, StatsProbe], Any]
    #: whether its graphs run through coil's backend (rows then count coil's codegen
    #: fallbacks, ``coil.exc.fallback_counts``; None for other compilers)
    coil_kernels: bool = False

    def compile(self, fn: Any) -> tuple[Any, StatsProbe]:
        probe = StatsProbe(self.capture)
        probe.start()
        return self.compile_with(fn, probe), probe

    def reset(self) -> None:
        reset_all()


def reset_all() -> None:
    """Drop coil's and torch.compile's in-memory caches (compiled frames, guards)."""
    try:
        import coil

        coil.reset()
    except Exception:
        pass
    try:
        import torch._dynamo

        torch._dynamo.reset()
    except Exception:
        pass


def _coil_backend(name: str) -> Callable:
    from coil.backends import lookup_backend

    return lookup_backend(name)


def _compile_eager(fn, probe):
    return fn


def _compile_coil(backend_name: str, **options):
    """``compile_with`` for coil's capture with backend ``backend_name``; ``options``:
    coil.config options for the compile (benchmarks/bench_variants.py's A/B rows)."""
    def compile_with(fn, probe):
        import coil

        return coil.compile(fn, backend=probe.counting(_coil_backend(backend_name)),
                            options=options or None)

    return compile_with


def _compile_torch_inductor(fn, probe):
    import torch

    probe.count_backend_calls = False
    return torch.compile(fn)


def _compile_torch_eager(fn, probe):
    import torch

    return torch.compile(fn, backend=probe.counting(lambda gm, example_inputs: gm.forward))


def _compile_torch_coil(fn, probe):
    import torch

    return torch.compile(fn, backend=probe.counting(_coil_backend("coil")))


COMPILERS: dict[str, Compiler] = {c.name: c for c in [
    Compiler("eager", "none", "eager PyTorch (the reference)", _compile_eager),
    Compiler("coil", "coil", "coil capture + coil backend (the whole pipeline)",
             _compile_coil("coil"), coil_kernels=True),
    Compiler("inductor", "torch", "torch.compile (Dynamo + Inductor)", _compile_torch_inductor),
    Compiler("coil+inductor", "coil", "coil capture + torch's Inductor backend",
             _compile_coil("inductor")),
    Compiler("torch+eager", "torch", "torch.compile's capture, graphs run as captured",
             _compile_torch_eager),
    Compiler("torch+coil", "torch", "torch.compile's capture + coil's backend",
             _compile_torch_coil, coil_kernels=True),
    Compiler("aot_eager", "coil", "coil capture + coil AOT autograd, FX-interpreted",
             _compile_coil("aot_eager")),
    Compiler("coil+eager", "coil", "coil capture only (graphs run as captured)",
             _compile_coil("eager")),
]}

#: What ``coil bench`` runs unless ``--compiler`` says otherwise.
BENCH_DEFAULT = ["eager", "coil", "inductor", "coil+inductor", "torch+coil"]


def resolve_compiler(name: str) -> Compiler:
    """A registered compiler by name, or ``"pkg.mod:attr"`` naming a :class:`Compiler`.

    Raises ValueError listing the valid names."""
    if name in COMPILERS:
        return COMPILERS[name]
    if ":" in name:
        module, attr = name.split(":", 1)
        obj = getattr(importlib.import_module(module), attr)
        if not isinstance(obj, Compiler):
            raise ValueError(f"{name} is not a coil.bench.compilers.Compiler")
        return obj
    raise ValueError(f"unknown compiler {name!r}; valid: {', '.join(COMPILERS)} "
                     "(or 'package.module:attr' naming a Compiler)")
