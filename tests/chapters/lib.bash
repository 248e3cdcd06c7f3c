# Shared helpers for the chapter tests (sourced). ctest sets BIN, COMPARE, SRC, MPIRUN.
set -euo pipefail
: "${BIN:?set BIN to the directory of the chapter binaries, or run through ctest}"
MPIRUN=${MPIRUN:-mpirun}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# run NAME NP BINARY ARGS... : runs a chapter (under mpirun when NP > 0), writes
# $WORK/NAME.safetensors and $WORK/NAME.jsonl, and keeps its output in $WORK/NAME.log.
run() {
  local name=$1 np=$2 binary=$3; shift 3
  local cmd=("$BIN/$binary" --save-final "$WORK/$name.safetensors" --metrics "$WORK/$name.jsonl" --log-every 1000 "$@")
  if [ "$np" -gt 0 ]; then cmd=("$MPIRUN" -np "$np" --oversubscribe "${cmd[@]}"); fi
  # A hang fails this run within RUN_TIMEOUT seconds, not at ctest's whole-script limit.
  cmd=(timeout "${RUN_TIMEOUT:-300}" "${cmd[@]}")
  if ! "${cmd[@]}" >"$WORK/$name.log" 2>&1; then
    echo "FAILED: ${cmd[*]}"; cat "$WORK/$name.log"; exit 1
  fi
}

# same A B [compare_runs flags...] : compares two runs' final parameters and loss histories.
same() {
  local a=$1 b=$2; shift 2
  echo "== $a vs $b ($*)"
  "$COMPARE" "$WORK/$a.safetensors" "$WORK/$b.safetensors" "$WORK/$a.jsonl" "$WORK/$b.jsonl" "$@"
}
