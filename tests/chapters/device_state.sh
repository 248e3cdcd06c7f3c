#!/usr/bin/env bash
# Training state on the emulated device (issue 27, item 3): checkpoints, --save-optimizer-state
# and --find-unused-parameters are the CPU's code there too. Emulated device memory is mapped
# PROT_NONE, so a writer or reader that touched it from the host would stop the run with
# SIGSEGV; the checkpoint code copies between the device and the host with copy_elements.
#  - chapters 01, 05 (replicated state), 06 and 08 (shards, N = 2 and 3): a run on the device
#    checkpointed at step 10 and resumed there from it ends BITWISE where the uninterrupted
#    device run ends, and that is the CPU run's end (device_backend.sh: the device is bitwise
#    the CPU);
#  - the checkpoint is the same file either way: one written on the device resumes on the CPU
#    and one written on the CPU resumes on the device, both bitwise;
#  - --save-optimizer-state on the device (chapter 06, gathered from the shards) writes the
#    CPU's file byte for byte;
#  - --find-unused-parameters on the device changes nothing when every parameter is used
#    (chapter 05, bitwise), as on the CPU (ch05_ddp.sh).
source "$(dirname "$0")/lib.bash"
base=(--model toy --hidden-sizes 16,8 --global-batch-size 48 --eval-every-epoch 0 --seed 5
      --max-steps 20 --clip-grad-norm 0.5)
check() {  # check NAME NP BINARY ARGS...
  local name=$1 np=$2 binary=$3; shift 3
  run "${name}_cpu" "$np" "$binary" "${base[@]}" "$@" --checkpoint-dir "$WORK/${name}_cpu_ck" \
    --checkpoint-every 10
  run "${name}_dev" "$np" "$binary" "${base[@]}" "$@" --device emulated \
    --checkpoint-dir "$WORK/${name}_dev_ck" --checkpoint-every 10
  "$COMPARE" "$WORK/${name}_cpu.safetensors" "$WORK/${name}_dev.safetensors" --bitwise >/dev/null
  # Resumed on the device from the device's checkpoint, and across devices both ways.
  run "${name}_dev_from_dev" "$np" "$binary" "${base[@]}" "$@" --device emulated \
    --resume "$WORK/${name}_dev_ck/step_00000010"
  run "${name}_dev_from_cpu" "$np" "$binary" "${base[@]}" "$@" --device emulated \
    --resume "$WORK/${name}_cpu_ck/step_00000010"
  run "${name}_cpu_from_dev" "$np" "$binary" "${base[@]}" "$@" \
    --resume "$WORK/${name}_dev_ck/step_00000010"
  for resumed in dev_from_dev dev_from_cpu cpu_from_dev; do
    grep -q "resumed from .*step_00000010" "$WORK/${name}_$resumed.log"
    "$COMPARE" "$WORK/${name}_cpu.safetensors" "$WORK/${name}_$resumed.safetensors" \
      --bitwise >/dev/null
    same_tail "${name}_cpu" "${name}_$resumed"
  done
  echo "ok: $name: checkpointed and resumed on the device, and across devices, bitwise"
}
check ch01 0 ch01_training_loop
check ch05_n2 2 ch05_ddp_buckets --bucket-cap-mb 0.002
check ch06_n3 3 ch06_zero1 --bucket-cap-mb 0.002
check ch08_n2 2 ch08_zero3

# --save-optimizer-state: chapter 06's shards gathered from the device, the CPU's bytes.
for dev in cpu emulated; do
  run "opt_$dev" 2 ch06_zero1 "${base[@]}" --device "$dev" \
    --save-optimizer-state "$WORK/opt_$dev.opt.safetensors"
done
cmp "$WORK/opt_cpu.opt.safetensors" "$WORK/opt_emulated.opt.safetensors"
echo "ok: --save-optimizer-state on the device writes the CPU's file"

# --find-unused-parameters with every parameter used: nothing changes, on the device too.
run unused_off 2 ch05_ddp_buckets "${base[@]}" --device emulated
run unused_on 2 ch05_ddp_buckets "${base[@]}" --device emulated --find-unused-parameters
same unused_off unused_on --bitwise
echo "ok: --find-unused-parameters on the device changes nothing when every parameter is used"
