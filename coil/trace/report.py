"""``coil report <dir> [-o out]``: render a compile log as a static HTML site.

The input is every ``*.jsonl`` file under ``<dir>`` (docs/compile_log.md gives the schema and the pages:
``index.html``, one ``compile_<pid>_<frame>_<attempt>.html`` per compile id, ``no_compile_id.html``).
Events are rendered generically: a group of events with one name is a table whose columns are the union
of their payload keys, and values get a readable form by shape (code, user stacks, lists, nested
tables), so a new stage's events appear without any change here; lines that are not JSON are counted.
Entry points: :func:`write_report` and :func:`main` (``python -m coil.trace.report`` works too)."""
from __future__ import annotations

import argparse
import difflib
import glob
import html
import json
import os
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import jinja2

# Fields every record has; the rest is the event's payload.
COMMON_FIELDS = ("ts", "pid", "compile_id", "event", "stage", "duration_ms")
# Event groups shown first on a compile page, in this order.
FIRST_EVENTS = ("graph_break", "recompile", "guards", "codegen_fallback", "eager_fallback", "cudagraph_skip")
COUNTED_EVENTS = ("graph_break", "recompile", "codegen_fallback", "eager_fallback")  # Counted in the index's columns.
NO_COMPILE_ID_PAGE = "no_compile_id.html"
# Payload keys holding a stack: a list of frame dicts or of traceback-style strings.
STACK_KEYS = ("user_stack", "stack", "traceback")


# --------------------------------------------------------------------------- reading

@dataclass
class Compile:
    """Everything logged under one compile id of one process."""

    pid: int
    compile_id: str
    events: list = field(default_factory=list)      # non-stage, non-artifact records
    stages: list = field(default_factory=list)      # "stage" records
    artifacts: list = field(default_factory=list)   # "artifact" records

    @property
    def page(self) -> str:
        return "compile_%s_%s.html" % (self.pid, self.compile_id.replace("/", "_"))

    @property
    def sort_key(self) -> tuple:
        return (self.pid, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.compile_id.split("/")))

    def stage_totals(self) -> "OrderedDict[str, float]":
        """Milliseconds per stage name (nested stages are listed under their own name)."""
        totals: OrderedDict[str, float] = OrderedDict()
        for r in self.stages:
            name = r.get("stage") or "?"
            totals[name] = totals.get(name, 0.0) + float(r.get("duration_ms") or 0.0)
        return totals

    def stage_self_totals(self) -> "OrderedDict[str, float]":
        """Milliseconds per stage name *excluding* nested stages (self time): a record's duration minus its
        direct children's. These add up to :meth:`total_ms`, so they are the compile-time breakdown."""
        selfs = self.stage_totals()
        for r in self.stages:
            if parent := r.get("parent"):
                selfs[parent] = selfs.get(parent, 0.0) - float(r.get("duration_ms") or 0.0)
        return selfs

    def total_ms(self) -> float:
        """Wall time of the top-level stages (those with no ``parent``)."""
        return sum(float(r.get("duration_ms") or 0.0) for r in self.stages if not r.get("parent"))

    def count(self, event: str) -> int:
        return sum(1 for r in self.events if r.get("event") == event)

    def title(self) -> str:
        """A human name for the compile: the captured function, if any event names it."""
        for r in self.events + self.stages:
            for key in ("fn", "function", "co_name", "frame", "name"):
                if isinstance(v := r.get(key), str) and v and r.get("event") != "artifact":
                    loc = ""
                    if isinstance(r.get("filename"), str) and r.get("lineno") is not None:
                        loc = f" ({os.path.basename(r['filename'])}:{r['lineno']})"
                    return v + loc
        return ""


@dataclass
class Log:
    """A parsed compile log directory."""

    compiles: list           # list[Compile], sorted
    loose: list              # records with no compile id
    files: list              # the .jsonl files read
    bad_lines: int = 0

