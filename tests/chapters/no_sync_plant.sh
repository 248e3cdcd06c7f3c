#!/usr/bin/env bash
# The planted cause "accumulation without no_sync" (scripts/bench.d/no_sync.patch, run by
# scripts/bench.d/11-attribution.sh as nosync) has not rotted: the bench only ever applies it to a
# scratch copy, so nothing else would notice when chapter 05 moves under it.
#  - it applies cleanly (git apply --check: every hunk's context, no fuzz) to chapter 05's
#    step.hpp as it is in this tree (the working tree, which is what the bench copies);
#  - the planted train_step is the intended mistake and nothing else: set_require_sync(true) on
#    every micro-step, finalize_backward() right after each micro-step's tape.backward(...) inside
#    the loop, none after it; compared as code (comments and spacing left out), the only lines
#    removed are the no_sync line and the finalize after the loop, the only lines added their two
#    replacements.
# No tolerance: both checks are exact. No run: that the planted chapter sends K times the bytes
# per step needs a second build of chapter 05 (minutes on 2 cores); the bench checks it, per rank
# and exactly, every time it plants the cause.
source "$(dirname "$0")/lib.bash"
SRC=${SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
PATCH=$SRC/scripts/bench.d/no_sync.patch
STEP=chapters/05_ddp_buckets/step.hpp
command -v git >/dev/null || { echo "skipped: no git to apply $PATCH"; exit 77; }

mkdir -p "$WORK/plant/$(dirname "$STEP")"
cp "$SRC/$STEP" "$WORK/plant/$STEP"
# Outside any repository (a $TMPDIR inside one would make git apply take paths from its top).
export GIT_CEILING_DIRECTORIES=$WORK
git -C "$WORK/plant" apply --check "$PATCH" || {
  echo "FAILED: $PATCH no longer applies to $STEP; remake it against the chapter as it is now (or, if a bug hunt changed $STEP, undo it: scripts/exercise reset ID)"; exit 1; }
git -C "$WORK/plant" apply "$PATCH"
echo "ok: $PATCH applies to $STEP"

python3 - "$SRC/$STEP" "$WORK/plant/$STEP" <<'PY'
import difflib, re, sys
def code(path):  # the lines of code, each without its comment and spacing
    lines = [re.sub(r"\s+", " ", l.split("//")[0]).strip() for l in open(path)]
    return [l for l in lines if l]
clean, planted = code(sys.argv[1]), code(sys.argv[2])
removed, added = [], []
for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, clean, planted, autojunk=False).get_opcodes():
    removed += clean[i1:i2] if op != "equal" else []
    added += planted[j1:j2] if op != "equal" else []
want_removed = ["engine.set_require_sync(micro_step == K - 1);", "engine.finalize_backward();"]
want_added = ["engine.set_require_sync(true);", "engine.finalize_backward();"]
assert sorted(removed) == sorted(want_removed) and sorted(added) == sorted(want_added), (removed, added)

def block_end(first):  # the line that closes the block opened on line `first`
    depth = 0
    for i in range(first, len(planted)):
        depth += planted[i].count("{") - planted[i].count("}")
        if depth == 0:
            return i
    raise AssertionError(f"no end to the block of {planted[first]!r}")
# The planted train_step, its micro-step loop, and what follows the loop.
fn = next(i for i, l in enumerate(planted) if l.startswith("inline double train_step("))
head = next(i for i in range(fn, len(planted)) if planted[i].startswith("for (int64_t micro_step"))
end = block_end(head)
loop, after = planted[head:end + 1], planted[end + 1:block_end(fn) + 1]
backward = next(i for i, l in enumerate(loop) if l.startswith("tape.backward("))
assert "engine.set_require_sync(true);" in loop[:backward], loop
assert loop[backward + 1] == "engine.finalize_backward();", ("finalize right after backward", loop)
assert not any("finalize_backward" in l for l in after), ("no finalize after the loop", after)
assert not any("set_require_sync" in l for l in planted if l != "engine.set_require_sync(true);"), planted
print("ok: the plant is set_require_sync(true) on every micro-step and finalize_backward() after "
      "each micro-step's backward, none after the loop; no other line of code changed")
PY
