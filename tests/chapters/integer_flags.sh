#!/usr/bin/env bash
# Integer flags cannot overflow (issue 9, item 3). Every integer flag of the chapters gets the
# values 0, -1, 2^31, 2^62 and 2^63-1; each run must either exit 0 after a correct short run
# or exit non-zero (not by a signal, not by a timeout) with a message naming the flag. The cases
# the issue reported (SIGFPE from world_size x K wrapping to 0 at np 4, SIGSEGV from a
# parameter count that wraps, an --epochs that overflows the step count) have their exact
# messages written below. Synthetic data, 2 steps: no dataset needed, a few seconds in all.
source "$(dirname "$0")/lib.bash"
VALUES=(0 -1 2147483648 4611686018427387904 9223372036854775807)
BASE=(--model toy --hidden-sizes 16 --max-steps 2 --eval-every-epoch 0 --log-every 1000
      --global-batch-size 64 --grad-accum-steps 1 --epochs 1 --seed 0)

# try NAME NP BINARY FLAG VALUE EXPECTED... : runs BINARY with BASE, FLAG replaced by VALUE.
# Passes if the exit is 0 with the header line printed, or non-zero (< 124) with every EXPECTED
# text (default: the flag's name) in the output.
try() {
  local name=$1 np=$2 binary=$3 flag=$4 value=$5; shift 5
  local expected=("$@") args=() i rc=0
  [ ${#expected[@]} -gt 0 ] || expected=("$flag")
  for ((i = 0; i < ${#BASE[@]}; i += 2)); do
    if [ "${BASE[i]}" != "$flag" ]; then
      if [ "$binary" = ch01_training_loop ] && [ "${BASE[i]}" = --grad-accum-steps ]; then continue; fi
      args+=("${BASE[i]}" "${BASE[i + 1]}")
    fi
  done
  args+=(${EXTRA:-} "$flag" "$value")
  local cmd=("$BIN/$binary" "${args[@]}")
  if [ "$np" -gt 0 ]; then cmd=("$MPIRUN" -np "$np" --oversubscribe "${cmd[@]}"); fi
  timeout 20 "${cmd[@]}" >"$WORK/$name.log" 2>&1 || rc=$?
  if [ "$rc" -ge 124 ]; then
    echo "FAILED $name: exit $rc (timeout or signal): ${cmd[*]}"; cat "$WORK/$name.log"; exit 1
  fi
  if [ "$rc" -eq 0 ]; then
    if ! grep -q " steps" "$WORK/$name.log" || [ "${EXPECT_ERROR:-0}" = 1 ]; then
      echo "FAILED $name: exit 0 but an error was expected: ${cmd[*]}"; cat "$WORK/$name.log"; exit 1
    fi
    echo "ok $name: ran correctly"
    return
  fi
  for text in "${expected[@]}"; do
    if ! grep -qF -- "$text" "$WORK/$name.log"; then
      echo "FAILED $name: exit $rc, message lacks \"$text\": ${cmd[*]}"; cat "$WORK/$name.log"; exit 1
    fi
  done
  echo "ok $name (exit $rc): $(grep -m1 -F -- "${expected[0]}" "$WORK/$name.log" | cut -c1-160)"
}

# The reported cases, with their messages.
EXPECT_ERROR=1 try fpe 4 ch05_ddp_buckets --grad-accum-steps 4611686018427387904 \
  "world_size x --grad-accum-steps: 4 x 4611686018427387904 overflows int64"
EXPECT_ERROR=1 try segv 0 ch01_training_loop --hidden-sizes 4611686018427387904 \
  "--hidden-sizes parameter count: 1024 x 4611686018427387904 overflows int64"
EXPECT_ERROR=1 try big_model 0 ch01_training_loop --hidden-sizes 2147483648 \
  "--hidden-sizes gives 2750926553344 parameters, 44014824853504 bytes of model states, more than this machine's"
BASE=(--model toy --hidden-sizes 16 --eval-every-epoch 0 --log-every 1000 --global-batch-size 64
      --grad-accum-steps 1 --seed 0)
EXPECT_ERROR=1 try epochs_steps 0 ch02_gradient_accumulation --epochs 9223372036854775807 \
  "--epochs x steps per epoch: 9223372036854775807 x 15 overflows int64" "--max-steps"
BASE=(--model toy --hidden-sizes 16 --max-steps 2 --eval-every-epoch 0 --log-every 1000
      --global-batch-size 64 --grad-accum-steps 1 --epochs 1 --seed 0)

# Every shared integer flag, single process (validate() is the same code in every chapter).
for flag in --epochs --max-steps --global-batch-size --grad-accum-steps --seed --log-every \
            --eval-every-epoch --hidden-sizes; do
  for v in "${VALUES[@]}"; do try "ch02${flag}=$v" 0 ch02_gradient_accumulation "$flag" "$v"; done
done
# World size times K at np 4; the chapters' own integer flags.
for v in "${VALUES[@]}"; do
  try "ch03_np4--grad-accum-steps=$v" 4 ch03_data_parallel --grad-accum-steps "$v"
  try "ch05_np2--trace-steps=$v" 2 ch05_ddp_buckets --trace-steps "$v"
  EXTRA=--memory-calculator try "ch06--world-size=$v" 0 ch06_zero1 --world-size "$v"
  # 0 is a real rank at np 2: it triggers the tests-only desync that chapter 08's own test covers.
  if [ "$v" != 0 ]; then try "ch08_np2--debug-desync-rank=$v" 2 ch08_zero3 --debug-desync-rank "$v"; fi
done
echo "integer flags: all cases exit 0 correctly or name the flag"
