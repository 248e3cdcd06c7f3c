#!/usr/bin/env bash
# Start-up hardening of the chapters (issue 9), each case with its expected message:
#   item 1  ranks whose --data-dir holds different Fashion-MNIST files stop at start-up naming
#           the rank, the directories and both counts/CRC-32s (not a hang or MPI_ERR_TRUNCATE);
#           two copies of the same files in different directories train normally
#   item 2  --seed is compared as a flag when --init-from is given (it still drives the shuffle)
#   item 4  an unwritable output path fails before the first step
#   item 9  chapters 01-02 under mpirun -np 2 refuse, naming the chapter to use
#   item 10 the ledger's formula line follows --optimizer, and the measured peak equals it
# Every mpirun has a timeout: a hang fails the test instead of blocking it.
source "$(dirname "$0")/lib.bash"
RUN_TIMEOUT=20
small=(--model toy --hidden-sizes 16 --max-steps 2 --eval-every-epoch 0 --log-every 1000)

# fails NAME TEXT... -- COMMAND... (lib.bash): COMMAND must exit 1..123 within RUN_TIMEOUT (not a
# timeout or signal) and print every TEXT. passes NAME COMMAND...: COMMAND must exit 0.
passes() {
  local name=$1; shift
  if ! timeout "$RUN_TIMEOUT" "$@" >"$WORK/$name.log" 2>&1; then
    echo "FAILED $name: $*"; cat "$WORK/$name.log"; exit 1
  fi
  echo "ok $name"
}
M=("$MPIRUN" --oversubscribe)

# --- item 9: single-process chapters under mpirun
for ch in ch01_training_loop ch02_gradient_accumulation; do
  fails "mpirun_$ch" "$ch runs on one process, but the launcher started 2" "use ch03_data_parallel" \
    -- "${M[@]}" -np 2 "$BIN/$ch" "${small[@]}"
done

# --- item 1: Fashion-MNIST-format sets of 640 and 576 training images (500 test images each)
python3 - "$WORK" <<'PY'
import gzip, os, struct, sys
w = sys.argv[1]
def idx(dims, data):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data
def split(d, prefix, n):
    os.makedirs(d, exist_ok=True)
    img = bytes((i * 7) % 256 for i in range(n * 784))
    lab = bytes(i % 10 for i in range(n))
    open(f"{d}/{prefix}-images-idx3-ubyte.gz", "wb").write(gzip.compress(idx([n, 28, 28], img), mtime=0))
    open(f"{d}/{prefix}-labels-idx1-ubyte.gz", "wb").write(gzip.compress(idx([n], lab), mtime=0))
for name, n in (("a", 640), ("a_copy", 640), ("b", 576)):
    split(f"{w}/{name}", "train", n)
    split(f"{w}/{name}", "t10k", 500)
PY
mlp=(--max-steps 2 --eval-every-epoch 0 --log-every 1000)
for ch in ch03_data_parallel ch05_ddp_buckets ch08_zero3; do
  fails "data_differs_$ch" "rank 1 loaded other training data than rank 0: rank 1 has 576 samples" \
    "from $WORK/b train; rank 0 has 640 samples" "from $WORK/a train" \
    -- "${M[@]}" -np 1 "$BIN/$ch" "${mlp[@]}" --data-dir "$WORK/a" : \
       -np 1 "$BIN/$ch" "${mlp[@]}" --data-dir "$WORK/b"
done
passes data_copies_ch05 "${M[@]}" -np 1 "$BIN/ch05_ddp_buckets" "${mlp[@]}" --data-dir "$WORK/a" : \
  -np 1 "$BIN/ch05_ddp_buckets" "${mlp[@]}" --data-dir "$WORK/a_copy"

# --- item 2: with --init-from, different seeds would shuffle differently: the flag check says so
"$BIN/ch01_training_loop" "${small[@]}" --save-final "$WORK/init.safetensors" >/dev/null
fails seed_with_init_from "rank 1 has seed=2, rank 0 has seed=1" \
  -- "${M[@]}" -np 1 "$BIN/ch05_ddp_buckets" "${small[@]}" --init-from "$WORK/init.safetensors" --seed 1 : \
     -np 1 "$BIN/ch05_ddp_buckets" "${small[@]}" --init-from "$WORK/init.safetensors" --seed 2

# --- item 4: unwritable outputs fail before the first step (no "step 1/" line printed)
fails save_final_ch01 "--save-final $WORK/none/w.safetensors: directory $WORK/none does not exist" \
  -- "$BIN/ch01_training_loop" "${small[@]}" --save-final "$WORK/none/w.safetensors"
fails trace_ch06 "--trace /proc/t.json: cannot create a file in /proc" \
  -- "${M[@]}" -np 2 "$BIN/ch06_zero1" "${small[@]}" --trace /proc/t.json
fails optstate_ch07 "--save-optimizer-state $WORK is a directory" \
  -- "${M[@]}" -np 2 "$BIN/ch07_zero2" "${small[@]}" --save-optimizer-state "$WORK"
