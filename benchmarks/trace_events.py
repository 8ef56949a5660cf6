"""Condense a COIL_TRACE directory into the runtime events of interest, one line each.

Usage: python benchmarks/trace_events.py TRACE_DIR [EVENT ...] > events.txt
(default events: the bench's first calls, compiles, autotuning and launch buckets), for
reading where a first call spends its time on the GPU machine without carrying the
whole log (kernel sources, graphs) back.
"""
import json
import pathlib
import sys

DEFAULT = {"bench_first_call", "bench_first_call_done", "autotune", "autotune_reused",
           "dynamic_launch_bucket", "dynamic_class_ahead", "backend_compile", "compile_pool_claim",
           "recompile", "dynamic_dim"}


def main(argv):
    root = pathlib.Path(argv[0])
    want = set(argv[1:]) or DEFAULT
    rows = []
    for f in sorted(root.rglob("*.jsonl")):
        for line in f.open():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") in want:
                rows.append(e)
    rows.sort(key=lambda e: e["ts"])
    t0 = rows[0]["ts"] if rows else 0
    for e in rows:
        rest = {k: v for k, v in e.items() if k not in ("ts", "pid", "event", "stage")}
        print(f"{e['ts'] - t0:9.3f} {e['event']:24s} {json.dumps(rest)[:300]}")


if __name__ == "__main__":
    main(sys.argv[1:])
