#!/usr/bin/env bash
# Chain link 05 vs 04: DDP all-reduces chapter 04's ring bucket by bucket, during backward.
#
# When the results are bitwise: the ring sums chunk c of a buffer in ring order starting at
# rank c + 1 (at N = 3: a_c + (a_{c+2} + a_{c+1})), so an element's summation order depends on
# which chunk of ITS all-reduce it lands in. Chapter 04 all-reduces each parameter on its own.
#  - one parameter per bucket (--bucket-cap-mb 0.0001, below every parameter's size): the same
#    all-reduces as chapter 04, in another order → bitwise at every N, also with accumulation
#    (no_sync: the last micro-step all-reduces the same accumulated sums chapter 04 does);
#  - default buckets (25 MiB, first 1 MiB) at N = 1 and 2: bitwise as well (N = 2 sums a0 + a1
#    or a1 + a0, equal because float addition is commutative);
#  - default buckets at N = 3 and 4: chunk boundaries move, the three- and four-term sums
#    associate differently and round differently in the last bit; AdamW's m / sqrt(v) carries
#    that on. Criteria: `close` in lib.bash (SGD: relative L2 1e-4 of the movement, losses
#    within 1e-6; AdamW: Adam's own bound, 4.2e-2 after 20 steps). Measured on an AMD EPYC
#    without AVX-512 (SGD relative L2 / AdamW max |Δparam|): np 3
#    8.2e-7 / 1.4e-7, np 4 1.2e-6 / 3.3e-7; SGD losses equal.
# Traffic (summary records): per optimizer step, every rank sends exactly chapter 04's bytes
# with one-parameter buckets; with default buckets the ranks' total equals chapter 04's total
# (2(N−1)·Ψ·4: per rank it moves by a few elements, the ceil-sized chunks of other lengths);
# and K = 4 micro-steps send exactly what K = 1 sends (no_sync: nothing on micro-steps 1..3).
source "$(dirname "$0")/lib.bash"

small=(--bucket-cap-mb 0.0001)
start_point start --model mlp --seed 3
for np in 1 2 3 4; do
  common=(--model mlp --global-batch-size 48 --max-steps 20 --eval-every-epoch 0 --seed 3)
  run ch04_n$np $np ch04_ring_allreduce "${common[@]}"
  run ch05_n$np $np ch05_ddp_buckets "${common[@]}"
  run ch05_small_n$np $np ch05_ddp_buckets "${common[@]}" "${small[@]}"
  same ch04_n$np ch05_small_n$np --bitwise
  if [ $np -le 2 ]; then same ch04_n$np ch05_n$np --bitwise
  else
    run ch04_n${np}_sgd $np ch04_ring_allreduce "${common[@]}" "${sgd[@]}"
    run ch05_n${np}_sgd $np ch05_ddp_buckets "${common[@]}" "${sgd[@]}"
    close ch04_n$np ch05_n$np start 20
  fi
  expect_eq "$(sent ch05_small_n$np)" "$(sent ch04_n$np)" "np $np: one-parameter buckets send chapter 04's bytes on every rank"
  expect_eq "$(total ch05_n$np)" "$(total ch04_n$np)" "np $np: default buckets send chapter 04's bytes over all ranks"

  # Gradient accumulation: no_sync on micro-steps 1..K-1.
  run ch04_k4_n$np $np ch04_ring_allreduce "${common[@]}" --grad-accum-steps 4
  run ch05_k4_n$np $np ch05_ddp_buckets "${common[@]}" "${small[@]}" --grad-accum-steps 4
  same ch04_k4_n$np ch05_k4_n$np --bitwise
  expect_eq "$(sent ch05_k4_n$np)" "$(sent ch05_small_n$np)" "np $np: K = 4 sends what K = 1 sends per optimizer step"
done

# The ToyModel (MSE, 2.4 M parameters, two buckets by default), across an epoch boundary: the
# evaluation's forward is never backpropagated and must not silence the next backward's hooks.
for np in 2 3; do
  common=(--model toy --global-batch-size 48 --epochs 2 --max-steps 24 --seed 5)
  run toy04_n$np $np ch04_ring_allreduce "${common[@]}"
  run toy05_small_n$np $np ch05_ddp_buckets "${common[@]}" "${small[@]}"
  same toy04_n$np toy05_small_n$np --bitwise
done
