#!/usr/bin/env bash
# Chain link 02(K) vs 01: gradient accumulation reproduces the full-batch step. This file
# derives the criteria every non-bitwise link of the chain uses (`close` in lib.bash).
# K = 1 must be bitwise: it is the same computation.
# K = 2, 4, 8 are not bitwise: the K micro-batch gradients are summed in another order than one
# GEMM over the whole batch sums them (float32 addition is not associative; Eigen's blocking,
# hence the order, depends on the CPU's SIMD width), and each micro-batch mean is scaled by 1/K
# instead of dividing once by B. Two criteria, neither of which depends on the machine:
#  - SGD (no momentum, no weight decay), 20 steps: the update is lr·g, linear in the gradient,
#    so the runs differ only by the gradients' float32 rounding (unit u = 6e-8; a sum of n
#    terms in another order: ~sqrt(n)·u relative, 1.3e-5 for the longest sums here, B·784 = 50176
#    terms; 1.5e-5 for the ToyModel's B·1024). Required: ||Δparam||_2 <= 1e-4 ·
#    ||param - start||_2 (over 6× that rounding scale), and every
#    step's loss within 1e-6 (8 float32 ulps at a loss of ~1). A single wrong or missing sample
#    of 64 changes the gradient by ~1/64 = 1.6e-2: 150× over the limit.
#    Measured on an AMD EPYC without AVX-512: relative 3.3e-6 (MLP) and 1.8e-5 (ToyModel),
#    losses within 1.5e-7, parameters within 3.7e-9.
#  - AdamW (the chapters' default), 20 steps: Adam divides by sqrt(v), so a rounding-sized
#    difference of a near-zero gradient (or one sample's ReLU sitting at 0 in one run and not
#    the other) can change a step by up to 2·lr: no finer bound follows from rounding. Required:
#    every element within AdamW's own bound, 2·lr·Σ_t R_t = 4.2e-2 (see compare_runs.cpp).
#    Measured: 3.4e-6 (MLP); ToyModel 1.3e-4 at K = 2 and 8, all in one hidden unit (row 999 of
#    0.weight: that unit's gradient differs after step 14, every other row within 9e-7), 1.5e-6
#    at K = 4. (A previous machine, with AVX-512, measured 2.4e-6 everywhere.)
source "$(dirname "$0")/lib.bash"
for model in mlp toy; do
  common=(--model $model --global-batch-size 64 --epochs 2 --eval-every-epoch 0 --seed 3)
  start_point start "${common[@]}"
  run ch01 0 ch01_training_loop "${common[@]}" --max-steps 20
  run ch01_sgd 0 ch01_training_loop "${common[@]}" "${sgd[@]}" --max-steps 20
  run ch02_k1 0 ch02_gradient_accumulation "${common[@]}" --max-steps 20 --grad-accum-steps 1
  same ch01 ch02_k1 --bitwise
  for K in 2 4 8; do
    run ch02_k$K 0 ch02_gradient_accumulation "${common[@]}" --max-steps 20 --grad-accum-steps $K
    run ch02_k${K}_sgd 0 ch02_gradient_accumulation "${common[@]}" "${sgd[@]}" --max-steps 20 \
      --grad-accum-steps $K
    close ch01 ch02_k$K start 20
  done
done
