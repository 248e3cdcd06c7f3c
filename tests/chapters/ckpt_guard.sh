#!/usr/bin/env bash
# Checkpoints, resume and reports against bad input (the breaker's findings F1-F8, F13-F20):
# each refusal exits non-zero before step 1 (on every rank: mpirun exits non-zero within the
# timeout, so no hang) with the message written here; each accepted case checks its numbers.
#   F1  a fresh run, or one resumed from elsewhere, refuses a --checkpoint-dir that holds
#       committed checkpoints (01, and 06 at N = 2); the old ones are untouched; a run resumed
#       from that directory may save and prune there
#   F19 --resume "" / --checkpoint-dir "" / --net-selftest "" are errors
#   F2  an unwritable --checkpoint-dir stops before step 1
#   F4  a checkpoint past the run's last step is refused; at it, its state is written out and
#       the summary's losses are null (never 0.0)
#   F5  another training set (the manifest's data fingerprint) is refused, naming both
#   F13 a resumed run continues --metrics: steps 1..S of the interrupted run kept, each step once
#   F18 after a resume, traffic per step and the predicted comm time are those of the
#       uninterrupted run (counted over the steps this process ran)
#   F20 ZeRO + SGD momentum with empty shards (N = 4, hidden 2,1) saves and resumes bitwise
#   F14 9-digit step directories are found by --resume D and pruned by --keep-checkpoints
#   F3  a manifest with a missing or mistyped field names the file and the field
#   F8  scripts/consolidate refuses an output inside the checkpoint it reads
#   F15 --net-selftest on a FIFO is refused (no hang); F6, F7 the messages named there
source "$(dirname "$0")/lib.bash"
RUN_TIMEOUT=60

# refused NAME PATTERN -- COMMAND...: COMMAND exits non-zero (not 124: a hang) and prints PATTERN
# (grep -E), and did not train (no "step 1/" line).
refused() {
  local name=$1 pattern=$2 rc=0
  shift 3
  timeout "$RUN_TIMEOUT" "$@" >"$WORK/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    echo "FAILED $name: exit $rc from: $*"; cat "$WORK/$name.log"; exit 1
  fi
  grep -qE -- "$pattern" "$WORK/$name.log" ||
    { echo "FAILED $name: no '$pattern' in the output of: $*"; cat "$WORK/$name.log"; exit 1; }
  ! grep -q "^step 1/" "$WORK/$name.log" ||
    { echo "FAILED $name: it trained before refusing"; cat "$WORK/$name.log"; exit 1; }
  echo "ok $name: $(grep -E -m1 -- "$pattern" "$WORK/$name.log" | cut -c1-200)"
}
steps_in() { ls "$1" | tr '\n' ' '; }
expect_dirs() {  # expect_dirs DIR "step_A step_B ": exactly these entries
  [ "$(steps_in "$1")" = "$2" ] || { echo "FAILED: $1 holds '$(steps_in "$1")', expected '$2'"; exit 1; }
}
M=("$MPIRUN" --oversubscribe)
T=(--model toy --hidden-sizes 16,8 --global-batch-size 48 --eval-every-epoch 0)
C1=("$BIN/ch01_training_loop" "${T[@]}")

# --- F1: one directory, one run -------------------------------------------------------------
run a 0 ch01_training_loop "${T[@]}" --max-steps 6 --checkpoint-dir "$WORK/c1" --checkpoint-every 2
expect_dirs "$WORK/c1" "step_00000002 step_00000004 step_00000006 "
refused fresh_into_used "checkpoint-dir .*/c1 already holds committed checkpoints of another run \(newest: .*/c1/step_00000006, step 6\) and this run does not resume from it.*add --resume .*/c1" \
  -- "${C1[@]}" --seed 7 --max-steps 3 --checkpoint-dir "$WORK/c1"
