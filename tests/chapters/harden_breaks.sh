#!/usr/bin/env bash
# Hardening, round 2 (issue 24), part two: what a breaker found after the first fixes
# (harden_files.sh has the issue's own list). Each case names the finding.
#   B1  ranks that resolve --resume to different checkpoints stop before step 1 (they trained
#       on mismatched models, then hung)
#   B2  a sharded checkpoint whose tensor offsets do not tile the model is refused, also by
#       consolidate (it crashed, or gave one tensor another's values)
#   B3  JSON nested 100 000 deep is refused (a stack overflow in the printing of the error)
#   B4  consolidate --as-checkpoint into a directory of checkpoints, or into the checkpoint it
#       reads, is refused (it overwrote another run's checkpoint)
#   B5  a run refused before step 1 leaves the previous run's --metrics intact (it truncated it)
#   B7  --resume and --checkpoint-dir given as relative paths inside the directory
#   B8  a character device that cannot be opened fails before step 1, naming the flag
#   B9  --metrics /dev/stdout appended to a shell's redirect file keeps what it held
#   B10 an output on the --init-from file is refused
#   B11 a manifest's field list that this optimizer cannot use is named
#   B13 resumed with --eval-every-epoch 0, the recorded evaluation is kept
#   B14 --checkpoint-dir inside a committed checkpoint; B15 a file with a step directory's name
#   and a second pass: a committed checkpoint is a step_* directory holding a manifest, at any
#   depth above the path (not any directory with a manifest.json); a tensor whose numel is not
#   its shape's product, a tensor name given twice, a field of another JSON type; --net-selftest
#   nested 100 000 deep; a stray step file in a resumed run's --checkpoint-dir
source "$(dirname "$0")/lib.bash"
RUN_TIMEOUT=60
T=(--model toy --hidden-sizes 16,8 --global-batch-size 48 --eval-every-epoch 0)
C1=("$BIN/ch01_training_loop" "${T[@]}")
is_root() { [ "$(id -u)" = 0 ]; }

# --- B1: one checkpoint for every rank ---------------------------------------------------------
run d 2 ch05_ddp_buckets "${T[@]}" --max-steps 4 --checkpoint-every 2 --checkpoint-dir "$WORK/D"
if is_root && unshare -m true 2>/dev/null; then
  mkdir -p "$WORK/D1"; cp -r "$WORK/D/step_00000002" "$WORK/D1/"
  A=("$BIN/ch05_ddp_buckets" "${T[@]}" --max-steps 8 --resume "$WORK/D")
  fails other_checkpoints "rank 1 found step_00000002" "rank 0 found step_00000004" \
    "every rank must resume from the same checkpoint" -- "$MPIRUN" --oversubscribe -np 1 "${A[@]}" : \
    -np 1 unshare -m bash -c "mount --bind '$WORK/D1' '$WORK/D' && exec \"\$@\"" x "${A[@]}"
  ! grep -q "^step 5/" "$WORK/other_checkpoints.log" || { echo "FAILED B1: it trained"; exit 1; }
fi

# --- B2, B11: manifests that read but do not fit -------------------------------------------------
run z 2 ch06_zero1 "${T[@]}" --max-steps 2 --checkpoint-dir "$WORK/cz"
edited() {  # edited NAME PYTHON-EDIT: a resealed copy of cz/step_00000002 in $WORK/e_NAME
  rm -rf "$WORK/e_$1"; mkdir -p "$WORK/e_$1"; cp -r "$WORK/cz/step_00000002" "$WORK/e_$1/"
  python3 -c "import json,sys; p=sys.argv[1]; m=json.load(open(p)); $2; json.dump(m, open(p,'w'), indent=2)" \
    "$WORK/e_$1/step_00000002/manifest.json"
  reseal_manifest "$WORK/e_$1/step_00000002/manifest.json"
}
edited far 'm["tensors"][5]["offset"] = 10**7'
fails far_offset "field tensors[5].offset is missing or not the end of the tensor before it" -- \
  "$BIN/consolidate_checkpoint" "$WORK/e_far" "$WORK/far.safetensors"
