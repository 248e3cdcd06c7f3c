#!/usr/bin/env bash
# Every chapter with --device cuda, on the CPU emulation of the GPU layer (tests/emul: host
# memory, each kernel of common/device/gpu/kernels.cu the same element function of
# common/core/kernels.hpp in a loop, SGEMM a reference column-major loop), against the same command
# on the CPU. What runs is the chapter's own train_step on the CUDA backend's table
# (common/device/gpu/cuda_backend.cpp, linear.cpp: the code a GPU runs, less CUDA itself), the
# communicator handing every message to the NCCL transport (common/device/gpu/nccl_transport.cpp,
# over tests/emul/nccl_emul.cpp: NCCL as MPI calls). What it cannot test: CUDA, cuBLAS, NCCL and
# the kernels' launch (scripts/gpu-check; the emulated device of chapter_device_backend proves no
# host loop touches device memory).
#
# Criteria, every chapter (03-08 at N = 1..4):
#  - numbers: `close` in lib.bash (SGD: relative L2 1e-4 of the movement, losses within 1e-6;
#    AdamW's own bound): the reference SGEMM adds a product's k terms in order, Eigen in blocks,
#    so the runs agree to float32 rounding, not bitwise;
#  - traffic: every rank sends exactly the CPU run's bytes (its summary record);
#  - 16 bits (chapters 01, 04, 06, 08): AdamW's bound alone (16 bits need AdamW), the same bytes;
#  - NCCL against --device-comm mpi (staged through host memory), chapters 03-08 at N = 3 and
#    both --collectives: bitwise, with the same bytes and the banner naming each (the same
#    computation; only what moves the messages differs, and the emulated NCCL's collective sums
#    are MPI's: on a GPU NCCL's differ in the last bits at N >= 3, scripts/gpu-check's bounds).
source "$(dirname "$0")/lib.bash"
EMUL=../emul
start_point start --model mlp --seed 3
pairs() {  # pairs CHAPTER NP ARGS...: the CPU run and the emulated-CUDA run, AdamW and SGD
  local ch=$1 np=$2; shift 2
  local name=${ch:0:2}_n$np
  run cpu_$name "$np" ch$ch "$@"
  run gpu_$name "$np" $EMUL/emul_ch$ch "$@" --device cuda
  run cpu_${name}_sgd "$np" ch$ch "$@" "${sgd[@]}"
  run gpu_${name}_sgd "$np" $EMUL/emul_ch$ch "$@" "${sgd[@]}" --device cuda
  close cpu_$name gpu_$name start 8
  if [ "$np" -gt 0 ]; then  # one process communicates nothing (its summary has no "comm")
    expect_eq "$(sent gpu_$name)" "$(sent cpu_$name)" "$ch np $np: the CPU's bytes on every rank"
  fi
  grep -q "^device CPU emulation" "$WORK/gpu_$name.log" || { echo "FAILED: no device line"; exit 1; }
}
common=(--model mlp --global-batch-size 48 --max-steps 8 --eval-every-epoch 0 --seed 3)
pairs 01_training_loop 0 "${common[@]}" --clip-grad-norm 0.5
pairs 02_gradient_accumulation 0 "${common[@]}" --grad-accum-steps 2
for np in 1 2 3 4; do
  pairs 03_data_parallel $np "${common[@]}"
  pairs 04_ring_allreduce $np "${common[@]}"
  pairs 05_ddp_buckets $np "${common[@]}" --bucket-cap-mb 0.5 --grad-accum-steps 2
  pairs 06_zero1 $np "${common[@]}" --bucket-cap-mb 0.5
  pairs 07_zero2 $np "${common[@]}" --bucket-cap-mb 0.5 --grad-accum-steps 2
  pairs 08_zero3 $np "${common[@]}" --grad-accum-steps 2
done
pairs 05_ddp_buckets 3 "${common[@]}" --collectives mpi --bucket-cap-mb 0.5
pairs 08_zero3 3 "${common[@]}" --collectives mpi --no-prefetch
# 16 bits: bf16/fp16 storage through the CUDA backend's conversions and 16-bit norm, the
# fp32 master weights on the device: AdamW's bound (16 bits need AdamW) and the CPU's bytes.
half_pair() {  # half_pair CHAPTER NP ARGS...
  local ch=$1 np=$2; shift 2
  local name=${ch:0:2}_n${np}_16
  run cpu_$name "$np" ch$ch "${common[@]}" "$@"
  run gpu_$name "$np" $EMUL/emul_ch$ch "${common[@]}" "$@" --device cuda
  adam_close cpu_$name gpu_$name 8
  if [ "$np" -gt 0 ]; then
    expect_eq "$(sent gpu_$name)" "$(sent cpu_$name)" "$ch np $np 16-bit: the CPU's bytes"
  fi
}
half_pair 01_training_loop 0 --precision bf16 --clip-grad-norm 0.5
half_pair 04_ring_allreduce 3 --precision fp16
half_pair 06_zero1 2 --precision bf16 --bucket-cap-mb 0.5 --reduce-dtype fp32
half_pair 08_zero3 3 --precision bf16 --grad-accum-steps 2
# The transport: NCCL (the default with --device cuda) against MPI staged through host memory.
transport_pair() {  # transport_pair CHAPTER ARGS...
  local ch=$1; shift
  local name=${ch:0:2}_$(echo "$*" | tr -dc 'a-z0-9' | tail -c 12)
  run nccl_$name 3 $EMUL/emul_ch$ch "${common[@]}" "$@" --device cuda
  run mpi_$name 3 $EMUL/emul_ch$ch "${common[@]}" "$@" --device cuda --device-comm mpi
  same nccl_$name mpi_$name
  expect_eq "$(sent nccl_$name)" "$(sent mpi_$name)" "$ch np 3 $*: NCCL sends MPI's bytes"
  grep -q "messages over nccl on the device" "$WORK/nccl_$name.log" || {
    echo "FAILED: $ch: no NCCL in the banner"; exit 1; }
  grep -q "messages staged through host memory" "$WORK/mpi_$name.log" || {
    echo "FAILED: $ch: --device-comm mpi does not stage"; exit 1; }
}
# The emulated NCCL is built where the NCCL headers are (a CUDA build: emul_comm_check beside).
if [ -x "$EMUL/emul_comm_check" ]; then
  transport_pair 03_data_parallel
  transport_pair 04_ring_allreduce --collectives mpi
  transport_pair 05_ddp_buckets --bucket-cap-mb 0.5 --grad-accum-steps 2
  transport_pair 06_zero1 --bucket-cap-mb 0.5 --collectives mpi
  transport_pair 07_zero2 --bucket-cap-mb 0.5 --precision bf16
  transport_pair 08_zero3 --grad-accum-steps 2
  # Two ranks on one GPU: NCCL cannot; every rank stops at start-up naming both and the fix.
  fails nccl_shared_gpu "[rank 1/2]" "ranks 0 and 1 both use" "--device-comm mpi" \
    -- "$MPIRUN" -np 2 --oversubscribe -x RINGZERO_EMUL_GPUS=1 "$BIN/$EMUL/emul_ch05_ddp_buckets" \
    --model toy --device cuda --max-steps 1
else
  echo "skip: the NCCL transport pairs (a build without the CUDA toolkit has no NCCL emulation)"
fi
echo "PASS: chapters 01-08 with --device cuda on the emulated GPU layer match the CPU; NCCL" \
  "moves what MPI moves, bit for bit"
