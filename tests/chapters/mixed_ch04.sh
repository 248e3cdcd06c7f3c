#!/usr/bin/env bash
# Chapter 04 in 16 bits (--precision bf16|fp16; step.hpp, ring_data_parallel.hpp,
# common/precision/precision.hpp):  - fp32 unchanged: no flag vs --precision fp32, bitwise (N = 3);
#  - 04(N) vs 03(N) in bf16. Bitwise at N = 1, 2: one 16-bit addition per element either way
#    (the ring adds g1 + g0 on one chunk, rank 0 adds g0 + g1: the fp32 sum is commutative and
#    is rounded once). At N = 3, 4 the ring sums chunk c in ring order starting at rank c + 1
#    and rounds to 16 bits after each hop, rank 0 sums ((g0 + g1) + g2) with its own
#    roundings: the last bf16 bit (2^-8 relative, not fp32's 2^-24) differs, and Adam turns a
#    near-zero gradient's flipped sign into a whole step. Criterion: AdamW's own bound,
#    2·lr·Σ_t R_t = 4.2e-2 after 20 steps of lr 1e-3 (compare_runs --adam-bound, as the fp32
#    link ch04_vs_ch03.sh; the SGD criterion of that link is unavailable: 16 bits need AdamW).
#    Measured on an AMD EPYC without AVX-512: max |Δparam| 1.6e-2 (N = 3), 1.5e-2 (N = 4),
#    losses apart by up to 9e-3 at step 20;
#  - fp16 at N = 2 from the initial weights x 6 (2 skipped steps): bitwise with chapter 03, so
#    both skip the same steps on every rank without advancing Adam (mixed_ch03.sh: 03 = 02);
#  - the ledger per rank, to the byte: parameters 2Ψ, gradients 2Ψ, optimizer_state 12Ψ on
#    EVERY rank (16Ψ), comm_buffers one 16-bit ring chunk of the largest parameter,
#    2·ceil(401408/N); with --reduce-dtype fp32 4Ψ (the widened gradient) + 4·ceil(401408/N);
#  - the counters per step: per parameter, every chunk but one, twice, at 2 bytes per element
#    (2(N-1)/N·Ψ·2: half of fp32's, exactly); with --reduce-dtype fp32 at 4 bytes;
#  - --collectives mpi: refused with a 16-bit --reduce-dtype (MPI has no bf16 sum), naming
#    both flags and the fix; with --reduce-dtype fp32 it trains, bitwise with our fp32 ring at
#    N = 2 (one fp32 addition either way).
source "$(dirname "$0")/lib.bash"
common=(--model mlp --global-batch-size 48 --max-steps 20 --epochs 2 --eval-every-epoch 0 --seed 3)
run fp32_np3 3 ch04_ring_allreduce "${common[@]}"
run fp32_flag_np3 3 ch04_ring_allreduce "${common[@]}" --precision fp32
same fp32_np3 fp32_flag_np3 --bitwise
for N in 1 2 3 4; do
  run ch03_np$N $N ch03_data_parallel "${common[@]}" --precision bf16
  run ch04_np$N $N ch04_ring_allreduce "${common[@]}" --precision bf16
  chain_link ch03_np$N ch04_np$N $N 20
done
run ch04_np3_r32 3 ch04_ring_allreduce "${common[@]}" --precision bf16 --reduce-dtype fp32
adam_close ch04_np3 ch04_np3_r32 20
run ch04_np2_r32 2 ch04_ring_allreduce "${common[@]}" --precision bf16 --reduce-dtype fp32
run ch04_np2_r32_mpi 2 ch04_ring_allreduce "${common[@]}" --precision bf16 --reduce-dtype fp32 --collectives mpi
same ch04_np2_r32 ch04_np2_r32_mpi --bitwise
stops mpi_bf16 2 ch04_ring_allreduce \
  "--collectives mpi with --reduce-dtype bf16 .*: MPI has no bf16 sum; use --reduce-dtype fp32" \
  "${common[@]}" --precision bf16 --collectives mpi

# fp16 with overflowing gradients: the initial weights x 6.
scaled_start w6 6 --model mlp --seed 3  # lib.bash: the initial weights x 6
f16=(--model mlp --global-batch-size 48 --max-steps 10 --epochs 1 --eval-every-epoch 0 --seed 3
  --precision fp16 --init-from "$WORK/w6.safetensors")
run f16_ch03_np2 2 ch03_data_parallel "${f16[@]}"
run f16_ch04_np2 2 ch04_ring_allreduce "${f16[@]}"
same f16_ch03_np2 f16_ch04_np2 --bitwise

check_summaries <<'PY'
sizes = [784 * 512, 512, 512 * 512, 512, 512 * 10, 10]  # the MLP's parameters
for name, N, r32, mpi in [("ch04_np1", 1, False, False), ("ch04_np2", 2, False, False),
                          ("ch04_np3", 3, False, False), ("ch04_np4", 4, False, False),
                          ("ch04_np3_r32", 3, True, False), ("ch04_np2_r32_mpi", 2, True, True)]:
    s = summary(name)
    psi, steps, b = s["num_parameters"], s["steps"], 4 if r32 else 2
    assert sum(sizes) == psi and s["precision"] == "bf16" and s["world_size"] == N
    def chunk(n, i):
        c = -(-n // N)
        lo = min(n, i * c)
        return min(n, lo + c) - lo
    for r in range(N):
        led = s["ledger"][r]
        comm_buf = (4 * psi if r32 else 0) + b * chunk(max(sizes), 0)
        got = (led["parameters"]["peak"], led["gradients"]["peak"], led["optimizer_state"]["peak"],
               led["comm_buffers"]["peak"], led["model_states_peak"])
        want = (2 * psi, 2 * psi, 12 * psi, comm_buf, 16 * psi)
        assert got == want, (name, r, got, want)
        if mpi:  # the payload handed to MPI_Allreduce
            sent = recv = psi * 4
        else:
            sent = sum(n - chunk(n, r) + n - chunk(n, (r + 1) % N) for n in sizes) * b if N > 1 else 0
            recv = sum(n - chunk(n, (r - 1) % N) + n - chunk(n, r) for n in sizes) * b if N > 1 else 0
        t = s["comm"][r]["training"]
        assert (t["bytes_sent"], t["bytes_received"]) == (sent * steps, recv * steps), (name, r, t, sent, recv)
    print(f"ok {name}: ledger 2Ψ + 2Ψ + 12Ψ = 16Ψ on every rank, comm_buffers {comm_buf} B; "
          f"rank 0 sends {sent} B per step ({'MPI payload Ψ·4' if mpi else f'ring, {b} bytes per element'}): exact")
for name in ("f16_ch03_np2", "f16_ch04_np2"):
    s = summary(name)
    assert s["precision"] == "fp16" and s["skipped_steps"] == 2 and s["loss_scale"] == 16384.0, s
print("ok fp16: 2 skipped steps, scale 2^16 -> 2^14, in 03 and 04 (N = 2) alike")
PY
echo "mixed precision, chapter 04: all checks passed"
