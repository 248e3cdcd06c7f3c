#!/usr/bin/env bash
# The trace scripts (scripts/trace_overlap.py, scripts/render_trace.py, both reading through
# scripts/trace_events.py) on hand-made traces, no chapter run:
#  - trace_overlap.py's numbers on a trace whose answer is known: rank 0's communication
#    [50, 150] µs beside a backward [0, 100] (50 of 100 µs hidden: 0.5); rank 1's [0, 40] beside
#    a forward [0, 40] that holds a wait [20, 30] for the queue (the wait is not compute: 30 of 40
#    µs hidden, 0.75); rank 2 (one traced step, [0, 100]): jobs "all_gather 1" [0, 30],
#    "all_gather 2" [30, 40] and "all_gather 3" [80, 90] beside no compute (50 µs busy, 0
#    hidden); its main thread waits for all_gather 1 over [10, 45] (20 µs while a job ran, 15
#    after all_gather 1 ended: matched by name, not the 5 after the later job), for collectives
#    over [60, 70] (all 10 after the last job ended) and for all_gather 3 over [75, 95] (5 µs
#    with the comm thread idle, 10 while it ran, 5 after): 65 µs of waits, 30 while a job ran,
#    5 with the comm thread idle, 30 after the jobs were done.
#    The same spans on the GPU's tracks (tids 2, 3) with --gpu, which has no waits split (a GPU
#    stream's idle gap is no thread's wake-up). Tolerance 1e-12: the script sums whole
#    microseconds in floats and divides by 1e3;
#  - every bad input refused by both scripts with exit status 1, the reason named, no traceback:
#    a missing file, a directory, a FIFO, bad JSON, JSON that is not a trace, a span whose tid is
#    a boolean, a NaN, infinite or 401-digit timestamp, one whose end overflows, a negative
#    duration, JSON nested 100,000 deep, a trace with no spans;
#  - render_trace.py draws the known trace to a non-empty PNG.
# render_trace.py needs matplotlib (Debian's python3-matplotlib, which scripts/setup installs for
# /usr/bin/python3); without it only trace_overlap.py is checked, and the test says so.
source "$(dirname "$0")/lib.bash"
SRC=${SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$WORK"  # the scripts find trace_events.py beside themselves, not in the working directory

span() {  # span PID TID CAT TS DUR
  printf '{"ph":"X","name":"%s","cat":"%s","pid":%s,"tid":%s,"ts":%s,"dur":%s}' "$3" "$3" "$1" "$2" "$4" "$5"
}
named() {  # named PID TID CAT NAME TS DUR
  printf '{"ph":"X","name":"%s","cat":"%s","pid":%s,"tid":%s,"ts":%s,"dur":%s}' "$4" "$3" "$1" "$2" "$5" "$6"
}
known() {  # known COMPUTE_TID COMM_TID: the trace described above, on those tracks
  local c=$1 m=$2
  echo "{\"traceEvents\":[$(span 0 "$c" backward 0 100),$(span 0 "$m" comm 50 100),$(span 1 "$c" forward 0 40),$(span 1 "$c" wait 20 10),$(span 1 "$m" comm 0 40),$(named 2 "$m" comm "all_gather 1" 0 30),$(named 2 "$m" comm "all_gather 2" 30 10),$(named 2 "$c" wait "wait all_gather 1" 10 35),$(named 2 "$c" wait "wait for collectives" 60 10),$(named 2 "$m" comm "all_gather 3" 80 10),$(named 2 "$c" wait "wait all_gather 3" 75 20),$(named 2 "$c" step "step 1" 0 100),{\"ph\":\"i\",\"name\":\"step 1\",\"pid\":0,\"tid\":0,\"ts\":0}]}"
}
known 0 1 >host.json
known 2 3 >gpu.json

check_overlap() {  # check_overlap TRACE [--gpu]
  python3 "$SRC/scripts/trace_overlap.py" "$@" >overlap.out
  python3 - overlap.out "${2:-host}" <<'PY'
import json, sys
rows = json.loads(open(sys.argv[1]).read().splitlines()[-1])
gpu = sys.argv[2] == "--gpu"
# rank, steps, busy, hidden, overlap; waits: all, while a job ran, comm thread idle, after
want = [(0, 0, 0.100, 0.050, 0.50, 0.0, 0.0, 0.0, 0.0),
        (1, 0, 0.040, 0.030, 0.75, 0.010, 0.010, 0.0, 0.0),
        (2, 1, 0.050, 0.0, 0.0, 0.065, 0.030, 0.005, 0.030)]
keys = ("wait_ms", "wait_running_ms", "wait_comm_idle_ms", "after_done_ms")
got = [(r["rank"], r["steps"], r["comm_ms"], r["overlapped_ms"], r["overlap"])
       + tuple(r.get(k, -1) for k in keys) for r in rows]
if gpu:
    want = [w[:5] + (-1,) * 4 for w in want]  # no waits split on the GPU
assert len(got) == 3 and all(g[0] == w[0] and all(abs(a - b) <= 1e-12 for a, b in zip(g[1:], w[1:]))
                             for g, w in zip(got, want)), f"FAILED: overlap {got}, expected {want}"
text = open(sys.argv[1]).read()
assert "rank 2, ms per step over 1 traced steps:" in text and "rank 0, ms over the trace (no step spans):" in text, text
print(f"ok: trace_overlap.py {got}")
PY
}
check_overlap host.json
check_overlap gpu.json --gpu

tools=(trace_overlap.py)
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then tools+=(render_trace.py)
else echo "note: no matplotlib in /usr/bin/python3 (scripts/setup installs it): render_trace.py not checked"; fi

# bad INPUT-FILE EXPECTED-REGEX: each tool refuses it with status 1, the reason, no traceback.
bad() {
  local input=$1 want=$2 tool
  for tool in "${tools[@]}"; do
    local args=(python3 "$SRC/scripts/$tool" "$input")
    [ "$tool" = render_trace.py ] && args=(/usr/bin/python3 "$SRC/scripts/$tool" "$input" "$WORK/out.png")
    local rc=0
    timeout 60 "${args[@]}" >bad.out 2>&1 || rc=$?
    if [ "$rc" != 1 ] || ! grep -Eq "$want" bad.out || grep -q Traceback bad.out; then
      echo "FAILED: $tool $input: status $rc (expected 1 and /$want/):"; cat bad.out; exit 1
    fi
    echo "ok: $tool refuses $(basename "$input"): $(head -c 160 bad.out)"
  done
}
bad "$WORK/missing.json" "cannot read .*missing.json"
mkdir -p adir; bad "$WORK/adir" "adir is not a regular file"
mkfifo fifo; bad "$WORK/fifo" "fifo is not a regular file"  # not a read that blocks forever
echo '{"traceEvents": [' >cut.json; bad "$WORK/cut.json" "is not a --trace file"
echo '[1, 2]' >list.json; bad "$WORK/list.json" 'no "traceEvents" list'
echo "{\"traceEvents\":[$(span 0 true backward 0 1)]}" >booltid.json
bad "$WORK/booltid.json" "without a finite numeric pid, tid, ts, dur"
echo "{\"traceEvents\":[$(span 0 0 backward NaN 1)]}" >nan.json
bad "$WORK/nan.json" "without a finite numeric"
echo "{\"traceEvents\":[$(span 0 0 backward Infinity 1)]}" >inf.json
bad "$WORK/inf.json" "without a finite numeric"
python3 -c 'print("[" * 100000 + "]" * 100000)' >deep.json; bad "$WORK/deep.json" "is not a --trace file"
echo "{\"traceEvents\":[$(span 0 0 backward 0 "1$(printf '0%.0s' $(seq 400))")]}" >huge.json
bad "$WORK/huge.json" "int too large to convert to float"  # an integer no float holds
echo "{\"traceEvents\":[$(span 0 0 backward 1e308 1e308)]}" >overflow.json
bad "$WORK/overflow.json" "an end beyond any number"
echo "{\"traceEvents\":[$(span 0 1 comm 0 10),$(span 0 1 comm 20 -1)]}" >negative.json
bad "$WORK/negative.json" "a negative duration"
echo '{"traceEvents":[{"ph":"i","name":"step 1","pid":0,"tid":0,"ts":0}]}' >nospans.json
bad "$WORK/nospans.json" "no span"

if [[ " ${tools[*]} " == *" render_trace.py "* ]]; then
  /usr/bin/python3 "$SRC/scripts/render_trace.py" host.json "$WORK/known.png" >/dev/null
  [ -s known.png ] || { echo "FAILED: render_trace.py drew nothing"; exit 1; }
  echo "ok: render_trace.py drew the known trace ($(stat -c %s known.png) bytes)"
  # A trace of many ranks: 40 draw the first 16 and say so; --ranks picks others, checked.
  spans=(); for r in $(seq 0 39); do spans+=("$(span "$r" 0 forward 0 5)" "$(span "$r" 1 comm 5 3)"); done
  (IFS=,; echo "{\"traceEvents\":[${spans[*]}]}") >many.json
  draw() { /usr/bin/python3 "$SRC/scripts/render_trace.py" many.json "$WORK/many.png" "$@" >many.out 2>&1; }
  draw && grep -q "showing the first 16 of 40 ranks (0..15; --ranks a:b for others)" many.out ||
    { echo "FAILED: 40 ranks, no --ranks:"; cat many.out; exit 1; }
  rm -f many.png; draw --ranks 38:39 && [ -s many.png ] || { echo "FAILED: --ranks 38:39:"; cat many.out; exit 1; }
  for spec_want in "5:2|give a:b with a <= b" "50:60|no rank of this trace is in 50..60 (it holds 40 ranks, 0..39)" "0:39|ok"; do
    rc=0; draw --ranks "${spec_want%%|*}" || rc=$?
    if [ "${spec_want#*|}" = ok ]; then [ "$rc" = 0 ] && continue
    elif [ "$rc" = 1 ] && grep -q "${spec_want#*|}" many.out; then continue; fi
    echo "FAILED: --ranks ${spec_want%%|*}: status $rc"; cat many.out; exit 1
  done
  echo "ok: render_trace.py draws 16 of 40 ranks unless told, and checks --ranks"
fi
