#!/usr/bin/env bash
# Checkpoints, item 6: refusals. Each bad checkpoint or changed flag must stop the run before
# training, on every rank (mpirun exits non-zero, within the run's timeout: no hang), with a
# message naming the file and the field: a missing manifest, a partial shard (truncated), a
# corrupted one (CRC-32), a shard missing, an unknown format_version, and the flags that give the
# state its meaning (--model, --hidden-sizes, --optimizer, --seed, precision) or its position
# (--global-batch-size: REFUSED, see docs/checkpoints.md). Also --resume with --init-from, and
# --checkpoint-every without --checkpoint-dir. The flags that may change (--lr, --epochs,
# --max-steps, --grad-accum-steps, the world size) are accepted: one such resume is checked.
source "$(dirname "$0")/lib.bash"

base=(--model toy --hidden-sizes 16,8 --global-batch-size 48 --eval-every-epoch 0 --seed 3)
run good 2 ch06_zero1 "${base[@]}" --max-steps 4 --checkpoint-dir "$WORK/ck" --checkpoint-every 2
good="$WORK/ck/step_00000004"
cp_ck() { rm -rf "$WORK/$1"; mkdir -p "$WORK/$1"; cp -r "$good" "$WORK/$1/"; echo "$WORK/$1/step_00000004"; }

d=$(cp_ck no_manifest); rm "$d/manifest.json"
fails no_manifest_dir 2 ch06_zero1 "step_00000004/manifest.json: missing" "${base[@]}" --resume "$d"
fails no_manifest_parent 2 ch06_zero1 "no committed checkpoint.*interrupted writes.*step_00000004" "${base[@]}" --resume "$(dirname "$d")"
d=$(cp_ck partial); truncate -s 1000 "$d/shard_00001.safetensors"
fails partial 2 ch06_zero1 "shard_00001.safetensors: 1000 bytes, but manifest.json field files\[shard_00001.safetensors\].bytes" "${base[@]}" --resume "$d"
d=$(cp_ck corrupt); printf '\x7f' | dd of="$d/shard_00000.safetensors" bs=1 seek=2000 conv=notrunc status=none
fails corrupt 2 ch06_zero1 "shard_00000.safetensors: CRC-32 .* field files\[shard_00000.safetensors\].crc32" "${base[@]}" --resume "$d"
d=$(cp_ck missing_shard); rm "$d/shard_00001.safetensors"
fails missing_shard 2 ch06_zero1 "shard_00001.safetensors: missing" "${base[@]}" --resume "$d"
d=$(cp_ck version); sed -i 's/"format_version": 2/"format_version": 99/' "$d/manifest.json"
fails version 2 ch06_zero1 "manifest.json: field format_version is 99" "${base[@]}" --resume "$d"
d=$(cp_ck precision); sed -i 's/"precision": "fp32"/"precision": "bf16"/' "$d/manifest.json"
reseal_manifest "$d/manifest.json"
fails precision 2 ch06_zero1 "manifest.json: field flags.precision is \"bf16\"" "${base[@]}" --resume "$d"

fails model 2 ch06_zero1 "manifest.json: field flags.model is \"toy\", this run has --model \"mlp\"" \
  --model mlp --hidden-sizes 16,8 --global-batch-size 48 --seed 3 --resume "$good"
fails sizes 2 ch06_zero1 "manifest.json: field flags.layer_sizes is \[1024,16,8,256\], this run has --model/--hidden-sizes \[1024,16,9,256\]" \
  --model toy --hidden-sizes 16,9 --global-batch-size 48 --seed 3 --resume "$good"
fails optimizer 2 ch06_zero1 "manifest.json: field flags.optimizer is \"adamw\", this run has --optimizer \"sgd\"" \
  "${base[@]}" --optimizer sgd --resume "$good"
fails seed 2 ch06_zero1 "manifest.json: field flags.seed is 3" --model toy --hidden-sizes 16,8 --global-batch-size 48 --seed 4 --resume "$good"
fails batch 2 ch06_zero1 "manifest.json: field flags.global_batch_size is 48, this run has --global-batch-size 96" \
  --model toy --hidden-sizes 16,8 --global-batch-size 96 --seed 3 --resume "$good"
fails batch_ch05 2 ch05_ddp_buckets "manifest.json: field flags.global_batch_size is 48" \
  --model toy --hidden-sizes 16,8 --global-batch-size 24 --seed 3 --resume "$good"
fails init_from 0 ch01_training_loop "--resume .* and --init-from .* both set the parameters" \
  "${base[@]}" --resume "$good" --init-from "$WORK/good.safetensors"
fails every_no_dir 0 ch01_training_loop "--checkpoint-every 5 needs --checkpoint-dir" "${base[@]}" --checkpoint-every 5

# Accepted: another world size, K, --lr and --max-steps.
run other_flags 3 ch06_zero1 "${base[@]}" --max-steps 6 --grad-accum-steps 2 --lr 0.002 --resume "$good"
grep -q "resumed from .*step_00000004" "$WORK/other_flags.log"
echo "ok: resumed with another world size, --grad-accum-steps, --lr and --max-steps"
