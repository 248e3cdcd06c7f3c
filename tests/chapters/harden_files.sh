#!/usr/bin/env bash
# Hardening, round 2 (issue 24): outputs never replace what is not ours, untrusted files never
# crash or mislead, every rank checks its output places before step 1. Each case below failed
# on a99e052 (the comment says how) and must pass now.
#   O1 a character device at --save-final is written through and stays a device (a99e052 renamed
#      a regular file over it: root's `--save-final /dev/null` replaced /dev/null)
#   O2 a symlink at --save-final, or at --metrics rewritten after --resume, stays a symlink; the
#      file it names gets the bytes (a99e052 replaced the link with a regular file)
#   O3 a FIFO at --metrics / --trace / --save-final, or as a dataset file, is refused at once
#      (a99e052 hung opening it); a directory as a dataset file or --init-from is named as such
#   O4 two outputs on one file, or an output inside a committed checkpoint, are refused
#   O5 a rank whose node-local --checkpoint-dir is read-only stops every rank before step 1
#      (a99e052 checked on rank 0 only: all steps ran, then the save failed)
#   U1 a manifest run beyond the model is refused before a byte is copied (a99e052: heap
#      overflow, SIGSEGV or "munmap_chunk(): invalid pointer")
#   U2 an edited manifest (the optimizer's step count) is refused by its own CRC-32
#   U3 a safetensors header naming a tensor twice is refused (a99e052 kept the last, rc 0)
#   U4 NaN weights in a checkpoint are named as a checkpoint of a diverged run, not as a
#      divergence of this one
#   S1 an epoch's evaluation lost between its last checkpoint and the evaluation is made by the
#      resumed run (a99e052 never made it)
#   S2 --seed past 2^64 - 1 and --seed 12abc; S3 SLURM_NTASKS of an allocation; S4
#      --memory-calculator --params nan; S5 --no-shuffle false; S6 --keep-checkpoints alone
source "$(dirname "$0")/lib.bash"
RUN_TIMEOUT=60
T=(--model toy --hidden-sizes 16,8 --global-batch-size 48 --eval-every-epoch 0)
C1=("$BIN/ch01_training_loop" "${T[@]}")
is_root() { [ "$(id -u)" = 0 ]; }

# --- O1: a character device is written through ------------------------------------------------
if is_root && mknod "$WORK/null" c 1 3 2>/dev/null; then
  "${C1[@]}" --max-steps 2 --save-final "$WORK/null" --metrics "$WORK/null" >"$WORK/o1.log" 2>&1 ||
    { echo "FAILED O1: exit $?"; cat "$WORK/o1.log"; exit 1; }
  [ -c "$WORK/null" ] || { echo "FAILED O1: the device node became $(stat -c %F "$WORK/null")"; exit 1; }
  echo "ok O1: --save-final/--metrics on a character device: written through, still a device"
else
  echo "note O1: not root (mknod): the device case is covered by tests/unit/output_paths_test.cpp"
fi

# --- O2: symlinks are followed ------------------------------------------------------------------
run plain 0 ch01_training_loop "${T[@]}" --max-steps 4
ln -s "$WORK/real.safetensors" "$WORK/link.safetensors"
"${C1[@]}" --max-steps 4 --save-final "$WORK/link.safetensors" >"$WORK/o2.log" 2>&1
[ -L "$WORK/link.safetensors" ] || { echo "FAILED O2: --save-final replaced the symlink"; exit 1; }
"$COMPARE" "$WORK/plain.safetensors" "$WORK/real.safetensors" --bitwise >/dev/null
ln -s "$WORK/m_real.jsonl" "$WORK/m_link.jsonl"
"${C1[@]}" --max-steps 2 --checkpoint-dir "$WORK/c_o2" --metrics "$WORK/m_link.jsonl" >/dev/null
"${C1[@]}" --max-steps 4 --resume "$WORK/c_o2" --metrics "$WORK/m_link.jsonl" >/dev/null
[ -L "$WORK/m_link.jsonl" ] || { echo "FAILED O2: --metrics after --resume replaced the symlink"; exit 1; }
[ "$(grep -c '"type":"step"' "$WORK/m_real.jsonl")" = 4 ] ||
  { echo "FAILED O2: the linked metrics file lacks steps 1-4"; cat "$WORK/m_real.jsonl"; exit 1; }
