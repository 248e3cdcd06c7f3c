#!/usr/bin/env bash
# Chapter 03 in 16 bits (--precision bf16|fp16; step.hpp, central_reducer.hpp,
# common/precision/precision.hpp):  - fp32 unchanged: no flag vs --precision fp32, bitwise (N = 3);
#  - 03(N) vs 02(K = N) in bf16, BITWISE at N = 1, 2, 3, 4: both seed backward with 1/N (03
#    pre-divides by N, 02 divides by K = N), rank r's micro-batch is 02's micro-batch r (the
#    sampler), and rank 0 adds the 16-bit gradients in rank order, one 16-bit addition each
#    (fp32 sum, one rounding), exactly as 02 accumulates its micro-batches' gradients;
#  - fp16 at N = 3 from the initial weights x 6, where the gradients overflow at the loss
#    scales 2^16 and 2^15 (2 skipped steps): bitwise with 02 (K = 3). So every rank skipped the
#    same steps (ranks 1 and 2 seed their backward with their OWN loss scale: one that missed a
#    halving would send gradients twice as large), and a skipped step did not advance Adam's
#    step count (its bias corrections would change every later update);
#  - the ledger per rank, to the byte, from the summary record: rank 0 parameters 2Ψ,
#    gradients 2Ψ, optimizer_state 12Ψ (fp32 master + exp_avg + exp_avg_sq), comm_buffers 2Ψ
#    (one incoming 16-bit gradient), model states 16Ψ; ranks 1..N-1 2Ψ, 2Ψ, 0, 0, 4Ψ. With
#    --reduce-dtype fp32: comm_buffers 4Ψ (the gradient widened) + 4Ψ on rank 0 (incoming);
#  - the counters per step, half of fp32's: rank 0 sends and receives (N-1)·Ψ·2, the others
#    Ψ·2; with --reduce-dtype fp32 the gradients travel in fp32 and the parameters still in 16
#    bits: rank 0 receives (N-1)·Ψ·4 and sends (N-1)·Ψ·2, the others send Ψ·4, receive Ψ·2;
#  - --reduce-dtype fp32 (an fp32 sum of the same 16-bit gradients: other roundings) is held to
#    AdamW's bound against the 16-bit sum (compare_runs --adam-bound, as the fp32 chain's links
#    that change the summation order); any other --reduce-dtype is refused, naming the fix.
source "$(dirname "$0")/lib.bash"
common=(--model mlp --global-batch-size 48 --max-steps 20 --epochs 2 --eval-every-epoch 0 --seed 3)
run fp32_np3 3 ch03_data_parallel "${common[@]}"
run fp32_flag_np3 3 ch03_data_parallel "${common[@]}" --precision fp32
same fp32_np3 fp32_flag_np3 --bitwise
for N in 1 2 3 4; do
  run ch02_k$N 0 ch02_gradient_accumulation "${common[@]}" --precision bf16 --grad-accum-steps $N
  run ch03_np$N $N ch03_data_parallel "${common[@]}" --precision bf16
  same ch02_k$N ch03_np$N --bitwise
done
run ch03_np3_r32 3 ch03_data_parallel "${common[@]}" --precision bf16 --reduce-dtype fp32
adam_close ch03_np3 ch03_np3_r32 20

# fp16 with overflowing gradients: the initial weights x 6 (loss ~13 at step 1).
scaled_start w6 6 --model mlp --seed 3  # lib.bash: the initial weights x 6
f16=(--model mlp --global-batch-size 48 --max-steps 10 --epochs 1 --eval-every-epoch 0 --seed 3
  --precision fp16 --init-from "$WORK/w6.safetensors")
run f16_ch02_k3 0 ch02_gradient_accumulation "${f16[@]}" --grad-accum-steps 3
run f16_ch03_np3 3 ch03_data_parallel "${f16[@]}"
same f16_ch02_k3 f16_ch03_np3 --bitwise

check_summaries <<'PY'
for name, N, r32 in [("ch03_np1", 1, False), ("ch03_np2", 2, False), ("ch03_np3", 3, False),
                     ("ch03_np4", 4, False), ("ch03_np3_r32", 3, True)]:
    s = summary(name)
    psi, steps = s["num_parameters"], s["steps"]
    assert s["precision"] == "bf16" and s["world_size"] == N
    for r in range(N):
        led = s["ledger"][r]
        comm_buf = (4 * psi + (4 * psi if r == 0 else 0)) if r32 else (2 * psi if r == 0 else 0)
        got = (led["parameters"]["peak"], led["gradients"]["peak"], led["optimizer_state"]["peak"],
               led["comm_buffers"]["peak"], led["model_states_peak"])
        want = (2 * psi, 2 * psi, 12 * psi if r == 0 else 0, comm_buf, (16 if r == 0 else 4) * psi)
        assert got == want, (name, r, got, want)
        t = s["comm"][r]["training"]
        g, p = (4 if r32 else 2), 2  # bytes per gradient / parameter element on the wire
        sent = (N - 1) * psi * p if r == 0 else psi * g
        recv = (N - 1) * psi * g if r == 0 else psi * p
        if N == 1: sent = recv = 0
        assert (t["bytes_sent"], t["bytes_received"]) == (sent * steps, recv * steps), (name, r, t, sent, recv)
    assert s["model_states_bytes_per_rank"] == 16 * psi
    print(f"ok {name}: ledger rank 0 (2Ψ, 2Ψ, 12Ψ, comm {'8Ψ' if r32 else '2Ψ'}) = 16Ψ, others 4Ψ; "
          f"rank 0 sends {(N - 1) * psi * 2} B, receives {(N - 1) * psi * (4 if r32 else 2)} B per step: exact")
for name in ("f16_ch02_k3", "f16_ch03_np3"):
    s = summary(name)
    assert s["precision"] == "fp16" and s["skipped_steps"] == 2 and s["loss_scale"] == 16384.0, s
print("ok fp16: 2 skipped steps, scale 2^16 -> 2^14, in 02 (K = 3) and 03 (N = 3) alike")
PY
# --reduce-dtype is fp32 or the --precision's: the others stop every rank, naming the fix.
fails reduce_fp32_params 2 ch03_data_parallel \
  "--reduce-dtype bf16 with --precision fp32: .* drop --reduce-dtype, or add --precision bf16" \
  "${common[@]}" --reduce-dtype bf16
fails reduce_other_16 2 ch03_data_parallel \
  "--reduce-dtype fp16 with --precision bf16: .* use --reduce-dtype bf16 or fp32" \
  "${common[@]}" --precision bf16 --reduce-dtype fp16
echo "mixed precision, chapter 03: all checks passed"
