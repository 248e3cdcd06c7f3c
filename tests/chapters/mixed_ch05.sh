#!/usr/bin/env bash
# Chapter 05 in 16 bits (--precision bf16; ddp.hpp, step.hpp, common/precision/precision.hpp), the
# chain link to chapter 04 at N = 1..4 (flags, fp16 and --reduce-dtype: mixed_ch05_reduce.sh).
# The buckets are ranges of the 16-bit gradients, summed by chapter 04's 16-bit ring, launched
# by the same hooks during backward, pre-divided (no division on the communication thread).
# As the fp32 link ch05_vs_ch04.sh:
#  - one parameter per bucket (--bucket-cap-mb 0.0001): chapter 04's all-reduces in another
#    order → bitwise with 04 at every N;
#  - default buckets at N = 1, 2: bitwise (one 16-bit addition per element either way); at
#    N = 3, 4 chunk boundaries move, the 16-bit sums associate and round differently (in the
#    last bf16 bit), and Adam carries that on. Criterion: AdamW's bound, 4.2e-2 after 20 steps
#    of lr 1e-3 (the SGD criterion is unavailable: 16 bits need AdamW). Measured on an AMD EPYC
#    without AVX-512: max |Δparam| 1.2e-2 at N = 3 and 4;
#  - traffic: one-parameter buckets send chapter 04's 16-bit bytes on every rank; default
#    buckets the same total over the ranks;
#  - the ledger per rank, to the byte: 2Ψ + 2Ψ + 12Ψ = 16Ψ every rank; comm_buffers one 16-bit
#    ring chunk of the largest bucket (one-parameter buckets: 2·ceil(401408/N)).
source "$(dirname "$0")/lib.bash"
small=(--bucket-cap-mb 0.0001)
common=(--model mlp --global-batch-size 48 --max-steps 20 --eval-every-epoch 0 --seed 3)
for np in 1 2 3 4; do
  run ch04_n$np $np ch04_ring_allreduce "${common[@]}" --precision bf16
  run ch05_n$np $np ch05_ddp_buckets "${common[@]}" --precision bf16
  run ch05_small_n$np $np ch05_ddp_buckets "${common[@]}" "${small[@]}" --precision bf16
  same ch04_n$np ch05_small_n$np --bitwise
  chain_link ch04_n$np ch05_n$np $np 20
  expect_eq "$(sent ch05_small_n$np)" "$(sent ch04_n$np)" "np $np: one-parameter buckets send chapter 04's 16-bit bytes on every rank"
  expect_eq "$(total ch05_n$np)" "$(total ch04_n$np)" "np $np: default buckets send chapter 04's 16-bit bytes over all ranks"
done
check_summaries <<'PY'
largest = 784 * 512  # one-parameter buckets: the largest bucket is fc1.weight
for name, N, small in [("ch05_small_n1", 1, True), ("ch05_small_n2", 2, True),
                       ("ch05_small_n3", 3, True), ("ch05_small_n4", 4, True), ("ch05_n4", 4, False)]:
    s = summary(name)
    psi = s["num_parameters"]
    assert s["precision"] == "bf16" and s["world_size"] == N
    for r in range(N):
        led = s["ledger"][r]
        got = (led["parameters"]["peak"], led["gradients"]["peak"], led["optimizer_state"]["peak"],
               led["model_states_peak"])
        assert got == (2 * psi, 2 * psi, 12 * psi, 16 * psi), (name, r, got)
        if small:
            want = 2 * -(-largest // N)
            assert led["comm_buffers"]["peak"] == want, (name, r, led["comm_buffers"], want)
    print(f"ok {name}: ledger 2Ψ + 2Ψ + 12Ψ = 16Ψ on every rank"
          + (f", comm_buffers {want} B" if small else ""))
PY
echo "mixed precision, chapter 05 vs 04: all checks passed"
