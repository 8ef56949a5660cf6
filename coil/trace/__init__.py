"""The structured compile log (``COIL_TRACE=<dir>``) and its HTML report.

Every stage writes what it took in, produced and decided through :func:`log` and :func:`artifact`, and times itself with
``with trace.stage("aot"): ...``. With the log off each call is one attribute test and a return; on, each process
appends JSON objects, one a line, to ``<dir>/coil_trace_<pid>.jsonl``. docs/compile_log.md gives the rules, the record
format and the events; ``coil report <dir>`` (:mod:`coil.trace.report`) renders the log as HTML."""
from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import threading
import time
from typing import Any, Callable, Iterator, Optional

__all__ = ["enabled", "log", "artifact", "stage", "compile_context", "current_compile_id", "next_frame_id", "set_dir",
           "trace_dir", "add_stage_listener", "remove_stage_listener"]


def _dir_of(value: Optional[str]) -> Optional[str]:
    """``COIL_TRACE``'s directory: unset, empty or ``0`` is off; ``1`` / ``true`` / ``on`` (a flag, not a
    directory name) is ``./coil_trace``."""
    if not value or value.lower() in ("0", "false", "off", "no"):
        return None
    return "coil_trace" if value.lower() in ("1", "true", "on", "yes") else value


class _State:
    def __init__(self) -> None:
        self.dir: Optional[str] = _dir_of(os.environ.get("COIL_TRACE"))
        self.file = None
        self.lock = threading.Lock()
        self.compile_ids: list[str] = []   # every active compile id, all threads
        self.local = threading.local()      # .compile_ids, .stage_stack per thread
        self.listeners: list[Callable[[str, str, Optional[float]], None]] = []
        self.frame_counter = itertools.count()


_state = _State()
atexit.register(lambda: set_dir(None))  # (the log's file is closed at exit: no ResourceWarning; FINDINGS_75 6)


def enabled() -> bool:
    """True when the compile log is being written."""
    return _state.dir is not None


def trace_dir() -> Optional[str]:
    """The directory the log is written to, or None."""
    return _state.dir


def set_dir(path: Optional[str]) -> None:
    """Start (or with ``None`` stop) writing the log to ``path`` from this process."""
    with _state.lock:
        if _state.file is not None:
            _state.file.close()
            _state.file = None
        _state.dir = path


def next_frame_id() -> int:
    """A fresh frame number for :func:`compile_context` (0, 1, 2, ... per process)."""
    return next(_state.frame_counter)


def current_compile_id() -> Optional[str]:
    """The innermost active compile id (``"frame/attempt"``) or None."""
    if own := getattr(_state.local, "compile_ids", None):
        return own[-1]
    ids = _state.compile_ids  # a helper thread (e.g. a parallel kernel build) with no
    return ids[-1] if ids else None  # compile of its own works for the latest one


@contextlib.contextmanager
def compile_context(frame_id: int, attempt: int) -> Iterator[str]:
    """Tag every event inside the block with compile id ``f"{frame_id}/{attempt}"``.

    Compile contexts and stages are per thread; a thread that has no compile context of its own (a worker building
    kernels for the compile in progress) logs under the most recently entered compile id of any thread."""
    cid, own = f"{frame_id}/{attempt}", _thread_list("compile_ids")
    own.append(cid)
    with _state.lock:
        _state.compile_ids.append(cid)
    try:
        yield cid
    finally:
        own.pop()
        with _state.lock:
            _state.compile_ids.remove(cid)


def _thread_list(name: str) -> list:
    return vars(_state.local).setdefault(name, [])  # this thread's own


def _current_stage() -> Optional[str]:
    stack = getattr(_state.local, "stage_stack", None)
    return stack[-1] if stack else None


def _write(record: dict) -> None:
    line = json.dumps(record, default=str)
    with _state.lock:
        if _state.dir is None:
            return
        if _state.file is None:
            os.makedirs(_state.dir, exist_ok=True)
            _state.file = open(os.path.join(_state.dir, f"coil_trace_{os.getpid()}.jsonl"), "a", buffering=1)
        _state.file.write(line + "\n")


def log(event: str, *, stage: Optional[str] = None, duration_ms: Optional[float] = None, **payload: Any) -> None:
    """Append one event. ``payload`` must be JSON-serialisable (else ``str()`` is used)."""
    if _state.dir is None:
        return
    _write({"ts": time.time(), "pid": os.getpid(), "compile_id": current_compile_id(), "event": event,
            "stage": stage if stage is not None else _current_stage(), "duration_ms": duration_ms, **payload})


def artifact(name: str, text: Any, kind: str = "text", **payload: Any) -> None:
    """Append a text artifact (source, graph code, guards, kernel...).

    ``text`` may be a zero-argument callable, called only when the log is on, so that
    costly formatting is skipped when it is off."""
    if _state.dir is None:
        return
    log("artifact", name=name, kind=kind, text=str(text() if callable(text) else text), **payload)


def add_stage_listener(fn: Callable[[str, str, Optional[float]], None]) -> None:
    """Call ``fn(stage, "start"|"end", duration_ms)`` around every stage (progress bars)."""
    _state.listeners.append(fn)


def remove_stage_listener(fn: Callable) -> None:
    if fn in _state.listeners:
        _state.listeners.remove(fn)


@contextlib.contextmanager
def stage(name: str, **payload: Any) -> Iterator[None]:
    """Time a compile stage; logs event ``stage`` with ``duration_ms`` (wall clock, ms)
    and ``parent`` (the enclosing stage's name, or None for a top-level stage, so the
    report can add up top-level stages without counting nested ones twice)."""
    if _state.dir is None and not _state.listeners:
        yield
        return
    for fn in _state.listeners:
        fn(name, "start", None)
    parent, stack = _current_stage(), _thread_list("stage_stack")
    stack.append(name)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        ms = (time.perf_counter() - t0) * 1e3
        stack.pop()
        log("stage", stage=name, duration_ms=ms, parent=parent, **payload)
        for fn in _state.listeners:
            fn(name, "end", ms)
