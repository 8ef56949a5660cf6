"""The ``coil`` command: ``coil demo``, ``coil bench``, ``coil conformance``, ``coil report``.

Each subcommand is a thin argparse front over a library function (:mod:`coil.bench.demo`, :mod:`coil.bench.suite`,
:mod:`coil.bench.conformance`, :mod:`coil.trace.report`), so everything the command does is callable from Python too;
the bench front ends are in :mod:`coil.bench.cli`. ``main(argv)`` returns the exit status: 0 on success; for
bench/conformance 0 even when rows fail (failures are results), unless ``--strict`` asks for 1 on any non-passing row.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from coil.bench.cli import add_bench, add_conformance, add_demo, run_bench, run_conformance, run_demo


def _run_report(a) -> int:
    from coil.trace import report
    return int(report.main([a.log_dir] + (["-o", a.out] if a.out else [])) or 0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``coil`` console script."""
    parser = argparse.ArgumentParser(prog="coil", description="coil: a readable PyTorch "
                                     "2-style compiler. Subcommands run its yardsticks.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_demo(sub)
    add_bench(sub)
    add_conformance(sub)
    p = sub.add_parser("report", help="render a compile log directory as HTML")
    p.add_argument("log_dir")
    p.add_argument("-o", "--out", default=None, help="output directory")
    a = parser.parse_args(argv)
    return {"demo": run_demo, "bench": run_bench, "conformance": run_conformance, "report": _run_report}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
