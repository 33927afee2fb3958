"""Top functions of a py-spy collapsed-stack file (`py-spy record --format raw`).

Run by hand:  .venv/bin/python bench/profile_summary.py FILE [--top 20] [--under gateway,channels]

Prints, for the functions of our own code (`--under`), the share of samples in which each
appears anywhere on the stack (inclusive), and for every function the share of samples in
which it is the innermost frame (self).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def frames(stack: str) -> list[tuple[str, str]]:
    out = []
    for frame in stack.split(";"):
        match = FRAME.match(frame.strip())
        if match:
            out.append((match["name"], match["file"]))
    return out


def short(name: str, file: str) -> str:
    for marker in ("site-packages/", "/work/", "lib/python3.11/"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{file}:{name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--under", default="gateway/,channels/,scheduler/")
    args = parser.parse_args()
    ours = tuple(args.under.split(","))
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in open(args.file, encoding="utf-8"):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        seen = set()
        found = frames(stack)
        for name, file in found:
            key = short(name, file)
            if key not in seen and any(marker in file for marker in ours) and "/.venv/" not in file:
                inclusive[key] += n
                seen.add(key)
        if found:
            own[short(*found[-1])] += n
    print(f"{total} samples")
    print("inclusive, our code:")
    for key, n in inclusive.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {key}")
    print("self (innermost frame):")
    for key, n in own.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {key}")


if __name__ == "__main__":
    main()
