#!/usr/bin/env bash
# Chapter 08 (ZeRO-3) with --precision bf16|fp16 (zero3.hpp, docs/mixed-precision.md):
#  - the chain: 08(N) in bf16 vs 02(K = N) in bf16, same global batch. Bitwise at N = 1, 2:
#    both seed backward with 1/N (08 pre-divides: loss_scale/(N·K)), round each micro-batch's
#    (rank's) fp32 gradient to 16 bits, and add the 16-bit gradients with one fp32 add and one
#    rounding per addition; a sum of two is the same in either order. At N = 3, 4 the ring adds
#    chunk c starting at rank c + 1, chapter 02 in micro-step order: another rounding order, so
#    every weight is held to AdamW's own bound 2·lr·Σ_t R_t (compare_runs --adam-bound, as the
#    fp32 links; lib.bash);
#  - the ledger to the byte on every rank: model states = 2Σs_l + 2Σs_l + 12·(real shard), the
#    formula (2 + 2 + 12)Ψ/N plus padding; comm_buffers peak = the ring's 16-bit chunk plus the
#    layers in flight, max(2P_l-1 + 8P_l + 2P_l+1) with prefetch, 8·max P_l without;
#  - the counters: every rank sends exactly K·(3(N−1)·2Σs_l + 48 L) bytes per step, half of the
#    fp32 run's payload (the 16-byte desync headers aside);
#  - fp16: at global batch 4 a gradient overflows the initial loss scale 2^16 once in 30
#    steps (measured); 08 at N = 2 skips that step exactly as 02 with K = 2 does (bitwise: same
#    weights, same losses), the scale ends at 2^15 with skipped_steps 1, and the saved Adam
#    step count is 29 (a skipped step does not advance it);
#  - --reduce-dtype fp32: the reduce-scatter sends fp32 (the 16-bit gradient widened) and sums
#    in fp32 into an fp32 gradient shard, from which the master weights step, as in chapters
#    03-07 (one meaning of the flag). At N = 2 that is chapter 05's --reduce-dtype fp32 BIT FOR
#    BIT (a sum of two is the same in either ring order); at N = 3 AdamW's bound against chapter
#    02. Counters: (N−1)Σs_l·(2·2 + 4) bytes per step; layers in flight max(2P_l-1 + 8P_l +
#    4P_l+1); the gradient shard 4Σs_l;
#  - fp32 stays the default and bit-identical (no flag vs --precision fp32);
#  - refused with a message naming the fix: --collectives mpi in 16 bits (MPI has no bf16 sum)
#    and a --reduce-dtype that is neither the parameters' dtype nor fp32.
source "$(dirname "$0")/lib.bash"
common=(--model mlp --global-batch-size 48 --max-steps 12 --epochs 1 --eval-every-epoch 0 --seed 3)
check_summary() {  # NAME PREFETCH(on|off) [REDUCE_BYTES: 2, or 4 with --reduce-dtype fp32]
  # (the reduce dtype is the gradient shard's too: rb bytes per element)
  python3 - "$WORK/$1.jsonl" "$2" "${3:-2}" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
rb = int(sys.argv[3])  # bytes per element of the reduce-scatter
N, psi, K = s["world_size"], s["num_parameters"], 1
sizes = [784 * 512 + 512, 512 * 512 + 512, 512 * 10 + 10]  # the MLP's layers, weight + bias
shard = [-(-n // N) for n in sizes]
P = [N * x for x in shard]
real = [[max(0, min(x, n - r * x)) for x, n in zip(shard, sizes)] for r in range(N)]
exact = [2 * sum(shard) + rb * sum(shard) + 12 * sum(real[r]) for r in range(N)]
assert s["precision"] == "bf16"
assert s["model_states_exact_bytes"] == exact, (s["model_states_exact_bytes"], exact)
if sys.argv[2] == "on":
    Pz = [0] + P + [0]
    flight = max(2 * Pz[l - 1] + 8 * Pz[l] + rb * Pz[l + 1] for l in range(1, len(P) + 1))
else:
    flight = 8 * max(P)
assert s["in_flight_peak_bytes"] == flight, (s["in_flight_peak_bytes"], flight)
for r, led in enumerate(s["ledger"]):
    assert led["model_states_peak"] == exact[r], (r, led["model_states_peak"], exact[r])
    assert led["parameters"]["peak"] == 2 * sum(real[r]) and led["gradients"]["peak"] == rb * sum(real[r])
    assert led["optimizer_state"]["peak"] == 12 * sum(real[r]), (r, led["optimizer_state"])
    assert led["padding"]["peak"] == (2 + rb) * (sum(shard) - sum(real[r])), (r, led["padding"])
    cb = led["comm_buffers"]  # at the end only the ring's chunk is left (of the reduce dtype)
    assert cb["current"] == rb * max(shard) and cb["peak"] == cb["current"] + flight, (r, cb, flight)
sent = K * ((N - 1) * (2 * 2 + rb) * sum(shard) + (48 * len(sizes) if N > 1 else 0))
for c in s["comm"]:
    t = c["training"]
    assert t["bytes_sent"] == s["steps"] * sent and t["bytes_received"] == s["steps"] * sent, (c["rank"], t, sent)
ratio = abs(max(exact) - 16 * psi / N)
print(f"ok: N = {N}, prefetch {sys.argv[2]}, reduce-scatter {rb} B/element: model states {exact} B = (2 + 2 + 12)Ψ/N + padding "
      f"(Ψ = {psi}); layers in flight {flight} B; sent {sent} B per step per rank")
PY
}
for N in 1 2 3 4; do
  run ch02_k$N 0 ch02_gradient_accumulation "${common[@]}" --precision bf16 --grad-accum-steps $N
  run ch08_n$N $N ch08_zero3 "${common[@]}" --precision bf16
  if [ $N -le 2 ]; then
    same ch02_k$N ch08_n$N --bitwise
  else
    echo "== ch02_k$N vs ch08_n$N (AdamW bound, 12 steps)"
    "$COMPARE" "$WORK/ch02_k$N.safetensors" "$WORK/ch08_n$N.safetensors" --adam-bound 1e-3 --steps 12
  fi
  check_summary ch08_n$N on
done
run ch08_n2_r32 2 ch08_zero3 "${common[@]}" --precision bf16 --reduce-dtype fp32
run ch05_n2_r32 2 ch05_ddp_buckets "${common[@]}" --precision bf16 --reduce-dtype fp32
same ch05_n2_r32 ch08_n2_r32 --bitwise  # one meaning of --reduce-dtype fp32 in 05 and 08
run ch08_n3_r32 3 ch08_zero3 "${common[@]}" --precision bf16 --reduce-dtype fp32
echo "== ch02_k3 vs ch08_n3_r32 (AdamW bound, 12 steps)"
"$COMPARE" "$WORK/ch02_k3.safetensors" "$WORK/ch08_n3_r32.safetensors" --adam-bound 1e-3 --steps 12
check_summary ch08_n3_r32 on 4
run ch08_n3_off 3 ch08_zero3 "${common[@]}" --precision bf16 --no-prefetch
same ch08_n3 ch08_n3_off --bitwise
check_summary ch08_n3_off off

# fp16: one overflow in 30 steps at global batch 4, skipped on every rank.
tiny=(--model mlp --global-batch-size 4 --max-steps 30 --epochs 1 --eval-every-epoch 0 --seed 3 --precision fp16)
run fp16_ch02 0 ch02_gradient_accumulation "${tiny[@]}" --grad-accum-steps 2
run fp16_ch08 2 ch08_zero3 "${tiny[@]}" --save-optimizer-state "$WORK/fp16_opt.safetensors"
same fp16_ch02 fp16_ch08 --bitwise
python3 - "$WORK/fp16_ch08.jsonl" "$WORK/fp16_ch02.jsonl" "$WORK/fp16_opt.safetensors" <<'PY'
import json, struct, sys
def summary(p):
    return [json.loads(l) for l in open(p) if '"summary"' in l][-1]
s, s2 = summary(sys.argv[1]), summary(sys.argv[2])
assert (s["skipped_steps"], s["loss_scale"]) == (1, 32768.0), (s["skipped_steps"], s["loss_scale"])
assert (s2["skipped_steps"], s2["loss_scale"]) == (1, 32768.0)
raw = open(sys.argv[3], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
for name, t in header.items():
    if name.endswith(".step"):
        b, e = t["data_offsets"]
        step = struct.unpack("<f", raw[8 + n + b:8 + n + e])[0]
        assert step == 29.0, (name, step)
print("ok: fp16 skipped 1 of 30 steps on every rank (scale 2^16 -> 2^15); Adam's step count 29")
PY

run fp32_default 2 ch08_zero3 "${common[@]}"
run fp32_flag 2 ch08_zero3 "${common[@]}" --precision fp32
same fp32_default fp32_flag --bitwise
fails mpi 2 ch08_zero3 "--collectives mpi with --precision bf16: MPI has no bf16 sum" \
  "${common[@]}" --precision bf16 --collectives mpi
fails reduce 2 ch08_zero3 "--reduce-dtype fp16 with --precision bf16: gradients are summed in" \
  "${common[@]}" --precision bf16 --reduce-dtype fp16
fails reduce_fp32 2 ch08_zero3 "--reduce-dtype bf16 with --precision fp32: gradients are summed in" \
  "${common[@]}" --reduce-dtype bf16
echo "mixed precision in chapter 08: all checks passed"
