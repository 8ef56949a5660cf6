"""Summary of BENCHMARKS.md's "Broad suite: latest row per model" table (no device needed).

Reads the table from BENCHMARKS.md, checks that it has exactly one line per model of
``coil.bench.broad.BROAD`` and mode of ``BROAD_MODES``, and prints:

- the geomean of coil / torch.compile over the bf16 rows and over the training rows where
  both compilers pass the accuracy rule ("pass", or "pass*": not stated in words, not
  marked as failing), and the same with the rows whose accuracy was not recorded ("n/r");
- the rows whose coil / torch.compile is below 0.9;
- the median cold compile seconds of coil and of torch.compile over the rows that have both;
- the models and modes without a row.

Every value is the table's own (two decimals for ratios, one for seconds), so the summary
can be recomputed from the file alone.

Usage: python benchmarks/broad_latest.py [BENCHMARKS.md]
"""
from __future__ import annotations

import math
import re
import statistics
import sys
from pathlib import Path

HEADING = "### Broad suite: latest row per model"
PASSING = {"pass", "pass*"}


def _num(cell: str):
    """The cell's value as a float, or None where it holds no number ("—", "n/r", ...)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*", cell)
    return float(m.group(1)) if m else None


def read_table(text: str) -> list[dict]:
    lines = text.splitlines()
    start = lines.index(HEADING)
    rows, in_table = [], False
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            in_table = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] == "model" or set(cells[0]) <= {"-"}:
                continue
            key = re.search(r"`(b_\w+)`", cells[0]).group(1)
            # "a / b", or one value for both compilers ("—", "n/r")
            acc = cells[5].split(" / ") if " / " in cells[5] else [cells[5]] * 2
            cold = cells[7].split(" / ") if " / " in cells[7] else [cells[7]] * 2
            rows.append(dict(model=key, mode=cells[1], coil_eager=_num(cells[2]),
                             tc_eager=_num(cells[3]), ratio=_num(cells[4]),
                             ratio_cell=cells[4], acc=acc, cold_coil=_num(cold[0]),
                             cold_tc=_num(cold[1]), when=cells[8]))
        elif in_table:
            break
    return rows


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main(path: str = "BENCHMARKS.md") -> None:
    rows = read_table(Path(path).read_text())
    from coil.bench.broad import BROAD, BROAD_MODES

    keys = [(r["model"], r["mode"]) for r in rows]
    expected = [(m, mode) for m in BROAD for mode in BROAD_MODES]
    assert sorted(keys) == sorted(expected), (set(keys) ^ set(expected),
                                              len(keys), len(expected))
    for mode in BROAD_MODES:
        timed = [r for r in rows if r["mode"] == mode and r["ratio"] is not None]
        stated = [r["ratio"] for r in timed if set(r["acc"]) == {"pass"}]
        both = [r["ratio"] for r in timed if set(r["acc"]) <= PASSING]
        with_nr = [r["ratio"] for r in timed if set(r["acc"]) <= PASSING | {"n/r"}]
        print(f"{mode}: coil / torch.compile geomean {geomean(both):.3f} over {len(both)} rows "
              f"where both pass (pass or pass*), min {min(both):.2f}; {geomean(stated):.3f} over "
              f"the {len(stated)} stated to pass; {geomean(with_nr):.3f} over {len(with_nr)} rows "
              f"with the {len(with_nr) - len(both)} whose accuracy is not recorded")
    below = [r for r in rows if r["ratio"] is not None and r["ratio"] < 0.9]
    print(f"below 0.9: {len(below)}: " + ", ".join(
        f"{r['model']} {r['mode']} {r['ratio']:.2f} (accuracy {' / '.join(r['acc'])})"
        for r in below))
    cold = [r for r in rows if r["cold_coil"] is not None and r["cold_tc"] is not None]
    for mode in (*BROAD_MODES, None):
        sel = [r for r in cold if mode is None or r["mode"] == mode]
        print(f"median cold compile s, {mode or 'all'} ({len(sel)} rows): coil "
              f"{statistics.median(r['cold_coil'] for r in sel):.2f}, torch.compile "
              f"{statistics.median(r['cold_tc'] for r in sel):.2f}")
    no_row = [r for r in rows if r["when"].startswith("—")]
    models = [m for m in BROAD if all(r["model"] != m or r["when"].startswith("—")
                                      for r in rows)]
    print(f"models without any row ({len(models)}): {', '.join(models)}")
    print(f"model/mode lines without a row ({len(no_row)}): "
          + ", ".join(f"{r['model']} {r['mode']}" for r in no_row))
    nratio = [r for r in rows if r["ratio"] is None and not r["when"].startswith("—")]
    print("rows without coil / torch.compile: " + ", ".join(
        f"{r['model']} {r['mode']} ({r['ratio_cell']})" for r in nratio))


if __name__ == "__main__":
    main(*sys.argv[1:])
