#!/usr/bin/env python3
"""Runs every marked "Run it" command of the READMEs and compares its output with the README.

The READMEs say what a command prints; this test keeps them true. A README marks a pair like
this (the HTML comments do not show when the Markdown is rendered):

    <!-- readme-test: command -->
    ```bash
    mpirun -np 4 --oversubscribe build/bin/ch03_data_parallel --epochs 1 --max-steps 200
    ```
    (any prose)
    <!-- readme-test: output -->
    ```
    ...exactly what the command prints on stdout...
    ```

Each command marker must be followed by exactly one output marker before the next command
marker; each marker by a fenced block (blank lines between are allowed). The command block holds
one shell command (a trailing `# comment` is allowed, `\\` continues a line). It runs as written,
with two substitutions so that the test uses the build being tested: a leading `build/bin/` of a
word becomes $BIN/ and a leading `mpirun` becomes $MPIRUN. It runs in a scratch directory, so
files it writes do not land in the source tree.

What is compared: the command's stdout, line by line, with the block, after masking the fields
that depend on the machine and its load (and on nothing else; every other number in the
chapters' output repeats bit for bit from run to run on one machine, and is compared):
  - `12345 samples/s` (throughput)        - `12.3 ms/step` and any other `12.3 ms` (time)
The command must also exit 0. Before anything runs, every digit of every block is changed in turn
to check the masks: a change outside the masked fields must be noticed, one inside must not (so a
mask that grew to swallow a loss fails here); each command's line reports how many digits it
compares.

The blocks were recorded on the development machine (AMD EPYC, AVX2 and FMA, no AVX-512, L1d
32 KiB, L2 1 MiB, L3 32 MiB; the release preset compiles with -march=native). Eigen's matrix
products add in an order set by the vector width and by blocks sized from the caches at run
time, so on another CPU the losses agree only to rounding and drift apart over hundreds of Adam
steps (README.md, "Expected output"). There the test exits 77 (ctest: skipped) and says why,
unless README_COMMANDS_ANY_CPU=1 asks to compare anyway.

Usage:
  readme_commands.py [--update] [--list] README.md [README.md ...]
      --list     print the marked commands and exit (nothing is run)
      --update   write each command's actual output into its README block (then review the diff)
Environment: SRC (repository root, default: two levels above this file), BIN (default
$SRC/build/bin), MPIRUN (default mpirun), README_COMMAND_TIMEOUT (seconds per command, 600).
Exit: 0 all equal, 1 a difference or a failed command, 2 a README's markup is wrong, 77 skipped
(another CPU's vector features, see above).
"""

import difflib
import os
import re
import subprocess
import sys
import tempfile
import time

COMMAND_MARK = "<!-- readme-test: command -->"
OUTPUT_MARK = "<!-- readme-test: output -->"

# (pattern, replacement): the machine-dependent fields. Keep this list short: every mask is a
# number the test no longer checks.
MASKS = [
    (re.compile(r"\b\d+ samples/s\b"), "<N> samples/s"),
    (re.compile(r"\b\d+(\.\d+)? ms\b"), "<T> ms"),
]


# What sets the order in which Eigen's matrix products add: the vector features (packet width,
# FMA), as /proc/cpuinfo names them, and the cache sizes (Eigen cuts the inner dimension into
# blocks sized from them at run time). The README blocks were recorded with these.
SIMD_FEATURES = ("avx", "avx2", "fma", "avx512f")
RECORDED_CPU = {"simd": "avx avx2 fma", "L1d": "32K", "L2": "1024K", "L3": "32768K"}


def cpu_signature():
    """This CPU's RECORDED_CPU fields; a field reads "?" where Linux does not tell."""
    sig = {"simd": "?", "L1d": "?", "L2": "?", "L3": "?"}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    sig["simd"] = " ".join(x for x in SIMD_FEATURES if x in have)
                    break
    except OSError:
        pass
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            def read(name):
                with open(os.path.join(base, index, name), encoding="utf-8") as f:
                    return f.read().strip()
            level, kind = read("level"), read("type")
            if kind in ("Data", "Unified"):
                sig["L" + level + ("d" if kind == "Data" else "")] = read("size")
    except OSError:
        pass
    return sig


