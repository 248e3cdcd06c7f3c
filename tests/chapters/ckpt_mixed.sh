#!/usr/bin/env bash
# Checkpoints of 16-bit runs (--precision bf16|fp16): what a checkpoint holds is the same as in
# fp32 ("params" are the fp32 master weights, with their AdamW moments and step counts; fp16's
# loss scaler goes to the manifest), and a resume rounds the 16-bit parameters from the masters
# as every step does. So, with no tolerance (the resumed run does the same float operations in
# the same order on the same state):
#  - resume at the same N: every chapter (01, 02; 03-08 at N = 1..4, bf16 and fp16 alternating,
#    one with --reduce-dtype fp32) saves every 10 of 40 steps; the run resumed from step 10 or 20
#    ends with the uninterrupted run's master weights (--save-final) and logs its every later
#    loss, bitwise, and its summary's loss scale and skipped steps are the uninterrupted run's.
#    In fp16 the loss scaler must have moved before the checkpoint (skipped steps > 0), or the
#    test could not tell a restored scaler from a fresh one: fp16_scaled makes it move.
#  - another N: a ZeRO checkpoint of N = 4 loaded at N' = 2 and 3 holds, element by element, the
#    consolidated masters and moments, and continued to step 16 equals the continuation from its
#    world-size-1 consolidation (scripts/consolidate --as-checkpoint), bitwise.
#  - another chapter: a chapter 05 checkpoint (bf16, N = 2) loads into 06, 07 and 08 bitwise.
source "$(dirname "$0")/lib.bash"
CONSOLIDATE=${CONSOLIDATE:-$BIN/consolidate_checkpoint}

common=(--model toy --hidden-sizes 16,8 --global-batch-size 48 --clip-grad-norm 0.5 --seed 5)
base=("${common[@]}" --eval-every-epoch 1)
bitwise() { "$COMPARE" "$WORK/$1" "$WORK/$2" --bitwise >/dev/null || { echo "FAILED: $1 vs $2"; "$COMPARE" "$WORK/$1" "$WORK/$2" --bitwise; exit 1; }; }

# same_scaler FULL RESUMED: the summaries' precision, loss_scale and skipped_steps are equal.
same_scaler() {
  python3 - "$WORK/$1.jsonl" "$WORK/$2.jsonl" <<'PY'
import json, sys
def summary(p):
    s = [j for j in map(json.loads, open(p)) if j["type"] == "summary"]
    assert s, f"{p}: no summary record"
    return {k: s[-1].get(k) for k in ("precision", "loss_scale", "skipped_steps")}
a, b = summary(sys.argv[1]), summary(sys.argv[2])
assert a == b and a["precision"] in ("bf16", "fp16"), f"summary {a} vs {b}"
print(f"ok: summary {a} equal")
PY
}

# moved CKPT: the fp16 checkpoint's loss scaler has skipped steps (so restoring it matters).
moved() {
  python3 - "$1/manifest.json" <<'PY'
import json, sys
ls = json.load(open(sys.argv[1]))["loss_scaler"]
assert ls["skipped_steps"] > 0 and ls["scale"] < 65536, f"the scaler never moved: {ls}"
print(f"ok: loss scaler at the checkpoint {ls}")
PY
}

# without_init ARGS...: ARGS less --init-from X (a resume takes its parameters from the
# checkpoint; the two together are refused).
without_init() {
  while [ $# -gt 0 ]; do
    if [ "$1" = --init-from ]; then shift 2; else printf '%s\n' "$1"; shift; fi
  done
}

# check NAME NP BINARY FROM ARGS... : the full run with checkpoints, the resume from step FROM.
check() {
  local name=$1 np=$2 binary=$3 from=$4; shift 4
  run "${name}_full" "$np" "$binary" "${base[@]}" --epochs 2 "$@" \
    --checkpoint-dir "$WORK/${name}_ck" --checkpoint-every 10
  run "${name}_from" "$np" "$binary" "${base[@]}" --epochs 2 $(without_init "$@") \
    --resume "$WORK/${name}_ck/step_000000$from"
  grep -q "resumed from .*step_000000$from" "$WORK/${name}_from.log"
  bitwise "${name}_full.safetensors" "${name}_from.safetensors"
  same_tail "${name}_full" "${name}_from"
  same_scaler "${name}_full" "${name}_from"
  case " $* " in *" fp16 "*) moved "$WORK/${name}_ck/step_000000$from" ;; esac
}

# fp16 with the initial weights ×8: the first steps overflow the scaled gradients (skipped,
# the scale halves) while the loss stays finite.
scaled_start big 8 "${base[@]}"
fp16=(--precision fp16 --init-from "$WORK/big.safetensors")

check ch01_bf16 0 ch01_training_loop 10 --precision bf16
check ch01_fp16 0 ch01_training_loop 20 "${fp16[@]}"
check ch02_fp16 0 ch02_gradient_accumulation 10 --grad-accum-steps 2 "${fp16[@]}"
for np in 1 2 3 4; do
  from=$([ $((np % 2)) -eq 1 ] && echo 10 || echo 20)
  p=$([ $((np % 2)) -eq 1 ] && echo bf16 || echo fp16)
  prec=(--precision bf16); [ $p = fp16 ] && prec=("${fp16[@]}")
  check ch03_${p}_n$np $np ch03_data_parallel $from --grad-accum-steps 2 "${prec[@]}"
  check ch04_${p}_n$np $np ch04_ring_allreduce $from --grad-accum-steps 2 "${prec[@]}"
  check ch05_${p}_n$np $np ch05_ddp_buckets $from --grad-accum-steps 2 --bucket-cap-mb 0.02 "${prec[@]}"
  check ch06_${p}_n$np $np ch06_zero1 $from --grad-accum-steps 2 --bucket-cap-mb 0.02 "${prec[@]}"
  check ch07_${p}_n$np $np ch07_zero2 $from --grad-accum-steps 2 --bucket-cap-mb 0.02 "${prec[@]}"
  check ch08_${p}_n$np $np ch08_zero3 $from --grad-accum-steps 2 "${prec[@]}"
