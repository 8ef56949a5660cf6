"""A long fuzz campaign in bounded-memory chunks (docs/fuzzing.md).

``python -m coil.bench.fuzz`` grows by about 1 MB a program (each program's C++ kernel
libraries stay loaded, FakeTensor's cache grows), so one process cannot run 20,000
programs on a small machine. This script runs programs ``[0, --programs)`` of one seed as
chunks of ``--chunk`` programs, each in a fresh ``python -m coil.bench.fuzz --start I
--count N`` process, ``--workers`` chunks at a time, and sums the chunks' summary tables
into one (same families and outcome columns). Each chunk's output is kept in
``OUT/chunk-<start>.txt``; repro files of failures go to ``OUT`` as usual. A chunk that
dies (killed, out of memory) is reported by its start index and counted as missing.

    OMP_NUM_THREADS=1 TRITON_INTERPRET=1 python tools/fuzz_campaign.py --seed 200 \\
        --programs 20000 --workers 2 --out fuzz-200 -- --backends cpp,triton --torch-ref \\
        --minimize-time 20 --per-class 2 --timeout 60

Arguments after ``--`` go to every chunk unchanged.
"""
import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from coil.bench.fuzz import FAILURES, OUTCOMES, _table


def _parse_table(text: str) -> Counter:
    """The ``(family, outcome) -> count`` table a fuzz process printed at its end."""
    lines = text.splitlines()
    head = next((i for i, ln in enumerate(lines) if ln.split()[:2] == ["family", OUTCOMES[0]]), None)
    stats = Counter()
    if head is None:
        return stats
    cols = lines[head].split()[1:]
    for ln in lines[head + 1:]:
        if not ln.strip():
            break
        parts = ln.rsplit(None, len(cols))
        name, counts = parts[0], parts[1:]
        for c, n in zip(cols, counts):
            stats[(name, c)] += int(n)
    return stats


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--programs", type=int, default=20000)
    ap.add_argument("--first", type=int, default=0, help="first program index")
    ap.add_argument("--chunk", type=int, default=1500, help="programs per process")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="fuzz-campaign")
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    os.makedirs(a.out, exist_ok=True)
    starts = list(range(a.first, a.first + a.programs, a.chunk))
    t0 = time.time()

    def run(start: int) -> tuple:
        count = min(a.chunk, a.first + a.programs - start)
        sub = os.path.join(a.out, f"chunk-{start}")
        os.makedirs(sub, exist_ok=True)  # each chunk its own _in_flight.py
        cmd = [sys.executable, "-m", "coil.bench.fuzz", "--seed", str(a.seed), "--start", str(start),
               "--count", str(count), "--time", "1e9", "--out", sub] + extra
        with open(sub + ".txt", "w") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        stats = _parse_table(open(sub + ".txt").read())
        print(f"[{time.time() - t0:7.0f}s] chunk {start}..{start + count - 1}: rc {rc}, "
              f"{stats[('all programs', 'ok')]} ok runs", flush=True)
        return start, count, stats

    total, missing = Counter(), []
    with ThreadPoolExecutor(a.workers) as pool:
        for start, count, stats in pool.map(run, starts):
            if not stats:
                missing.append(start)
            total.update(stats)
    print("\n" + _table(total))
    done = a.programs - sum(min(a.chunk, a.first + a.programs - s) for s in missing)
    print(f"\nseed {a.seed}: {done} programs in {time.time() - t0:.0f} s"
          + (f"; chunks without a summary (died): {missing}" if missing else ""))
    bad = sum(n for (f, o), n in total.items() if f == "all programs" and o in FAILURES)
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main())
