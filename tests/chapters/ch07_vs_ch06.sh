#!/usr/bin/env bash
# Chain link 07 vs 06: ZeRO-2 runs chapter 06's collectives on the same padded buckets and
# only changes what a rank keeps of the gradients (its shard; a bucket's full gradient is
# freed once reduced). Expected: BITWISE equal parameters, losses and AdamW state (exp_avg,
# exp_avg_sq and the step count of every parameter, gathered with --save-optimizer-state), at
# every N, for the MLP with a width that divides by no N, for --hidden-sizes 1 with one bucket
# per parameter (a 1-element bucket: ranks that own only padding) with K = 3 and active
# clipping, and for the ToyModel across an epoch boundary.
# From the summary record, on every rank: the same bytes sent per step as chapter 06; model
# states between steps = 4(Ψ + padding) + 4·(shard) + 8·(real shard) exactly, and the peak
# = that + the two largest consecutive buckets (K = 1: allocating bucket b frees bucket b − 2)
# or + every bucket (K = 3: no_sync accumulates full gradients across micro-steps, as DDP).
# Chapter 07 vs chapter 05 directly: tests/mpi/zero2.cpp (bitwise, optimizer state included).
source "$(dirname "$0")/lib.bash"

# check_zero2 NAME K: chapter 07's memory against its formula, traffic against chapter 06's.
check_zero2() {
  python3 - "$WORK/$1.jsonl" "$WORK/${1/ch07/ch06}.jsonl" "$2" "$1" <<'PY'
import json, sys
def summary(path): return [json.loads(l) for l in open(path) if '"summary"' in l][-1]
s, s6, K = summary(sys.argv[1]), summary(sys.argv[2]), int(sys.argv[3])
sent = [c["training"]["bytes_sent"] / s["steps"] for c in s["comm"]]
sent6 = [c["training"]["bytes_sent"] / s6["steps"] for c in s6["comm"]]
assert sent == sent6 == s["theory_bytes_sent_per_rank_per_step"], (sent, sent6)
extra = s["in_flight_peak_bytes"] if K == 1 else 4 * (s["num_parameters"] + s["padding"])
exact = s["model_states_exact_bytes"]
for r, led in enumerate(s["ledger"]):
    assert led["model_states_current"] == exact[r], (r, led["model_states_current"], exact[r])
    assert led["model_states_peak"] == exact[r] + extra, (r, led["model_states_peak"], exact[r], extra)
    assert led["model_states_current"] < s6["ledger"][r]["model_states_current"] or s["world_size"] == 1
print(f"ok: {sys.argv[4]}: model states {exact} between steps, + {extra} B at the peak; "
      f"chapter 06: {[l['model_states_current'] for l in s6['ledger']]}; sent {sent[0]:.0f} B/step as chapter 06")
PY
}

# run_pair NAME NP ARGS...: chapters 06 and 07 on the same flags, compared bit for bit.
run_pair() {
  local name=$1 np=$2; shift 2
  run ch06_$name $np ch06_zero1 "$@" --save-optimizer-state "$WORK/ch06_$name.opt.safetensors"
  run ch07_$name $np ch07_zero2 "$@" --save-optimizer-state "$WORK/ch07_$name.opt.safetensors"
  same ch06_$name ch07_$name --bitwise
  "$COMPARE" "$WORK/ch06_$name.opt.safetensors" "$WORK/ch07_$name.opt.safetensors" --bitwise
}

for np in 1 2 3 4; do
  common=(--model mlp --hidden-sizes 61 --global-batch-size 72 --max-steps 12 --eval-every-epoch 0 --seed 3
          --bucket-cap-mb 0.1)
  run_pair n$np $np "${common[@]}"
  check_zero2 ch07_n$np 1
  odd=(--model mlp --hidden-sizes 1 --bucket-cap-mb 0.000001 --global-batch-size 72 --max-steps 12
       --eval-every-epoch 0 --seed 4 --grad-accum-steps 3 --clip-grad-norm 0.05)
  run_pair odd_n$np $np "${odd[@]}"
  check_zero2 ch07_odd_n$np 3
done

for np in 2 3; do
  toy=(--model toy --hidden-sizes 64,37 --global-batch-size 48 --epochs 2 --max-steps 24 --seed 5 --bucket-cap-mb 0.01)
  run_pair toy_n$np $np "${toy[@]}"
  check_zero2 ch07_toy_n$np 1
done

# The step count of every parameter equals the number of optimizer steps, as unsharded AdamW.
python3 - "$WORK/ch07_odd_n4.opt.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
steps = {k: struct.unpack("<f", raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])[0]
         for k, v in header.items() if k.endswith(".step")}
assert sorted(steps) == ["0.bias.step", "0.weight.step", "2.bias.step", "2.weight.step"], steps
assert all(v == 12 for v in steps.values()), steps
print("ok: every parameter's AdamW step count is 12")
PY
