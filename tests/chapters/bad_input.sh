#!/usr/bin/env bash
# Bad input gets a clear message and a non-zero exit, never a crash or a silent run: missing
# dataset, corrupt IDX files, unknown flags, non-positive sizes, a global batch that K does not
# divide, a diverging (non-finite) loss, and a few neighbours. Each case asserts the exit code
# AND the words of the message that name the value and the fix. Needs no dataset: the corrupt
# IDX files are written here, the rest fails in flag validation or runs on synthetic data.
source "$(dirname "$0")/lib.bash"
CH01=("$BIN/ch01_training_loop")
CH02=("$BIN/ch02_gradient_accumulation")

# fails NAME TEXT... -- COMMAND... (lib.bash): COMMAND must exit 1..123 within RUN_TIMEOUT (not a
# timeout or signal) and print every TEXT.

# bytes B...: raw bytes given as numbers 0..255 (octal escapes: portable printf).
bytes() { for b in "$@"; do printf "\\$(printf %03o "$b")"; done; }
# idx_header FILE TYPE DIMS...: a big-endian IDX header (0, 0, TYPE, ndim, dims as u32) in FILE.
idx_header() {
  local file=$1 type=$2; shift 2
  bytes 0 0 "$type" $# >"$file"
  for d in "$@"; do bytes $((d >> 24 & 255)) $((d >> 16 & 255)) $((d >> 8 & 255)) $((d & 255)) >>"$file"; done
}

# Missing dataset: the path and the fix (scripts/setup installs dataset-fashion-mnist).
fails missing_dataset "$WORK/no-such-dir" "scripts/setup" -- "${CH01[@]}" --data-dir "$WORK/no-such-dir"

# Corrupt IDX files: the file and what is wrong with it.
mkdir -p "$WORK/magic" "$WORK/short" "$WORK/counts"
idx_header "$WORK/magic/raw" 9 60000 28 28  # element type 0x09 instead of 0x08 (ubyte)
gzip -c "$WORK/magic/raw" >"$WORK/magic/train-images-idx3-ubyte.gz"
fails idx_bad_magic "$WORK/magic/train-images-idx3-ubyte.gz" "bad magic 0x00000903, expected 0x00000803" \
  -- "${CH01[@]}" --data-dir "$WORK/magic"
idx_header "$WORK/short/raw" 8 60000 28 28
head -c 1000 /dev/zero >>"$WORK/short/raw"
gzip -c "$WORK/short/raw" >"$WORK/short/train-images-idx3-ubyte.gz"
fails idx_truncated "$WORK/short/train-images-idx3-ubyte.gz" "truncated: 1000 of 47040000 data bytes" \
  -- "${CH01[@]}" --data-dir "$WORK/short"
idx_header "$WORK/counts/images" 8 2 28 28
head -c $((2 * 784)) /dev/zero >>"$WORK/counts/images"
idx_header "$WORK/counts/labels" 8 3
bytes 1 2 3 >>"$WORK/counts/labels"
gzip -c "$WORK/counts/images" >"$WORK/counts/train-images-idx3-ubyte.gz"
gzip -c "$WORK/counts/labels" >"$WORK/counts/train-labels-idx1-ubyte.gz"
fails idx_count_mismatch "2 images but 3 labels" -- "${CH01[@]}" --data-dir "$WORK/counts"

# Flags CLI11 rejects: the flag is named, exit code non-zero (CLI11's own codes).
fails unknown_flag "--frobnicate" "--help" -- "${CH01[@]}" --frobnicate
fails not_a_number "--global-batch-size" "abc" -- "${CH01[@]}" --global-batch-size abc
fails no_grad_accum_in_ch01 "--grad-accum-steps" -- "${CH01[@]}" --grad-accum-steps 2
fails unknown_model "--model" "mlp" -- "${CH01[@]}" --model resnet

# Non-positive sizes: the flag and its value.
fails batch_zero "--global-batch-size 0 must be positive" -- "${CH01[@]}" --global-batch-size 0
fails batch_negative "--global-batch-size -64 must be positive" -- "${CH02[@]}" --global-batch-size -64
fails epochs_zero "--epochs 0 must be positive" -- "${CH01[@]}" --epochs 0
fails max_steps_zero "--max-steps 0 must be positive" -- "${CH01[@]}" --max-steps 0
fails hidden_zero "--hidden-sizes has 0" -- "${CH01[@]}" --hidden-sizes 64,0
fails lr_zero "--lr 0 must be a positive" -- "${CH01[@]}" --lr 0
fails accum_zero "--grad-accum-steps 0 must be positive" -- "${CH02[@]}" --grad-accum-steps 0

