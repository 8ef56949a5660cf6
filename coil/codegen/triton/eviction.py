"""L2 eviction hints for looped Triton reductions.

A looped reduction that needs a row twice (layer_norm's statistics, then its normalize step; softmax's max/sum, then its
output) walks the row once per loop: the second walk is a cheap L2 hit only if the first walk's lines are still there.
Loads of a pointer in a loop that a *later* loop loads again get ``eviction_policy='evict_last'`` (keep them); loads in
a loop after which no loop needs the pointer get ``'evict_first'`` when an earlier loop loaded it (its last use: make
room). Loads seen in one loop only keep the default. Torch Inductor marks its multi-pass reductions the same way. Hints
change cache behaviour only, never values."""
from __future__ import annotations

import re

_LOAD = re.compile(r"tl\.load\((in_ptr\d+)\b")


def _close_paren(line: str, start: int) -> int:
    """Index of the ``)`` closing the ``(`` at ``start``."""
    depth = 0
    for i in range(start, len(line)):
        if line[i] == "(":
            depth += 1
        elif line[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced parentheses in {line!r}")


def add_eviction_hints(loops: list[list[str]]) -> list[list[str]]:
    """``loops``: the body lines of each r loop of one kernel, in order. Returns them with hints added to
    ``tl.load(in_ptrN ...)`` calls (no change when fewer than two loops load the same pointer)."""
    loaded = [set(_LOAD.findall("\n".join(lines))) for lines in loops]
    out = []
    for i, lines in enumerate(loops):
        later, earlier = set().union(*loaded[i + 1:]), set().union(*loaded[:i])
        new = []
        for line in lines:
            pos = 0
            while (m := _LOAD.search(line, pos)) is not None:
                ptr = m.group(1)
                policy = "evict_last" if ptr in later else ("evict_first" if ptr in earlier else None)
                end = _close_paren(line, m.end() - len(ptr) - 1)
                if policy and "eviction_policy" not in line[m.start():end]:
                    line = f"{line[:end]}, eviction_policy='{policy}'{line[end:]}"
                pos = m.end()
            new.append(line)
        out.append(new)
    return out