edited wrap 'm["tensors"][1]["offset"] = 2**62'
fails wrap_offset "field tensors[1].offset is missing or not the end of the tensor before it" -- \
  "${C1[@]}" --max-steps 4 --resume "$WORK/e_wrap"
edited fields 'm["fields"] = ["params"]'
fails fields_sgd "field fields is [\"params\"], this run's --optimizer needs [\"params\",\"exp_avg\",\"exp_avg_sq\"]" -- \
  "${C1[@]}" --max-steps 4 --resume "$WORK/e_fields"

# --- B3: deep nesting --------------------------------------------------------------------------
python3 - "$WORK/deep.safetensors" <<'PY'
import struct, sys
h = ('{"w":{"dtype":"F32","shape":' + "[" * 100000 + "]" * 100000 + ',"data_offsets":[0,0]}}').encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h)
PY
fails deep "deep.safetensors header: the JSON nests deeper than 64 levels" -- "${C1[@]}" --init-from "$WORK/deep.safetensors"

# --- B4: consolidate --as-checkpoint ------------------------------------------------------------
before=$(sha256sum "$WORK/D/step_00000004/"* | sha256sum)
fails as_other "--as-checkpoint $WORK/D already holds step_0000000" -- \
  "$BIN/consolidate_checkpoint" "$WORK/cz" --as-checkpoint "$WORK/D"
fails as_itself "--as-checkpoint $WORK/cz/step_00000002 is (or is inside) the committed checkpoint" -- \
  "$BIN/consolidate_checkpoint" "$WORK/cz" --as-checkpoint "$WORK/cz/step_00000002"
ln -s "$WORK/cz/step_00000002" "$WORK/to_step"  # a link to the checkpoint leads into it
fails as_link "--as-checkpoint $WORK/to_step is (or is inside) the committed checkpoint" -- \
  "$BIN/consolidate_checkpoint" "$WORK/cz" --as-checkpoint "$WORK/to_step"
[ ! -e "$WORK/cz/step_00000002/step_00000002" ] || { echo "FAILED as_link: it wrote into the checkpoint"; exit 1; }
[ "$(sha256sum "$WORK/D/step_00000004/"* | sha256sum)" = "$before" ] || { echo "FAILED B4: D changed"; exit 1; }
"$BIN/consolidate_checkpoint" "$WORK/cz" --as-checkpoint "$WORK/fresh" >/dev/null  # a new directory: fine
# Its own words, not --resume's; one process only (two under mpirun wrote the same files twice).
fails consolidate_missing "the checkpoint $WORK/nonexistent: no such file or directory" -- \
  "$BIN/consolidate_checkpoint" "$WORK/nonexistent" "$WORK/x.safetensors"
fails consolidate_np2 "consolidate_checkpoint runs on one process, but the launcher started 2" -- \
  "$MPIRUN" -np 2 --oversubscribe "$BIN/consolidate_checkpoint" "$WORK/cz" "$WORK/np2.safetensors"
[ ! -e "$WORK/np2.safetensors" ] || { echo "FAILED consolidate_np2: it wrote the file"; exit 1; }
# OUT under a step directory's name beside the checkpoint it reads: a later --resume would stop there.
# The message calls the folder what it is for this tool (it has no --checkpoint-dir).
fails consolidate_step_name "OUT $WORK/cz/step_00000009 takes the name of a checkpoint step directory in the checkpoint's directory $WORK/cz (" -- \
  "$BIN/consolidate_checkpoint" "$WORK/cz" "$WORK/cz/step_00000009"
