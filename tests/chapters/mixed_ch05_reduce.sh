#!/usr/bin/env bash
# Chapter 05 in 16 bits, the rest (the chain link at N = 1..4: mixed_ch05.sh):
#  - fp32 unchanged: no flag vs --precision fp32, bitwise (N = 2);
#  - accumulation: K = 4 with one-parameter buckets is bitwise with chapter 04 (no_sync, then
#    the same 16-bit sums) and sends what K = 1 sends;
#  - fp16 at N = 3 from the initial weights x 6 (2 skipped steps): bitwise with 04 (one-
#    parameter buckets), so every rank skips the same steps without advancing Adam;
#  - --reduce-dtype fp32: the ledger's comm_buffers 4Ψ (the widened gradient) + 4·ceil(401408/N),
#    and exactly twice the 16-bit bytes on the wire, on every rank;
#  - --collectives mpi: refused with a 16-bit --reduce-dtype, naming both flags and the fix;
#    with --reduce-dtype fp32 bitwise with our fp32 ring at N = 2 (one fp32 addition).
source "$(dirname "$0")/lib.bash"
small=(--bucket-cap-mb 0.0001)
common=(--model mlp --global-batch-size 48 --max-steps 20 --eval-every-epoch 0 --seed 3)
run fp32_np2 2 ch05_ddp_buckets "${common[@]}"
run fp32_flag_np2 2 ch05_ddp_buckets "${common[@]}" --precision fp32
same fp32_np2 fp32_flag_np2 --bitwise
run ch04_k4_n2 2 ch04_ring_allreduce "${common[@]}" --precision bf16 --grad-accum-steps 4
run ch05_k4_n2 2 ch05_ddp_buckets "${common[@]}" "${small[@]}" --precision bf16 --grad-accum-steps 4
run ch05_small_n2 2 ch05_ddp_buckets "${common[@]}" "${small[@]}" --precision bf16
same ch04_k4_n2 ch05_k4_n2 --bitwise
expect_eq "$(sent ch05_k4_n2)" "$(sent ch05_small_n2)" "np 2: K = 4 sends what K = 1 sends per optimizer step"

run ch05_small_n3 3 ch05_ddp_buckets "${common[@]}" "${small[@]}" --precision bf16
run ch05_r32_n3 3 ch05_ddp_buckets "${common[@]}" "${small[@]}" --precision bf16 --reduce-dtype fp32
run ch05_r32_n2 2 ch05_ddp_buckets "${common[@]}" --precision bf16 --reduce-dtype fp32
run ch05_r32_mpi_n2 2 ch05_ddp_buckets "${common[@]}" --precision bf16 --reduce-dtype fp32 --collectives mpi
same ch05_r32_n2 ch05_r32_mpi_n2 --bitwise
stops mpi_bf16 2 ch05_ddp_buckets \
  "--collectives mpi with --reduce-dtype bf16 .*: MPI has no bf16 sum; use --reduce-dtype fp32" \
  "${common[@]}" --precision bf16 --collectives mpi

scaled_start w6 6 --model mlp --seed 3  # lib.bash: the initial weights x 6
f16=(--model mlp --global-batch-size 48 --max-steps 10 --epochs 1 --eval-every-epoch 0 --seed 3
  --precision fp16 --init-from "$WORK/w6.safetensors")
run f16_ch04_n3 3 ch04_ring_allreduce "${f16[@]}"
run f16_ch05_n3 3 ch05_ddp_buckets "${f16[@]}" "${small[@]}"
same f16_ch04_n3 f16_ch05_n3 --bitwise

check_summaries <<'PY'
largest = 784 * 512  # one-parameter buckets: the largest bucket is fc1.weight
s16, s32 = summary("ch05_small_n3"), summary("ch05_r32_n3")
psi = s32["num_parameters"]
for r in range(3):
    led = s32["ledger"][r]
    want = 4 * psi + 4 * -(-largest // 3)
    assert led["comm_buffers"]["peak"] == want, (r, led["comm_buffers"], want)
    assert led["model_states_peak"] == 16 * psi, (r, led)
    a, b = s16["comm"][r]["training"], s32["comm"][r]["training"]
    assert 2 * a["bytes_sent"] == b["bytes_sent"] and 2 * a["bytes_received"] == b["bytes_received"], (a, b)
print(f"ok --reduce-dtype fp32: comm_buffers 4Ψ + 4·ceil(401408/3) = {want} B, model states 16Ψ, "
      "twice the 16-bit bytes sent and received on every rank")
for name in ("f16_ch04_n3", "f16_ch05_n3"):
    s = summary(name)
    assert s["precision"] == "fp16" and s["skipped_steps"] == 2 and s["loss_scale"] == 16384.0, s
print("ok fp16: 2 skipped steps, scale 2^16 -> 2^14, in 04 and 05 (N = 3) alike")
PY
echo "mixed precision, chapter 05 (flags, fp16, --reduce-dtype): all checks passed"
