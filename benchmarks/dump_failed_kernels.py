"""Print the source of every kernel named in a ``kernel_compile_fallback`` or
``autotune_error`` event of a COIL_TRACE directory (to debug GPU-only compile errors).

    python benchmarks/dump_failed_kernels.py TRACE_DIR
"""
import glob
import json
import re
import sys

events = []
for f in glob.glob(sys.argv[1] + "/*.jsonl"):
    events += [json.loads(line) for line in open(f)]
names, errors = set(), []
for e in events:
    if e.get("event") in ("kernel_compile_fallback", "autotune_error"):
        text = e.get("error", "")
        errors.append(text)
        names |= set(re.findall(r"triton_\w+", text)) | ({e["kernel"]} if "kernel" in e else set())
for err in errors[:3]:
    print("ERROR:", err[-3000:], "\n")
for e in events:
    if e.get("event") == "artifact" and e.get("name", "").startswith("kernel ") and \
            e["name"].split(" ", 1)[1] in names:
        print(f"==== {e['name']} ({e.get('compile_id')})\n{e['text']}")
