#!/usr/bin/env bash
# Ranks launched with different flags (Open MPI's MPMD syntax "A : B") must all stop at
# start-up with a message naming the flag and both values — not hang in a collective, crash,
# or train on with silently different settings. Each case must fail within RUN_TIMEOUT.
source "$(dirname "$0")/lib.bash"
RUN_TIMEOUT=60
small=(--model toy --hidden-sizes 8 --max-steps 3 --eval-every-epoch 0 --global-batch-size 64)
# expect_mismatch CHAPTER EXPECTED_TEXT RANK0_FLAGS -- RANK1_FLAGS
expect_mismatch() {
  local chapter=$1 expected=$2; shift 2
  local a=() b=()
  while [ "$1" != -- ]; do a+=("$1"); shift; done; shift; b=("$@")
  local log=$WORK/mismatch.log
  if timeout "$RUN_TIMEOUT" "$MPIRUN" -np 1 "$BIN/$chapter" "${small[@]}" "${a[@]}" : \
       -np 1 "$BIN/$chapter" "${small[@]}" "${b[@]}" >"$log" 2>&1; then
    echo "FAILED: $chapter ran to completion with ${a[*]} vs ${b[*]}"; cat "$log"; exit 1
  fi
  if [ "$(grep -c "$expected" "$log")" -eq 0 ]; then
    echo "FAILED: $chapter with ${a[*]} vs ${b[*]}: no '$expected' in:"; cat "$log"; exit 1
  fi
  echo "ok: $chapter ${a[*]} vs ${b[*]} -> $(grep -m1 "$expected" "$log" | sed 's/.*: rank/rank/')"
}
expect_mismatch ch03_data_parallel "rank 1 has weight-decay=0, rank 0 has weight-decay=0.01" -- --weight-decay 0
# A flag error on one rank only stops every rank (the others would wait for it forever).
expect_mismatch ch04_ring_allreduce "a flag error on another rank" -- --no-such-flag
expect_mismatch ch04_ring_allreduce "rank 1 has lr=0.002, rank 0 has lr=0.001" --lr 0.001 -- --lr 0.002
expect_mismatch ch04_ring_allreduce "rank 1 has hidden-sizes" -- --hidden-sizes 8,4
expect_mismatch ch05_ddp_buckets "rank 1 has grad-accum-steps=2" -- --grad-accum-steps 2
expect_mismatch ch06_zero1 "rank 1 has clip-grad-norm=0.01" -- --clip-grad-norm 0.01
expect_mismatch ch07_zero2 "rank 1 has optimizer=\"sgd\"" -- --optimizer sgd
expect_mismatch ch08_zero3 "rank 1 has save-final" -- --save-final "$WORK/x.safetensors"
# What the chapters check through its effect keeps its own message: different seeds are
# caught by the start-up parameter check (chapter 03's lesson).
expect_mismatch ch05_ddp_buckets "initial parameters different" -- --seed 7
