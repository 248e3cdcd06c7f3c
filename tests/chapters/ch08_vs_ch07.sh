#!/usr/bin/env bash
# Chain link 08 vs 07: ZeRO-3 reaches chapter 07's numbers: parameters, loss history and
# AdamW's state (--save-optimizer-state, gathered).
# Bitwise where the ring sums every element in the same order:
#  - world sizes 1 and 2 always (one term, or a sum of two, which is commutative);
#  - any world size when chapter 07's buckets are exactly ZeRO-3's layers (--hidden-sizes
#    10,784 makes every weight 7840 elements; --bucket-cap-mb 0.02993 = 31384 bytes closes a
#    bucket after each weight, so both chunk each layer the same way), clipping active;
#  - K = 2 at N = 1, and --no-prefetch against prefetch (only the timing differs).
# Within a tolerance elsewhere: for N >= 3 an element's ring sum is associated by its chunk
# within the bucket (chapter 07) or within the layer (ZeRO-3), so the last bit differs, and
# Adam's m / sqrt(v) amplifies that; with K > 1, chapter 07 accumulates full gradients and
# reduce-scatters once (no_sync), ZeRO-3 reduce-scatters every micro-step and accumulates the
# shard: another summation order at every N >= 2. Criteria: `close` in lib.bash (SGD:
# relative L2 1e-4 of the movement, losses within 1e-6; AdamW: Adam's own bound, 4.2e-2 after
# 20 steps); AdamW's state is compared bit for bit in the bitwise cases only (no bound on m and
# v follows from rounding either). Measured on an AMD EPYC without AVX-512 (SGD relative L2 /
# AdamW max |Δparam|): mlp N = 3 5.6e-8 /
# 2.3e-7, N = 4 1.2e-6 / 3.7e-7; K = 2 at N = 2 2.1e-6 / 1.6e-6, N = 4 2.0e-6 / 1.0e-6;
# --hidden-sizes 1 and 3 at N = 4 below 1e-9 / 1.5e-8; SGD losses equal.
source "$(dirname "$0")/lib.bash"

# pair NAME NP ARGS...: runs chapters 07 (plus the flags in $only07) and 08 with the same
# arguments, saving AdamW's state too.
only07=()
pair() {
  local name=$1 np=$2; shift 2
  run "${name}_07" "$np" ch07_zero2 "$@" "${only07[@]}" --save-optimizer-state "$WORK/${name}_07.adamw.safetensors"
  run "${name}_08" "$np" ch08_zero3 "$@" --save-optimizer-state "$WORK/${name}_08.adamw.safetensors"
}
# check NAME --bitwise: parameters and losses, then the optimizer state, bit for bit.
check() {
  local name=$1; shift
  same "${name}_07" "${name}_08" "$@"
  "$COMPARE" "$WORK/${name}_07.adamw.safetensors" "$WORK/${name}_08.adamw.safetensors" "$@" | tail -1
}
# near NAME NP ARGS...: the same pair under SGD, then `close` (from the start with ARGS).
near() {
  local name=$1 np=$2; shift 2
  run "${name}_07_sgd" "$np" ch07_zero2 "$@" "${only07[@]}" "${sgd[@]}"
  run "${name}_08_sgd" "$np" ch08_zero3 "$@" "${sgd[@]}"
  start_point "${name}_start" "$@"
  close "${name}_07" "${name}_08" "${name}_start" 20
}
common=(--model mlp --global-batch-size 48 --max-steps 20 --epochs 1 --eval-every-epoch 0 --seed 3)

only07=(--bucket-cap-mb 0.02993)
for np in 1 2 3 4; do  # buckets = layers: bitwise at every N, with clipping that bites
  pair aligned_n$np $np "${common[@]}" --hidden-sizes 10,784 --clip-grad-norm 0.5
  check aligned_n$np --bitwise
done
only07=()

for np in 2 3 4; do  # the default MLP (two buckets, three layers)
  pair mlp_n$np $np "${common[@]}"
  if [ "$np" -le 2 ]; then check mlp_n$np --bitwise; else near mlp_n$np $np "${common[@]}"; fi
done

for np in 1 2 4; do  # accumulation: chapter 07 reduces once per step, ZeRO-3 every micro-step
  pair accum_n$np $np "${common[@]}" --grad-accum-steps 2
  if [ "$np" -eq 1 ]; then check accum_n$np --bitwise
  else near accum_n$np $np "${common[@]}" --grad-accum-steps 2; fi
done

for hidden in 1 3; do  # widths that leave padding in every layer at N = 3 and 4
  for np in 2 4; do
    pair hidden${hidden}_n$np $np "${common[@]}" --hidden-sizes $hidden
    if [ "$np" -le 2 ]; then check hidden${hidden}_n$np --bitwise
    else near hidden${hidden}_n$np $np "${common[@]}" --hidden-sizes $hidden; fi
  done
done

run prefetch 3 ch08_zero3 "${common[@]}" --clip-grad-norm 0.5
run no_prefetch 3 ch08_zero3 "${common[@]}" --clip-grad-norm 0.5 --no-prefetch
same prefetch no_prefetch --bitwise
