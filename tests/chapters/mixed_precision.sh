#!/usr/bin/env bash
# --precision (common/precision/mixed.hpp) in chapters 01-02:
#  - fp32 stays the default and bit-identical: no flag vs --precision fp32, bitwise;
#  - the chain in bf16 (and fp16): 02 with K = 1 vs 01 is the same computation, bitwise;
#    02 with K = 2 vs 01 sums the micro-batch gradients in another order AND rounds each
#    micro-batch's gradient to 16 bits before the 16-bit accumulation, so it is held to
#    AdamW's own bound, as the fp32 link is (ch02_vs_ch01.sh; compare_runs --adam-bound);
#  - the ledger to the byte, from the summary record: parameters 2Ψ, gradients 2Ψ, optimizer
#    state 12Ψ (fp32 master + exp_avg + exp_avg_sq), model states 16Ψ;
#  - bf16 and fp16 train: after 30 steps the last batch's loss is within 3 % of fp32's
#    (measured with these flags: bf16 1.1 %, fp16 0.8 %; the 16-bit roundings move a 30-step
#    trajectory by about that much, while a lost or broken update leaves the loss near its
#    starting 2.3, +200 %); fp16 reports its
#    loss scale (2^16, GradScaler's initial value: no overflow in 30 steps) and 0 skipped steps;
source "$(dirname "$0")/lib.bash"
common=(--global-batch-size 64 --epochs 1 --eval-every-epoch 0 --seed 5 --max-steps 30)
run fp32 0 ch01_training_loop "${common[@]}"
run fp32_flag 0 ch01_training_loop "${common[@]}" --precision fp32
same fp32 fp32_flag --bitwise
for p in bf16 fp16; do
  run ch01_$p 0 ch01_training_loop "${common[@]}" --precision $p
  run ch02_${p}_k1 0 ch02_gradient_accumulation "${common[@]}" --precision $p --grad-accum-steps 1
  same ch01_$p ch02_${p}_k1 --bitwise
  run ch02_${p}_k2 0 ch02_gradient_accumulation "${common[@]}" --precision $p --grad-accum-steps 2
  echo "== ch01_$p vs ch02_${p}_k2 (AdamW bound)"
  "$COMPARE" "$WORK/ch01_$p.safetensors" "$WORK/ch02_${p}_k2.safetensors" --adam-bound 1e-3 --steps 30
  python3 - "$WORK/fp32.jsonl" "$WORK/ch01_$p.jsonl" "$p" <<'PY'
import json, sys
def summary(path):
    return [json.loads(l) for l in open(path) if '"summary"' in l][-1]
fp32, s, p = summary(sys.argv[1]), summary(sys.argv[2]), sys.argv[3]
psi = s["num_parameters"]
led = s["ledger"][0]
got = (led["parameters"]["peak"], led["gradients"]["peak"], led["optimizer_state"]["peak"],
       s["model_states_bytes_per_rank"])
want = (2 * psi, 2 * psi, 12 * psi, 16 * psi)
print(f"{p}: ledger (parameters, gradients, optimizer_state, model states) {got}, formula {want}")
assert got == want, "ledger differs from 2Ψ + 2Ψ + 12Ψ"
rel = abs(s["final_loss"] - fp32["final_loss"]) / fp32["final_loss"]
print(f"{p}: final loss {s['final_loss']:.6f} vs fp32 {fp32['final_loss']:.6f}: {rel:.2e} relative")
assert rel <= 0.03, "loss too far from fp32"
assert s["precision"] == p
if p == "fp16":
    assert s["loss_scale"] == 65536.0 and s["skipped_steps"] == 0, (s["loss_scale"], s["skipped_steps"])
PY
done
echo "mixed precision: all checks passed"