def read_log(log_dir: str) -> Log:
    """Parse every ``*.jsonl`` file under ``log_dir`` (recursively).

    Raises:
        FileNotFoundError: ``log_dir`` does not exist or holds no ``.jsonl`` file."""
    if not os.path.isdir(log_dir):
        raise FileNotFoundError(f"no such log directory: {log_dir!r} (run with COIL_TRACE=<dir> to write one)")
    if not (files := sorted(glob.glob(os.path.join(log_dir, "**", "*.jsonl"), recursive=True))):
        raise FileNotFoundError(f"no .jsonl compile log under {log_dir!r} (run with COIL_TRACE=<dir> to write one)")
    records, bad = [], 0
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    r = None
                if isinstance(r, dict) and "event" in r:
                    records.append(r)
                else:
                    bad += 1
    records.sort(key=lambda r: (r.get("ts") or 0.0))  # stable: file order within a tie
    by_id: dict = {}
    loose = []
    for r in records:
        if (cid := r.get("compile_id")) is None:
            loose.append(r)
            continue
        key = (r.get("pid") or 0, str(cid))
        c = by_id.get(key) or by_id.setdefault(key, Compile(pid=key[0], compile_id=key[1]))
        {"stage": c.stages, "artifact": c.artifacts}.get(r.get("event"), c.events).append(r)
    for c in by_id.values():  # stage events are written at their end: order by start
        c.stages.sort(key=lambda r: (r.get("ts") or 0.0) - (r.get("duration_ms") or 0.0) / 1e3)
    return Log(compiles=sorted(by_id.values(), key=lambda c: c.sort_key), loose=loose, files=files, bad_lines=bad)


# ------------------------------------------------------------------- highlighting

_LEXERS = {"python": "python", "py": "python", "triton": "python", "fx": "python", "cpp": "cpp", "c++": "cpp", "c": "c",
           "json": "json", "text": None, "bytecode": None, "diff": "diff"}


def highlight(text: str, kind: str) -> str:
    """HTML for ``text`` as code of ``kind`` (python, triton, cpp, json, diff, text).

    Uses pygments (classes styled by the report's stylesheet); unknown kinds and
    very large texts (> 2 MB) are escaped without colour."""
    if (lexer_name := _LEXERS.get(kind)) is None or len(text) > 2_000_000:
        return '<pre class="code">%s</pre>' % html.escape(text)
    from pygments import highlight as _hl
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_by_name
    formatter = HtmlFormatter(cssclass="code hl", linenos=False, nowrap=False)
    return _hl(text, get_lexer_by_name(lexer_name, stripnl=False), formatter)


# ---------------------------------------------------------------- value rendering

def _is_frame(v: Any) -> bool:
    return isinstance(v, dict) and "filename" in v and ("lineno" in v or "line" in v)


def render_stack(frames: list) -> str:
    """A user stack (list of ``{filename, lineno, name, line}``, innermost last)."""
    lines = []
    for fr in frames:
        where = "%s:%s" % (fr.get("filename"), fr.get("lineno", "?"))
        name = fr.get("name")
        head = f'<span class="loc">{html.escape(where)}</span>'
        if name:
            head += f' in <span class="fn">{html.escape(str(name))}</span>'
        text = fr.get("line") or fr.get("text") or ""
        lines.append(head + (f'\n    <span class="srcline">{html.escape(str(text).strip())}</span>' if text else ""))
    return '<pre class="stack">%s</pre>' % "\n".join(lines)