def mask(text):
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


def normalise(text):
    """Masked, trailing spaces dropped, trailing empty lines dropped: a list of lines."""
    lines = [line.rstrip() for line in mask(text).split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


class MarkupError(Exception):
    pass


def fenced_block_after(lines, i, path):
    """The fenced block that starts at the first non-blank line after line i: (first, last, body).

    first is the index of the opening fence, last that of the closing fence."""
    j = i + 1
    while j < len(lines) and not lines[j].strip():
        j += 1
    if j >= len(lines) or not lines[j].startswith("```"):
        raise MarkupError(f"{path}:{i + 1}: the marker must be followed by a fenced block (```)")
    k = j + 1
    while k < len(lines) and lines[k].rstrip() != "```":
        k += 1
    if k >= len(lines):
        raise MarkupError(f"{path}:{j + 1}: fenced block never closed")
    return j, k, lines[j + 1 : k]


def parse(path):
    """The marked (command, output) pairs of one README, in order."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    pairs, pending = [], None
    for i, line in enumerate(lines):
        mark = line.strip()
        if mark == COMMAND_MARK:
            if pending:
                raise MarkupError(
                    f"{path}:{pending['line']}: command marker without an output marker before "
                    f"the next command marker (line {i + 1})")
            first, last, body = fenced_block_after(lines, i, path)
            joined = " ".join(l.rstrip().rstrip("\\").strip() for l in body if l.strip())
            command = re.sub(r"\s+#\s.*$", "", joined).strip()  # a trailing comment
            if not command:
                raise MarkupError(f"{path}:{first + 1}: empty command block")
            pending = {"line": i + 1, "command": command}
        elif mark == OUTPUT_MARK:
            if not pending:
                raise MarkupError(f"{path}:{i + 1}: output marker without a command marker before it")
            first, last, body = fenced_block_after(lines, i, path)
            pending.update(out_first=first, out_last=last, expected="\n".join(body))
            pairs.append(pending)
            pending = None
    if pending:
        raise MarkupError(f"{path}:{pending['line']}: command marker without an output marker")
    return pairs


def check_run_it_sections(path, pairs):
    """A chapter README's "## Run it" section must hold at least one marked command."""
    if os.path.basename(os.path.dirname(os.path.abspath(path)))[:2].isdigit():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        m = re.search(r"^## Run it\n(.*?)(?=^## |\Z)", text, re.S | re.M)
        if not m:
            raise MarkupError(f"{path}: no '## Run it' section")
        if COMMAND_MARK not in m.group(1):
            raise MarkupError(f"{path}: its '## Run it' section has no {COMMAND_MARK} command")


def substitute(command, bin_dir, mpirun):
    command = re.sub(r"(?<![\w/.-])build/bin/", bin_dir.rstrip("/") + "/", command)
    return re.sub(r"^mpirun(?=\s)", mpirun, command)


def digits_checked(expected):
    """(compared, masked): how many digits of a block the comparison checks and how many it masks.

    Raises AssertionError naming the line if changing a digit outside the masked fields would not
    be noticed (a mask too broad), or changing one inside them would (a mask too narrow)."""
    compared = masked = 0
    for n, line in enumerate(expected.split("\n")):
        spans = [m.span() for pattern, _ in MASKS for m in pattern.finditer(line)]
        for i, ch in enumerate(line):
            if not ch.isdigit():
                continue
            changed = line[:i] + ("1" if ch != "1" else "2") + line[i + 1 :]
            inside = any(a <= i < b for a, b in spans)
            same = mask(changed).rstrip() == mask(line).rstrip()
            if inside != same:
                raise AssertionError(f"line {n + 1} of the block, column {i + 1}: changing its "
                                     f"digit is {'not ' if not same else ''}noticed although it is "
                                     f"{'inside' if inside else 'outside'} a masked field: {line!r}")
            compared += not inside
            masked += inside
    return compared, masked


def run_pair(path, pair, env, timeout, scratch):
    command = substitute(pair["command"], env["BIN"], env["MPIRUN"])
    start = time.monotonic()
    try:
        proc = subprocess.run(["bash", "-c", command], cwd=scratch, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"did not finish within {timeout} s (README_COMMAND_TIMEOUT)", timeout
    secs = time.monotonic() - start
    if proc.returncode != 0:
        return proc.stdout, (f"exit status {proc.returncode}\n--- stderr ---\n{proc.stderr}"
                             f"\n--- stdout ---\n{proc.stdout}"), secs
    return proc.stdout, None, secs


def compare(path, pair, actual):
    """Empty list if equal after masking, else the diff lines (README line numbers)."""
    want, got = normalise(pair["expected"]), normalise(actual)
    if want == got:
        return []
    first = pair["out_first"] + 2  # README line of the block's first line
    return list(difflib.unified_diff(want, got, f"{path} (block from line {first})",
                                     "actual output (masked)", lineterm="", n=2))


def update(path, pairs_actual):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for pair, actual in reversed(pairs_actual):
        body = [l.rstrip() for l in actual.rstrip("\n").split("\n")]
        lines[pair["out_first"] + 1 : pair["out_last"]] = body
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    flags = {a for a in argv[1:] if a.startswith("--")}
    unknown = flags - {"--update", "--list"}
    if unknown or not args:
        print(__doc__)
        return 2
    src = os.environ.get("SRC") or os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    env = dict(os.environ)
    env.setdefault("BIN", os.path.join(src, "build", "bin"))
    env.setdefault("MPIRUN", "mpirun")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    timeout = int(env.get("README_COMMAND_TIMEOUT", "600"))

    parsed = []
    try:
        for path in args:
            full = path if os.path.isabs(path) else os.path.join(src, path)
            pairs = parse(full)
            check_run_it_sections(full, pairs)
            if not pairs:
                raise MarkupError(f"{path}: no {COMMAND_MARK} in it")
            for p in pairs:
                try:
                    p["compared"], p["masked"] = digits_checked(p["expected"])
                except AssertionError as e:
                    raise MarkupError(f"{path}:{p['out_first'] + 2}: masking: {e}")
            parsed.append((path, full, pairs))
    except MarkupError as e:
        print(f"README markup: {e}")
        return 2
    cpu = cpu_signature()
    if cpu != RECORDED_CPU and "--update" not in flags and "--list" not in flags \
            and not env.get("README_COMMANDS_ANY_CPU"):
        print(f"skipped: the README outputs were recorded on a CPU with {RECORDED_CPU}; this one "
              f"has {cpu}, so Eigen's products may add in another order and the losses differ "
              f"from some step on. README_COMMANDS_ANY_CPU=1 compares anyway.")
        return 77
    if "--list" in flags:
        for path, _, pairs in parsed:
            for p in pairs:
                print(f"{path}:{p['line']}: {p['command']}")
        return 0

    failures = 0
    total_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="readme_commands.") as scratch:
        for path, full, pairs in parsed:
            results = []
            for pair in pairs:
                actual, error, secs = run_pair(path, pair, env, timeout, scratch)
                where = f"{path}:{pair['line']}"
                if error:
                    failures += 1
                    print(f"FAIL {where} ({secs:.1f} s): {pair['command']}\n  {error}")
                    continue
                results.append((pair, actual))
                diff = compare(path, pair, actual)
                if diff and "--update" not in flags:
                    failures += 1
                    print(f"FAIL {where} ({secs:.1f} s): {pair['command']}\n  the output differs "
                          f"from the README's block (masked: samples/s, ms). To accept the new "
                          f"output, run this script with --update and review the diff.")
                    print("\n".join("  " + d for d in diff))
                    continue
                print(f"ok   {where} ({secs:.1f} s, {pair['compared']} digits compared, "
                      f"{pair['masked']} masked): {pair['command']}"
                      + ("  [updated]" if diff else ""), flush=True)
            if "--update" in flags and results:
                update(full, results)
    print(f"{sum(len(p) for _, _, p in parsed)} commands, {failures} failed, "
          f"{time.monotonic() - total_start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
