#!/usr/bin/env bash
# Grader for 02.1 (and bug hunt 02.b1): chapter 02 with K = 2 and 4 micro-batches must take the
# same optimizer steps as chapter 01 on the whole batch (the ToyModel, 8 steps, seed 3).
# Run with SGD, not AdamW: Adam divides by sqrt(v), so a gradient K times too large moves its
# update only through eps (measured: 02.1 without its 1/K stays within 1e-6 under AdamW), while SGD's update
# is K times too large and the parameters drift at once.
# Tolerance 1e-5 on parameters and losses: the K micro-batch sums round differently from one
# GEMM over the whole batch (float32 is not associative), ~1e-7 relative per step.
# Needs BIN (the chapter binaries) and COMPARE (tests/compare_runs); scripts/exercise sets both.
set -euo pipefail
: "${BIN:?}" "${COMPARE:?}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
common=(--model toy --global-batch-size 64 --max-steps 8 --epochs 1 --eval-every-epoch 0 --seed 3
        --optimizer sgd --lr 0.05 --log-every 1000)
run() {
  local name=$1 binary=$2; shift 2
  if ! timeout 60 "$BIN/$binary" "${common[@]}" --save-final "$WORK/$name.safetensors" \
      --metrics "$WORK/$name.jsonl" "$@" >"$WORK/$name.log" 2>&1; then
    echo "chapter 02 stopped ($name):"; tail -3 "$WORK/$name.log"; exit 1
  fi
}
run ch01 ch01_training_loop
fail=0
for K in 2 4; do
  run k$K ch02_gradient_accumulation --grad-accum-steps $K
  if out=$("$COMPARE" "$WORK/ch01.safetensors" "$WORK/k$K.safetensors" "$WORK/ch01.jsonl" \
           "$WORK/k$K.jsonl" --atol 1e-5 --loss-atol 1e-5 2>&1); then
    echo "K = $K: same steps as chapter 01 (within 1e-5): $out" | head -3
  else
    fail=1
    echo "K = $K: chapter 02 does not take chapter 01's step. compare_runs says:"
    echo "$out" | head -8
    echo "  invariant: (1/K) Σ_k grad(mean over micro-batch k) = grad(mean over the whole batch)."
    echo "  Losses equal at step 1 but not after = the forward is right, the gradient is not."
  fi
done
if [ $fail = 0 ]; then echo "PASS 02.1 accumulation matches the full batch at K = 2, 4"; fi
exit $fail
