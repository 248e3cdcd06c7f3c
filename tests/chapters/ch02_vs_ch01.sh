#!/usr/bin/env bash
# Chain link 02(K) vs 01: gradient accumulation reproduces the full-batch step.
# Tolerance: |Δparam| <= 1e-5, |Δloss| <= 1e-5 after 20 AdamW steps. Why not bitwise: the K
# micro-batch gradients are summed in another order than one GEMM over the whole batch sums
# them (float32 addition is not associative), and each micro-batch mean is scaled by 1/K
# instead of dividing once by B. Those ~1e-7 relative differences are amplified by Adam's
# m / sqrt(v) normalisation; measured here: at most 2.4e-6 on parameters, 1.2e-7 on losses.
# K = 1 must be bitwise: it is the same computation.
source "$(dirname "$0")/lib.bash"
for model in "--model mlp" "--model toy"; do
  common=($model --global-batch-size 64 --max-steps 20 --epochs 2 --eval-every-epoch 0 --seed 3)
  run ch01 0 ch01_training_loop "${common[@]}"
  run ch02_k1 0 ch02_gradient_accumulation "${common[@]}" --grad-accum-steps 1
  same ch01 ch02_k1 --bitwise
  for K in 2 4 8; do
    run ch02_k$K 0 ch02_gradient_accumulation "${common[@]}" --grad-accum-steps $K
    same ch01 ch02_k$K --atol 1e-5 --loss-atol 1e-5
  done
done
