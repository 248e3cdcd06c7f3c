#!/usr/bin/env bash
# Every chapter with --device emulated: the model moves to the emulated device (Model::to, before
# the lesson is built, so the lesson's buffers are allocated there too) and the chapter's own
# train_step runs on it, every op, optimizer update and reduction add through the device
# backend's table (common/core/device_backend.hpp), every message staged through host memory by the
# communicator. Emulated device memory is mapped PROT_NONE, so host code that touched it
# directly would stop the run with SIGSEGV; the backend runs the host functions on a second
# mapping, so the runs must equal the CPU runs BITWISE (weights and every step's loss) and send
# the CPU's bytes on every rank: cross-entropy (Fashion-MNIST, evaluated on the device between
# epochs) and MSE (the ToyModel), AdamW and SGD with momentum and clipping, K = 1, 2, 4; the
# central reducer, the ring and MPI's all-reduce, DDP's buckets, ZeRO-1/2 (padded buckets,
# reduce-scatter and all-gather, ring and MPI's, sharded clipping) and ZeRO-3 (layers gathered
# for their compute, with and without prefetch), at N = 1..4.
source "$(dirname "$0")/lib.bash"
pair() {  # pair NAME BINARY ARGS...: the CPU run and the emulated run, bitwise equal
  local name=$1 binary=$2; shift 2
  run cpu_$name 0 "$binary" "$@"
  run emu_$name 0 "$binary" "$@" --device emulated
  same cpu_$name emu_$name --bitwise
  grep -q "^device emulated" "$WORK/emu_$name.log" || { echo "FAILED: no device line"; exit 1; }
  python3 - "$WORK/emu_$name.jsonl" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
assert s["device"].startswith("emulated"), s.get("device")
assert s["device_model_states_bytes_per_rank"] > 0, "no device column in the ledger"
PY
}
mlp=(--model mlp --global-batch-size 48 --eval-every-epoch 0 --seed 3)
pair 01_mlp ch01_training_loop "${mlp[@]}" --max-steps 12 --clip-grad-norm 0.5
pair 02_mlp ch02_gradient_accumulation "${mlp[@]}" --max-steps 8 --grad-accum-steps 2
toy=(--model toy --global-batch-size 64 --epochs 2 --seed 3 --optimizer sgd --momentum 0.9)
pair 02_toy ch02_gradient_accumulation "${toy[@]}" --grad-accum-steps 4 --clip-grad-norm 0.5
pair 01_toy ch01_training_loop "${toy[@]}"
grep -q "epoch 1 | test loss" "$WORK/emu_01_toy.log" || { echo "FAILED: no evaluation"; exit 1; }
# Cross-entropy evaluated on the device between epochs (2 steps of 30000 samples per epoch).
pair 01_mlp_eval ch01_training_loop --model mlp --global-batch-size 30000 --epochs 2 --seed 3
grep -q "epoch 1 | test loss .* | test accuracy" "$WORK/emu_01_mlp_eval.log" ||
  { echo "FAILED: no evaluation"; exit 1; }

# dist_pair NAME NP BINARY ARGS...: the same, under mpirun, and the same bytes on every rank.
dist_pair() {
  local name=$1 np=$2 binary=$3; shift 3
  run cpu_$name "$np" "$binary" "$@"
  run emu_$name "$np" "$binary" "$@" --device emulated
  same cpu_$name emu_$name --bitwise
  expect_eq "$(sent emu_$name)" "$(sent cpu_$name)" "$name: the CPU's bytes per step, every rank"
  grep -q "messages staged through host memory" "$WORK/emu_$name.log" ||
    { echo "FAILED: no staging in the device line"; exit 1; }
  # ZeRO-1 and ZeRO-3 hold their model states constantly: the device column's peak is exactly
  # the bytes the engine says (the chapter's formula, padding included) on the largest rank.
  python3 - "$WORK/emu_$name.jsonl" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
assert s["device"].startswith("emulated"), s.get("device")
exact = s.get("model_states_exact_bytes")
if exact and s.get("zero_stage") in (1, 3):
    assert s["device_model_states_bytes_per_rank"] == max(exact), \
        (s["device_model_states_bytes_per_rank"], exact)
PY
}
dist=(--model mlp --global-batch-size 48 --max-steps 6 --eval-every-epoch 0 --seed 3)
for np in 1 2 3 4; do
  dist_pair 03_n$np "$np" ch03_data_parallel "${dist[@]}" --grad-accum-steps 2
  dist_pair 04_n$np "$np" ch04_ring_allreduce "${dist[@]}" --clip-grad-norm 0.5
  dist_pair 05_n$np "$np" ch05_ddp_buckets "${dist[@]}" --bucket-cap-mb 0.5 --grad-accum-steps 2
done
dist_pair 04_mpi 3 ch04_ring_allreduce "${dist[@]}" --collectives mpi
dist_pair 05_sgd 3 ch05_ddp_buckets "${dist[@]}" --optimizer sgd --momentum 0.9 --collectives mpi
for np in 1 2 3 4; do
  dist_pair 06_n$np "$np" ch06_zero1 "${dist[@]}" --bucket-cap-mb 0.5 --clip-grad-norm 0.5
  dist_pair 07_n$np "$np" ch07_zero2 "${dist[@]}" --bucket-cap-mb 0.5 --grad-accum-steps 2
  dist_pair 08_n$np "$np" ch08_zero3 "${dist[@]}" --grad-accum-steps 2
done
dist_pair 06_mpi 3 ch06_zero1 "${dist[@]}" --collectives mpi --optimizer sgd --momentum 0.9
dist_pair 07_mpi 2 ch07_zero2 "${dist[@]}" --collectives mpi --bucket-cap-mb 0.5
dist_pair 08_mpi 3 ch08_zero3 "${dist[@]}" --collectives mpi --clip-grad-norm 0.5
dist_pair 08_no_prefetch 3 ch08_zero3 "${dist[@]}" --no-prefetch
# Evaluation on the device through ZeRO-3's gathers (2 steps of 30000 samples, then the test set).
dist_pair 08_eval 3 ch08_zero3 --model mlp --global-batch-size 30000 --epochs 1 --seed 3
grep -q "epoch 1 | test loss .* | test accuracy" "$WORK/emu_08_eval.log" ||
  { echo "FAILED: no evaluation"; exit 1; }
echo "PASS: chapters 01-08 on the emulated device equal the CPU bitwise, the same bytes per rank"
