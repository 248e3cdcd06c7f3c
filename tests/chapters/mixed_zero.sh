#!/usr/bin/env bash
# Chapters 06 (ZeRO-1) and 07 (ZeRO-2) in 16 bits (--precision bf16|fp16;
# common/precision/shard_precision.hpp), at N = 1, 2, 3, 4:
#  - the ledger to the byte, per rank, from the summary record: parameters 2Ψ, gradients 2Ψ
#    (ZeRO-1) or 2·(real shard) (ZeRO-2, between steps), optimizer state 12·(real shard)
#    (fp32 master + exp_avg + exp_avg_sq), padding 2 bytes per padding element of each 16-bit
#    padded buffer, model states = the exact formula the chapter prints;
#  - the counters per rank per step = 2(N−1)/N · 2(Ψ + padding) exactly (16-bit reduce-scatter
#    and 16-bit all-gather), and (N−1)/N · (4 + 2)(Ψ + padding) with --reduce-dtype fp32;
#  - 07(N) vs 06(N) in bf16, BITWISE (parameters = the gathered fp32 master weights, losses,
#    AdamW's moments and step counts): ZeRO-2 runs chapter 06's 16-bit collectives on the same
#    padded buckets and keeps only its shard, the same sums in the same order; its gradients
#    between steps are the shard (in the reduce dtype), its peak adds at most two 16-bit
#    buckets;
#  - 06(N) in bf16 against chapter 02 in bf16 with K = N micro-batches (the same samples: rank
#    r's share is chapter 02's micro-batch r): BITWISE at N = 1 and 2 (one 16-bit gradient per
#    rank, pre-divided by N; at N = 2 the ring's one 16-bit addition a + b is chapter 02's
#    16-bit accumulation b + a, the same rounded sum); at N = 3, 4 the ring adds the 16-bit
#    gradients in ring order (chunk c from rank c + 1), chapter 02 in micro-batch order, each
#    addition rounded to 16 bits: another order, held to AdamW's own bound (compare_runs
#    --adam-bound, as the fp32 links that change the order);
#  - fp16 trains (scale reported, skipped steps counted); --reduce-dtype fp32 is within AdamW's
#    bound of chapter 02 too, and bit for bit chapter 05's --reduce-dtype fp32 (the master weights
#    step from the fp32 sum in every chapter; ZeRO-2 keeps that sum as its fp32 gradient shard);
#  - fp32 unchanged: no flag vs --precision fp32, bitwise (ch06_vs_ch05.sh and ch07_vs_ch06.sh
#    keep the fp32 chain);
#  - refusals: --collectives mpi with 16 bits; an fp16 forward that
#    overflows at step 1 (weights 1e5 times the initial ones) stops every rank naming the fix.
# One 16-bit step against a serial re-enactment, bit for bit, the fp16 overflow skip on every
# rank, and the calculator's mixed-precision rows against the ledger: tests/mpi/zero_mixed.cpp.
source "$(dirname "$0")/lib.bash"

common=(--model mlp --hidden-sizes 61 --global-batch-size 72 --max-steps 12 --eval-every-epoch 0
        --seed 3)
zero=("${common[@]}" --bucket-cap-mb 0.1)  # several buckets, none divisible by 3 or 4

