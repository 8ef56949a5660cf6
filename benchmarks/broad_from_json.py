"""The latest broad-suite row per model and mode on one card, computed from raw bench JSON (no device needed).

    python benchmarks/broad_from_json.py --card H100 benchmarks/results/h100_*/broad_*.json [--markdown]

Reads ``coil bench --suite broad --paired --json`` files (``benchmarks/suite_broad.sh`` writes them), keeps the files
whose ``meta.gpu`` contains ``--card``, and per (model, mode) of ``coil.bench.broad`` takes the latest file (by
``meta.date``) that has both a coil and a torch.compile (``inductor``) row for it. A file's tree is its name's
``_<commit>`` suffix where it has one (the GPU machine's checkout metadata lags, so ``meta.commit`` may name an older
commit), else ``meta.commit``.

Prints, per mode, the geomean of coil / torch.compile (each row's ratio of the two speedups over the shared eager
series) over the rows where both pass the bench's accuracy rule, the rows below 0.9, the rows where coil does not pass
or has codegen fallbacks, the median cold compile seconds of both, and the model/mode lines without a row.
``--markdown`` prints the rows as a BENCHMARKS.md table first.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics

from broad_latest import geomean


def load(paths: list[str], card: str) -> dict:
    """{(model, mode): row} of the latest file on ``card`` holding both compilers' rows for that model and mode.

    A row: dict(model, mode, date, tree, file, eager_ms, coil, tc) where coil / tc are the bench's row dicts."""
    latest: dict = {}
    for path in paths:
        data = json.load(open(path))
        meta = data.get("meta", {})
        if card.lower() not in str(meta.get("gpu", "")).lower():
            continue
        m = re.search(r"_([0-9a-f]{7,40})\.json$", os.path.basename(path))
        tree = m.group(1) if m else str(meta.get("commit", "?"))
        by_key: dict = {}
        for r in data["rows"]:
            by_key.setdefault((r["model"], r["mode"]), {})[r["compiler"]] = r
        for key, rows in by_key.items():
            if "coil" not in rows or "inductor" not in rows:
                continue
            row = dict(model=key[0], mode=key[1], date=meta.get("date", ""), tree=tree,
                       file=os.path.relpath(path), coil=rows["coil"], tc=rows["inductor"],
                       eager_ms=rows["coil"].get("eager_ms"))
            if key not in latest or row["date"] >= latest[key]["date"]:
                latest[key] = row
    return latest


def ratio(row: dict):
    """coil's speedup over torch.compile's on the shared eager series, or None where either has no time."""
    a, b = row["coil"].get("speedup"), row["tc"].get("speedup")
    return a / b if a and b else None


def _fmt(v, digits=2):
    return "—" if v is None else f"{v:.{digits}f}"


def markdown(rows: list[dict]) -> str:
    out = ["| model | mode | coil / eager | torch.compile / eager | coil / torch.compile | ms eager / coil / tc "
           "| accuracy coil / tc | fallbacks | graphs / breaks | cold s coil / tc | peak GB coil / tc | date (UTC), tree |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c, t = r["coil"], r["tc"]
        out.append(
            f"| `{r['model']}` | {r['mode']} | {_fmt(c.get('speedup'))} | {_fmt(t.get('speedup'))} | "
            f"{_fmt(ratio(r))} | {_fmt(r['eager_ms'])} / {_fmt(c.get('compiled_ms'))} / {_fmt(t.get('compiled_ms'))} | "
            f"{c['status']} / {t['status']} | {c.get('codegen_fallbacks', '—')} | "
            f"{c.get('graphs')} / {c.get('graph_breaks')} | {_fmt(c.get('cold_compile_s'), 1)} / "
            f"{_fmt(t.get('cold_compile_s'), 1)} | {_fmt(c.get('peak_mem_gb'))} / {_fmt(t.get('peak_mem_gb'))} | "
            f"{r['date'].replace(' UTC', '')}, {r['tree'][:7]} |")
    return "\n".join(out)


def summary(latest: dict, models: list[str], modes: tuple) -> str:
    lines = []
    for mode in modes:
        rows = [r for (m, md), r in latest.items() if md == mode]
        both = [ratio(r) for r in rows if r["coil"]["status"] == "pass" and r["tc"]["status"] == "pass"
                and ratio(r) is not None]
        gm = geomean(both) if both else float("nan")
        lines.append(f"{mode}: {len(rows)} rows; coil / torch.compile geomean {gm:.3f} over the {len(both)} where both "
                     f"pass, min {min(both, default=float('nan')):.2f}")
        bad = [f"{r['model']} ({r['coil']['status']}, fallbacks {r['coil'].get('codegen_fallbacks')})" for r in rows
               if r["coil"]["status"] != "pass" or r["coil"].get("codegen_fallbacks")]
        lines.append(f"  coil not passing or with codegen fallbacks: {', '.join(bad) or 'none'}")
        low = [f"{r['model']} {ratio(r):.2f}" for r in rows if ratio(r) is not None and ratio(r) < 0.9]
        lines.append(f"  below 0.9: {', '.join(low) or 'none'}")
        cold = [r for r in rows if r["coil"].get("cold_compile_s") and r["tc"].get("cold_compile_s")]
        if cold:
            lines.append(f"  median cold compile s over {len(cold)}: coil "
                         f"{statistics.median(r['coil']['cold_compile_s'] for r in cold):.1f}, torch.compile "
                         f"{statistics.median(r['tc']['cold_compile_s'] for r in cold):.1f}")
        missing = [m for m in models if (m, mode) not in latest]
        lines.append(f"  without a row ({len(missing)}): {' '.join(missing)}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--card", default="H100", help="a substring of meta.gpu (H100, H200)")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    from coil.bench.broad import BROAD, BROAD_MODES
    latest = load(a.files, a.card)
    if a.markdown:
        order = {m: i for i, m in enumerate(BROAD)}
        print(markdown(sorted(latest.values(), key=lambda r: (order.get(r["model"], 1 << 30), r["mode"]))))
        print()
    print(summary(latest, list(BROAD), tuple(BROAD_MODES)))


if __name__ == "__main__":
    main()