refused fresh_keep "already holds committed checkpoints" \
  -- "${C1[@]}" --seed 7 --max-steps 15 --checkpoint-dir "$WORK/c1" --checkpoint-every 15 --keep-checkpoints 1
run b 0 ch01_training_loop "${T[@]}" --max-steps 2 --checkpoint-dir "$WORK/c2"
refused resumed_elsewhere "already holds committed checkpoints of another run .* this run resumes from .*/c2/step_00000002" \
  -- "${C1[@]}" --max-steps 4 --resume "$WORK/c2" --checkpoint-dir "$WORK/c1"
refused fresh_into_used_np2 "already holds committed checkpoints" \
  -- "${M[@]}" -np 2 "$BIN/ch06_zero1" "${T[@]}" --max-steps 3 --checkpoint-dir "$WORK/c1"
expect_dirs "$WORK/c1" "step_00000002 step_00000004 step_00000006 "
echo "ok: run A's checkpoints untouched by the refused runs"
# Resumed from c1 (its own lineage): saves there and prunes (newest 2 of 2, 4, 6, 8).
run a_resumed 0 ch01_training_loop "${T[@]}" --max-steps 8 --resume "$WORK/c1" --checkpoint-dir "$WORK/c1" \
  --checkpoint-every 2 --keep-checkpoints 2
expect_dirs "$WORK/c1" "step_00000006 step_00000008 "
echo "ok: resumed from c1, saved step 8 and kept the newest 2"

# --- F19: empty values ----------------------------------------------------------------------
refused empty_resume "--resume: an empty path" -- "${C1[@]}" --max-steps 2 --resume ""
refused empty_dir "--checkpoint-dir: an empty path" -- "${C1[@]}" --max-steps 2 --checkpoint-dir ""
refused empty_resume_np2 "--resume: an empty path" -- "${M[@]}" -np 2 "$BIN/ch06_zero1" "${T[@]}" --max-steps 2 --resume ""
# Every path flag: an empty value was taken as "not given" (a run from random weights for
# --init-from, an output silently not written for the others).
for flag in --init-from --metrics --save-final; do
  refused "empty$flag" "$flag: an empty path; give" -- "${C1[@]}" --max-steps 2 "$flag" ""
done
refused blank_save_final "--save-final: an empty path; give" -- "${C1[@]}" --max-steps 2 --save-final " "
[ ! -e " " ] || { echo "FAILED blank_save_final: it wrote a file named ' '"; exit 1; }
for flag in --trace --save-optimizer-state; do
  refused "empty${flag}_np2" "$flag: an empty path; give" \
    -- "${M[@]}" -np 2 "$BIN/ch06_zero1" "${T[@]}" --max-steps 2 "$flag" ""
done
# --trace-steps without --trace traced nothing, silently; --trace on chapters 01-04 was "not expected".
refused trace_steps_alone "--trace-steps requires --trace" \
  -- "${M[@]}" -np 2 "$BIN/ch05_ddp_buckets" "${T[@]}" --max-steps 2 --trace-steps 2
refused trace_ch01 "--trace: this chapter has no communication thread to trace; --trace is chapters 05-08's" \
  -- "${C1[@]}" --max-steps 2 --trace "$WORK/t.json"

# --- F2: unwritable --checkpoint-dir, before step 1 -----------------------------------------
touch "$WORK/afile"
refused dir_is_file "--checkpoint-dir .*/afile: cannot create the directory" \
  -- "${C1[@]}" --max-steps 3 --checkpoint-dir "$WORK/afile" --save-final "$WORK/w.safetensors"
refused dir_under_file "--checkpoint-dir .*/afile/sub: cannot create the directory" \
  -- "${M[@]}" -np 2 "$BIN/ch06_zero1" "${T[@]}" --max-steps 3 --checkpoint-dir "$WORK/afile/sub"

# --- F4: nothing left to train --------------------------------------------------------------
refused past_end "the checkpoint has 8 steps done, and this run stops at step 4 \(--epochs 1, --max-steps 4\): it is past this run's end" \
  -- "${C1[@]}" --max-steps 4 --resume "$WORK/c1"