[ ! -e "$WORK/cz/step_00000009" ] || { echo "FAILED consolidate_step_name: it wrote the file"; exit 1; }
# However the checkpoint is named: with a trailing slash, /., from inside its directory, by a link.
newest=$(basename "$(ls -d "$WORK"/cz/step_* | tail -1)")
ln -sfn "$WORK/cz/$newest" "$WORK/cz_link"
i=0
for spelling in "$WORK/cz/$newest/" "$WORK/cz/$newest/." "$newest" "$WORK/cz_link"; do
  i=$((i + 1))
  fails "consolidate_step_name_$i" "takes the name of a checkpoint step directory in the checkpoint's directory $WORK/cz (" -- \
    bash -c 'cd "$1" && exec "${@:2}"' x "$WORK/cz" "$BIN/consolidate_checkpoint" "$spelling" "$WORK/cz/step_00000009"
  [ ! -e "$WORK/cz/step_00000009" ] || { echo "FAILED consolidate_step_name ($spelling): it wrote the file"; exit 1; }
done
# A probe that cannot be removed again (an append-only directory): refused, the probe named.
if is_root && mkdir -p "$WORK/appendonly" && chattr +a "$WORK/appendonly" 2>/dev/null; then
  fails consolidate_append_only "--as-checkpoint $WORK/appendonly/new: cannot write in $WORK/appendonly (a new file cannot be removed again: Operation not permitted; an append-only directory? the probe $WORK/appendonly/.write-test.tmp." -- \
    "$BIN/consolidate_checkpoint" "$WORK/cz" "$WORK/ao_out.safetensors" --as-checkpoint "$WORK/appendonly/new"
  chattr -a "$WORK/appendonly"
  [ ! -e "$WORK/ao_out.safetensors" ] || { echo "FAILED consolidate_append_only: OUT written first"; exit 1; }
fi
ln -sfn "$WORK/nowhere" "$WORK/dangling"  # a link to nothing above the new checkpoint
fails consolidate_dangling "--as-checkpoint $WORK/dangling/sub: $WORK/dangling is a dangling symbolic link" -- \
  "$BIN/consolidate_checkpoint" "$WORK/cz" "$WORK/dl_out.safetensors" --as-checkpoint "$WORK/dangling/sub"
long=$(printf 'a%.0s' $(seq 250))  # a legal name, too long with the temporary file's suffix
fails consolidate_long_name "cannot create a file in $WORK (File name too long, once .tmp.XXXXXX is added); give a shorter name" -- \
  "$BIN/consolidate_checkpoint" "$WORK/cz" "$WORK/$long"
mkdir -p "$WORK/outdir"  # a directory as OUT: the fix names a file of OUT's kind
fails consolidate_out_dir "OUT $WORK/outdir is a directory; give a file name, e.g. $WORK/outdir/model.safetensors" -- \
  "$BIN/consolidate_checkpoint" "$WORK/cz" "$WORK/outdir"
# A path ending in / names a directory, whatever stands there (one, a file, nothing yet): never
# "mkdir -p" a file's name.
: >"$WORK/afile.safetensors"
for p in "$WORK/outdir/" "$WORK/afile.safetensors/" "$WORK/notyet/"; do
  fails "consolidate_slash_$(basename "$p")" "OUT $p ends in /, so it names a directory; give a file path, e.g. ${p}model.safetensors, or ${p%/} without the /" -- \
    "$BIN/consolidate_checkpoint" "$WORK/cz" "$p"
done
fails consolidate_under_file "OUT $WORK/afile.safetensors/x.safetensors: $WORK/afile.safetensors is a regular file, not a directory" -- \
  "$BIN/consolidate_checkpoint" "$WORK/cz" "$WORK/afile.safetensors/x.safetensors"
