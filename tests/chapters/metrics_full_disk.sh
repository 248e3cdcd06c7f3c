#!/usr/bin/env bash
# --metrics on a full disk (issue 9): the JSON-lines file is streamed (read while the run trains;
# common/io/atomic_file.hpp says why it is not renamed into place like the other outputs), so what
# must hold is that a failed write leaves a VALID PREFIX: whole records only, every line JSON,
# and the run stops at once with a message naming --metrics and the records kept (not killed by
# SIGXFSZ, not a cut last line). A file-size limit (ulimit -f 8: 8 KiB) stands in for the full
# disk. Chapter 01 (one process): under mpirun the limit would also stop Open MPI's own
# shared-memory files; the writer is the same StepLogger in every chapter.
source "$(dirname "$0")/lib.bash"
small=(--model toy --hidden-sizes 8 --global-batch-size 8 --max-steps 400 --eval-every-epoch 0 --log-every 1000)

check() {  # check NAME RC: the run failed with the message, the file is a valid prefix
  local name=$1 rc=$2
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
    echo "FAILED $name: exit $rc (0: the limit was not reached; >128: killed by a signal)"
    cat "$WORK/$name.log"; exit 1
  fi
  grep -qE "writing --metrics $WORK/$name.jsonl failed at record [0-9]+ \(File too large \(disk full or file size limit\?\)\); the file keeps the [0-9]+ whole records before it" "$WORK/$name.log" ||
    { echo "FAILED $name: no --metrics message"; cat "$WORK/$name.log"; exit 1; }
  python3 - "$WORK/$name.jsonl" "$WORK/$name.log" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
kept = int(re.search(r"keeps the (\d+) whole records", open(sys.argv[2]).read()).group(1))
assert text.endswith("\n"), "the last record is cut: " + repr(text[-80:])
records = [json.loads(line) for line in text.splitlines()]
assert len(records) == kept > 10, (len(records), kept)
assert all(r["type"] == "step" for r in records) and [r["step"] for r in records] == list(range(1, kept + 1))
print(f"ok: {sys.argv[1].split('/')[-1]}: {kept} whole records, {len(text)} bytes, every line JSON")
PY
}

rc=0
timeout 60 bash -c 'ulimit -f 8; exec "$@"' limit "$BIN/ch01_training_loop" "${small[@]}" \
  --metrics "$WORK/ch01.jsonl" >"$WORK/ch01.log" 2>&1 || rc=$?
check ch01 "$rc"