# At the last step: no step runs; the checkpoint's state is written out, no loss is made up.
run at_end 0 ch01_training_loop "${T[@]}" --max-steps 8 --resume "$WORK/c1"
grep -q "note: the checkpoint is at this run's last step: no step is trained" "$WORK/at_end.log"
"$BIN/consolidate_checkpoint" "$WORK/c1" "$WORK/c1_params.safetensors" >/dev/null
"$COMPARE" "$WORK/c1_params.safetensors" "$WORK/at_end.safetensors" --bitwise >/dev/null
python3 - "$WORK/at_end.jsonl" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
assert s["steps"] == 8 and s["steps_run"] == 0 and s["final_loss"] is None and s["test_loss"] is None, s
print("ok at_end: --save-final = the checkpoint's parameters (bitwise), summary losses null")
PY

# --- F5: another training set ---------------------------------------------------------------
grep -q '"data": {' "$WORK/c1/step_00000008/manifest.json" || { echo "FAILED: no data fingerprint"; exit 1; }
mkdir -p "$WORK/c5"; cp -r "$WORK/c1/step_00000008" "$WORK/c5/"
python3 - "$WORK/c5/step_00000008/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["data"]["crc32"] ^= 1; m["data"]["source"] = "other"
json.dump(m, open(sys.argv[1], "w"), indent=2)
PY
reseal_manifest "$WORK/c5/step_00000008/manifest.json"
refused other_data "manifest.json: field data is .*\"crc32\":.*\"source\":\"other\".*, this run's training set is .*: other samples than the run that wrote it" \
  -- "${C1[@]}" --max-steps 10 --resume "$WORK/c5"
