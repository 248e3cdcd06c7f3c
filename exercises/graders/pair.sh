#!/usr/bin/env bash
# Grader helper: runs two chapters on the same flags under mpirun and compares their final
# parameters and losses with tests/compare_runs (the equivalence chain's own tool).
#   pair.sh NP CHAPTER_A CHAPTER_B COMPARE_FLAGS... -- CHAPTER_FLAGS... [--b B_ONLY_FLAGS...]
# e.g. pair.sh 3 ch04_ring_allreduce ch05_ddp_buckets --bitwise -- --model toy --max-steps 6
# Prints where they differ (compare_runs names the tensor and the largest difference) and
# which invariant that breaks. Needs BIN, COMPARE, MPIRUN (scripts/exercise sets them).
set -euo pipefail
: "${BIN:?}" "${COMPARE:?}"
np=$1 a=$2 b=$3
shift 3
flags=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags="$flags $1"; shift; done
shift  # the --
common=() b_only=()
while [ $# -gt 0 ] && [ "$1" != "--b" ]; do common+=("$1"); shift; done
if [ $# -gt 0 ]; then shift; b_only=("$@"); fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for which in "$a" "$b"; do
  extra=()
  if [ "$which" = "$b" ]; then extra=("${b_only[@]}"); fi
  if ! timeout 60 "${MPIRUN:-mpirun}" -np "$np" --oversubscribe "$BIN/$which" "${common[@]}" "${extra[@]}" \
      --save-final "$WORK/$which.safetensors" --metrics "$WORK/$which.jsonl" --log-every 1000 \
      >"$WORK/$which.log" 2>&1; then
    echo "N = $np: $which stopped (or hung for 60 s):"
    grep -m3 -E "\[rank|rror|expected|not expected" "$WORK/$which.log" || tail -4 "$WORK/$which.log"
    exit 1
  fi
done
# shellcheck disable=SC2086
if out=$("$COMPARE" "$WORK/$a.safetensors" "$WORK/$b.safetensors" "$WORK/$a.jsonl" \
         "$WORK/$b.jsonl" $flags 2>&1); then
  echo "N = $np: $b takes $a's steps ($flags): $(echo "$out" | head -1)"
else
  echo "N = $np: $b does NOT take $a's steps ($flags). compare_runs:"
  echo "$out" | head -6
  echo "  invariant: every rank ends each step with the same parameters as the previous chapter."
  exit 1
fi
