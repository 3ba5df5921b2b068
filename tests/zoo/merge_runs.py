#!/usr/bin/env python3
"""Merge the JSON files of several run_zoo.py runs (chunks of one seed range) into one kill /
false-alarm matrix, as run_zoo.py prints it.

    merge_runs.py OUT.md RUN.json [RUN.json ...]

Exit 1 on any false alarm or any should-catch bug that passed, as run_zoo.py."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_zoo import summarize  # noqa: E402


def main():
    out, files = sys.argv[1], sys.argv[2:]
    results, seeds, total, binary, commits = [], [], 0.0, "", set()
    for f in files:
        with open(f) as fh:
            j = json.load(fh)
        results += j["results"]
        seeds += list(range(j["seeds"][0], j["seeds"][1] + 1))
        total += j["seconds"]
        binary = j["binary"]
        commits.add(j["main_commit"])
    seeds.sort()
    md, bad = summarize(results, binary, seeds, " / ".join(sorted(commits)), total)
    with open(out, "w") as fh:
        fh.write(md + "\n")
    print(md)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