def render_value(v: Any, key: str = "") -> str:
    """HTML for one payload value, chosen by its shape (see module note)."""
    if v is None:
        return '<span class="none">—</span>'
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return "%.3f" % v if key.endswith("_ms") else html.escape(repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        if key in ("traceback", "code", "source", "guard_code") or "\n" in v:
            return highlight(v, "python" if key in ("code", "source", "guard_code") else "text")
        return html.escape(v)
    if isinstance(v, list):
        if not v:
            return '<span class="none">[]</span>'
        if all(_is_frame(x) for x in v):
            return render_stack(v)
        if all(isinstance(x, str) for x in v) and key in ("guards", "failed_guards"):
            return '<pre class="code">%s</pre>' % html.escape("\n".join(v))
        if all(isinstance(x, str) for x in v) and key in STACK_KEYS:  # traceback lines
            return '<pre class="stack">%s</pre>' % html.escape("\n".join(x.rstrip() for x in v))
        if len(v) <= 200 and all(isinstance(x, (str, int, float, bool)) for x in v) \
                and sum(len(str(x)) for x in v) < 120:
            return html.escape(", ".join(str(x) for x in v))
        items = "".join("<li>%s</li>" % render_value(x, key) for x in v[:1000])
        more = f"<li>… {len(v) - 1000} more</li>" if len(v) > 1000 else ""
        return f"<ul>{items}{more}</ul>"
    if isinstance(v, dict):
        if _is_frame(v):
            return render_stack([v])
        rows = "".join('<tr><th>%s</th><td>%s</td></tr>' % (html.escape(str(k)), render_value(x, str(k)))
                       for k, x in v.items())
        return f'<table class="kv">{rows}</table>'
    return html.escape(json.dumps(v, default=str))


def payload(record: dict) -> dict:
    """The event-specific fields of a record (everything but :data:`COMMON_FIELDS`)."""
    return {k: v for k, v in record.items() if k not in COMMON_FIELDS}


def group_events(events: Iterable[dict]) -> "OrderedDict[str, list]":
    """Events grouped by name: :data:`FIRST_EVENTS` first, then by first appearance."""
    groups: OrderedDict[str, list] = OrderedDict((name, []) for name in FIRST_EVENTS)
    for r in events:
        groups.setdefault(str(r.get("event")), []).append(r)
    return OrderedDict((k, v) for k, v in groups.items() if v)


def event_table(records: list) -> dict:
    """Columns (union of payload keys, first-seen order) and rendered rows of a group."""
    cols = list(dict.fromkeys(k for r in records for k in payload(r)))
    show_stage = any(r.get("stage") for r in records)
    show_ms = any(r.get("duration_ms") is not None for r in records)
    head = (["stage"] if show_stage else []) + (["ms"] if show_ms else []) + cols
    rows = [([html.escape(str(r.get("stage") or ""))] if show_stage else [])
            + ([render_value(r.get("duration_ms"), "duration_ms")] if show_ms else [])
            + [render_value(p[c], c) if c in p else "" for c in cols] for r, p in ((r, payload(r)) for r in records)]
    return {"head": head, "rows": rows}


def _env() -> jinja2.Environment:
    """The page templates: ``templates/*.jinja`` beside this module."""
    loader = jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates"))
    return jinja2.Environment(loader=loader, autoescape=True, undefined=jinja2.StrictUndefined)


def _breakdown_rows(totals: dict, selfs: dict, top_total: float) -> list:
    denom = top_total if top_total > 0 else (sum(selfs.values()) or 1.0)
    return [{"name": k, "ms": v, "self_ms": max(selfs.get(k, 0.0), 0.0),
             "pct": 100.0 * max(selfs.get(k, 0.0), 0.0) / denom} for k, v in totals.items()]


def _artifact_views(records: list) -> list:
    """One view per distinct artifact; a repeat (same name, kind, text, e.g. by two layers) shows once, counted."""
    views, seen = [], {}
    for a in records:
        text = str(a.get("text", ""))
        if (key := (a.get("name"), a.get("kind"), text)) in seen:
            seen[key]["times"] += 1
            continue
        extra = {k: v for k, v in payload(a).items() if k not in ("name", "kind", "text")}
        views.append({"name": str(a.get("name", "?")), "kind": str(a.get("kind", "text")), "times": 1,
                      "stage": a.get("stage"), "lines": len(text.splitlines()),
                      "html": highlight(text, str(a.get("kind", "text"))),
                      "extra": render_value(extra) if extra else "", "open": len(records) <= 3 and len(text) < 20_000})
        seen[key] = views[-1]
    return views


def previous_attempts(compiles: list) -> dict:
    """``(pid, "f/a") -> Compile`` of ``"f/(a-1)"`` (the same frame's previous attempt)."""
    by_id, out = {(c.pid, c.compile_id): c for c in compiles}, {}
    for c in compiles:
        frame, _, attempt = c.compile_id.rpartition("/")
        if attempt.isdigit() and int(attempt) > 0 and (prev := by_id.get((c.pid, f"{frame}/{int(attempt) - 1}"))):
            out[(c.pid, c.compile_id)] = prev
    return out


def artifact_diffs(prev: Compile, cur: Compile) -> list:
    """Unified diffs of the artifacts both compiles logged under one name whose text
    differs (first artifact of each name), as ``[{"name", "html"}]``."""
    def first_by_name(c: Compile) -> dict:   # (reversed: the first of each name is written last)
        return {str(a.get("name")): str(a.get("text", "")) for a in reversed(c.artifacts)}
    old, new = first_by_name(prev), first_by_name(cur)
    diffs = []
    for name, text in new.items():
        if name in old and old[name] != text:
            lines = difflib.unified_diff(old[name].splitlines(), text.splitlines(), f"{prev.compile_id}/{name}",
                                         f"{cur.compile_id}/{name}", lineterm="", n=2)
            diffs.append({"name": name, "html": highlight("\n".join(lines), "diff")})
    return diffs


def _group_tables(events: list) -> list:
    return [(name, event_table(recs)) for name, recs in group_events(events).items()]


def write_report(log_dir: str, out_dir: Optional[str] = None) -> str:
    """Render the compile log in ``log_dir`` as HTML in ``out_dir``.

    Args:
        log_dir: a directory written by ``COIL_TRACE=<dir>`` (``*.jsonl`` files).
        out_dir: where to write; default ``<log_dir>/report``. Created if missing;
            existing pages of the same names are overwritten.

    Returns:
        The path of ``index.html``.

    Raises:
        FileNotFoundError: ``log_dir`` is missing or has no ``.jsonl`` file."""
    log = read_log(log_dir)
    out_dir = out_dir or os.path.join(log_dir, "report")
    os.makedirs(out_dir, exist_ok=True)
    from pygments.formatters import HtmlFormatter
    env = _env()
    common = {"pygments_css": HtmlFormatter(style="default").get_style_defs(".hl"), "loose_page": NO_COMPILE_ID_PAGE}
    multi_pid, previous = len({c.pid for c in log.compiles}) > 1, previous_attempts(log.compiles)
    all_totals, all_selfs = Counter(), Counter()  # stage names in first-seen order
    rows, grand_total = [], 0.0
    for c in log.compiles:
        totals, selfs = c.stage_totals(), c.stage_self_totals()
        all_totals.update(totals)
        all_selfs.update(selfs)
        total = c.total_ms()
        grand_total += total
        row = {"pid": c.pid, "compile_id": c.compile_id, "page": c.page, "title": c.title(), "total": total,
               "stages": totals, "n_events": len(c.events), "n_artifacts": len(c.artifacts)}
        row.update({ev: c.count(ev) for ev in COUNTED_EVENTS})
        rows.append(row)
        prev = previous.get((c.pid, c.compile_id))
        diffs = artifact_diffs(prev, c) if prev is not None else []
        page = env.get_template("compile.jinja").render(
            title=row["title"] or f"compile {c.compile_id}", c=c, multi_pid=multi_pid, total=total,
            breakdown=_breakdown_rows(totals, selfs, total), groups=_group_tables(c.events),
            artifacts=_artifact_views(c.artifacts), diffs=diffs, prev_page=prev.page if prev else "",
            prev_id=prev.compile_id if prev else "", **common)
        Path(out_dir, c.page).write_text(page, encoding="utf-8")
    loose_events = [r for r in log.loose if r.get("event") not in ("artifact",)]
    Path(out_dir, NO_COMPILE_ID_PAGE).write_text(env.get_template("loose.jinja").render(
        title="events without compile id", groups=_group_tables(loose_events),
        artifacts=_artifact_views([r for r in log.loose if r.get("event") == "artifact"]), **common), encoding="utf-8")
    index = env.get_template("index.jinja").render(
        title="coil compile log", log_dir=log_dir, files=log.files, bad_lines=log.bad_lines,
        n_compiles=len(log.compiles), compiles=rows, stage_names=list(all_totals),
        multi_pid=multi_pid, total_ms=grand_total,
        breakdown=_breakdown_rows(all_totals, all_selfs, grand_total), n_loose=len(log.loose), **common)
    index_path = os.path.join(out_dir, "index.html")
    Path(index_path).write_text(index, encoding="utf-8")
    return index_path


def main(argv: Optional[list] = None) -> int:
    """``coil report <dir> [-o out]``; returns a process exit code (0 ok, 2 no log)."""
    parser = argparse.ArgumentParser(prog="coil report", description="Render a coil compile log "
                                     "(written with COIL_TRACE=<dir>) as static HTML.")
    parser.add_argument("log_dir", help="directory holding coil_trace_<pid>.jsonl files")
    parser.add_argument("-o", "--out", default=None, help="output directory (default: <log_dir>/report)")
    args = parser.parse_args(argv)
    try:
        index = write_report(args.log_dir, args.out)
    except FileNotFoundError as e:
        print(f"coil report: {e}")
        return 2
    print(f"wrote {index}")
    return 0


if __name__ == "__main__":  # python -m coil.trace.report <dir> [-o out]
    raise SystemExit(main())