# Real data: Fashion-MNIST with one training label changed (same sizes, same shape).
FM=/usr/share/datasets/fashion-mnist
if [ -f "$FM/train-labels-idx1-ubyte.gz" ]; then
  mkdir -p "$WORK/fake"; cp "$FM"/*.gz "$WORK/fake/"
  python3 - "$WORK/fake/train-labels-idx1-ubyte.gz" <<'PY'
import gzip, sys
b = bytearray(gzip.open(sys.argv[1]).read()); b[8] = (b[8] + 1) % 10
gzip.open(sys.argv[1], "wb").write(bytes(b))
PY
  F=(--model mlp --hidden-sizes 8 --global-batch-size 6000 --eval-every-epoch 0)
  run fake 0 ch01_training_loop "${F[@]}" --data-dir "$WORK/fake" --max-steps 1 --checkpoint-dir "$WORK/cf"
  refused other_data_real "field data is .*fake train.*, this run's training set is .*$FM train" \
    -- "$BIN/ch01_training_loop" "${F[@]}" --data-dir "$FM" --max-steps 2 --resume "$WORK/cf"
fi

# --- F13: --metrics continues -----------------------------------------------------------------
run full8 0 ch01_training_loop "${T[@]}" --max-steps 8
"$BIN/ch01_training_loop" "${T[@]}" --max-steps 6 --checkpoint-dir "$WORK/c13" --checkpoint-every 4 \
  --metrics "$WORK/m13.jsonl" >/dev/null
"$BIN/ch01_training_loop" "${T[@]}" --max-steps 8 --resume "$WORK/c13/step_00000004" \
  --metrics "$WORK/m13.jsonl" >/dev/null
python3 - "$WORK/full8.jsonl" "$WORK/m13.jsonl" <<'PY'
import json, sys
def recs(p): return [json.loads(l) for l in open(p)]
full, cont = recs(sys.argv[1]), recs(sys.argv[2])
steps = lambda rs: [(r["step"], r["loss"]) for r in rs if r["type"] == "step"]
assert steps(cont) == steps(full), f"{[s for s, _ in steps(cont)]} vs the uninterrupted 1..8"
summ = [r for r in cont if r["type"] == "summary"]
assert len(summ) == 1 and summ[0]["steps"] == 8 and summ[0]["steps_run"] == 4, summ
print("ok: --metrics after the resume from step 4: steps 1..8 once each, losses = uninterrupted, one summary")
PY

# --- F18: traffic per step after a resume -----------------------------------------------------
NET=(--net-bandwidth 1 --net-compute-ms 1 --net-alpha-us 10)
run full10 2 ch05_ddp_buckets "${T[@]}" --max-steps 10 "${NET[@]}"
run part8 2 ch05_ddp_buckets "${T[@]}" --max-steps 8 --checkpoint-dir "$WORK/c18"
run res10 2 ch05_ddp_buckets "${T[@]}" --max-steps 10 --resume "$WORK/c18" "${NET[@]}"
python3 - "$WORK/full10.jsonl" "$WORK/res10.jsonl" <<'PY'
import json, sys
def summary(p): return [json.loads(l) for l in open(p) if '"summary"' in l][-1]
a, b = summary(sys.argv[1]), summary(sys.argv[2])
assert b["steps_run"] == 2 and a["steps_run"] == 10, (a["steps_run"], b["steps_run"])
# ch05's traffic per step is the same every step (same buckets, same sizes): exactly equal.
assert a["bytes_sent_per_rank_per_step"] == b["bytes_sent_per_rank_per_step"] > 0, \
    (a["bytes_sent_per_rank_per_step"], b["bytes_sent_per_rank_per_step"])
assert a["prediction"]["comm_ms"] == b["prediction"]["comm_ms"] > 0, (a["prediction"], b["prediction"])
print(f"ok: resumed (2 steps run) = uninterrupted: {b['bytes_sent_per_rank_per_step']} B/rank/step, "
      f"comm {b['prediction']['comm_ms']:.3f} ms")
PY
grep -q "communication per rank per optimizer step (2 steps" "$WORK/res10.log" ||
  { echo "FAILED: the traffic table does not count the 2 steps run"; cat "$WORK/res10.log"; exit 1; }

# --- F20: ZeRO + SGD momentum with empty shards -----------------------------------------------
Z=(--model toy --hidden-sizes 2,1 --global-batch-size 60 --optimizer sgd --momentum 0.9 --lr 0.01
   --eval-every-epoch 0)
run z_full 4 ch08_zero3 "${Z[@]}" --max-steps 8
run z_part 4 ch08_zero3 "${Z[@]}" --max-steps 8 --checkpoint-dir "$WORK/c20" --checkpoint-every 4
run z_res 4 ch08_zero3 "${Z[@]}" --max-steps 8 --resume "$WORK/c20/step_00000004"
"$COMPARE" "$WORK/z_full.safetensors" "$WORK/z_res.safetensors" --bitwise >/dev/null
echo "ok: ch08 N=4 SGD momentum, hidden 2,1 (empty shards): saved, resumed from 4, bitwise equal"
run z6 2 ch06_zero1 "${Z[@]}" --bucket-cap-mb 0.000001 --max-steps 4 --checkpoint-dir "$WORK/c20b"
[ -f "$WORK/c20b/step_00000004/manifest.json" ] || { echo "FAILED: ch06 did not save"; exit 1; }
echo "ok: ch06 N=2 with one-element buckets saved"

# --- F14: 9-digit step directories; directory name vs global_step -----------------------------
mkdir -p "$WORK/big"
python3 - "$WORK/c1/step_00000008" "$WORK/big" <<'PY'
import json, shutil, sys
src, out = sys.argv[1], sys.argv[2]
m = json.load(open(src + "/manifest.json"))
s, spe = 100000006, m["steps_per_epoch"]
m["global_step"], m["epoch"], m["position_in_epoch"] = s, s // spe + 1, s % spe
shutil.copytree(src, f"{out}/step_{s}")
json.dump(m, open(f"{out}/step_{s}/manifest.json", "w"), indent=2)
shutil.copytree(src, f"{out}/step_00000008")  # older: --resume big must not take it
PY
reseal_manifest "$WORK/big/step_100000006/manifest.json"
BIG=(--epochs 100000000 --max-steps 100000008 --checkpoint-every 1 --keep-checkpoints 1)
run big1 0 ch01_training_loop "${T[@]}" "${BIG[@]}" --resume "$WORK/big" --checkpoint-dir "$WORK/big"
grep -q "resumed from .*big/step_100000006" "$WORK/big1.log" || { echo "FAILED: --resume big"; cat "$WORK/big1.log"; exit 1; }
expect_dirs "$WORK/big" "step_100000008 "
echo "ok: 9-digit steps: --resume D took step_100000006, --keep-checkpoints 1 left step_100000008"
mkdir -p "$WORK/swap"; cp -r "$WORK/c1/step_00000006" "$WORK/swap/step_00000009"
refused swapped "swap/step_00000009 is named for step 9, but manifest.json field global_step is 6" \
  -- "${C1[@]}" --max-steps 12 --resume "$WORK/swap"

# --- F3: damaged manifest fields --------------------------------------------------------------
damaged() {  # damaged NAME PYTHON-EDIT PATTERN
  rm -rf "$WORK/d_$1"; mkdir -p "$WORK/d_$1"; cp -r "$WORK/c1/step_00000008" "$WORK/d_$1/"
  python3 -c "import json,sys; p=sys.argv[1]; m=json.load(open(p)); $2; json.dump(m, open(p,'w'))" \
    "$WORK/d_$1/step_00000008/manifest.json"
  reseal_manifest "$WORK/d_$1/step_00000008/manifest.json"
  refused "manifest_$1" "$3" -- "${C1[@]}" --max-steps 12 --resume "$WORK/d_$1"
}
damaged no_psi 'del m["num_parameters"]' "manifest.json: field num_parameters is missing or not an integer >= 1; the manifest is damaged"
damaged crc_str 'm["files"][0]["crc32"] = "x"' "manifest.json: field files\[0\].crc32 is missing or not a 32-bit unsigned integer"
damaged no_step 'del m["tensors"][0]["step"]' "manifest.json: field tensors\[0\].step is missing"
damaged huge_psi 'm["num_parameters"] = 10**13' "manifest.json: field tensors\[[0-9]\].numel is missing or not within num_parameters|numel add up to"
damaged neg_psi 'm["num_parameters"] = -5' "manifest.json: field num_parameters is missing or not an integer >= 1"

# --- F8: scripts/consolidate into its own checkpoint -----------------------------------------
CONS="$BIN/consolidate_checkpoint"
before=$(sha256sum "$WORK/c1/step_00000008/"* | sha256sum)
refused cons_inside "OUT .*/c1/step_00000008/model.safetensors is inside the committed checkpoint .*/c1/step_00000008" \
  -- "$CONS" "$WORK/c1/step_00000008" "$WORK/c1/step_00000008/model.safetensors"
