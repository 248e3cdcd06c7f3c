#!/usr/bin/env bash
# Chapters 03 and 04, distributed plumbing:
#  1. Distributed evaluation equals single-process evaluation exactly. The same weights (from a
#     short chapter 01 run) are evaluated at np 1 and np 3 (10 000 test samples do not divide
#     by 3): each chapter starts from them (--init-from) and takes one step with lr 1e-30, which
#     leaves every weight bit unchanged (asserted below), then evaluates. Ranks evaluate whole
#     batches of the single-process evaluation and the sums are exact in double, so test loss
#     and accuracy must be identical, not close.
#  2. Ranks started with different initial weights (here: another --seed on the last rank, via
#     mpirun's MPMD syntax) abort at start-up with a message naming the rank, before training.
source "$(dirname "$0")/lib.bash"
run trained 0 ch01_training_loop --global-batch-size 64 --max-steps 60 --eval-every-epoch 0 --seed 5
one_step=(--init-from "$WORK/trained.safetensors" --global-batch-size 48 --max-steps 1 --lr 1e-30 --seed 5)
for ch in ch03_data_parallel ch04_ring_allreduce; do
  for N in 1 3; do
    run ${ch}_eval_np$N $N $ch "${one_step[@]}"
    # The weights evaluated are exactly the trained ones (tensors only: the loss histories differ).
    "$COMPARE" "$WORK/trained.safetensors" "$WORK/${ch}_eval_np$N.safetensors" --bitwise
  done
  python3 - "$WORK/${ch}_eval_np1.jsonl" "$WORK/${ch}_eval_np3.jsonl" <<'PY'
import json, sys
ev = [[json.loads(l) for l in open(p) if '"eval"' in l][-1] for p in sys.argv[1:]]
a, b = ev
assert a["test_accuracy"] == b["test_accuracy"] and a["test_loss"] == b["test_loss"], (a, b)
assert a["test_accuracy"] > 0.6, a  # trained weights, not chance
print(f"== eval np 1 vs np 3: accuracy {a['test_accuracy']} and loss {a['test_loss']} identical")
PY
done

for ch in ch03_data_parallel ch04_ring_allreduce; do
  args=(--global-batch-size 48 --max-steps 5 --eval-every-epoch 0)
  log="$WORK/$ch.mismatch.log"
  if "$MPIRUN" --oversubscribe -np 2 "$BIN/$ch" "${args[@]}" : -np 1 "$BIN/$ch" "${args[@]}" --seed 9 >"$log" 2>&1; then
    echo "FAILED: $ch trained on with different initial weights"; cat "$log"; exit 1
  fi
  grep -q "rank(s) 2 started with initial parameters different from rank 0's" "$log" \
    || { echo "FAILED: $ch did not name rank 2"; cat "$log"; exit 1; }
  if grep -q "^step " "$log"; then echo "FAILED: $ch took a step before aborting"; cat "$log"; exit 1; fi
  echo "== $ch: mismatched start-up aborts: $(grep -o 'rank(s) 2 started[^;]*' "$log")"
done
