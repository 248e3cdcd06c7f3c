#!/usr/bin/env python3
"""Every exercise and bug hunt in exercises/catalogue.json still points at real code.

Code moves (a file renamed, a line reworded) silently break `scripts/exercise start/bug` while
the default `exercises` proof (a subset) still passes. This check is cheap and covers all of
them: every file named exists, every exercise ID has a BEGIN/END region pair in each of its
files and in no other source file (each exercise exists once: no later chapter holds a copy of
its answer), every answer note that `release` takes out of a student copy is there once, and
every bug-hunt patch's `find` text occurs exactly once in its file (so the
patch applies to one place only) and lies outside every exercise's region (a student who solves
the exercise must not overwrite the bug, nor find it in the answer), every wrong solution of
tests/exercises/wrong_solutions.json patches its own exercise's region once, and README.md's
counts of exercises and bug hunts are the catalogue's. Exit 1 naming each broken entry.
"""
import json
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
catalogue = json.loads((root / "exercises/catalogue.json").read_text())
broken = []
for ex in catalogue["exercises"]:
    for f in ex["files"]:
        path = root / f
        if not path.is_file():
            broken.append(f"exercise {ex['id']}: file {f} does not exist")
            continue
        text = path.read_text()
        begins = text.count(f"BEGIN EXERCISE {ex['id']} ")
        ends = text.count(f"END EXERCISE {ex['id']}\n")
        if begins == 0 or begins != ends:
            broken.append(f"exercise {ex['id']}: {f} has {begins} BEGIN and {ends} END markers")
    for note in ex.get("answer_notes", []):  # what `release` takes out of a student copy
        path = root / note["file"]
        n = path.read_text(encoding="utf-8").count(note["find"]) if path.is_file() else 0
        if n != 1:
            broken.append(f"exercise {ex['id']}: an answer note's text occurs {n} times in "
                          f"{note['file']} (must be exactly once): {note['find'][:80]!r}")
listed = {(ex["id"], f) for ex in catalogue["exercises"] for f in ex["files"]}
for path in sorted(p for d in ("chapters", "common", "tests") for p in (root / d).rglob("*")
                   if p.suffix in (".hpp", ".cpp", ".cu", ".cuh")):
    for ident in re.findall(r"BEGIN EXERCISE (\S+) ", path.read_text()):
        rel = str(path.relative_to(root))
        if (ident, rel) not in listed:
            broken.append(f"exercise {ident}: {rel} holds its region but is not among its files "
                          "(each exercise exists once: build on the chapter that has it)")
for bug in catalogue["bugs"]:
    for patch in bug["patch"]:
        path = root / patch["file"]
        if not path.is_file():
            broken.append(f"bug hunt {bug['id']}: file {patch['file']} does not exist")
            continue
        text = path.read_text()
        n = text.count(patch["find"])
        if n != 1:
            broken.append(f"bug hunt {bug['id']}: its patch text occurs {n} times in "
                          f"{patch['file']} (must be exactly once): {patch['find'][:80]!r}")
            continue
        at = text.index(patch["find"])
        for m in re.finditer(r"BEGIN EXERCISE (\S+) .*?END EXERCISE \1\n", text, re.S):
            if m.start() < at + len(patch["find"]) and at < m.end():
                broken.append(f"bug hunt {bug['id']}: planted inside exercise {m[1]}'s region "
                              f"in {patch['file']}; plant it outside every solution region")
# The graders' wrong solutions (absent from a student copy): each patch applies once, inside its
# exercise's region, so that prove_graders.sh breaks the solution and nothing else.
wrong_path = root / "tests/exercises/wrong_solutions.json"
wrong = json.loads(wrong_path.read_text(encoding="utf-8"))["wrong"] if wrong_path.exists() else []
for w in wrong:
    for patch in w["patch"]:
        path = root / patch["file"]
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        if text.count(patch["find"]) != 1:
            broken.append(f"wrong solution {w['id']} '{w['name']}': its patch text occurs "
                          f"{text.count(patch['find'])} times in {patch['file']} (must be once)")
            continue
        at = text.index(patch["find"])
        region = (r"[^\n]*BEGIN EXERCISE " + re.escape(w["id"]) + r" .*?END EXERCISE " +
                  re.escape(w["id"]) + r"\n")
        inside = any(m.start() <= at and at + len(patch["find"]) <= m.end()
                     for m in re.finditer(region, text, re.S))
        if not inside:
            broken.append(f"wrong solution {w['id']} '{w['name']}': its patch is not inside "
                          f"exercise {w['id']}'s region in {patch['file']}")
n_ex, n_bug = len(catalogue["exercises"]), len(catalogue["bugs"])
# README's counts are `scripts/exercise list`'s (the catalogue's).
said = re.search(r"(\d+) implementation exercises[^.]*?(\d+) bug\s+hunts",
                 (root / "README.md").read_text())
if not said or (int(said[1]), int(said[2])) != (n_ex, n_bug):
    broken.append(f"README.md says {said[1] if said else '?'} implementation exercises and "
                  f"{said[2] if said else '?'} bug hunts; the catalogue has {n_ex} and {n_bug}")
for line in broken:
    print("BROKEN:", line)
print(f"{n_ex} exercises, {n_bug} bug hunts: {'all point at real code' if not broken else f'{len(broken)} broken'}")
sys.exit(1 if broken else 0)