# A global batch K does not divide: the three numbers and the fix.
fails batch_not_divisible "--global-batch-size 64 is not divisible by world_size 1 x --grad-accum-steps 3" \
  "multiple of 3" -- "${CH02[@]}" --grad-accum-steps 3

# Other combinations that cannot run.
fails model_data_mismatch "--model mlp does not fit --data synthetic" -- "${CH01[@]}" --data synthetic
fails batch_exceeds_dataset "--global-batch-size 2000 exceeds the 1000 training samples" \
  -- "${CH01[@]}" --model toy --global-batch-size 2000
fails init_from_missing "$WORK/none.safetensors" "--init-from" "no such file on this rank" -- "${CH01[@]}" --model toy --init-from "$WORK/none.safetensors"

# A diverging run stops at the first non-finite loss and names the step: with lr 1e10 the
# first AdamW step moves every weight by ~1e10, and step 2's loss overflows float32 to inf.
toy=(--model toy --hidden-sizes 32 --lr 1e10 --max-steps 10 --eval-every-epoch 0)
fails nan_loss_ch01 "loss is inf at step 2" "lower --lr" -- "${CH01[@]}" "${toy[@]}"
fails nan_loss_ch02 "loss is inf at step 2" "lower --lr" -- "${CH02[@]}" "${toy[@]}" --grad-accum-steps 4
# --device: an unknown one; cuda where it cannot run (with no GPU or no CUDA build, every
# chapter, on every rank); flags the device path does not carry; --collectives nccl (NCCL is how
# device messages travel, --device-comm, not a choice of collective); --device-comm nccl off a GPU
# or on one process. On a machine with a GPU, scripts/gpu-check covers cuda.
fails device_unknown "--device" "tpu" -- "${CH01[@]}" --device tpu
if ! nvidia-smi -L >/dev/null 2>&1; then
  fails device_cuda_no_gpu "--device cuda" "--device cpu" -- "${CH01[@]}" --model toy --device cuda --max-steps 1
  for ch in 03_data_parallel 04_ring_allreduce 05_ddp_buckets 06_zero1 07_zero2 08_zero3; do
    fails device_cuda_no_gpu_$ch "[rank 1/2]" "--device cuda" "--device cpu" \
      -- "$MPIRUN" -np 2 --oversubscribe "$BIN/ch$ch" --model toy --device cuda --max-steps 1
  done
fi
fails device_cuda_bench "--device cuda with --bench-allreduce" "Drop --device cuda" \
  -- "$MPIRUN" -np 2 --oversubscribe "$BIN/ch04_ring_allreduce" --device cuda --bench-allreduce
fails collectives_nccl "--collectives" "nccl" -- "$BIN/ch05_ddp_buckets" --model toy \
  --collectives nccl --max-steps 1
fails device_comm_emulated "[rank 1/2]" "--device-comm nccl with --device emulated" \
  "use --device cuda" -- "$MPIRUN" -np 2 --oversubscribe "$BIN/ch04_ring_allreduce" --model toy \
  --device emulated --device-comm nccl --max-steps 1
fails device_comm_one_process "--device-comm nccl: chapter" "runs on one process" \
  "drop --device-comm" -- "${CH01[@]}" --model toy --device cuda --device-comm nccl --max-steps 1
fails device_comm_cpu "[rank 1/2]" "--device-comm mpi with --device cpu" "drop --device-comm" \
  -- "$MPIRUN" -np 2 --oversubscribe "$BIN/ch05_ddp_buckets" --model toy --device-comm mpi \
  --max-steps 1
# RINGZERO_COMM_CPUS (scripts/cluster up --comm-core pins the communication thread with it):
# a value that is not a CPU list stops the chapter at start-up, naming the value and the fix.
fails comm_cpus_word "RINGZERO_COMM_CPUS='one'" "a list such as 1, 2,3 or 0-3" \
  -- env RINGZERO_COMM_CPUS=one "$BIN/ch05_ddp_buckets" --model toy --max-steps 1
fails comm_cpus_empty "RINGZERO_COMM_CPUS is set but empty" "or unset it" \
  -- env RINGZERO_COMM_CPUS= "$BIN/ch05_ddp_buckets" --model toy --max-steps 1
echo "all bad-input cases fail with their message"
