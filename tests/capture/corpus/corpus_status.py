"""Print the corpus status per group as markdown (what STATUS.md holds).

    python tests/capture/corpus/corpus_status.py            # runs the corpus with --runxfail
    python tests/capture/corpus/corpus_status.py run.xml    # or reads a junit xml
    python tests/capture/corpus/corpus_status.py --write-known [run.xml]  # rewrite known_failures.py

Runs every row ignoring xfail marks, then lists per group: passed/total and, for each
failing row, the first line of its failure. Use it to decide which xfail marks to drop.
"""
from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))


def _first_line(text: str) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line.startswith("E "):
            line = line[1:].strip()
        if line and not line.startswith(("def ", "@", "self", "check(")):
            return line[:220]
    return "?"


def collect(xml_path: str) -> dict:
    groups: dict = collections.defaultdict(lambda: {"pass": 0, "fail": [], "skip": 0})
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        group = case.get("classname", "").rsplit(".", 1)[-1].replace("test_corpus_", "")
        name = case.get("name")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            msg = failure.get("message") or failure.text or ""
            groups[group]["fail"].append((name, _first_line(msg)))
        elif case.find("skipped") is not None:
            groups[group]["skip"] += 1
        else:
            groups[group]["pass"] += 1
    return groups


def render(groups: dict) -> str:
    out = ["| group | passed | failed | skipped |", "|---|---|---|---|"]
    for g in sorted(groups):
        d = groups[g]
        out.append(f"| {g} | {d['pass']} | {len(d['fail'])} | {d['skip']} |")
    tot_p = sum(d["pass"] for d in groups.values())
    tot_f = sum(len(d["fail"]) for d in groups.values())
    out.append(f"| **total** | {tot_p} | {tot_f} | |")
    for g in sorted(groups):
        if groups[g]["fail"]:
            out.append(f"\n### {g}\n")
            for name, msg in sorted(groups[g]["fail"]):
                out.append(f"- `{name}`: {msg}")
    return "\n".join(out)


def write_known(groups: dict) -> None:
    """Rewrite known_failures.py from the failing table rows (id ``test_x[row]``)."""
    lines = []
    for g in sorted(groups):
        for name, msg in sorted(groups[g]["fail"]):
            if "[" not in name:
                continue
            row = name[name.index("[") + 1:-1]
            lines.append(f"    {g + '::' + row!r}: {msg!r},")
    path = os.path.join(HERE, "known_failures.py")
    text = open(path).read()
    head = text[:text.index("KNOWN_FAILURES")]
    with open(path, "w") as f:
        f.write(head + "KNOWN_FAILURES: dict[str, str] = {\n" + "\n".join(lines) + "\n}\n")


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--write-known"]
    if args:
        xml_path = args[0]
    else:
        xml_path = os.path.join(tempfile.mkdtemp(), "corpus.xml")
        subprocess.run([sys.executable, "-m", "pytest", HERE, "-q", "-p", "no:benchmark", "--runxfail", "-n", "2",
                        "--tb=short", f"--junitxml={xml_path}"], check=False, stdout=subprocess.DEVNULL)
    groups = collect(xml_path)
    print(render(groups))
    if "--write-known" in sys.argv:
        write_known(groups)


if __name__ == "__main__":
    main()