refused cons_manifest "OUT .*manifest.json is inside the committed checkpoint" -- "$CONS" "$WORK/c1" "$WORK/c1/step_00000008/manifest.json"
refused cons_opt "--optimizer-state .* is inside the committed checkpoint" \
  -- "$CONS" "$WORK/c1" --optimizer-state "$WORK/c1/step_00000008/o.safetensors"
refused cons_nodir "OUT .*/nodir/x.safetensors: directory .*/nodir does not exist" -- "$CONS" "$WORK/c1" "$WORK/nodir/x.safetensors"
[ "$(sha256sum "$WORK/c1/step_00000008/"* | sha256sum)" = "$before" ] || { echo "FAILED: checkpoint changed"; exit 1; }
echo "ok: the checkpoint's files are unchanged"

# --- F15, F6: cost-model flags ----------------------------------------------------------------
mkfifo "$WORK/fifo"
C5=("${M[@]}" -np 2 "$BIN/ch05_ddp_buckets" "${T[@]}" --max-steps 2)
refused fifo "--net-selftest .*/fifo is not a regular file" -- "${C5[@]}" --net-selftest "$WORK/fifo" --net-compute-ms 1
refused selftest_empty "--net-selftest: an empty path" -- "${C5[@]}" --net-selftest "" --net-compute-ms 1
echo '{"latency_us": "x", "bandwidth_bps": 1e9}' >"$WORK/st_str.json"
refused selftest_str "selftest file '.*st_str.json': field latency_us is \"x\", not a finite number" \
  -- "${C5[@]}" --net-selftest "$WORK/st_str.json" --net-compute-ms 1