[ ! -e "$WORK/notyet" ] || { echo "FAILED consolidate_slash: it made notyet"; exit 1; }
if is_root && unshare -m true 2>/dev/null; then  # a read-only mount: the error names the flag
  mkdir -p "$WORK/ro"
  fails consolidate_readonly "--as-checkpoint $WORK/ro/new: cannot write in $WORK/ro (Read-only" -- \
    unshare -m bash -c "mount -o bind,ro '$WORK/ro' '$WORK/ro' && exec \"\$@\"" x \
    "$BIN/consolidate_checkpoint" "$WORK/cz" "$WORK/ro_out.safetensors" --as-checkpoint "$WORK/ro/new"
  [ ! -e "$WORK/ro_out.safetensors" ] || { echo "FAILED consolidate_readonly: OUT written first"; exit 1; }
fi

# --- B5: a refused run keeps the previous metrics -----------------------------------------------
"${C1[@]}" --max-steps 4 --checkpoint-dir "$WORK/c5" --metrics "$WORK/m5.jsonl" >/dev/null
lines=$(wc -l <"$WORK/m5.jsonl")
fails refused_keeps_metrics 0 ch01_training_loop "already holds committed checkpoints" "${T[@]}" \
  --max-steps 6 --checkpoint-dir "$WORK/c5" --metrics "$WORK/m5.jsonl"
expect_eq "$(wc -l <"$WORK/m5.jsonl")" "$lines" "B5: the refused run left the previous --metrics whole (lines)"

# --- B7: relative paths -------------------------------------------------------------------------
(cd "$WORK/c5" && "${C1[@]}" --max-steps 6 --checkpoint-dir . --resume step_00000004 >"$WORK/b7.log" 2>&1) ||
  { echo "FAILED B7: a relative resume inside D was refused"; cat "$WORK/b7.log"; exit 1; }
[ -d "$WORK/c5/step_00000006" ] || { echo "FAILED B7: no step 6"; exit 1; }
echo "ok B7: --checkpoint-dir . --resume step_00000004 inside D resumed and saved step 6"

# --- B8, B9, B10: devices, streams, inputs ---------------------------------------------------------
if is_root && mknod "$WORK/tty" c 5 0 2>/dev/null; then  # /dev/tty: no controlling terminal here
  fails tty "--save-final $WORK/tty: cannot open it for writing" -- setsid "${C1[@]}" --max-steps 3 --save-final "$WORK/tty"
  ! grep -q "^step 1/" "$WORK/tty.log" || { echo "FAILED B8: it trained first"; exit 1; }
fi
echo "a line the shell wrote before" >"$WORK/run.log"
"${C1[@]}" --max-steps 2 --metrics /dev/stdout >>"$WORK/run.log" 2>&1
head -1 "$WORK/run.log" | grep -q "a line the shell wrote before" && grep -q '"type":"summary"' "$WORK/run.log" ||
  { echo "FAILED B9: --metrics /dev/stdout replaced the redirect file"; cat "$WORK/run.log"; exit 1; }
echo "ok B9: --metrics /dev/stdout >> run.log kept the log and appended the records"
fails init_from_metrics 0 ch01_training_loop "--init-from $WORK/d.safetensors and --metrics $WORK/d.safetensors name the same file" \
  "${T[@]}" --init-from "$WORK/d.safetensors" --metrics "$WORK/d.safetensors"

# --- B13: a recorded evaluation is kept when the resumed run makes none; later ones go ----------
E=(--model toy --hidden-sizes 16,8 --global-batch-size 100 --epochs 2)  # 10 steps per epoch
"$BIN/ch01_training_loop" "${E[@]}" --checkpoint-every 5 --checkpoint-dir "$WORK/c13" --metrics "$WORK/m13.jsonl" >/dev/null
cp "$WORK/m13.jsonl" "$WORK/m13b.jsonl"
"$BIN/ch01_training_loop" "${E[@]}" --eval-every-epoch 0 --resume "$WORK/c13/step_00000010" --metrics "$WORK/m13.jsonl" >/dev/null
expect_eq "$(grep -c '"type":"eval"' "$WORK/m13.jsonl")" 1 "B13: resumed at step 10 without evaluations: epoch 1's recorded evaluation kept, epoch 2's dropped"
"$BIN/ch01_training_loop" "${E[@]}" --eval-every-epoch 0 --resume "$WORK/c13/step_00000005" --metrics "$WORK/m13b.jsonl" >/dev/null
expect_eq "$(grep -c '"type":"eval"' "$WORK/m13b.jsonl")" 0 "B13: resumed at step 5: no evaluation of the stopped run's later steps kept"

