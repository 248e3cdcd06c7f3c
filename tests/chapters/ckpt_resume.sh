#!/usr/bin/env bash
# Checkpoints, item 3: resume at the same world size is exact. For every chapter (01, 02, and
# 03-08 at N = 1, 2, 3, 4) the uninterrupted 2-epoch run (40 steps; an epoch is 1000 / 48 = 20
# steps) saves checkpoints every 10 steps; a run resumed from step 10 (mid-epoch) or step 20 (the
# end of epoch 1: the resumed run starts epoch 2 at position 0) must end with the uninterrupted
# run's parameters and log its loss of every later step, BITWISE, with the same epoch numbers
# (no epoch skipped or repeated). No tolerance: the resumed run does the same float operations
# in the same order on the same state. Chapters 01 and 02 also resume from a run that STOPPED
# at step 20 (--max-steps 20), from both points. With accumulation (K = 2 where the chapter has
# it) and active clipping (0.5); chapter 01 also with SGD + momentum (its momentum buffer and
# first-step flag). The distributed chapters resume from step 10 at N = 1, 3 and from step 20
# at N = 2, 4 (one resume per configuration keeps the test short; both points are covered per
# chapter). Last: --keep-checkpoints 2 leaves the newest two, and --resume DIR takes the newest.
source "$(dirname "$0")/lib.bash"

base=(--model toy --hidden-sizes 16,8 --global-batch-size 48 --eval-every-epoch 1 --clip-grad-norm 0.5
      --seed 5)

# check NAME NP BINARY "FROM..." ARGS... : the full run with checkpoints, resumes from FROM.
check() {
  local name=$1 np=$2 binary=$3 from=$4; shift 4
  run "${name}_full" "$np" "$binary" "${base[@]}" --epochs 2 "$@" \
    --checkpoint-dir "$WORK/${name}_ck" --checkpoint-every 10
  for s in $from; do
    run "${name}_from$s" "$np" "$binary" "${base[@]}" --epochs 2 "$@" \
      --resume "$WORK/${name}_ck/step_000000$s"
    grep -q "resumed from .*step_000000$s" "$WORK/${name}_from$s.log"
    "$COMPARE" "$WORK/${name}_full.safetensors" "$WORK/${name}_from$s.safetensors" --bitwise >/dev/null
    same_tail "${name}_full" "${name}_from$s"
  done
}

# stopped NAME BINARY ARGS... : a run that stops at step 20 with checkpoints at 10 and 20 (the
# last step), resumed from each; compared with NAME_full from check().
stopped() {
  local name=$1 binary=$2; shift 2
  run "${name}_part" 0 "$binary" "${base[@]}" --epochs 2 --max-steps 20 "$@" \
    --checkpoint-dir "$WORK/${name}_stop_ck" --checkpoint-every 10
  for s in 10 20; do
    run "${name}_stop$s" 0 "$binary" "${base[@]}" --epochs 2 "$@" \
      --resume "$WORK/${name}_stop_ck/step_000000$s"
    "$COMPARE" "$WORK/${name}_full.safetensors" "$WORK/${name}_stop$s.safetensors" --bitwise >/dev/null
    same_tail "${name}_full" "${name}_stop$s"
  done
}

check ch01 0 ch01_training_loop "10 20"
stopped ch01 ch01_training_loop
check ch01_sgd 0 ch01_training_loop "10 20" --optimizer sgd --momentum 0.9 --lr 0.01
check ch02 0 ch02_gradient_accumulation "10 20" --grad-accum-steps 2
stopped ch02 ch02_gradient_accumulation --grad-accum-steps 2
for np in 1 2 3 4; do
  from=$([ $((np % 2)) -eq 1 ] && echo 10 || echo 20)
  check ch03_n$np $np ch03_data_parallel $from --grad-accum-steps 2
  check ch04_n$np $np ch04_ring_allreduce $from --grad-accum-steps 2
  check ch05_n$np $np ch05_ddp_buckets $from --grad-accum-steps 2 --bucket-cap-mb 0.02
  check ch06_n$np $np ch06_zero1 $from --grad-accum-steps 2 --bucket-cap-mb 0.02
  check ch07_n$np $np ch07_zero2 $from --grad-accum-steps 2 --bucket-cap-mb 0.02
  check ch08_n$np $np ch08_zero3 $from --grad-accum-steps 2
done

# --resume D takes the newest committed checkpoint; --keep-checkpoints 2 keeps two.
run keep 2 ch06_zero1 "${base[@]}" --max-steps 12 --checkpoint-dir "$WORK/keep_ck" --checkpoint-every 3 \
  --keep-checkpoints 2
kept=$(cd "$WORK/keep_ck" && echo step_*)
[ "$kept" = "step_00000009 step_00000012" ] || { echo "FAILED: kept $kept"; exit 1; }
run keep_resume 2 ch06_zero1 "${base[@]}" --max-steps 14 --resume "$WORK/keep_ck" \
  --trace "$WORK/keep_resume.json" --trace-steps 5
grep -q "resumed from .*step_00000012" "$WORK/keep_resume.log"
echo "ok: --keep-checkpoints 2 kept $kept; --resume DIR took step 12"
# --trace-steps counts this run's steps: the resumed run traces its steps 13 and 14, and says so.
grep -q "more than the 2 steps this run trains: the trace holds all 2" "$WORK/keep_resume.log" || {
  echo "FAILED: no --trace-steps note for the 2 steps left"; cat "$WORK/keep_resume.log"; exit 1; }
traced=$(python3 -c 'import json, sys
print(" ".join(sorted({e["name"] for e in json.load(open(sys.argv[1]))["traceEvents"]
                       if e.get("cat") == "step" and e["pid"] == 0})))' "$WORK/keep_resume.json")
[ "$traced" = "step 13 step 14" ] || { echo "FAILED: the resumed run traced '$traced'"; exit 1; }
echo "ok: the resumed run traced $traced"
