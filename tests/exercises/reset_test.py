#!/usr/bin/env python3
"""`scripts/exercise reset` of a bug hunt (undo_patch), for every bug hunt in the catalogue, on a
scratch copy of each patched file:
  - planted, then reset: the file is the original byte for byte;
  - planted, then fixed by the student with other whitespace (spaces doubled, none around
    punctuation, a line break after the first "(" or ","), then reset: the original byte for
    byte, since a fix that is the original up to whitespace is the original;
  - planted, then the planted text rewritten (a token changed): reset refuses (exit 2) and changes nothing.
Exit 1 naming each failure.
"""
import importlib.machinery
import importlib.util
import json
import pathlib
import re
import shutil
import sys
import tempfile

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
loader = importlib.machinery.SourceFileLoader("exercise", str(root / "scripts/exercise"))
spec = importlib.util.spec_from_loader("exercise", loader)
exercise = importlib.util.module_from_spec(spec)
loader.exec_module(exercise)


def respaced(text, how):
    """`text` with its whitespace changed, its characters not."""
    if how == "doubled":
        return text.replace(" ", "  ")
    if how == "tight":  # no space next to punctuation
        return re.sub(r"[ \t]*([^\w\s])[ \t]*", r"\1", text)
    return re.sub(r"([(,])", r"\1\n    ", text, count=1)  # "broken": a line break


failures = []
bugs = json.loads((root / "exercises/catalogue.json").read_text())["bugs"]
for bug in bugs:
    with tempfile.TemporaryDirectory() as tmp:
        scratch = pathlib.Path(tmp)
        files = {p["file"] for p in bug["patch"]}
        for f in files:
            (scratch / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(root / f, scratch / f)
        original = {f: (scratch / f).read_text() for f in files}

        def plant():
            for f, text in original.items():
                (scratch / f).write_text(text)
            exercise.apply_patch(scratch, bug)

        def restored(case):
            for f, text in original.items():
                if (scratch / f).read_text() != text:
                    failures.append(f"{bug['id']}: {case}: reset left {f} different")

        plant()
        exercise.undo_patch(scratch, bug)
        restored("planted")
        for how in ("doubled", "tight", "broken"):
            plant()
            for p in bug["patch"]:
                path = scratch / p["file"]
                fixed = respaced(p["find"], how)
                path.write_text(path.read_text().replace(p["replace"], fixed, 1))
            exercise.undo_patch(scratch, bug)
            restored(f"a fix with {how} whitespace")
        plant()
        p = bug["patch"][0]
        path = scratch / p["file"]
        rewritten = re.sub(r"\w+", lambda m: m.group(0) + "_x", p["replace"], count=1)
        path.write_text(path.read_text().replace(p["replace"], rewritten, 1))
        before = path.read_text()
        try:
            exercise.undo_patch(scratch, bug)
            failures.append(f"{bug['id']}: reset accepted a rewritten line")
        except SystemExit as e:
            if e.code != 2 or path.read_text() != before:
                failures.append(f"{bug['id']}: reset of a rewritten line: exit {e.code}, file "
                                f"{'unchanged' if path.read_text() == before else 'changed'}")
for f in failures:
    print("FAILED:", f)
print(f"reset checked for {len(bugs)} bug hunts: {len(failures)} failures")
sys.exit(1 if failures else 0)