for log in save_final_ch01 trace_ch06 optstate_ch07; do
  if grep -q "^step 1/" "$WORK/$log.log"; then echo "FAILED $log: a step ran first"; exit 1; fi
done

# --- item 10: formula follows the optimizer; measured model-state peak = formula (Ψ = 20752)
psi=20752
for opt in "adamw 0 fp32 + AdamW|4Ψ + 4Ψ + 8Ψ = 16Ψ|16" "sgd 0 fp32 + SGD|4Ψ + 4Ψ = 8Ψ|8" \
           "sgd 0.9 fp32 + SGD with momentum|4Ψ + 4Ψ + 4Ψ = 12Ψ|12"; do
  read -r o m rest <<<"$opt"
  IFS='|' read -r name text k <<<"$rest"
  for ch in ch01_training_loop:0 ch02_gradient_accumulation:0 ch04_ring_allreduce:2 ch05_ddp_buckets:2; do
    b=${ch%%:*} np=${ch##*:}
    cmd=("$BIN/$b"); [ "$np" -gt 0 ] && cmd=("${M[@]}" -np "$np" "$BIN/$b")
    passes "formula_${b}_${o}_$m" "${cmd[@]}" "${small[@]}" --optimizer "$o" --momentum "$m" \
      --metrics "$WORK/f.jsonl"
    grep -qF "$name" "$WORK/formula_${b}_${o}_$m.log" && grep -qF "$text" "$WORK/formula_${b}_${o}_$m.log" ||
      { echo "FAILED: $b --optimizer $o --momentum $m: formula is not '$name ... $text'";
        grep formula "$WORK/formula_${b}_${o}_$m.log"; exit 1; }
    peak=$(python3 -c "import json,sys; print(int([json.loads(l) for l in open(sys.argv[1])][-1]['model_states_bytes_per_rank']))" "$WORK/f.jsonl")
    [ "$peak" = "$((k * psi))" ] || { echo "FAILED: $b $o $m: peak $peak, formula $((k * psi))"; exit 1; }
    echo "   $b --optimizer $o --momentum $m: $text, peak $peak B = ${k}Ψ"
  done
done
for ch in "ch06_zero1:ZeRO-1, fp32 + SGD): 4Ψ + 4Ψ = " "ch07_zero2:ZeRO-2, fp32 + SGD): 4Ψ + 4Ψ/N = " \
          "ch08_zero3:ZeRO-3, fp32 + SGD): (4 + 4)Ψ/N = "; do
  b=${ch%%:*} text=${ch#*:}
  passes "formula_$b" "${M[@]}" -np 2 "$BIN/$b" "${small[@]}" --optimizer sgd
  grep -qF "$text" "$WORK/formula_$b.log" ||
    { echo "FAILED: $b formula lacks '$text'"; grep formula "$WORK/formula_$b.log"; exit 1; }
  echo "   $b --optimizer sgd: $text"
done
# --- a learner's slips: each message names the flag, the value and the fix
fails later_chapters_flag "ch01_training_loop has no flag --grad-accum-steps" "ch01_training_loop --help lists" \
  -- "$BIN/ch01_training_loop" "${small[@]}" --grad-accum-steps 4
fails bucket_cap_zero "--bucket-cap-mb: 0 MiB is not a finite size from 1 byte" \
  -- "$BIN/ch05_ddp_buckets" "${small[@]}" --bucket-cap-mb 0
fails first_bucket_cap_nan "--first-bucket-cap-mb: nan MiB is not a finite size from 1 byte" \
  -- "$BIN/ch06_zero1" "${small[@]}" --first-bucket-cap-mb nan
fails data_dir_missing "Fashion-MNIST directory '$WORK/nofm' not found; give --data-dir a directory that holds the four .gz files" \
  -- "$BIN/ch01_training_loop" --data fashion-mnist --data-dir "$WORK/nofm" --max-steps 1
fails data_dir_file "Fashion-MNIST directory '/etc/passwd' is a regular file; give --data-dir a directory" \
  -- "$BIN/ch01_training_loop" --data fashion-mnist --data-dir /etc/passwd --max-steps 1
fails bucket_cap_overflow "--bucket-cap-mb: 1e400 MiB is not a finite size" \
  -- "$BIN/ch05_ddp_buckets" "${small[@]}" --bucket-cap-mb 1e400  # inf once converted
fails bucket_cap_empty "--first-bucket-cap-mb: an empty value is not a size in MiB" \
  -- "$BIN/ch07_zero2" "${small[@]}" --first-bucket-cap-mb ""
fails flag_value_not_named "The following argument was not expected: junk" \
  -- "$BIN/ch01_training_loop" "${small[@]}" --lr -inf junk  # -inf is --lr's value, not a flag
fails single_dash "ch01_training_loop has no flag -max-steps (did you mean --max-steps?)" \
  -- "$BIN/ch01_training_loop" -max-steps 2
echo "start-up hardening: all cases as expected"