echo '{"latency_us": 3, "bandwidth_bps": 0}' >"$WORK/st_zero.json"
refused selftest_zero "selftest file '.*st_zero.json': field bandwidth_bps is 0, must be > 0" \
  -- "${C5[@]}" --net-selftest "$WORK/st_zero.json" --net-compute-ms 1
echo '{"latency_us": 3, "bandwidth_bps": 1e9}' >"$WORK/st.json"
refused selftest_and_flags "--net-selftest .*st.json with --net-bandwidth/--net-alpha-us: give one network" \
  -- "${C5[@]}" --net-selftest "$WORK/st.json" --net-bandwidth 1 --net-compute-ms 1
refused alpha_alone "--net-alpha-us/--net-compute-ms/--net-cores need --net-bandwidth" -- "${C5[@]}" --net-alpha-us 10
refused cores_alone "--net-cores need --net-bandwidth" -- "${C5[@]}" --net-cores 4
refused cores_negative "--net-cores: .-1. is not a whole number of cores" -- "${C5[@]}" "${NET[@]}" --net-cores -1
refused bw_nan "--net-bandwidth: nan must be a finite number > 0 \(Gbit/s per link and direction\)" \
  -- "${C5[@]}" --net-bandwidth nan --net-compute-ms 1
refused bw_zero "--net-bandwidth: 0 must be a finite number > 0" -- "${C5[@]}" --net-bandwidth 0 --net-compute-ms 1
refused compute_nan "--net-compute-ms: nan must be a finite number >= 0 \(milliseconds per step\)" \
  -- "${C5[@]}" --net-bandwidth 1 --net-compute-ms nan
refused net_one_process "chapter 01_training_loop runs on one process, with no communication to predict" \
  -- "${C1[@]}" --max-steps 2 --net-bandwidth 1 --net-compute-ms 1

# --- F7: --reduce-dtype; fp16 overflow at step 1 ----------------------------------------------
refused reduce_one_process "--reduce-dtype fp16: chapter 01_training_loop runs on one process and reduces no gradients" \
  -- "${C1[@]}" --max-steps 2 --precision bf16 --reduce-dtype fp16
run reduce_fp32 2 ch06_zero1 "${T[@]}" --max-steps 2 --reduce-dtype fp32
echo "ok: --reduce-dtype fp32 (what 03-08 do) accepted"
run w0 0 ch01_training_loop "${T[@]}" --max-steps 1 --lr 1e-30 --optimizer sgd
python3 - "$WORK/w0.safetensors" "$WORK/wbig.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
data = bytearray(b[8 + n:])
vals = struct.unpack(f"<{len(data) // 4}f", data)
open(sys.argv[2], "wb").write(b[:8 + n] + struct.pack(f"<{len(vals)}f", *[v * 1e5 for v in vals]))
PY
refused fp16_overflow "at step 1, before any update: the forward pass overflowed fp16's range" \
  -- "${C1[@]}" --max-steps 3 --init-from "$WORK/wbig.safetensors" --precision fp16

echo "all ckpt_guard cases passed"
