#!/usr/bin/env bash
# --precision bf16 and fp16 against fp32, side by side in the same run: chapter 01 on the
# ToyModel (1024-1024-1024-256, batch 64, AdamW) and on the Fashion-MNIST MLP, median ms per
# optimizer step (metrics summary, ms_per_step) over 60 steps, the three precisions
# interleaved ROUNDS times so that a busy moment hits them alike. Goal: bf16 <= 1.3x fp32.
# What 16 bits cost here: the roundings of every Linear's inputs, outputs and gradients and
# the 16-bit <-> fp32 conversions (F16C for fp16; a vectorised integer loop for bf16). What
# they do not buy on a CPU without AVX-512 BF16: faster products (the GEMM runs in fp32).
#   ROUNDS=5 scripts/bench.d/09-mixed-precision.sh        (default 3)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
CH01="$BUILD/bin/ch01_training_loop"
ROUNDS=${ROUNDS:-3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
[ -x "$CH01" ] || { echo "skipped: $CH01 not built (scripts/bench builds it)"; exit 0; }

for model in toy mlp; do
  for r in $(seq "$ROUNDS"); do
    for p in fp32 bf16 fp16; do
      "$CH01" --model $model --max-steps 60 --eval-every-epoch 0 --log-every 1000 --precision $p \
        --metrics "$TMP/$model-$p-$r.jsonl" >/dev/null
    done
  done
  python3 - "$TMP" "$model" "$ROUNDS" <<'PY'
import json, statistics, sys
tmp, model, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def ms(p):
    vals = []
    for r in range(1, rounds + 1):
        for line in open(f"{tmp}/{model}-{p}-{r}.jsonl"):
            j = json.loads(line)
            if j.get("type") == "summary":
                vals.append(j["ms_per_step"])
    return statistics.median(vals)
base = ms("fp32")
print(f"{model:4} | fp32 {base:7.2f} ms/step", end="")
for p in ("bf16", "fp16"):
    m = ms(p)
    print(f" | {p} {m:7.2f} ms/step ({m / base:.2f}x fp32)", end="")
print()
PY
done