echo "ok O2: symlinks at --save-final and at --metrics after --resume stay links; targets written"

# --- O3: FIFOs and directories are refused at once ----------------------------------------------
mkfifo "$WORK/fifo"
fails fifo_metrics 0 ch01_training_loop "--metrics .*/fifo is a FIFO \(named pipe\)" "${T[@]}" --metrics "$WORK/fifo"
fails fifo_save_final 0 ch01_training_loop "--save-final .*/fifo is a FIFO" "${T[@]}" --save-final "$WORK/fifo"
fails fifo_trace 2 ch05_ddp_buckets "--trace .*/fifo is a FIFO" "${T[@]}" --trace "$WORK/fifo"
fails fifo_init_from 0 ch01_training_loop "--init-from .*/fifo is a FIFO \(named pipe\), not a regular file" "${T[@]}" --init-from "$WORK/fifo"
fails dir_init_from 0 ch01_training_loop "--init-from .*/c_o2 is a directory, not a regular file" "${T[@]}" --init-from "$WORK/c_o2"
mkdir -p "$WORK/fm_fifo" "$WORK/fm_dir"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  mkfifo "$WORK/fm_fifo/$f"; mkdir "$WORK/fm_dir/$f"
done
FM=(--model mlp --data fashion-mnist --global-batch-size 64 --max-steps 1)
fails fifo_dataset 0 ch01_training_loop "dataset file .*/fm_fifo/.*-ubyte.gz is a FIFO \(named pipe\), not a regular file" "${FM[@]}" --data-dir "$WORK/fm_fifo"
fails dir_dataset 0 ch01_training_loop "dataset file .*/fm_dir/.*-ubyte.gz is a directory, not a regular file" "${FM[@]}" --data-dir "$WORK/fm_dir"

# --- O4: one file, one output; nothing written into a committed checkpoint -----------------------
fails same_metrics_trace 2 ch05_ddp_buckets "--metrics .*/same.out and --trace .*/same.out name the same file" \
  "${T[@]}" --metrics "$WORK/same.out" --trace "$WORK/same.out"
fails same_final_optimizer 2 ch06_zero1 "--save-final .*/s.st and --save-optimizer-state .*/./s.st name the same file" \
  "${T[@]}" --save-final "$WORK/s.st" --save-optimizer-state "$WORK/./s.st"
ln -s "$WORK/m_real.jsonl" "$WORK/m_link2.jsonl"
fails same_via_link 0 ch01_training_loop "--save-final .*/m_link2.jsonl and --metrics .*/m_real.jsonl name the same file" \
  "${T[@]}" --metrics "$WORK/m_real.jsonl" --save-final "$WORK/m_link2.jsonl"
before=$(sha256sum "$WORK/c_o2/step_00000002/"* | sha256sum)
fails into_checkpoint 0 ch01_training_loop "--save-final .*/c_o2/step_00000002/model.safetensors is inside the committed checkpoint" \
  "${T[@]}" --max-steps 1 --save-final "$WORK/c_o2/step_00000002/model.safetensors"
fails into_checkpoint_new 0 ch01_training_loop "--metrics .*/c_o2/step_00000002/m.jsonl is inside the committed checkpoint" \
  "${T[@]}" --max-steps 1 --metrics "$WORK/c_o2/step_00000002/m.jsonl"
fails is_checkpoint_dir 0 ch01_training_loop "--save-final .*/c_new is the --checkpoint-dir" \
  "${T[@]}" --max-steps 1 --checkpoint-dir "$WORK/c_new" --save-final "$WORK/c_new"
fails is_checkpoint_dir_slash 0 ch01_training_loop "--save-final .*/c_new2 is the --checkpoint-dir .*/c_new2/" \
  "${T[@]}" --max-steps 1 --checkpoint-dir "$WORK/c_new2/" --save-final "$WORK/c_new2"  # not made yet
mkdir -p "$WORK/c_new3"  # a step directory's name in it: a later save would stop there
fails step_name_in_checkpoint_dir 0 ch01_training_loop "--save-final .*/c_new3/step_00000001 takes the name of a checkpoint step directory in the --checkpoint-dir .*/c_new3 \\(" \
  "${T[@]}" --max-steps 1 --checkpoint-dir "$WORK/c_new3" --save-final "$WORK/c_new3/step_00000001"
