#!/usr/bin/env bash
# Chain link 06 vs 05: ZeRO-1 splits chapter 05's bucket all-reduce into its two halves, a
# reduce-scatter of the gradients and (after each rank's optimizer step on its shard) an
# all-gather of the parameters. Every bucket is padded to a multiple of N, so its shards are
# exactly the ring's chunks of the unpadded bucket (ceil(n/N) elements): every element is
# summed in the same order as in chapter 05, and AdamW's update is elementwise. Expected:
# BITWISE equal parameters and losses at every N, with
#  - the MLP with a hidden width (61) that makes no bucket divisible by 3 or 4;
#  - --hidden-sizes 1 and one bucket per parameter: a 1-element bucket (0.bias), so at N > 1
#    some ranks own only padding; accumulation K = 3 (no_sync); clipping that is active
#    (checked: the same run without clipping ends elsewhere). The clip norm is a float64 sum
#    of the shards' Σ g² over ranks instead of one sum over all gradients: another order, but
#    the float clip coefficient comes out the same (measured: bitwise here);
#  - the ToyModel across an epoch boundary;
#  - --collectives mpi: MPI_Reduce_scatter_block + MPI_Allgather vs chapter 05's MPI_Allreduce,
#    which sum in MPI's own orders: `close` in lib.bash (SGD: relative L2 1e-4 of the movement,
#    losses within 1e-6; AdamW: Adam's own bound, 2.5e-2 after 12 steps). Measured at np 3 on
#    an AMD EPYC without AVX-512: SGD relative 6.9e-7, losses equal; AdamW 1.9e-8).
# From the summary record, on every rank: bytes sent per step = theory exactly (2(N−1)·s per
# padded bucket: 2(N−1)/N·4(Ψ + padding)), the same per step for K = 3 as for K = 1; and
# model-state bytes (current and peak) = the exact formula 8(Ψ + padding) + 8·(real shard).
# Last, the memory calculator against the seeds' table and the ZeRO paper's Figure 1.
source "$(dirname "$0")/lib.bash"

# check_zero NAME: traffic and model states of every rank against the summary's theory.
check_zero() {
  python3 - "$WORK/$1.jsonl" "$1" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
n = s["world_size"]
sent = [c["training"]["bytes_sent"] / s["steps"] for c in s["comm"]]
assert sent == s["theory_bytes_sent_per_rank_per_step"], (sent, s["theory_bytes_sent_per_rank_per_step"])
exact = s["model_states_exact_bytes"]
for r in range(n):
    led = s["ledger"][r]
    assert led["model_states_current"] == exact[r], (r, led["model_states_current"], exact[r])
    assert led["model_states_peak"] == exact[r], (r, led["model_states_peak"], exact[r])
    assert led["padding"]["current"] == 8 * s["padding"], (r, led["padding"], s["padding"])
psi, pad = s["num_parameters"], s["padding"]
ideal = 2 * (n - 1) * 4 * (psi + pad) // n if n > 1 else 0
assert all(b == ideal for b in sent), (sent, ideal)
print(f"ok: {sys.argv[2]}: sent {sent[0]:.0f} B/step/rank = 2(N-1)/N·4(Ψ+{pad}); model states {exact}")
PY
}
sent() { python3 -c 'import json,sys; s=[json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][-1]; print(s["comm"][0]["training"]["bytes_sent"] // s["steps"])' "$WORK/$1.jsonl"; }

for np in 1 2 3 4; do
  common=(--model mlp --hidden-sizes 61 --global-batch-size 72 --max-steps 12 --eval-every-epoch 0 --seed 3)
  run ch05_n$np $np ch05_ddp_buckets "${common[@]}"
  run ch06_n$np $np ch06_zero1 "${common[@]}"
  same ch05_n$np ch06_n$np --bitwise
  check_zero ch06_n$np

  odd_base=(--model mlp --hidden-sizes 1 --bucket-cap-mb 0.000001 --global-batch-size 72 --max-steps 12
            --eval-every-epoch 0 --seed 4)
  odd=("${odd_base[@]}" --grad-accum-steps 3 --clip-grad-norm 0.05)
  run ch05_odd_n$np $np ch05_ddp_buckets "${odd[@]}"
  run ch06_odd_n$np $np ch06_zero1 "${odd[@]}"
  same ch05_odd_n$np ch06_odd_n$np --bitwise
  check_zero ch06_odd_n$np
  run ch06_k1_n$np $np ch06_zero1 "${odd_base[@]}" --clip-grad-norm 0.05
  [ "$(sent ch06_k1_n$np)" = "$(sent ch06_odd_n$np)" ] || { echo "FAILED: K = 3 sends other bytes than K = 1"; exit 1; }
done

run ch06_noclip 3 ch06_zero1 "${odd_base[@]}" --grad-accum-steps 3
if "$COMPARE" "$WORK/ch06_odd_n3.safetensors" "$WORK/ch06_noclip.safetensors" --atol 1e-4 >/dev/null; then
  echo "FAILED: --clip-grad-norm 0.05 changed nothing: clipping was not active"; exit 1
fi
echo "ok: clipping is active in the runs above"

for np in 2 3; do
  toy=(--model toy --hidden-sizes 64,37 --global-batch-size 48 --epochs 2 --max-steps 24 --seed 5 --bucket-cap-mb 0.01)
  run toy05_n$np $np ch05_ddp_buckets "${toy[@]}"
  run toy06_n$np $np ch06_zero1 "${toy[@]}"
  same toy05_n$np toy06_n$np --bitwise
  check_zero toy06_n$np
done

run mpi05 3 ch05_ddp_buckets "${common[@]}" --collectives mpi
run mpi06 3 ch06_zero1 "${common[@]}" --collectives mpi
start_point start "${common[@]}"
run mpi05_sgd 3 ch05_ddp_buckets "${common[@]}" --collectives mpi "${sgd[@]}"
run mpi06_sgd 3 ch06_zero1 "${common[@]}" --collectives mpi "${sgd[@]}"
close mpi05 mpi06 start 12

# The memory calculator reproduces the seeds' table and the ZeRO paper's Figure 1 (no mpirun).
"$BIN/ch06_zero1" --memory-calculator --params 7e9 --world-size 8 >"$WORK/calc.log"
"$BIN/ch07_zero2" --memory-calculator --params 7.5e9 --world-size 64 --mixed-precision >"$WORK/paper.log"
for row in "DDP .*\| +112 GB" "ZeRO-1 .*\| +63 GB" "ZeRO-2 .*\| +38.5 GB" "ZeRO-3 .*\| +14 GB"; do
  grep -Eq "$row\$" "$WORK/calc.log" || { echo "FAILED: calculator row /$row/"; cat "$WORK/calc.log"; exit 1; }
done
for row in "DDP .*\| +120 GB" "ZeRO-1 .*\| +31.4 GB" "ZeRO-2 .*\| +16.6 GB" "ZeRO-3 .*\| +1.9 GB"; do
  grep -Eq "$row\$" "$WORK/paper.log" || { echo "FAILED: calculator row /$row/"; cat "$WORK/paper.log"; exit 1; }
done
echo "ok: --memory-calculator: 112 / 63 / 38.5 / 14 GB (seeds) and 120 / 31.4 / 16.6 / 1.9 GB (paper)"