done
check ch06_r32 3 ch06_zero1 10 --bucket-cap-mb 0.02 --precision bf16 --reduce-dtype fp32
check ch08_r32 2 ch08_zero3 20 "${fp16[@]}" --reduce-dtype fp32

# Another world size: N = 4 -> N' = 2, 3 (bf16), through the consolidation.
base=("${common[@]}" --eval-every-epoch 0)
for ch in 06_zero1 07_zero2 08_zero3; do
  c=ch$ch
  extra=(--precision bf16); [ "$ch" != 08_zero3 ] && extra+=(--bucket-cap-mb 0.02)
  run ${c}_n4 4 $c "${base[@]}" "${extra[@]}" --max-steps 10 --checkpoint-dir "$WORK/${c}_ck4"
  "$CONSOLIDATE" "$WORK/${c}_ck4" "$WORK/${c}_cons4.safetensors" \
    --optimizer-state "$WORK/${c}_opt4.safetensors" --as-checkpoint "$WORK/${c}_ck4_as1" >/dev/null
  for np in 2 3; do
    run ${c}_load$np $np $c "${base[@]}" "${extra[@]}" --max-steps 10 --resume "$WORK/${c}_ck4" \
      --save-optimizer-state "$WORK/${c}_loadopt$np.safetensors"
    bitwise ${c}_cons4.safetensors ${c}_load$np.safetensors
    bitwise ${c}_opt4.safetensors ${c}_loadopt$np.safetensors
    run ${c}_cont$np $np $c "${base[@]}" "${extra[@]}" --max-steps 16 --resume "$WORK/${c}_ck4"
    run ${c}_contc$np $np $c "${base[@]}" "${extra[@]}" --max-steps 16 --resume "$WORK/${c}_ck4_as1"
    bitwise ${c}_cont$np.safetensors ${c}_contc$np.safetensors
    echo "ok: $c bf16 N=4 -> N=$np: loaded state = consolidated; continuation = from consolidation"
  done
done
# fp16 at another N: the scaler's state goes with it (N = 3 -> 2, chapter 07).
run f16_n3 3 ch07_zero2 "${base[@]}" "${fp16[@]}" --bucket-cap-mb 0.02 --max-steps 10 \
  --checkpoint-dir "$WORK/f16_ck3"
moved "$WORK/f16_ck3/step_00000010"
"$CONSOLIDATE" "$WORK/f16_ck3" --as-checkpoint "$WORK/f16_ck3_as1" >/dev/null
run f16_cont 2 ch07_zero2 "${base[@]}" --precision fp16 --bucket-cap-mb 0.02 --max-steps 16 --resume "$WORK/f16_ck3"
run f16_contc 2 ch07_zero2 "${base[@]}" --precision fp16 --bucket-cap-mb 0.02 --max-steps 16 --resume "$WORK/f16_ck3_as1"
bitwise f16_cont.safetensors f16_contc.safetensors
same_scaler f16_cont f16_contc
echo "ok: ch07 fp16 N=3 -> N=2: continuation = from consolidation, same loss scaler"

# Another chapter: 05's checkpoint (bf16, N = 2) loads into 06, 07, 08 element by element.
b16=(--precision bf16)
run x05_part 2 ch05_ddp_buckets "${base[@]}" "${b16[@]}" --bucket-cap-mb 0.02 --max-steps 10 \
  --checkpoint-dir "$WORK/x05_ck"
for ch in 06_zero1 07_zero2 08_zero3; do
  run x05_load_$ch 2 ch$ch "${base[@]}" "${b16[@]}" --max-steps 10 --resume "$WORK/x05_ck"
  bitwise x05_part.safetensors x05_load_$ch.safetensors
done
echo "ok: a chapter 05 bf16 checkpoint loads into 06, 07, 08 bitwise"

# A hand-edited loss scaler (the manifest re-sealed) is refused naming its field, before any
# step: a scale that is not a power of two in float's normal range (1e-40 would be a denormal
# and end in a NaN loss that blames the learning rate), a growth tracker past the interval.
edit_scaler() {  # edit_scaler NAME KEY VALUE: a copy of f16_ck3's step 10 with loss_scaler.KEY = VALUE
  local d="$WORK/edit_$1"
  cp -r "$WORK/f16_ck3/step_00000010" "$d"
  python3 - "$d/manifest.json" "$2" "$3" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["loss_scaler"][sys.argv[2]] = json.loads(sys.argv[3])
open(sys.argv[1], "w").write(json.dumps(m, indent=2))
PY
  reseal_manifest "$d/manifest.json"
  echo "$d"
}
for bad in "tiny scale 1e-40" "odd scale 100.0" "zero scale 0"; do
  set -- $bad
  d=$(edit_scaler "$1" "$2" "$3")
  fails "scaler_$1" 3 ch07_zero2 "field loss_scaler.scale is missing or not a power of two" \
    "${common[@]}" --precision fp16 --bucket-cap-mb 0.02 --max-steps 12 --resume "$d"
done
d=$(edit_scaler tracker growth_tracker 2000)
fails scaler_tracker 3 ch07_zero2 "field loss_scaler.growth_tracker is missing or not below the growth interval, 2000" \
  "${common[@]}" --precision fp16 --bucket-cap-mb 0.02 --max-steps 12 --resume "$d"
echo "ok: edited loss scalers refused, naming the field"
