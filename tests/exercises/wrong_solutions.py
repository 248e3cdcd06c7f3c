#!/usr/bin/env python3
"""Proves the graders against plausible wrong solutions (tests/exercises/wrong_solutions.json).

    wrong_solutions.py COPY ID...    in the repository copy COPY (prove_graders.sh's scratch
                                     copy, its build configured), for every wrong solution of
                                     each ID: apply its patch, run `scripts/exercise check ID`,
                                     require a failure whose output matches every `expect`
                                     regex (the grader names where), restore the file.

With WRONG_SOLUTIONS_OUT=DIR each grader's output is also kept in DIR (one file per wrong
solution), to write the `expect` regexes from. Prints one line per wrong solution; exit status: the number that were not caught as required
(at most 100). Without the catalogue (a student copy: `scripts/exercise release` deletes it)
there is nothing to prove: exit 0.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


def prove(copy, w):
    """'' when the grader fails on `w` with every expected message, else why not."""
    originals = {}
    try:
        for p in w["patch"]:
            path = copy / p["file"]
            originals.setdefault(path, path.read_bytes())
            current = path.read_bytes().decode("utf-8")
            if current.count(p["find"]) != 1:
                return f"its patch text occurs {current.count(p['find'])} times in {p['file']}"
            path.write_bytes(current.replace(p["find"], p["replace"]).encode("utf-8"))
        try:
            r = subprocess.run([str(copy / "scripts/exercise"), "check", w["id"]], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        except subprocess.TimeoutExpired:
            return "its check ran past 600 s (a hang the grader did not stop)"
        out = r.stdout
        keep = os.environ.get("WRONG_SOLUTIONS_OUT")  # a directory: each grader's output, kept
        if keep:
            name = re.sub(r"[^A-Za-z0-9]+", "_", f"{w['id']} {w['name']}").strip("_")
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / f"{name}.log").write_text(out)
        if r.returncode == 0:
            return "the grader PASSES it"
        if "BUILD FAILED" in out:
            return "it does not compile:\n" + out[-1500:]
        missing = [e for e in w["expect"] if not re.search(e, out)]
        if missing:
            return f"the grader fails, but its output lacks {missing}:\n" + out[-2500:]
        return ""
    finally:
        for path, data in originals.items():
            path.write_bytes(data)


def main(copy, ids):
    copy = Path(copy)
    source = Path(__file__).parent / "wrong_solutions.json"
    if not source.exists():
        print("   no wrong-solution catalogue here (a student copy): nothing to prove")
        return 0
    catalogue = json.loads(source.read_text(encoding="utf-8"))
    bad = 0
    for w in catalogue["wrong"]:
        if w["id"] not in ids:
            continue
        t0 = time.time()
        why = prove(copy, w)
        if why:
            bad += 1
            print(f"FAIL: {w['id']} wrong solution '{w['name']}': {why}")
        else:
            print(f"   {w['id']} catches '{w['name']}' ({time.time() - t0:.0f} s)", flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(min(main(sys.argv[1], set(sys.argv[2:])), 100))
