#!/usr/bin/env bash
# Checkpoints, item 7: faults.
#  - SIGKILL in the middle of a checkpoint write: the test hook RINGZERO_TEST_KILL_IN_CHECKPOINT
#    =STEP:RANK makes that rank kill itself (SIGKILL, no clean-up) after writing half of its
#    file for checkpoint STEP. mpirun then takes the other ranks down. The interrupted
#    checkpoint has no manifest; --resume DIR takes the previous one, and the resumed run ends
#    with the uninterrupted run's parameters, BITWISE. Chapter 06 at N = 3 (rank 1 dies writing
#    its shard), chapter 01 (the one process dies writing model.safetensors).
#  - Disk full: a file-size limit on the ranks (ulimit -f; the writer ignores SIGXFSZ, so
#    write() fails with EFBIG, as it fails with ENOSPC on a full disk) while checkpoint 8 is written: the run stops with an
#    error naming the file, the previous checkpoint's files are unchanged (sha256), no
#    manifest appears for step 8, and resuming still works. Chapter 01 and chapter 06 at N = 2.
source "$(dirname "$0")/lib.bash"

base=(--model toy --hidden-sizes 16,8 --global-batch-size 48 --eval-every-epoch 0 --seed 9
      --grad-accum-steps 2 --clip-grad-norm 0.5)
run k06_full 3 ch06_zero1 "${base[@]}" --max-steps 12
rc=0  # the ranks inherit the variable from mpirun (local launch)
RINGZERO_TEST_KILL_IN_CHECKPOINT=8:1 timeout 120 "$MPIRUN" -np 3 --oversubscribe "$BIN/ch06_zero1" \
  "${base[@]}" --max-steps 12 --checkpoint-dir "$WORK/k06" --checkpoint-every 4 >"$WORK/k06_killed.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAILED: the killed run exited $rc"; cat "$WORK/k06_killed.log"; exit 1; }
[ -f "$WORK/k06/step_00000004/manifest.json" ] && [ ! -f "$WORK/k06/step_00000008/manifest.json" ] ||
  { echo "FAILED: expected step 4 committed and step 8 not"; ls -lR "$WORK/k06"; exit 1; }
ls "$WORK/k06/step_00000008" | grep -q "shard_00001.safetensors.tmp" ||
  { echo "FAILED: rank 1 was not killed mid-write"; ls -l "$WORK/k06/step_00000008"; exit 1; }
run k06_resumed 3 ch06_zero1 "${base[@]}" --max-steps 12 --resume "$WORK/k06" --checkpoint-dir "$WORK/k06" \
  --checkpoint-every 4
grep -q "resumed from .*step_00000004" "$WORK/k06_resumed.log"
"$COMPARE" "$WORK/k06_full.safetensors" "$WORK/k06_resumed.safetensors" --bitwise >/dev/null
echo "ok: ch06 N=3, rank 1 SIGKILLed writing checkpoint 8: resumed from 4, final parameters bitwise equal"

base1=(--model toy --hidden-sizes 16,8 --global-batch-size 48 --eval-every-epoch 0 --seed 9)
run k01_full 0 ch01_training_loop "${base1[@]}" --max-steps 12
rc=0
RINGZERO_TEST_KILL_IN_CHECKPOINT=8:0 timeout 60 "$BIN/ch01_training_loop" "${base1[@]}" --max-steps 12 \
  --checkpoint-dir "$WORK/k01" --checkpoint-every 4 >"$WORK/k01_killed.log" 2>&1 || rc=$?
[ "$rc" -eq 137 ] || { echo "FAILED: expected SIGKILL (137), got $rc"; exit 1; }
run k01_resumed 0 ch01_training_loop "${base1[@]}" --max-steps 12 --resume "$WORK/k01"
grep -q "resumed from .*step_00000004" "$WORK/k01_resumed.log"
"$COMPARE" "$WORK/k01_full.safetensors" "$WORK/k01_resumed.safetensors" --bitwise >/dev/null
echo "ok: ch01 SIGKILLed writing checkpoint 8: resumed from 4, final parameters bitwise equal"

# disk_full NAME NP BINARY ARGS...: checkpoint 4 normally, then checkpoint 8 under an 8 MiB file
# size limit on the ranks (each checkpoint file is 11.5 MB: ToyModel with one hidden layer of
# 1500; a smaller limit would already stop MPI's start-up, whose shared-memory files count too).
disk_full() {
  local name=$1 np=$2 binary=$3; shift 3
  local ck="$WORK/${name}_ck"
  run ${name}_first "$np" "$binary" "$@" --max-steps 4 --checkpoint-dir "$ck"
  local before; before=$(cd "$ck/step_00000004" && sha256sum -- *)
  # The limit applies to the ranks only (mpirun's own shared-memory files stay unlimited).
  local cmd=(bash -c 'ulimit -f 8192; exec "$@"' limit "$BIN/$binary" --log-every 1000 "$@" --max-steps 8
             --resume "$ck" --checkpoint-dir "$ck")
  if [ "$np" -gt 0 ]; then cmd=("$MPIRUN" -np "$np" --oversubscribe "${cmd[@]}"); fi
  local rc=0
  timeout 120 "${cmd[@]}" >"$WORK/${name}_full.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAILED: $name: exit $rc"; cat "$WORK/${name}_full.log"; exit 1; }
  grep -q "writing .*step_00000008/.*failed .*File too large (disk full or file size limit?)" "$WORK/${name}_full.log" ||
    { echo "FAILED: $name: no write error"; cat "$WORK/${name}_full.log"; exit 1; }
  [ "$(cd "$ck/step_00000004" && sha256sum -- *)" = "$before" ] || { echo "FAILED: $name: step 4 changed"; exit 1; }
  [ ! -f "$ck/step_00000008/manifest.json" ] || { echo "FAILED: $name: step 8 committed"; exit 1; }
  run ${name}_again "$np" "$binary" "$@" --max-steps 8 --resume "$ck"
  grep -q "resumed from .*step_00000004" "$WORK/${name}_again.log"
  echo "ok: $name: $(grep -m1 -o 'writing .*step_00000008/[^ ]* failed[^;]*' "$WORK/${name}_full.log"); step 4 unchanged (sha256), resumable"
}
big=(--model toy --hidden-sizes 1500 --global-batch-size 48 --eval-every-epoch 0 --seed 9)
disk_full f01 0 ch01_training_loop "${big[@]}"  # one 23 MB file
disk_full f06 2 ch06_zero1 "${big[@]}"
