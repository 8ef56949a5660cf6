"""Progress bar, terminal tables, markdown and run metadata for the bench commands.

Missing values (``None``) print as "—": a result that was not measured never shows as
a number.
"""
from __future__ import annotations

import collections
import datetime
import os
import platform
import subprocess
import sys
import time
from typing import Any, Optional, Sequence, TextIO


class Progress:
    """A small progress bar on stderr: ``[#####-----] 5/10 1:23 label``.

    On a terminal it redraws one line; otherwise it prints one line per step (so logs
    stay readable). ``enabled=False`` silences it."""

    def __init__(self, total: int, enabled: bool = True, stream: Optional[TextIO] = None,
                 width: int = 24):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()

    def _line(self, label: str) -> str:
        filled = int(self.width * self.done / self.total)
        el = int(time.perf_counter() - self.t0)
        return (f"[{'#' * filled}{'-' * (self.width - filled)}] {self.done}/{self.total} "
                f"{el // 60}:{el % 60:02d} {label}")

    def show(self, label: str) -> None:
        """Show ``label`` as the current step (does not advance)."""
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K" + self._line(label)[:150])
            self.stream.flush()

    def advance(self, label: str, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        if not self.enabled:
            return
        if self.tty:
            self.show(label)
        else:
            self.stream.write(self._line(label) + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def fmt(value: Any, spec: str = "") -> str:
    """Format a cell; None → "—"."""
    if value is None:
        return "—"
    if isinstance(value, float) and spec:
        return format(value, spec)
    return str(value)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain aligned text table."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def render_markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table."""
    def esc(c: str) -> str:
        return c.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def machine_info() -> dict:
    """Where the numbers come from: date (UTC), CPU, GPU, versions, git commit."""
    import torch

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "command": " ".join(["coil"] + sys.argv[1:]) if sys.argv else "",
        "commit": _git_commit(),
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    for pkg in ("transformers", "timm", "triton"):
        try:
            info[pkg] = __import__(pkg).__version__
        except Exception:
            info[pkg] = None
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> Optional[str]:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:
        return None


def meta_markdown(meta: dict) -> str:
    """One paragraph saying when, where and how numbers were made."""
    m = collections.defaultdict(lambda: "?", meta)
    gpu = f", GPU {m['gpu']}" if meta.get("gpu") else ""
    return (f"*{m['date']}; {m['cpu']} ({m['cpu_count']} cores){gpu}; "
            f"Python {m['python']}, torch {m['torch']}, transformers "
            f"{m['transformers']}, triton {m['triton']}; coil commit "
            f"{m['commit']}; load average at start {m['load_average']}; command: "
            f"`{m['command']}`*")
