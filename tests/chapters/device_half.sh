#!/usr/bin/env bash
# 16-bit training on the emulated device (issue 27): --precision bf16|fp16 and --reduce-dtype are
# the CPU's code there too. The backend has three 16-bit entries, the conversions and the norm
# (common/core/device_backend.hpp); the rest (16-bit accumulation, rounding, the ring's 16-bit
# add, the overflow test, the norms, the master weights' update) is built from them and the
# float32 entries (common/core/half.cpp, common/precision/mixed.cpp). Emulated device memory is
# mapped PROT_NONE, so a 16-bit loop left on the host would stop the run with SIGSEGV; the
# backend runs the host functions on a second mapping, so each run must equal the CPU run
# BITWISE (weights and every step's loss) and send the CPU's bytes on every rank:
#  - chapters 01-02 in bf16 and fp16 (clipping, K = 2);
#  - chapters 03-08 in bf16 at N = 1..4 (the central reducer, the ring, DDP's buckets,
#    ZeRO-1/2/3 with their padded 16-bit shards and fp32 master weights);
#  - fp16 at N = 3 and --reduce-dtype fp32 (the fp32 sums of 16-bit gradients);
#  - ranks whose ring chunk or shard is empty (tiny layers in buckets of their own);
#  - fp16 whose gradients overflow (the initial weights x 6): the loss scaler skips the same
#    steps on the device (the overflow test through the backend);
#  - 16-bit checkpoints written on the device resume on the CPU and on the device, bitwise.
source "$(dirname "$0")/lib.bash"
pair() {  # pair NAME NP BINARY ARGS...: the CPU run and the emulated run, bitwise equal
  local name=$1 np=$2 binary=$3; shift 3
  run cpu_$name "$np" "$binary" "$@"
  run emu_$name "$np" "$binary" "$@" --device emulated
  same cpu_$name emu_$name --bitwise >/dev/null
  grep -q "^device emulated" "$WORK/emu_$name.log" || { echo "FAILED: no device line"; exit 1; }
  if [ "$np" -gt 0 ]; then  # one process communicates nothing (its summary has no "comm")
    expect_eq "$(sent emu_$name)" "$(sent cpu_$name)" "$name: the CPU's bytes on every rank"
  fi
  python3 - "$WORK/cpu_$name.jsonl" "$WORK/emu_$name.jsonl" <<'PY'
import json, sys
cpu, emu = ([json.loads(l) for l in open(f) if '"summary"' in l][-1] for f in sys.argv[1:])
assert emu["device"].startswith("emulated"), emu.get("device")
for k in ("precision", "loss_scale", "skipped_steps"):
    assert cpu.get(k) == emu.get(k), (k, cpu.get(k), emu.get(k))
# The 16-bit model states live on the device: its column holds what the CPU's host column holds.
assert emu["device_model_states_bytes_per_rank"] == cpu["model_states_bytes_per_rank"], \
    (emu["device_model_states_bytes_per_rank"], cpu["model_states_bytes_per_rank"])
PY
  echo "ok: $name bitwise on the device"
}
d=(--model mlp --global-batch-size 48 --max-steps 6 --eval-every-epoch 0 --seed 3)
pair 01_bf16 0 ch01_training_loop "${d[@]}" --precision bf16 --clip-grad-norm 0.5
pair 01_fp16 0 ch01_training_loop "${d[@]}" --precision fp16
pair 02_bf16 0 ch02_gradient_accumulation "${d[@]}" --precision bf16 --grad-accum-steps 2
b=("${d[@]}" --precision bf16)
for np in 1 2 3 4; do
  pair 03_n$np "$np" ch03_data_parallel "${b[@]}" --grad-accum-steps 2
  pair 04_n$np "$np" ch04_ring_allreduce "${b[@]}" --clip-grad-norm 0.5
  pair 05_n$np "$np" ch05_ddp_buckets "${b[@]}" --bucket-cap-mb 0.5 --grad-accum-steps 2
  pair 06_n$np "$np" ch06_zero1 "${b[@]}" --bucket-cap-mb 0.5 --clip-grad-norm 0.5
  pair 07_n$np "$np" ch07_zero2 "${b[@]}" --bucket-cap-mb 0.5 --grad-accum-steps 2
  pair 08_n$np "$np" ch08_zero3 "${b[@]}" --grad-accum-steps 2
