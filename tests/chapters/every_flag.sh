#!/usr/bin/env bash
# Every flag that a distributed chapter's --help lists, changed on one rank only (issue 9,
# item 2): an MPMD launch `mpirun -np 1 BIN ARGS : -np 1 BIN ARGS --flag OTHER` must stop both
# ranks (exit 1..123: no hang, no signal) with a message naming that flag, or the flag is in the
# list below, whose reasons docs/design.md ("Every rank checks every other rank's flags")
# gives; each listed flag has its own expected outcome here:
#   seed                  the start-up parameter check: "initial parameters different"
#   init-from             read on every rank; a missing file on rank 1 stops it naming the flag
#   data-dir              verify_same_data compares what was loaded, so a directory holding the
#                         same files may differ (rank 1 here: a copy of rank 0's, same run)
#   bucket-cap-mb         the bucket-plan check: "bucket plans differ" (05-07; a cap that gives
#   first-bucket-cap-mb     the same plan computes the same thing)
#   help                  rank 1 prints --help and stops; rank 0 stops too ("--help")
#   trace-steps           without --trace (rank 1 alone): a flag error there, "requires --trace"
# The flag list is read from --help, so a flag added later is tested without a line here; a
# flag whose value the script cannot derive from --help fails the test, naming it.
# Default: chapter 05 (~45 flags, ~1 min on 2 cores). EVERY_FLAG_CHAPTERS="ch03_data_parallel
# ch04_ring_allreduce ..." picks others; EVERY_FLAG_ALL=1 runs chapters 03-08 (~6 min).
source "$(dirname "$0")/lib.bash"
chapters=${EVERY_FLAG_CHAPTERS:-ch05_ddp_buckets}
if [ "${EVERY_FLAG_ALL:-0}" = 1 ]; then
  chapters="ch03_data_parallel ch04_ring_allreduce ch05_ddp_buckets ch06_zero1 ch07_zero2 ch08_zero3"
fi
mkdir -p "$WORK/data_copy"
DATA=${DATA_DIR:-/usr/share/datasets/fashion-mnist}
if [ -d "$DATA" ]; then cp "$DATA"/*.gz "$WORK/data_copy/" 2>/dev/null || true; fi

for chapter in $chapters; do
  RINGZERO_CHECK_COLLECTIVES= timeout 30 "$MPIRUN" -np 1 "$BIN/$chapter" --help >"$WORK/$chapter.help" 2>&1
  python3 - "$chapter" "$WORK" "$MPIRUN" "$BIN" "$DATA" <<'PY'
import os, re, subprocess, sys, time
chapter, work, mpirun, bindir, data = sys.argv[1:6]
help_text = open(f"{work}/{chapter}.help").read()
base = ["--model", "toy", "--hidden-sizes", "8", "--max-steps", "2", "--eval-every-epoch", "0",
        "--global-batch-size", "8", "--log-every", "1000"]
# Values no rule below derives (a list, a path that must exist for the run to mean anything).
override = {"hidden-sizes": ["8,4"], "bucket-cap-mb": ["0.0001"], "first-bucket-cap-mb": ["0.0001"],
            "init-from": [f"{work}/no_such_file.safetensors"], "data-dir": [f"{work}/data_copy"],
            "resume": [f"{work}/no_such_checkpoint"]}
expect = {  # flag -> (must the run stop?, pattern in its output)
    "seed": (True, r"initial parameters different"),
    "init-from": (True, r"init-from"),
    "data-dir": (False, None),
    "bucket-cap-mb": (True, r"bucket plans differ"),
    "first-bucket-cap-mb": (True, r"bucket plans differ"),
    "help": (True, r"--help"),
    "trace-steps": (True, r"--trace-steps requires --trace"),  # alone on rank 1: a flag error
}
flags = []  # (name, type or None for a switch, default or None), from CLI11's "--name TYPE=default"
for line in help_text.splitlines():
    m = re.match(r"^\s+(?:-\w,)?--([a-z0-9][a-z0-9-]*)(.*)$", line)
    if not m:
        continue
    rest = m.group(2)
    spec = "" if rest.startswith("  ") else re.split(r"\s{2,}", rest.strip())[0]  # then: description
    if spec == "" or spec.startswith("(Env"):
        flags.append((m.group(1), None, None))
        continue
    kind, _, default = spec.partition("=") if not spec.startswith("TEXT:{") else (
        spec.split("}")[0] + "}", "", spec.split("}", 1)[1].lstrip("="))
    flags.append((m.group(1), kind, default.split(" ")[0] if default else None))
assert len(flags) > 20, f"{chapter} --help: only {len(flags)} flags parsed:\n{help_text}"

def other_value(name, kind, default):
    if name in override:
        return override[name]
    if kind is None:  # a switch: present on rank 1 only
        return []
    choices = re.search(r"\{(.*?)\}", kind)
    if choices:
        opts = [c for c in choices.group(1).split(",") if c != default]
        return [opts[0]]
    if kind.startswith(("INT", "UINT")):
        d = int(float(default)) if default not in (None, "") else 0
        return [str(d + 1 if d >= 0 else 3)]
    if kind.startswith("FLOAT"):
        d = float(default) if default not in (None, "") else 0.0
        return [repr(d * 2 if d > 0 else 0.5)]
    if kind.startswith("TEXT") or kind.startswith("INT=[]"):  # a path or a name
        if kind.startswith("INT"):
            raise SystemExit(f"FAILED: {chapter} --{name}: a list needs an override")
        return [f"{work}/other_{name}"]
    raise SystemExit(f"FAILED: {chapter} --{name}: no rule for a value of type {kind!r}")

# The test suite turns --check-collectives on through the environment: off here, so that the
# flag on rank 1 alone is a difference like any other.
env = {k: v for k, v in os.environ.items() if k != "RINGZERO_CHECK_COLLECTIVES"}
failed, checked, t0 = [], 0, time.time()
for name, kind, default in flags:
    # Rank 0 runs `base`; rank 1 the same with this flag set to another value than rank 0's
    # (base's value where base sets the flag, else the default --help shows).
    flag = f"--{name}"
    effective = base[base.index(flag) + 1] if flag in base else default
    value = other_value(name, kind, effective)
    stop, pattern = expect.get(name, (True, rf"rank 1 has {re.escape(name)}="))
    other = list(base)
    if flag in base and value:
        other[base.index(flag) + 1] = value[0]
    else:
        other += [flag, *value]
    cmd = [mpirun, "-np", "1", f"{bindir}/{chapter}", *base, ":", "-np", "1",
           f"{bindir}/{chapter}", *other]
    start = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = str(e.stdout or "") + str(e.stderr or ""), 124
    secs = time.time() - start
    checked += 1
    if stop:
        ok = 0 < rc < 124 and re.search(pattern, out) and not re.search(r"signal (11|6|7|8) |Segmentation|SIGSEGV", out)
    else:
        ok = rc == 0
    verdict = "ok" if ok else "FAILED"
    first = next((l for l in out.splitlines() if pattern and re.search(pattern, l)), "")
    print(f"{verdict} {chapter} --{name} {' '.join(value)}: exit {rc} in {secs:.1f}s; {first.strip()[:160]}")
    if not ok:
        failed.append(name)
        print(out[-3000:])
print(f"{chapter}: {checked} flags in {time.time() - t0:.0f}s, {len(failed)} failed {failed}")
sys.exit(1 if failed else 0)
PY
done