[ "$(sha256sum "$WORK/c_o2/step_00000002/"* | sha256sum)" = "$before" ] && [ ! -e "$WORK/c_o2/step_00000002/m.jsonl" ] ||
  { echo "FAILED O4: the committed checkpoint changed"; exit 1; }
echo "ok O4: the committed checkpoint is unchanged"

# --- O5: every rank checks its own --checkpoint-dir ----------------------------------------------
# Rank 1 runs in its own mount namespace where the directory is read-only: a node-local
# directory that only rank 1 cannot write. Root only (unshare, mount).
if is_root && unshare -m true 2>/dev/null; then
  mkdir -p "$WORK/local_ck"
  A=("$BIN/ch05_ddp_buckets" "${T[@]}" --max-steps 3 --log-every 1 --checkpoint-dir "$WORK/local_ck")
  ro="mount --bind '$WORK/local_ck' '$WORK/local_ck' && mount -o remount,ro,bind '$WORK/local_ck' && exec \"\$@\""
  start=$(date +%s)
  fails node_local "[rank 1/2]" "--checkpoint-dir $WORK/local_ck is not writable (Read-only file system)" \
    "every rank stops before step 1" -- \
    "$MPIRUN" --oversubscribe -np 1 "${A[@]}" : -np 1 unshare -m bash -c "$ro" rank1 "${A[@]}"
  ! grep -q "^step 1/" "$WORK/node_local.log" || { echo "FAILED O5: it trained first"; exit 1; }
  [ $(($(date +%s) - start)) -le 30 ] || { echo "FAILED O5: took over 30 s"; exit 1; }
else
  echo "note O5: not root or no unshare: the node-local directory case is not run here"
fi

# --- U1, U2: a damaged or edited manifest ---------------------------------------------------------
run z 2 ch06_zero1 "${T[@]}" --max-steps 2 --checkpoint-dir "$WORK/cz"
damaged() {  # damaged NAME RESEAL(0|1) PYTHON-EDIT PATTERN
  rm -rf "$WORK/d_$1"; mkdir -p "$WORK/d_$1"; cp -r "$WORK/cz/step_00000002" "$WORK/d_$1/"
  local m="$WORK/d_$1/step_00000002/manifest.json"
  python3 -c "import json,sys; p=sys.argv[1]; m=json.load(open(p)); $3; json.dump(m, open(p,'w'), indent=2)" "$m"
  if [ "$2" = 1 ]; then reseal_manifest "$m"; fi
  STOPS_SHOW="$4" stops "manifest_$1" 2 ch06_zero1 "$4" "${T[@]}" --max-steps 4 --resume "$WORK/d_$1"
}
damaged run_beyond 1 'm["files"][1]["runs"][0][0] = m["num_parameters"] + 100000' \
  "shard_00001.safetensors: range \[[0-9]+, [0-9]+ \+ [0-9]+\) outside the model's [0-9]+ elements"
damaged run_overlap 1 'm["files"][1]["runs"][0][1] = 7' "runs tile the file's tensors in order, so it must start at 0"
damaged step_edited 0 'm["tensors"][0]["step"] = 1' \
  "manifest.json: field manifest_crc32 is [0-9a-f]{8}, but the manifest's text has CRC-32 [0-9a-f]{8} \(edited or corrupted"
damaged path_escape 1 'm["files"][0]["file"] = "/etc/hostname"' "field files\[0\].file is missing or not a file name inside"

# --- U3: a tensor named twice -------------------------------------------------------------------
python3 - "$WORK/plain.safetensors" "$WORK/twice.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
header = b[8:8 + n].decode().rstrip()
entry = json.dumps(json.loads(header)["0.bias"], separators=(",", ":"))
h = (header[:-1] + ',"0.bias":' + entry + "}").encode()  # the same name again, same data
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + b[8 + n:])
PY
fails twice 0 ch01_training_loop "twice.safetensors header: the JSON names \"0.bias\" twice" "${T[@]}" --init-from "$WORK/twice.safetensors"