done
f=("${d[@]}" --precision fp16)
pair 05_fp16_n3 3 ch05_ddp_buckets "${f[@]}" --bucket-cap-mb 0.5
pair 07_fp16_n3 3 ch07_zero2 "${f[@]}" --bucket-cap-mb 0.5 --clip-grad-norm 0.5
pair 08_fp16_n3 3 ch08_zero3 "${f[@]}" --no-prefetch
pair 04_r32_n3 3 ch04_ring_allreduce "${b[@]}" --reduce-dtype fp32
pair 06_r32_n2 2 ch06_zero1 "${b[@]}" --reduce-dtype fp32 --bucket-cap-mb 0.5
pair 08_r32_n3 3 ch08_zero3 "${f[@]}" --reduce-dtype fp32

# Empty pieces: layers of 2 or 3 outputs in buckets of their own leave some rank an empty ring
# chunk (chapter 05) or a shard of padding only (06, 07), whose 16-bit conversions, overflow test
# and norm run on empty device spans.
tiny=(--model mlp --hidden-sizes 3,2 --global-batch-size 48 --max-steps 4 --eval-every-epoch 0
      --seed 3 --bucket-cap-mb 0.00001)
pair empty_05 3 ch05_ddp_buckets "${tiny[@]}" --precision bf16
pair empty_06 4 ch06_zero1 "${tiny[@]}" --precision bf16 --clip-grad-norm 0.5
pair empty_07 3 ch07_zero2 "${tiny[@]}" --precision fp16 --clip-grad-norm 0.5

# fp16 with overflowing gradients: the same steps skipped, the same scale, on the device.
scaled_start w6 6 --model mlp --seed 3  # lib.bash: the initial weights x 6
big=(--model mlp --global-batch-size 48 --max-steps 10 --epochs 1 --eval-every-epoch 0 --seed 3
     --precision fp16 --init-from "$WORK/w6.safetensors")
pair overflow_04 2 ch04_ring_allreduce "${big[@]}"
pair overflow_06 2 ch06_zero1 "${big[@]}" --bucket-cap-mb 0.5
python3 - "$WORK/emu_overflow_04.jsonl" "$WORK/emu_overflow_06.jsonl" <<'PY'
import json, sys
for f in sys.argv[1:]:
    s = [json.loads(l) for l in open(f) if '"summary"' in l][-1]
    assert s["skipped_steps"] == 2 and s["loss_scale"] == 16384.0, (f, s["skipped_steps"], s["loss_scale"])
print("ok: fp16 overflow on the device: 2 skipped steps, scale 2^16 -> 2^14 (as on the CPU)")
PY

# A 16-bit checkpoint written on the device (replicated master weights: chapter 04; shards:
# chapter 07) resumes on the CPU and on the device, and ends where the CPU run ends.
ck=(--model mlp --global-batch-size 48 --max-steps 8 --eval-every-epoch 0 --seed 3 --precision bf16)
for ch in 04_ring_allreduce 07_zero2; do
  run ck_cpu_$ch 2 ch$ch "${ck[@]}"
  run ck_dev_$ch 2 ch$ch "${ck[@]}" --device emulated --checkpoint-dir "$WORK/ck_$ch" \
    --checkpoint-every 4
  "$COMPARE" "$WORK/ck_cpu_$ch.safetensors" "$WORK/ck_dev_$ch.safetensors" --bitwise >/dev/null
  for on in cpu emulated; do
    run ck_${on}_from_dev_$ch 2 ch$ch "${ck[@]}" --device $on --resume "$WORK/ck_$ch/step_00000004"
    grep -q "resumed from .*step_00000004" "$WORK/ck_${on}_from_dev_$ch.log"
    "$COMPARE" "$WORK/ck_cpu_$ch.safetensors" "$WORK/ck_${on}_from_dev_$ch.safetensors" \
      --bitwise >/dev/null
    same_tail ck_cpu_$ch ck_${on}_from_dev_$ch
  done
  echo "ok: $ch's bf16 checkpoint written on the device resumes on the CPU and the device, bitwise"
done
echo "PASS: 16-bit chapters 01-08 on the emulated device equal the CPU bitwise, the same bytes per rank"
