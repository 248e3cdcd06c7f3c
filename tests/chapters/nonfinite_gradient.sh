#!/usr/bin/env bash
# A gradient that turns non-finite on one rank (issue 9, item 6). bin/ch05_rank_fault and
# ch07_rank_fault (tests/tools/rank_fault.cpp) set, on the last rank only, the second Linear
# layer's first weight to +inf right after its forward in step S: that rank's loss for step S is
# still finite, but its local gradient of layer 0 is not; the reduction then spreads it to every
# rank, and every rank's loss is NaN from step S + 1 on. Expected, every rank stopping together
# (exit 1 through MPI_Abort, no hang, no signal), the message naming step S and that rank:
#   S = 2 of 4 steps: "loss is nan at step 3 ... the gradient first became non-finite at step 2
#                      on rank(s) R (step 2: 0.weight[i] = nan ...)"
#   S = 3 of 3 steps: the loss never shows it; the end-of-run report stops every rank with
#                      "the gradient first became non-finite at step 3 on rank(s) R", before
#                      --save-final writes the non-finite weights (no file is written).
# np 1, 2, 3, 4 (chapter 05), np 2 (chapter 07).
source "$(dirname "$0")/lib.bash"
small=(--model toy --global-batch-size 24 --eval-every-epoch 0 --log-every 1000)
bad_grad='\(step [0-9]+: 0\.(weight|bias)\[[0-9]+\] = -?(nan|inf)'

STOPS_SHOW='(loss is|the gradient first).*on rank\(s\) [0-9, ]+ \([^)]*\)'  # the line each ok names (stops: lib.bash)

for case in "05 1" "05 2" "05 3" "05 4" "07 2"; do
  set -- $case
  ch=$1 np=$2 r=$(($2 - 1))
  stops "ch${ch}_np${np}_loss" "$np" "ch${ch}_rank_fault" \
    "loss is -?nan at step 3 \(global-batch mean\).*; the gradient first became non-finite at step 2 on rank\(s\) $r $bad_grad" \
    "${small[@]}" --max-steps 4 --debug-fault-rank "$r" --debug-inf-weight-step 2
  stops "ch${ch}_np${np}_last" "$np" "ch${ch}_rank_fault" \
    "the gradient first became non-finite at step 3 on rank\(s\) $r $bad_grad" \
    "${small[@]}" --max-steps 3 --debug-fault-rank "$r" --debug-inf-weight-step 3 \
    --save-final "$WORK/never.safetensors"
  if [ -e "$WORK/never.safetensors" ]; then echo "FAILED: non-finite weights were saved"; exit 1; fi
done
echo "ok: a non-finite gradient is named by its step and rank at np 1-4"