# --- U4: NaN weights in a checkpoint --------------------------------------------------------------
mkdir -p "$WORK/c_nan"; cp -r "$WORK/c_o2/step_00000002" "$WORK/c_nan/"
python3 - "$WORK/c_nan/step_00000002" <<'PY'
import json, struct, sys, zlib
d = sys.argv[1]; f = d + "/model.safetensors"
b = bytearray(open(f, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
start = json.loads(b[8:8 + n])["0.weight"]["data_offsets"][0]
b[8 + n + start + 12:8 + n + start + 16] = struct.pack("<f", float("nan"))  # 0.weight[3]
open(f, "wb").write(b)
m = json.load(open(d + "/manifest.json"))
m["files"][0]["bytes"], m["files"][0]["crc32"] = len(b), zlib.crc32(bytes(b))
json.dump(m, open(d + "/manifest.json", "w"), indent=2)
PY
reseal_manifest "$WORK/c_nan/step_00000002/manifest.json"
fails nan_checkpoint 0 ch01_training_loop "the checkpoint's params hold nan at 0.weight\[3\]: it was saved after the run that wrote it had diverged" \
  "${T[@]}" --max-steps 6 --resume "$WORK/c_nan"

# --- S1: the evaluation of an epoch whose last checkpoint was its last step ------------------------
E=(--model toy --hidden-sizes 16,8 --global-batch-size 100 --epochs 2)  # 10 steps per epoch
"$BIN/ch01_training_loop" "${E[@]}" --metrics "$WORK/full.jsonl" --checkpoint-dir "$WORK/c_ev" \
  --checkpoint-every 10 >/dev/null
# The state a kill right after step 10's checkpoint leaves: that checkpoint, and the metrics
# up to step 10 without the epoch's evaluation.
mkdir -p "$WORK/c_ev2"; cp -r "$WORK/c_ev/step_00000010" "$WORK/c_ev2/"
python3 -c '
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
keep = [r for r in rs if r["type"] == "step" and r["step"] <= 10]
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in keep))' "$WORK/full.jsonl" "$WORK/cut.jsonl"
"$BIN/ch01_training_loop" "${E[@]}" --metrics "$WORK/cut.jsonl" --resume "$WORK/c_ev2" >/dev/null
python3 - "$WORK/full.jsonl" "$WORK/cut.jsonl" <<'PY'
import json, sys
def recs(p, t): return [{k: v for k, v in r.items() if k not in ("ms_per_step", "samples_per_s")}
                        for r in map(json.loads, open(p)) if r["type"] == t]
full, cont = sys.argv[1], sys.argv[2]
assert recs(cont, "eval") == recs(full, "eval") and len(recs(full, "eval")) == 2, \
    (recs(cont, "eval"), recs(full, "eval"))
assert recs(cont, "step") == recs(full, "step")
order = [r["type"] for r in map(json.loads, open(cont))]
assert order.index("eval") == 10, order  # after step 10, before step 11: where the full run has it
print("ok S1: the resumed run made epoch 1's evaluation: evals and steps equal the uninterrupted run's")
PY

# --- S2-S6: flags -------------------------------------------------------------------------------
fails seed_past 0 ch01_training_loop "18446744073709551616 is past 2\^64 - 1" "${T[@]}" --seed 18446744073709551616
fails seed_text 0 ch01_training_loop "'12abc' is not an integer" "${T[@]}" --seed 12abc
"${C1[@]}" --max-steps 1 --seed 18446744073709551615 >/dev/null  # 2^64 - 1 itself is a seed
SLURM_NTASKS=4 SLURM_JOB_ID=1 "${C1[@]}" --max-steps 1 >"$WORK/slurm.log" 2>&1 ||
  { echo "FAILED S3: a single process in a 4-task allocation was refused"; cat "$WORK/slurm.log"; exit 1; }
echo "ok S3: SLURM_NTASKS=4 (an allocation) runs one process"
SLURM_STEP_NUM_TASKS=4 fails slurm_step 0 ch01_training_loop "launcher started 4 \(SLURM_STEP_NUM_TASKS=4\)" "${T[@]}"
fails params_nan 0 ch06_zero1 "nan is not a finite number" --memory-calculator --params nan
fails no_shuffle_false 0 ch01_training_loop "--no-shuffle is a flag and takes no value, so 'false' after it is not expected" \
  "${T[@]}" --no-shuffle false
fails keep_alone 0 ch01_training_loop "--keep-checkpoints 2 needs --checkpoint-dir" "${T[@]}" --keep-checkpoints 2
echo "harden_files: all cases passed"
