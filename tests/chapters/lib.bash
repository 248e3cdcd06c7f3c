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

# Two runs that cannot be bitwise (another summation order somewhere) are compared twice, with
# criteria that hold on any CPU (their derivation: tests/chapters/ch02_vs_ch01.sh):
#  - the same two runs under SGD (no momentum, no weight decay: the update is lr·g, linear in
#    the gradient): ||Δparam||_2 <= 1e-4 · ||param - start||_2 and every loss within 1e-6;
#  - under AdamW: every element within AdamW's own bound 2·lr·Σ_t R_t (compare_runs.cpp).
sgd=(--optimizer sgd --weight-decay 0)

# start_point NAME ARGS...: the initial parameters of runs with ARGS (only --model,
# --hidden-sizes and --seed matter): one SGD step of lr 1e-30 moves no weight by over ~1e-30.
start_point() {
  local name=$1 keep=(); shift
  while [ $# -gt 0 ]; do
    case $1 in --model | --hidden-sizes | --seed) keep+=("$1" "$2"); shift 2 ;; *) shift ;; esac
  done
  run "$name" 0 ch01_training_loop "${keep[@]}" --global-batch-size 48 --epochs 1 \
    --eval-every-epoch 0 "${sgd[@]}" --max-steps 1 --lr 1e-30
}

# scaled_start NAME FACTOR ARGS...: start_point's initial parameters (of ARGS) times FACTOR, in
# $WORK/NAME.safetensors (for --init-from: e.g. weights large enough to overflow fp16).
scaled_start() {
  local name=$1 factor=$2; shift 2
  start_point "${name}_unscaled" "$@"
  python3 - "$WORK/${name}_unscaled.safetensors" "$WORK/$name.safetensors" "$factor" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
vals = struct.unpack(f"<{(len(b) - 8 - n) // 4}f", b[8 + n:])
f = float(sys.argv[3])
open(sys.argv[2], "wb").write(b[:8 + n] + struct.pack(f"<{len(vals)}f", *[v * f for v in vals]))
PY
}

# close A B START STEPS [LR]: runs A_sgd, B_sgd under SGD and A, B under AdamW (STEPS steps of
# lr LR, default 1e-3), all from the parameters in run START, are as close as rounding allows.
close() {
  local a=$1 b=$2 start=$3 steps=$4 lr=${5:-1e-3}
  same "${a}_sgd" "${b}_sgd" --start "$WORK/$start.safetensors" --rel-l2 1e-4 --loss-atol 1e-6
  adam_close "$a" "$b" "$steps" "$lr"
}

# adam_close A B STEPS [LR]: runs A and B are within AdamW's own bound, every element within
# 2·lr·Σ_t R_t after STEPS steps of lr LR, default 1e-3 (compare_runs --adam-bound): for two runs
# that sum in another order where close's SGD criterion is unavailable (16 bits need AdamW).
adam_close() {
  local a=$1 b=$2 steps=$3 lr=${4:-1e-3}
  echo "== $a vs $b (AdamW bound, $steps steps)"
  "$COMPARE" "$WORK/$a.safetensors" "$WORK/$b.safetensors" --adam-bound "$lr" --steps "$steps"
}

# chain_link A B N STEPS: the link between two chapters' runs at N ranks whose gradient sums
# differ only in association: bitwise at N = 1, 2 (one addition per element either way, and
# float addition is commutative), adam_close at N >= 3 (the sums associate and round differently).
chain_link() {
  local a=$1 b=$2 n=$3 steps=$4
  if [ "$n" -le 2 ]; then same "$a" "$b" --bitwise; else adam_close "$a" "$b" "$steps"; fi
}

