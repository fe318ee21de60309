"""Summary of several runs of ``_scripts/sweep_transformers.py`` (or of
``sweep_diffusers.py``): one result per class over the logs given, the counts per path
among the classes eager runs, and the differences between the paths::

    python _scripts/sweep_summary.py sweep_1.log sweep_2.log ...

A class seen in several logs keeps its last line where eager ran (a later run with
better inputs supersedes an earlier eager failure; a later failure of eager itself does
not erase a run where it worked).
"""

from __future__ import annotations

import collections
import re
import sys

PATHS = ("eager", "export", "yobx", "yobx-onnx", "torch-onnx")
_STATUS = r"(ok|fail|timeout|crash|WRONG|UNSTABLE|-)"
_LINE = re.compile(r"^(\w+)" + (r"\s+" + _STATUS) * len(PATHS) + r"\s*$")


def results(files: list[str]) -> dict[str, list[str]]:
    """Class name -> the status of each path, over the logs in order."""
    latest: dict[str, list[str]] = {}
    for name in files:
        with open(name, encoding="utf-8", errors="replace") as stream:
            for line in stream:
                match = _LINE.match(line)
                if not match:
                    continue
                cls, *statuses = match.groups()
                if cls in latest and latest[cls][0] == "ok" and statuses[0] != "ok":
                    continue
                latest[cls] = statuses
    return latest


def main(files: list[str]) -> None:
    latest = results(files)
    ran = {n: v for n, v in latest.items() if v[0] == "ok"}
    print(f"{len(latest)} classes, {len(ran)} run eagerly")
    for index, path in enumerate(PATHS):
        pool = latest.values() if index == 0 else ran.values()
        counts = collections.Counter(v[index] for v in pool)
        print(f"  {path:11s} " + ", ".join(f"{k} {c}" for k, c in sorted(counts.items())))
    pairs = (("export", "yobx"), ("torch-onnx", "yobx-onnx"))
    for theirs, ours in pairs:
        t, o = PATHS.index(theirs), PATHS.index(ours)
        lost = [n for n, v in ran.items() if v[t] == "ok" and v[o] != "ok"]
        ahead = [n for n, v in ran.items() if v[o] == "ok" and v[t] != "ok"]
        print(f"{theirs} ok, {ours} not ({len(lost)}): {', '.join(lost)}")
        print(f"{ours} ok, {theirs} not ({len(ahead)}): {', '.join(ahead)}")
    failing = [n for n, v in ran.items() if all(s != "ok" for s in v[1:])]
    print(f"every path fails ({len(failing)}): {', '.join(failing)}")
    wrong = [f"{n} ({PATHS[i]})" for n, v in ran.items() for i, s in enumerate(v) if s == "WRONG"]
    print(f"WRONG ({len(wrong)}): {', '.join(wrong)}")
    unstable = [
        f"{n} ({PATHS[i]})" for n, v in ran.items() for i, s in enumerate(v) if s == "UNSTABLE"
    ]
    print(f"UNSTABLE ({len(unstable)}): {', '.join(unstable)}")


if __name__ == "__main__":
    main(sys.argv[1:])