# --- B14, B15: checkpoint directories -------------------------------------------------------------
fails inside_ck 0 ch01_training_loop "--checkpoint-dir $WORK/c5/step_00000004 is \(or is inside\) a committed checkpoint" \
  "${T[@]}" --max-steps 2 --checkpoint-dir "$WORK/c5/step_00000004"
mkdir -p "$WORK/c15"; touch "$WORK/c15/step_00000004"
fails stray_step 0 ch01_training_loop "$WORK/c15/step_00000004 is not a directory, but has a checkpoint's name" \
  "${T[@]}" --max-steps 4 --checkpoint-dir "$WORK/c15"
# --- Second pass: a checkpoint is a step_* directory with a manifest, at any depth ----------------
mkdir -p "$WORK/P"; echo '{}' >"$WORK/P/manifest.json"  # some other tool's manifest.json
"${C1[@]}" --max-steps 1 --metrics "$WORK/P/m.jsonl" >/dev/null || { echo "FAILED: P/manifest.json taken for a checkpoint"; exit 1; }
fails deep_ck 0 ch01_training_loop "--checkpoint-dir $WORK/c5/step_00000004/a/b is \(or is inside\) a committed checkpoint" \
  "${T[@]}" --max-steps 2 --checkpoint-dir "$WORK/c5/step_00000004/a/b"
[ ! -e "$WORK/c5/step_00000004/a" ] || { echo "FAILED: the refused run made a directory in the checkpoint"; exit 1; }
mkdir -p "$WORK/c5/step_00000004/x"
fails deep_output 0 ch01_training_loop "--save-final $WORK/c5/step_00000004/x/w.st is inside the committed checkpoint" \
  "${T[@]}" --max-steps 2 --save-final "$WORK/c5/step_00000004/x/w.st"
rmdir "$WORK/c5/step_00000004/x"
edited shape 'm["tensors"][0]["shape"] = [16, 49]'
fails shape "field tensors[0].numel is missing or not the product of its shape" -- \
  "$BIN/consolidate_checkpoint" "$WORK/e_shape" "$WORK/shape.safetensors"
edited name 'm["tensors"][0]["name"] = "0.bias"'
fails name "field tensors[1].name is missing or not a tensor name given once" -- \
  "$BIN/consolidate_checkpoint" "$WORK/e_name" "$WORK/name.safetensors"
edited format 'm["format"] = 5'
fails format_type "manifest.json: a field is missing or of another type than this binary writes" -- \
  "$BIN/consolidate_checkpoint" "$WORK/e_format" "$WORK/format.safetensors"
python3 -c 'print("{\"latency_us\": " + "[" * 100000 + "]" * 100000 + ", \"bandwidth_bps\": 1e9}")' >"$WORK/self.json"
fails deep_selftest 2 ch04_ring_allreduce "selftest file .*self.json: the JSON nests deeper than 64 levels" \
  "${T[@]}" --max-steps 1 --net-selftest "$WORK/self.json" --net-compute-ms 1
# A resumed run's --checkpoint-dir with a file where its next step directory goes.
touch "$WORK/c5/step_00000008"
fails stray_resumed 0 ch01_training_loop "$WORK/c5/step_00000008 is not a directory, but has a checkpoint's name" \
  "${T[@]}" --max-steps 8 --checkpoint-dir "$WORK/c5" --resume "$WORK/c5"
rm "$WORK/c5/step_00000008"
echo "harden_breaks: all cases passed"
