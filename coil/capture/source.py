"""Sources: where a traced value came from, as a Python expression.

Every :class:`~coil.capture.variables.base.VariableTracker` built from a real value carries a ``Source``. A source
prints as a Python expression over the frame's arguments (by name), ``___G`` (the function's globals) and ``___f`` (the
function object itself, for closure cells), so the same text serves three purposes:

- guards: ``type(x) is ___Tensor and x.dtype is ___c3 ...`` (see :mod:`.guards`);
- graph inputs: the generated entry fetches each lifted input by evaluating it;
- reconstruction: the entry rebuilds output values that were only read.

Sources into ``nn.Module`` internals (``_modules``, ``_parameters``, ``_buffers``)
print as dict lookups, which is much cheaper than ``Module.__getattr__``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Source:
    """Base class: ``expr()`` is the Python expression text for the value: by default the class's ``template``
    formatted with its fields (a field that is a source formats as its expression)."""

    template = ""

    def expr(self) -> str:
        return self.template.format(**self.__dict__)

    def __str__(self) -> str:
        return self.expr()


@dataclass(frozen=True)
class LocalSource(Source):
    """A frame argument, by name (the guard and entry functions take them as parameters)."""
    name: str
    template = "{name}"


@dataclass(frozen=True)
class GlobalSource(Source):
    """``globals[name]``: ``___G`` is the root function's globals; inlined functions
    from other modules use a namespace-held dict (``gname``)."""
    name: str
    gname: str = "___G"
    template = "{gname}[{name!r}]"


@dataclass(frozen=True)
class BuiltinSource(Source):
    """A name of the builtins module."""
    name: str
    template = "___builtins.{name}"


@dataclass(frozen=True)
class ClosureSource(Source):
    """The content of the root function's ``index``-th closure cell."""
    index: int
    template = "___f.__closure__[{index}].cell_contents"


@dataclass(frozen=True)
class AttrSource(Source):
    """``base.attr`` (plain attribute access)."""
    base: Source
    attr: str
    template = "{base}.{attr}"


@dataclass(frozen=True)
class CallSource(Source):
    """``base()``: the referent of a ``weakref.ref``."""
    base: Source
    template = "{base}()"


@dataclass(frozen=True)
class TypeSource(Source):
    """``type(base)``."""
    base: Source
    template = "type({base})"


@dataclass(frozen=True)
class ModuleDictSource(Source):
    """``base.<dict_name>[key]`` for an nn.Module's ``_modules``/``_parameters``/``_buffers`` (or ``__dict__``)."""
    base: Source
    dict_name: str
    key: str
    template = "{base}.{dict_name}[{key!r}]"


@dataclass(frozen=True)
class GetItemSource(Source):
    """``base[key]`` with a constant key (int, str, ...)."""
    base: Source
    key: Any
    template = "{base}[{key!r}]"


@dataclass(frozen=True)
class DefaultsSource(Source):
    """A default argument value of a function reached through ``fn_source``."""
    fn_source: Source
    index: int
    kw: bool = False

    def expr(self) -> str:
        if self.kw:
            return f"{self.fn_source.expr()}.__kwdefaults__[{self.index!r}]"
        return f"{self.fn_source.expr()}.__defaults__[{self.index}]"


@dataclass(frozen=True)
class ConstSource(Source):
    """A value the generated code holds directly (namespace name ``name``; or an expression over such names, as a
    guarded dict lookup): closure cells of inlined functions guarded by identity."""
    name: str
    template = "{name}"


@dataclass(frozen=True)
class IterRestSource(Source):
    """``___iter_rest(base)``: the items a tuple or range iterator has left (see :func:`iter_rest`); ``reduce_at``:
    ``base.__reduce__()[1][i]`` instead (the inner iterator, or the count, of an ``enumerate``/``zip``)."""
    base: Source
    reduce_at: int = -1

    def expr(self) -> str:
        if self.reduce_at >= 0:
            return f"{self.base.expr()}.__reduce__()[1][{self.reduce_at}]"
        return f"___iter_rest({self.base.expr()})"


def iter_rest(it) -> tuple:
    """The items tuple or range iterator ``it`` has left, without advancing it."""
    r = it.__reduce__()
    return r[1][0][r[2]:] if len(r) > 2 else r[1][0]
