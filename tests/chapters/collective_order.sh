#!/usr/bin/env bash
# Ranks that launch their collectives in different orders (issue 9, items 7 and 8), chapters
# 05-08. Each case writes its expected message below.
#  - chapters 05, 06, 07 (bin/ch0N_rank_fault: the chapter plus a test-only fault, built from
#    tests/tools/rank_fault.cpp): the last rank launches its buckets in REVERSE order (bug
#    hunt 05.b2's fault: unchecked, a crash inside MPI or a hang), or SWAPS the two buckets of
#    equal length (unchecked: every collective has the length the others expect, and the run
#    ends with different weights on each rank). With --check-collectives (here through
#    RINGZERO_CHECK_COLLECTIVES=1, which ctest sets, or the flag) every rank must stop within
#    10 s, exit code 1 (MPI_Abort; no signal), with "ranks out of step: collective #S is the
#    all-reduce|reduce-scatter of bucket B (E elements) on this rank, but ... on rank R";
#    np 2, 3, 4 for chapter 05 (np 2, 3 for 06-07: the same hook code);
#  - the same binaries without a mismatch (np 1: one rank can only agree with itself) train to
#    the same bits as the chapter itself, and the check changes no number (chapter 05 at np 3,
#    check on vs off: final weights and every loss equal, bitwise);
#  - chapter 08 with prefetch (bin/zero3_desync: one rank runs a layer once more): the desync
#    message, exit code 1 on every rank within 10 s, and no SIGSEGV (the communication thread
#    is stopped and joined before the buffers it uses are freed, common/comm/comm_thread.hpp).
# Bucket plan of the toy model with --bucket-cap-mb 4 (see --explain-buckets): 3 buckets of
# 262400 (net.4), 1049600 (net.2) and 1049600 (net.0) elements.
source "$(dirname "$0")/lib.bash"
small=(--model toy --bucket-cap-mb 4 --global-batch-size 24 --max-steps 3 --eval-every-epoch 0)
sgd_small=(--optimizer sgd --weight-decay 0)

STOPS_SHOW='ranks out of step.*on rank [0-9]+'  # the line each ok names (stops: lib.bash)

rs=("the all-reduce" "the reduce-scatter" "the reduce-scatter")
i=0
for ch in 05 06 07; do
  what=${rs[$i]}; i=$((i + 1))
  nps="2 3"; [ "$ch" = 05 ] && nps="2 3 4"
  for np in $nps; do
    last=$((np - 1))
    # Reverse: the faulty rank starts with bucket 2 (1049600 elements), the others with bucket 0
    # (262400): whichever notices first names both.
    stops "ch${ch}_reverse_np$np" "$np" "ch${ch}_rank_fault" \
      "ranks out of step: collective #0 is $what of bucket (0 \(262[0-9]{3}|2 \(10496[0-9]{2}) elements\) on this rank, but collective #0 is $what of bucket (2 \(10496[0-9]{2}|0 \(262[0-9]{3}) elements\) on rank [0-9]" \
      "${small[@]}" --debug-fault-rank "$last" --debug-bucket-order reverse
    # Swap: buckets 1 and 2 have the same length, so only their number differs.
    stops "ch${ch}_swap_np$np" "$np" "ch${ch}_rank_fault" \
      "ranks out of step: collective #1 is $what of bucket [12] \(10496[0-9]{2} elements\) on this rank, but collective #1 is $what of bucket [12] \(10496[0-9]{2} elements\) on rank [0-9]" \
      "${small[@]}" --debug-fault-rank "$last" --debug-bucket-order swap
  done
done
grep -q "Every rank must launch the same buckets in the same order" "$WORK/ch05_swap_np2.log"

# The flag alone (no environment variable) turns the check on.
RINGZERO_CHECK_COLLECTIVES= stops ch05_swap_flag_np2 2 ch05_rank_fault \
  "ranks out of step: collective #1 is the all-reduce of bucket [12]" \
  "${small[@]}" --check-collectives --debug-fault-rank 1 --debug-bucket-order swap

# One rank agrees with itself whatever its order: the fault binary trains like the chapter.
run ch05_np1 1 ch05_ddp_buckets "${small[@]}" "${sgd_small[@]}"
run ch05_reverse_np1 1 ch05_rank_fault "${small[@]}" "${sgd_small[@]}" --debug-fault-rank 0 --debug-bucket-order reverse
same ch05_np1 ch05_reverse_np1

# The check changes no number: chapter 05 at np 3 with and without it, bitwise.
run ch05_checked 3 ch05_ddp_buckets "${small[@]}" --check-collectives
RINGZERO_CHECK_COLLECTIVES=0 run ch05_unchecked 3 ch05_ddp_buckets "${small[@]}"
same ch05_checked ch05_unchecked
python3 - "$WORK/ch05_checked.jsonl" "$WORK/ch05_unchecked.jsonl" <<'PY'
import json, sys
def summary(p):
    return [j for j in map(json.loads, open(p)) if j["type"] == "summary"][0]
a, b = summary(sys.argv[1]), summary(sys.argv[2])
assert a["bytes_sent_per_rank_per_step"] == b["bytes_sent_per_rank_per_step"], (a, b)
assert a["model_states_bytes_per_rank"] == b["model_states_bytes_per_rank"]
print(f"ok: --check-collectives changes no number (sent {a['bytes_sent_per_rank_per_step']:.0f} B/step either way)")
PY

# Chapter 08 with prefetch: a layer run on one rank only ends with the desync message and exit
# code 1 on every rank, never a SIGSEGV in the communication thread (item 8).
for np in 2 3 4; do
  for prefetch in "" --no-prefetch; do
    stops "ch08_desync_np$np$prefetch" "$np" zero3_desync \
      "ranks out of step: ZeRO-3 collective #[0-9]+ is .*the all-gather of layer 2 for its forward" \
      --model toy --global-batch-size 24 --max-steps 3 --eval-every-epoch 0 $prefetch \
      --debug-desync-rank $((np - 1)) --debug-desync-layer 2
  done
done
echo "ok: every out-of-order launch stopped every rank with its message"