# sent NAME: the bytes each rank of run NAME sent per optimizer step (its summary record's
# comm.training.bytes_sent over steps), space-separated in rank order. total NAME: their sum.
sent() {
  python3 -c '
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][-1]
print(" ".join(str(c["training"]["bytes_sent"] // s["steps"]) for c in s["comm"]))' "$WORK/$1.jsonl"
}
total() { local t=0; for b in $(sent "$1"); do t=$((t + b)); done; echo $t; }

# expect_eq GOT WANT WHAT: GOT equals WANT (as strings), or the test fails naming WHAT.
expect_eq() { if [ "$1" != "$2" ]; then echo "FAILED: $3: $1 != $2"; exit 1; fi; echo "ok: $3 ($1)"; }

# check_summaries <<'PY' ... PY: runs the Python program on stdin with json and sys imported,
# W = $WORK and summary(NAME) = run NAME's last summary record (its --metrics file); an assert
# that fails fails the test.
check_summaries() {
  local program
  program=$(cat)
  python3 - "$WORK" <<PY
import json, sys
W = sys.argv[1]
def summary(name):
    return [json.loads(l) for l in open(f"{W}/{name}.jsonl") if '"summary"' in l][-1]
$program
PY
}

# fails NAME NP BINARY PATTERN ARGS... : a chapter run (under mpirun when NP > 0) must exit
# non-zero within RUN_TIMEOUT (124, a hang, fails too) and its output must contain PATTERN
# (grep -E).
# fails NAME TEXT... -- COMMAND... : any command line (e.g. mpirun with two app contexts, one
# per --data-dir) must exit with a code 1..123 within RUN_TIMEOUT (0: it ran on; 124: a hang;
# above: a signal or a command that could not run) and its output must contain every TEXT
# (grep -F: the words of the message, verbatim).
fails() {
  local name=$1 rc=0 mode=-E signals_fail=0 cmd=() texts=()
  shift
  if [[ $# -ge 3 && $1 =~ ^[0-9]+$ && -x $BIN/$2 ]]; then
    local np=$1 binary=$2
    texts=("$3")
    shift 3
    cmd=("$BIN/$binary" --log-every 1000 "$@")
    if [ "$np" -gt 0 ]; then cmd=("$MPIRUN" -np "$np" --oversubscribe "${cmd[@]}"); fi
  else
    mode=-F signals_fail=1
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do texts+=("$1"); shift; done
    if [ $# -lt 2 ] || [ ${#texts[@]} -eq 0 ]; then
      echo "FAILED $name: fails NAME TEXT... -- COMMAND... needs a TEXT and a COMMAND"; exit 1
    fi
    shift
    cmd=("$@")
  fi
  timeout "${RUN_TIMEOUT:-120}" "${cmd[@]}" >"$WORK/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || { [ "$rc" -gt 124 ] && [ "$signals_fail" = 1 ]; }; then
    echo "FAILED $name: expected an error, got exit $rc (0: ran on; 124: hang; >124: signal):" \
      "${cmd[*]}"
    cat "$WORK/$name.log"; exit 1
  fi
  local text
  for text in "${texts[@]}"; do
    if ! grep -q "$mode" -- "$text" "$WORK/$name.log"; then
      echo "FAILED $name: no '$text' in the output (exit $rc) of ${cmd[*]}"; cat "$WORK/$name.log"
      exit 1
    fi
  done
  local first
  first=$(grep "$mode" -m1 -- "${texts[0]}" "$WORK/$name.log" | cut -c1-220)
  echo "ok: $name refused (exit $rc): $first"
}

# same_tail FULL RESUMED : the resumed run's step records (step, epoch, loss) equal, exactly,
# those of the uninterrupted run from the resumed run's first step on; nothing skipped or
# repeated (the resumed run logs every step up to the end of the uninterrupted one).
same_tail() {
  python3 - "$WORK/$1.jsonl" "$WORK/$2.jsonl" <<'PY'
import json, sys
def steps(p):
    return [(j["step"], j["epoch"], j["loss"]) for j in map(json.loads, open(p)) if j["type"] == "step"]
full, res = steps(sys.argv[1]), steps(sys.argv[2])
assert res, "the resumed run logged no step"
first = res[0][0]
tail = [s for s in full if s[0] >= first]
assert tail == res, f"resumed from step {first}: {res[:3]}... vs {tail[:3]}..."
print(f"ok: steps {first}..{res[-1][0]} equal (epochs {sorted(set(s[1] for s in res))})")
PY
}

# stops NAME NP BINARY PATTERN ARGS...: a run that must stop. Every rank must exit within 10 s
# with a code 1..123 (0: it trained on; 124: a hang; above 128: a signal), no rank may die of a
# signal, and the output must match PATTERN (grep -E). Prints how long it took and the first
# match of $STOPS_SHOW (default: PATTERN).
stops() {
  local name=$1 np=$2 binary=$3 pattern=$4 rc=0; shift 4
  local start=$(date +%s%N)
  timeout 60 "$MPIRUN" -np "$np" --oversubscribe "$BIN/$binary" "$@" >"$WORK/$name.log" 2>&1 || rc=$?
  local ms=$(( ($(date +%s%N) - start) / 1000000 ))
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
    echo "FAILED $name: exit $rc (0: trained on; 124: hang; >128: signal)"; cat "$WORK/$name.log"; exit 1
  fi
  if grep -qiE "segmentation fault|signal (11|6|7|8)([^0-9]|$)|SIGSEGV|MPI_ERR_TRUNCATE|core dumped" "$WORK/$name.log"; then
    echo "FAILED $name: a rank crashed"; cat "$WORK/$name.log"; exit 1
  fi
  if ! grep -qE -- "$pattern" "$WORK/$name.log"; then
    echo "FAILED $name: no '$pattern'"; cat "$WORK/$name.log"; exit 1
  fi
  if [ "$ms" -gt 10000 ]; then echo "FAILED $name: took $ms ms to stop (limit 10 s)"; exit 1; fi
  echo "ok $name: stopped in $ms ms: $(grep -E -m1 -o -- "${STOPS_SHOW:-$pattern}" "$WORK/$name.log" | tail -c 230)"
}

# reseal_manifest FILE...: recomputes each checkpoint manifest's own CRC-32 (its field
# manifest_crc32, 8 hex digits: the CRC-32 of the text with those digits as 00000000), as a tool
# that edits a manifest on purpose must; a test that edits one to reach a check behind the seal
# calls it after the edit.
reseal_manifest() {
  python3 - "$@" <<'PY'
import re, sys, zlib
for path in sys.argv[1:]:
    text = open(path, encoding="utf-8").read()
    key = re.compile(r'("manifest_crc32"\s*:\s*")([0-9a-fA-F]{8})(")')
    assert len(key.findall(text)) == 1, f"{path}: no single manifest_crc32 field"
    zeroed = key.sub(lambda m: m.group(1) + "00000000" + m.group(3), text)
    crc = "%08x" % zlib.crc32(zeroed.encode("utf-8"))
    open(path, "w", encoding="utf-8").write(key.sub(lambda m: m.group(1) + crc + m.group(3), text))
PY
}