# check_mixed NAME STAGE GRAD_BYTES: ledger and counters of every rank against the formulas.
check_mixed() {
  python3 - "$WORK/$1.jsonl" "$1" "$2" "$3" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
name, stage, gb = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
n, psi, pad = s["world_size"], s["num_parameters"], s["padding"]
sent = [c["training"]["bytes_sent"] / s["steps"] for c in s["comm"]]
want = (n - 1) * (gb + 2) * (psi + pad) // n  # every chunk is (Ψ + padding)/N per bucket
assert sent == s["theory_bytes_sent_per_rank_per_step"] == [want] * n, (sent, want)
exact = s["model_states_exact_bytes"]
for r, led in enumerate(s["ledger"]):
    p, g, o = (led[k]["current"] for k in ("parameters", "gradients", "optimizer_state"))
    real = o // 12
    assert o == 12 * real, (r, o)
    assert p == 2 * psi, (r, p, psi)
    if stage == 1:
        assert g == 2 * psi and led["padding"]["current"] == 4 * pad, (r, g, led["padding"])
    else:
        shard = (psi + pad) // n  # the gradient shard holds the reduce dtype: gb bytes
        assert g == gb * real and led["padding"]["current"] == 2 * pad + gb * (shard - real), (r, g)
    assert led["model_states_current"] == exact[r] == p + g + o + led["padding"]["current"], (r, exact)
    if stage == 1:
        assert led["model_states_peak"] == exact[r], (r, led["model_states_peak"], exact[r])
    else:  # K = 1: at most two consecutive 16-bit buckets in flight
        assert led["model_states_peak"] == exact[r] + s["in_flight_peak_bytes"], (r, led["model_states_peak"])
reals = [l["optimizer_state"]["current"] // 12 for l in s["ledger"]]
assert sum(reals) == psi, (reals, psi)  # every master element once
print(f"ok: {name}: Ψ = {psi}, padding {pad}: parameters 2Ψ, gradients "
      f"{'2Ψ' if stage == 1 else f'{gb}·shard'}, optimizer 12·{reals}, model states {exact} B; "
      f"sent {sent[0]:.0f} B/step = (N-1)/N·({gb} + 2)(Ψ + padding)")
PY
}

for np in 1 2 3 4; do
  run ch02_k$np 0 ch02_gradient_accumulation "${common[@]}" --precision bf16 --grad-accum-steps $np
  run ch06_n$np $np ch06_zero1 "${zero[@]}" --precision bf16 \
    --save-optimizer-state "$WORK/ch06_n$np.opt.safetensors"
  check_mixed ch06_n$np 1 2
  if [ $np -le 2 ]; then
    same ch02_k$np ch06_n$np --bitwise
  else
    echo "== ch02_k$np vs ch06_n$np (AdamW bound: another 16-bit summation order)"
    "$COMPARE" "$WORK/ch02_k$np.safetensors" "$WORK/ch06_n$np.safetensors" --adam-bound 1e-3 --steps 12
  fi
  run ch07_n$np $np ch07_zero2 "${zero[@]}" --precision bf16 \
    --save-optimizer-state "$WORK/ch07_n$np.opt.safetensors"
  check_mixed ch07_n$np 2 2
  same ch06_n$np ch07_n$np --bitwise
  "$COMPARE" "$WORK/ch06_n$np.opt.safetensors" "$WORK/ch07_n$np.opt.safetensors" --bitwise
done

# fp16 at N = 3: trains, reports its scale; --reduce-dtype fp32: fp32 on the reduce-scatter.
run ch06_fp16 3 ch06_zero1 "${zero[@]}" --precision fp16
check_mixed ch06_fp16 1 2
run ch06_rfp32 3 ch06_zero1 "${zero[@]}" --precision bf16 --reduce-dtype fp32
check_mixed ch06_rfp32 1 4
echo "== ch02_k3 vs ch06_rfp32 (AdamW bound)"
"$COMPARE" "$WORK/ch02_k3.safetensors" "$WORK/ch06_rfp32.safetensors" --adam-bound 1e-3 --steps 12
run ch05_rfp32 3 ch05_ddp_buckets "${zero[@]}" --precision bf16 --reduce-dtype fp32
same ch05_rfp32 ch06_rfp32 --bitwise  # one meaning of --reduce-dtype fp32 in 05 and 06
python3 - "$WORK/ch06_fp16.jsonl" "$WORK/ch06_rfp32.jsonl" "$WORK/ch06_n3.jsonl" <<'PY'
import json, sys
def summary(p): return [json.loads(l) for l in open(p) if '"summary"' in l][-1]
f16, r32, b16 = (summary(p) for p in sys.argv[1:4])
assert f16["precision"] == "fp16" and f16["reduce_dtype"] == "fp16"
assert f16["loss_scale"] == 65536.0 and f16["skipped_steps"] == 0, (f16["loss_scale"], f16["skipped_steps"])
assert r32["precision"] == "bf16" and r32["reduce_dtype"] == "fp32"
for s in (f16, r32):  # a 12-step trajectory moved by 16-bit roundings, not a broken update
    rel = abs(s["final_loss"] - b16["final_loss"]) / b16["final_loss"]
    assert rel <= 0.03, (s["precision"], s["reduce_dtype"], s["final_loss"], b16["final_loss"])
print(f"ok: fp16 scale {f16['loss_scale']:.0f}, 0 skipped; final losses fp16 {f16['final_loss']:.5f}, "
      f"bf16 reduce fp32 {r32['final_loss']:.5f}, bf16 {b16['final_loss']:.5f}")
PY

# fp32 is unchanged: no flag vs --precision fp32, bitwise.
run ch06_fp32 2 ch06_zero1 "${zero[@]}"
run ch06_fp32_flag 2 ch06_zero1 "${zero[@]}" --precision fp32
same ch06_fp32 ch06_fp32_flag --bitwise

run ch07_fp16 3 ch07_zero2 "${zero[@]}" --precision fp16
check_mixed ch07_fp16 2 2
same ch06_fp16 ch07_fp16 --bitwise
run ch07_rfp32 3 ch07_zero2 "${zero[@]}" --precision bf16 --reduce-dtype fp32
check_mixed ch07_rfp32 2 4
same ch06_rfp32 ch07_rfp32 --bitwise

# fp16's range at step 1: weights 1e5 times the initial ones overflow the forward on every rank.
start_point w0 "${common[@]}"  # lib.bash: the initial weights of these flags
python3 - "$WORK/w0.safetensors" "$WORK/wbig.safetensors" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
vals = struct.unpack(f"<{(len(b) - 8 - n) // 4}f", b[8 + n:])
open(sys.argv[2], "wb").write(b[:8 + n] + struct.pack(f"<{len(vals)}f", *[v * 1e5 for v in vals]))
PY
fails fp16_range 2 ch07_zero2 "at step 1, before any update: the forward pass overflowed fp16's range" \
  "${zero[@]}" --precision fp16 --init-from "$WORK/wbig.safetensors"

fails mpi16 2 ch06_zero1 "--collectives mpi with --precision bf16.*drop --collectives mpi" \
  "${zero[@]}" --precision bf16 --collectives mpi
fails mpi16_07 2 ch07_zero2 "--collectives mpi with --precision fp16.*drop --collectives mpi" \
  "${zero[@]}" --precision fp16 --collectives mpi
echo "mixed precision in ZeRO: all checks passed"
